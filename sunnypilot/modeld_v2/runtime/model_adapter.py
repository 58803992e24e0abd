"""What the daemons drive of a loaded model each frame and across a model switch: `ModelRunner` is the one implementation, benchmarks stub
it (benchmarks/stubbed_loop.StubModel). A protocol, so a stub satisfies it by its shape alone."""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from sunnypilot.modeld_v2.format.bundle import Metadata
from sunnypilot.modeld_v2.runtime.frame_feeds import CameraFrames

@runtime_checkable
class ModelAdapter(Protocol):
  """A fused warp+model: host inputs written in place, camera frames in, one run, outputs read back."""
  @property
  def numpy_inputs(self) -> dict[str, np.ndarray]: ...  # {host input: a float32 view the next run reads}
  @property
  def output_slices(self) -> dict[str, list[int]]: ...  # {head: [start, stop]} in the output vector
  @property
  def metadata(self) -> Metadata: ...  # the model bundle's
  @property
  def warp_frame_size(self) -> int: ...  # bytes the warp reads of one camera frame
  @property
  def camera_buffers(self) -> tuple[str, ...]: ...  # copy_frames' keys: ("img", "big_img"), or ("driver",)
  @property
  def in_place(self) -> bool: ...  # camera buffers are read in place (not copied)

  def copy_frames(self, bufs: CameraFrames) -> None: ...
  def run(self) -> object: ...
  def output_array(self, name: str = "outputs") -> np.ndarray: ...
  def reset_states(self) -> None: ...
  def reset_warmup_buffers(self) -> None: ...
  def drop_camera_buffers(self) -> None: ...
  def hold_gil(self, hold: bool) -> None: ...
  def close(self) -> None: ...
