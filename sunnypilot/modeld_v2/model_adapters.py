"""What modeld drives each frame: inputs in named numpy views, camera frames in, one fused run, outputs out."""
from __future__ import annotations

import ctypes
import logging
import mmap
from typing import Any

import numpy as np
from tinygrad import Device, Tensor

from sunnypilot.modeld_v2.bundle import state_names
from sunnypilot.modeld_v2.frame_fusion import SPLIT_FRAMES
from sunnypilot.modeld_v2.loader import load_device, load_fused
from sunnypilot.modeld_v2.replay import ALIGNMENT, write_tensor
from sunnypilot.modeld_v2.tinygrad_internals import copy_out

log = logging.getLogger("modeld_v2")
VISION_INPUTS = ("img", "big_img")  # modeld's names for the road and wide camera buffers, in the warp's order
MAPS_HOST_MEMORY = ("CPU", "QCOM", "CUDA")  # devices whose kernels can read a host buffer in place; others (NV, AMD, CL) need an upload
CU_MEMHOSTREGISTER_DEVICEMAP, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 0x02, 712

class CudaHostRegistration:
  """CUDA reads host memory only through a device pointer of registered pages: register each camera buffer once, unregister on reset."""
  def __init__(self, device: str):
    from tinygrad.runtime.autogen import cuda
    self.cuda, self.dev, self.registered = cuda, Device[device], []

  def _check(self, status, what: str) -> None:
    if status != 0: raise RuntimeError(f"{what} failed with CUDA error {status}")

  def map(self, ptr: int, length: int) -> int:
    """The device pointer of host memory [ptr, ptr+length), which stays valid until unmap_all()."""
    self._check(self.cuda.cuCtxSetCurrent(self.dev.context), "cuCtxSetCurrent")
    status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
    if status == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:  # a stale registration of memory that went away and came back at this address
      self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))
      status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
    self._check(status, "cuMemHostRegister")
    self.registered.append(ptr)
    dptr = self.cuda.CUdeviceptr_v2()
    self._check(self.cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(ptr), 0), "cuMemHostGetDevicePointer")
    return dptr.value

  def unmap_all(self) -> None:
    self.dev.synchronize()  # no kernel may still be reading them
    for ptr in self.registered: self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))
    self.registered.clear()

  def mapped_tensor(self, array: np.ndarray) -> Tensor:
    """A device tensor over a page-aligned host array (registered here): kernels read and write the array itself."""
    return Tensor.from_blob(self.map(array.ctypes.data, array.nbytes), (array.size,), dtype=array.dtype.name, device=self.dev.device)

def host_pages(nbytes: int, dtype: Any = np.uint8) -> np.ndarray:
  """A zeroed, page-aligned host array (an anonymous mapping), as the driver registers whole pages."""
  return np.frombuffer(mmap.mmap(-1, max(nbytes * np.dtype(dtype).itemsize, 1)), dtype, count=nbytes)

class BaseModelAdapter:
  """The per-frame interface modeld uses: fill `numpy_inputs`, `copy_frames(bufs)`, `run()`, read the outputs."""
  numpy_inputs: dict[str, np.ndarray]

  def copy_frames(self, bufs: dict[str, Any]) -> None: raise NotImplementedError
  def reset_warmup_buffers(self) -> None: raise NotImplementedError
  def reset_states(self) -> None: raise NotImplementedError
  def run(self) -> Tensor: raise NotImplementedError
  def output_array(self) -> np.ndarray: raise NotImplementedError

def _pointer(buf: Any) -> tuple[int, int]:
  """(address, length) of a VisionBuf-like object's mapping."""
  view = np.frombuffer(buf.data, dtype=np.uint8)
  return view.ctypes.data, view.nbytes

class NativeTinygradAdapter(BaseModelAdapter):
  """A fused warp+model bundle: one host upload, the warp's kernels and the model's, per frame.

  Packed warps copy both frames into the host buffer. --split-frames warps read each visionipc buffer in place: it is mapped once per
  pointer with Tensor.from_blob (on CUDA after registering its pages) and bound by pointer, so steady state copies no frame
  bytes. numpy frames (warmup, tests) are uploaded instead: cached host memory must not be read in place by a GPU.
  """
  def __init__(self, model_path: str, warp_path: str, device: str | None = None, cache: bool = True, map_camera_buffers: bool = True,
               allow_device: bool = False):
    self.model_device = load_device(device)
    kind = self.model_device.split(":")[0]
    # CUDA with mapping: the packed host inputs and the outputs live in registered host memory the graph reads and writes in place
    self._pinned = CudaHostRegistration(self.model_device) if map_camera_buffers and kind == "CUDA" else None
    self.jits = load_fused(model_path, warp_path, device=self.model_device, cache=cache, allow_device=allow_device,
                           mapped=("host",) if self._pinned else ())
    self.run_model = self.jits["run"]
    fused = self.jits["metadata"]["fused"]
    self.warp_frame_size = fused["frame_size"]
    self.split = [name for name in SPLIT_FRAMES if name in self.run_model.input_names]  # the warp reads the camera buffers in place
    self.in_place = bool(self.split) and map_camera_buffers and kind in MAPS_HOST_MEMORY
    self._cuda = CudaHostRegistration(self.model_device) if self.in_place and kind == "CUDA" else None  # camera buffers, dropped on reconnect
    self.state_pairs = {name: f"next_{name}" for name in state_names(self.jits["input_specs"], self.jits["output_specs"])}
    self.input_queues = {name: Tensor(np.zeros(spec.shape, spec.dtype), device=self.model_device).realize()
                         for name, spec in self.jits["input_specs"].items() if name in self.state_pairs}
    offsets = fused["host_layout"]
    self.packed_input = host_pages(fused["host_bytes"])
    # the NPY buffer is this array (or the device reads it through its mapping): writes to the views land in the next run
    self.host = self._pinned.mapped_tensor(self.packed_input) if self._pinned else Tensor(self.packed_input, device="NPY")
    self.numpy_inputs = {name: np.ndarray(tuple(shape), dtype=np.float32, buffer=self.packed_input, offset=offsets[name])
                         for name, shape in fused["host_shapes"].items()}
    self.frames = None if self.split else self.packed_input[offsets["frames"]:].reshape(2, self.warp_frame_size)
    self.outputs = {name: Tensor(np.zeros(spec.shape, spec.dtype), device=self.model_device).realize()
                    for name, spec in self.jits["output_specs"].items()}
    if self._pinned:
      self._output_view = host_pages(int(np.prod(self.outputs["outputs"].shape)), np.float32).reshape(self.outputs["outputs"].shape)
      self.outputs["outputs"] = self._pinned.mapped_tensor(self._output_view.reshape(-1)).reshape(self._output_view.shape)
    for name, next_name in self.state_pairs.items(): self.outputs[next_name] = self.input_queues[name]  # next_X is written into X
    self.frame_inputs: dict[str, Tensor] = {}
    self.camera_tensors: dict[int, Tensor] = {}  # pointer -> the camera buffer mapped as a tensor, once (one stream may feed both inputs)
    self._uploads: dict[str, Tensor] = {}  # per split input: the device buffer numpy frames are uploaded into
    out = self.outputs["outputs"]
    self._output_buffer = out.uop.base.buffer
    if not self._pinned:
      self._output_view = np.frombuffer(self._output_buffer.as_memoryview(force_zero_copy=True), np.float32).reshape(out.shape) \
        if self.run_model.outputs_in_place else np.empty(out.shape, np.float32)
    if self.split and map_camera_buffers and not self.in_place:
      log.warning("%s cannot read camera buffers in place: frames are uploaded each step", self.model_device)

  @property
  def registered_camera_buffers(self) -> int:
    """Camera buffers registered with the CUDA driver now (0 elsewhere)."""
    return len(self._cuda.registered) if self._cuda else 0

  def copy_frames(self, bufs: dict[str, Any]) -> None:
    """Take this step's camera frames: {"img": road, "big_img": wide}, each a VisionBuf (shared camera memory with .data) or a numpy array.
    Only VisionBufs are read in place: a numpy frame (warmup, tests) is host memory its owner may free or reuse, so it is always copied."""
    for i, key in enumerate(VISION_INPUTS):
      if key not in bufs: continue
      buf = bufs[key]
      camera = hasattr(buf, "data") and not isinstance(buf, np.ndarray)
      if not self.split:
        np.copyto(self.frames[i], np.frombuffer(buf.data if camera else buf, dtype=np.uint8, count=self.warp_frame_size))
        continue
      name = ("frame", "big_frame")[i]
      if camera and self.in_place:
        ptr, length = _pointer(buf)
        if ptr not in self.camera_tensors:
          if ptr % ALIGNMENT: raise ValueError(f"{key}: camera buffer at {ptr:#x} is not {ALIGNMENT}-byte aligned")
          if length < self.warp_frame_size: raise ValueError(f"{key}: camera buffer has {length} bytes, the warp reads {self.warp_frame_size}")
          device_ptr = self._cuda.map(ptr, length) if self._cuda else ptr
          self.camera_tensors[ptr] = Tensor.from_blob(device_ptr, (self.warp_frame_size,), dtype="uint8", device=self.model_device)
        self.frame_inputs[name] = self.camera_tensors[ptr]
      else:
        data = np.frombuffer(buf.data if camera else buf, dtype=np.uint8, count=self.warp_frame_size)
        if name not in self._uploads: self._uploads[name] = Tensor(np.zeros(self.warp_frame_size, np.uint8), device=self.model_device).realize()
        write_tensor(self._uploads[name], data)
        self.frame_inputs[name] = self._uploads[name]

  def drop_camera_buffers(self) -> None:
    """Forget every camera mapping and the bindings made with them (camerad restarted: its old buffers are gone)."""
    self.run_model.forget([*self.camera_tensors.values(), *self._uploads.values()])
    self.frame_inputs.clear()
    self.camera_tensors.clear()
    self._uploads.clear()
    if self._cuda: self._cuda.unmap_all()

  def close(self) -> None:
    """Let go of the camera buffers and, on CUDA, of the registered host inputs and outputs (the adapter is being replaced)."""
    self.drop_camera_buffers()
    if self._pinned: self._pinned.unmap_all()

  def reset_warmup_buffers(self) -> None:
    """Back to a clean start: zero host inputs and states; drop frame tensors, camera mappings and input bindings."""
    self.packed_input[:] = 0
    self.drop_camera_buffers()
    self.reset_states()

  def reset_states(self) -> None:
    """Zero the recurrent states (hidden state, image, desire and feature queues): what a NaN run wrote would feed every later run."""
    for name in self.state_pairs: write_tensor(self.input_queues[name], np.zeros(self.input_queues[name].shape, self.input_queues[name].dtype.fmt))

  def run(self) -> Tensor:
    if self.split and len(self.frame_inputs) != len(self.split): raise RuntimeError("copy_frames() has not been given both camera frames yet")
    self.run_model(host=self.host, **self.input_queues, **self.frame_inputs, output_buffers=self.outputs)
    return self.outputs["outputs"]

  def output_array(self) -> np.ndarray:
    """This step's outputs (1, N) as numpy, valid until the next run(): on the direct CPU replay a view of the output buffer itself
    (the kernels have finished when run() returns), on CUDA the registered host memory the graph wrote once the device is done, elsewhere
    read back into one preallocated array (no scheduling, no allocation)."""
    if self._pinned: Device[self.model_device].synchronize()
    elif not self.run_model.outputs_in_place:
      copy_out(self._output_buffer, memoryview(self._output_view).cast("B"))  # waits for the device
    return self._output_view
