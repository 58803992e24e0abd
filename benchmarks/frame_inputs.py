"""What every path of a frame benchmark is fed, the same on each: camerad's rotating camera buffers (synthetic road scenes, or a cabin
for the driver camera) and each frame's host inputs, written by name into an adapter's numpy_inputs."""
from __future__ import annotations

import mmap
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, sensor_for_size
from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
from sunnypilot.modeld_v2.replay.road_scene import road_scene
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS, DRIVER_BUFFER

BUFFERS_PER_STREAM = 18  # camerad's count per stream

class CameraBuffer:
  """A VisionBuf stand-in: a page-aligned shared mapping with `.data`, like visionipc's."""
  def __init__(self, data: np.ndarray):
    self._map = mmap.mmap(-1, data.nbytes)
    self.data = memoryview(self._map)
    np.frombuffer(self.data, np.uint8)[:] = data

def synthetic_buffers(frame: Any, n: int = BUFFERS_PER_STREAM) -> list[dict[str, CameraBuffer]]:
  """camerad's `n` road and wide buffer pairs, each a road_scene frame a little further down the road."""
  road, wide = SENSOR_CAMERAS[sensor_for_size(frame.width, frame.height)]
  return [dict(zip(CAMERA_BUFFERS, (CameraBuffer(road_scene(frame, cam.focal_length, t=i * 0.05)) for cam in (road, wide))))
          for i in range(n)]

def cabin_buffers(frame: Any, n: int = BUFFERS_PER_STREAM) -> list[dict[str, CameraBuffer]]:
  """camerad's `n` driver buffers (page-aligned shared mappings), each a cabin_scene frame."""
  return [{DRIVER_BUFFER: CameraBuffer(cabin_scene(frame, i))} for i in range(n)]

HOST_VALUES = {"traffic_convention": lambda step: [1, 0], "action_t": lambda step: [0.2 + 0.001 * (step % 10), 0.45],
               "lateral_control_params": lambda step: [20 + step % 5, 0.2], "driving_style": lambda step: [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]}

def set_inputs(adapter: Any, step: int, m_inv: np.ndarray) -> None:
  """A driving model's host inputs this frame, the same on every path: the transforms, a one-frame desire pulse now and then (the desire
  queue's max-pool must keep it), the HOST_VALUES by name, anything else zero (openpilot's navigation inputs)."""
  for name, view in adapter.numpy_inputs.items():
    if name == HOST_TRANSFORM: view[:] = m_inv
    elif name == "desire": view.reshape(-1)[:] = np.eye(view.size, dtype=np.float32)[1 + step % 7] if step % 6 == 2 else 0
    else: view.reshape(-1)[:] = HOST_VALUES[name](step) if name in HOST_VALUES else 0

def set_dm_inputs(adapter: Any, step: int, m_inv: np.ndarray) -> None:
  """The driver-monitoring model's inputs this frame, the same on every path: the driver camera's M_inv, and a calibration that drifts a
  little from frame to frame."""
  adapter.numpy_inputs[HOST_TRANSFORM][:] = m_inv
  adapter.numpy_inputs["calib"].reshape(-1)[:] = [0.01 * np.sin(step / 7), 0.03 + 0.005 * np.cos(step / 5), -0.01]
