"""How the camera frames of a step reach the fused part, one class per way: copied into the packed host buffer (a packed warp), uploaded
into a device buffer per input (a --split-frames warp on a device that cannot read host memory, or with mapping off), or read in place
from the camera buffers (a --split-frames warp on CPU, QCOM or CUDA). The adapter picks one and feeds it {"img": road, "big_img": wide},
or {"driver": driver camera} for a driver-monitoring warp."""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np
from tinygrad import Tensor

from sunnypilot.modeld_v2.format.fields import device_kind
from sunnypilot.modeld_v2.format.warp_inputs import DRIVER_FRAMES, WARP_FRAMES
from sunnypilot.modeld_v2.runtime.cuda_host import CudaHostRegistration
from sunnypilot.modeld_v2.runtime.kernel_replay import ALIGNMENT, write_tensor

if TYPE_CHECKING:
  from typing_extensions import TypeIs

CAMERA_BUFFERS = ("img", "big_img")  # copy_frames' keys for the road and wide VisionIPC buffers: openpilot modeld's vision input names

DRIVER_BUFFER = "driver"  # copy_frames' key for the driver camera's VisionIPC buffer (dmonitoringmodeld)

# the warp's input for each camera buffer: a --split-frames warp's road and wide, a driver-monitoring warp's one
FRAME_INPUTS = dict(zip(CAMERA_BUFFERS, WARP_FRAMES, strict=True)) | {DRIVER_BUFFER: DRIVER_FRAMES[0]}

class VisionBuf(Protocol):
  """msgq's VisionBuf as a feed reads it: the camera's shared memory as a uint8 array over it."""
  @property
  def data(self) -> np.ndarray: ...

CameraFrame = VisionBuf | np.ndarray  # what a feed takes per camera: a camera buffer, or a numpy frame (warmup, tests)
CameraFrames = Mapping[str, CameraFrame]  # copy_frames' {"img": road, "big_img": wide} or {"driver": driver}

def is_camera_buffer(buf: CameraFrame) -> TypeIs[VisionBuf]:
  """A VisionBuf (shared camera memory with .data), not a numpy frame (warmup, tests: host memory its owner may free or reuse)."""
  return hasattr(buf, "data") and not isinstance(buf, np.ndarray)

def frame_bytes(buf: CameraFrame, size: int) -> np.ndarray:
  """The first `size` bytes of a camera buffer or numpy frame, as uint8, without a copy."""
  return np.frombuffer(buf.data if is_camera_buffer(buf) else buf, dtype=np.uint8, count=size)

class FrameFeed:
  """One way of feeding frames. `inputs`: the part's frame inputs now (none when the frames travel in the host buffer); `tensors`: every
  frame tensor made so far, whose bindings the replay drops (Replay.forget) before drop() lets them go (camerad restarted, warmup over)."""
  def __init__(self) -> None: self.inputs: dict[str, Tensor] = {}
  def feed(self, key: str, buf: CameraFrame) -> None: raise NotImplementedError
  @property
  def tensors(self) -> list[Tensor]: return []
  def drop(self) -> None: self.inputs.clear()
  @property
  def reads_in_place(self) -> bool: return False
  @property
  def registered_camera_buffers(self) -> int: return 0

class PackedFrames(FrameFeed):
  """A packed warp: both frames copied into the packed host buffer, which the part uploads with the host inputs."""
  def __init__(self, frames: np.ndarray):
    super().__init__()
    self.frames = frames  # (2, frame size): a view of the host buffer

  def feed(self, key: str, buf: CameraFrame) -> None:
    i = CAMERA_BUFFERS.index(key)
    np.copyto(self.frames[i], frame_bytes(buf, self.frames.shape[1]))

class UploadFrames(FrameFeed):
  """A --split-frames warp fed by upload: each frame written into a device buffer of its input, allocated once."""
  def __init__(self, device: str, frame_size: int):
    super().__init__()
    self.device, self.frame_size = device, frame_size
    self.uploads: dict[str, Tensor] = {}

  def feed(self, key: str, buf: CameraFrame) -> None:
    name = FRAME_INPUTS[key]
    if name not in self.uploads: self.uploads[name] = Tensor(np.zeros(self.frame_size, np.uint8), device=self.device).realize()
    write_tensor(self.uploads[name], frame_bytes(buf, self.frame_size))
    self.inputs[name] = self.uploads[name]

  @property
  def tensors(self) -> list[Tensor]: return list(self.uploads.values())

  def drop(self) -> None:
    self.uploads.clear()
    super().drop()

class InPlaceFrames(UploadFrames):
  """A --split-frames warp reading the camera buffers in place: each buffer mapped once per pointer with Tensor.from_blob (on CUDA after
  registering its pages) and bound by pointer, so steady state copies no frame bytes. Numpy frames are uploaded: a GPU must not read cached
  host memory in place."""
  def __init__(self, device: str, frame_size: int):
    super().__init__(device, frame_size)
    self.camera_tensors: dict[int, Tensor] = {}  # pointer -> the camera buffer mapped as a tensor, once (one stream may feed both inputs)
    self.cuda = CudaHostRegistration(device) if device_kind(device) == "CUDA" else None  # camera buffers, dropped on reconnect

  def feed(self, key: str, buf: CameraFrame) -> None:
    if not is_camera_buffer(buf): return super().feed(key, buf)
    view = np.frombuffer(buf.data, dtype=np.uint8)
    ptr, length = view.ctypes.data, view.nbytes
    if ptr not in self.camera_tensors:
      if ptr % ALIGNMENT: raise ValueError(f"{key}: camera buffer at {ptr:#x} is not {ALIGNMENT}-byte aligned")
      if length < self.frame_size: raise ValueError(f"{key}: camera buffer has {length} bytes, the warp reads {self.frame_size}")
      device_ptr = self.cuda.map(ptr, length) if self.cuda else ptr
      self.camera_tensors[ptr] = Tensor.from_blob(device_ptr, (self.frame_size,), dtype="uint8", device=self.device)
    self.inputs[FRAME_INPUTS[key]] = self.camera_tensors[ptr]

  @property
  def tensors(self) -> list[Tensor]: return [*self.camera_tensors.values(), *super().tensors]

  def drop(self) -> None:
    self.camera_tensors.clear()
    super().drop()
    if self.cuda: self.cuda.unmap_all()

  @property
  def reads_in_place(self) -> bool:
    """Whether every frame input now is a camera buffer's own memory (not an upload)."""
    mapped = list(self.camera_tensors.values())
    return bool(self.inputs) and all(any(t is m for m in mapped) for t in self.inputs.values())

  @property
  def registered_camera_buffers(self) -> int:
    """Camera buffers registered with the CUDA driver now (0 elsewhere)."""
    return len(self.cuda.registered) if self.cuda else 0
