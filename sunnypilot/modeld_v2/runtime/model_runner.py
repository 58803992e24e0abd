"""What modeld drives each frame: inputs in named numpy views, camera frames in, one fused run, outputs out."""
from __future__ import annotations

import logging

import numpy as np
from tinygrad import Tensor

from sunnypilot.modeld_v2.format.bundle import Metadata, TensorSpec, next_name
from sunnypilot.modeld_v2.format.fields import device_kind
from sunnypilot.modeld_v2.runtime.cuda_host import CudaHostRegistration, host_pages
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS, DRIVER_BUFFER, CameraFrames, FrameFeed, InPlaceFrames, PackedFrames, UploadFrames
from sunnypilot.modeld_v2.runtime.frame_fusion import SPLIT_FRAMES, FusedLayout
from sunnypilot.modeld_v2.runtime.kernel_replay import write_tensor
from sunnypilot.modeld_v2.runtime.loader import Verify, load_device, load_fused
from sunnypilot.modeld_v2.runtime.output_readbacks import CopiedOutput, OutputReadback, PinnedOutput, ViewedOutput

log = logging.getLogger(__name__)
MAPS_HOST_MEMORY = ("CPU", "QCOM", "CUDA")  # devices whose kernels can read a host buffer in place; others (NV, AMD, CL) need an upload

class ModelRunner:
  """A fused warp+model bundle (the daemons' ModelAdapter): one host upload, the warp's kernels and the model's, per frame. The camera
  frames arrive through a frame feed (frame_feeds: packed, uploaded or read in place) and the outputs leave through an output readback (output_readbacks).
  `map_camera_buffers=False` uploads the frames of a --split-frames warp and keeps the host inputs and outputs out of CUDA's registered
  memory. `verify`: see loader.stream_parts (the daemons: the model set's signature or manifest check). A driver-monitoring pair
  (a dmonitoring_model bundle and a dm_warp) runs the same way, fed {"driver": buffer}."""
  def __init__(self, model_path: str, warp_path: str, device: str | None = None, map_camera_buffers: bool = True, allow_device: bool = False,
               verify: Verify | None = None):
    self.model_device = load_device(device)
    kind = device_kind(self.model_device)
    # CUDA with mapping: the packed host inputs (and the outputs, see PinnedOutput) live in registered host memory the graph reads in place
    self._host_cuda = CudaHostRegistration(self.model_device) if map_camera_buffers and kind == "CUDA" else None
    self.bundle = load_fused(model_path, warp_path, device=self.model_device, allow_device=allow_device, mapped=("host",) if self._host_cuda else (),
                             verify=verify)
    self.replay = self.bundle.run
    assert self.bundle.fused is not None, "load_fused returns a fused part"
    self.layout: FusedLayout = self.bundle.fused
    self.warp_frame_size = self.layout.frame_size
    # the warp's camera inputs, read in place (two for the road cameras, one for the driver's), and copy_frames' keys for them
    self.split = [name for name in SPLIT_FRAMES if name in self.bundle.input_specs] if self.layout.split_frames else []
    self.camera_buffers: tuple[str, ...] = (DRIVER_BUFFER,) if self.bundle.metadata.get("kind") == "dmonitoring_model" else CAMERA_BUFFERS
    self.in_place = bool(self.split) and map_camera_buffers and kind in MAPS_HOST_MEMORY
    self.states = {name: Tensor(np.zeros(self.bundle.input_specs[name].shape, self.bundle.input_specs[name].dtype), device=self.model_device).realize()
                   for name in self.bundle.state_names}
    self.packed_input = host_pages(self.layout.host_bytes)
    # the NPY buffer is this array (or the device reads it through its mapping): writes to the views land in the next run
    self.host = self._host_cuda.mapped_tensor(self.packed_input) if self._host_cuda else Tensor(self.packed_input, device="NPY")
    self.numpy_inputs: dict[str, np.ndarray] = {name: np.ndarray(shape, dtype=np.float32, buffer=self.packed_input, offset=self.layout.host_layout[name])
                         for name, shape in self.layout.host_shapes.items()}
    self.frame_feed = self._frame_feed()
    # every output but the states' next values comes back to the host: `outputs` (the raw vector) and, in a bundle with the output parse
    # in its graph, the messages' float block
    pinned, nexts = map_camera_buffers and kind == "CUDA", {next_name(n) for n in self.states}
    self.readbacks = {name: self._readback(spec, pinned) for name, spec in self.bundle.output_specs.items() if name not in nexts}
    self.outputs = {name: readback.tensor for name, readback in self.readbacks.items()}
    for name, state in self.states.items(): self.outputs[next_name(name)] = state  # next_X is written into X
    if self.split and map_camera_buffers and not self.in_place:
      log.warning("%s cannot read camera buffers in place: frames are uploaded each step", self.model_device)

  def _frame_feed(self) -> FrameFeed:
    if not self.split: return PackedFrames(self.packed_input[self.layout.host_layout["frames"]:].reshape(2, self.warp_frame_size))
    return (InPlaceFrames if self.in_place else UploadFrames)(self.model_device, self.warp_frame_size)

  def _readback(self, spec: TensorSpec, pinned: bool) -> OutputReadback:
    if pinned: return PinnedOutput(spec, self.model_device)
    return (ViewedOutput if self.replay.outputs_in_place else CopiedOutput)(spec, self.model_device)

  @property
  def output_slices(self) -> dict[str, list[int]]:
    """{head name: [start, stop]} in the output vector, as the bundle records them (checked when it was read)."""
    return self.bundle.metadata["output_slices"]

  @property
  def metadata(self) -> Metadata:
    """The model bundle's metadata (its generation, layout and output slices among it)."""
    return self.bundle.metadata

  @property
  def registered_camera_buffers(self) -> int:
    """Camera buffers registered with the CUDA driver now (0 elsewhere)."""
    return self.frame_feed.registered_camera_buffers

  def copy_frames(self, bufs: CameraFrames) -> None:
    """Take this step's camera frames: {"img": road, "big_img": wide} ({"driver": driver} for driver monitoring: `camera_buffers`), each a
    VisionBuf (shared camera memory with .data) or a numpy array. Only VisionBufs are read in place: a numpy frame (warmup, tests) is host
    memory its owner may free or reuse, so it is always copied."""
    for key in self.camera_buffers:
      if key in bufs: self.frame_feed.feed(key, bufs[key])

  def drop_camera_buffers(self) -> None:
    """Forget every camera mapping and the bindings made with them (camerad restarted: its old buffers are gone)."""
    self.replay.forget(self.frame_feed.tensors)
    self.frame_feed.drop()

  def close(self) -> None:
    """Let go of the camera buffers and, on CUDA, of the registered host inputs and outputs (the adapter is being replaced)."""
    self.drop_camera_buffers()
    for readback in self.readbacks.values(): readback.close()
    if self._host_cuda: self._host_cuda.unmap_all()

  def reset_warmup_buffers(self) -> None:
    """Back to a clean start: zero host inputs and states; drop frame tensors, camera mappings and input bindings."""
    self.packed_input[:] = 0
    self.drop_camera_buffers()
    self.reset_states()

  def reset_states(self) -> None:
    """Zero the recurrent states (hidden state, image, desire and feature queues): what a NaN run wrote would feed every later run."""
    for state in self.states.values(): write_tensor(state, np.zeros(state.shape, state.dtype.fmt))

  def run(self) -> Tensor:
    if len(self.frame_feed.inputs) != len(self.split):
      raise RuntimeError(f"copy_frames() has not been given {'both camera frames' if len(self.split) > 1 else 'its camera frame'} yet")
    self.replay(host=self.host, **self.states, **self.frame_feed.inputs, output_buffers=self.outputs)
    return self.outputs["outputs"]

  def output_array(self, name: str = "outputs") -> np.ndarray:
    """This step's output `name` as numpy (`outputs`: the raw (1, N) vector), valid until the next run() (see output_readbacks); the same
    array every step."""
    return self.readbacks[name].read()

  def hold_gil(self, hold: bool) -> None:
    """See Replay.hold_gil: False while a thread beside the frames runs this model (its warm-up on the model switch's thread)."""
    self.replay.hold_gil(hold)
