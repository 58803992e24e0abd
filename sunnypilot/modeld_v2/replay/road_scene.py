"""Synthetic NV12 road scenes: a straight road with lane lines in perspective, as a camera at the device's height sees it.

Used to preview the warp, feed the camerad stand-in, and run the demo without real camera footage.
"""
from __future__ import annotations

import numpy as np

from sunnypilot.modeld_v2.model.camera_frame import NV12Frame

CAMERA_HEIGHT = 1.22  # metres above the road
LANE_LINES = ((-1.85, True), (1.85, False), (-5.55, False), (5.55, False))  # lateral metres (right positive), dashed?

def _ground(width: int, height: int, focal: float, rows: np.ndarray, cols: np.ndarray, t: float, speed: float):
  """Y and chroma for pixels (rows, cols) of a camera with this focal length centred on its image."""
  cy, cx = height / 2, width / 2
  below = rows > cy + 0.5
  dist = focal * CAMERA_HEIGHT / np.maximum(rows - cy, 0.5)  # metres ahead where this row meets the road (rows below the horizon)
  lateral = (cols - cx) * dist / focal
  sky, asphalt = 200 - 60 * np.clip((cy - rows) / max(cy, 1), 0, 1), np.abs(lateral) < 5.8  # then a grass verge
  y = np.where(below, np.where(asphalt, 95, 70), sky)
  u, v = np.where(below, np.where(asphalt, 128, 110), 150), np.where(below, np.where(asphalt, 128, 115), 112)
  for offset, dashed in LANE_LINES:
    on = (np.abs(lateral - offset) < 0.08) & below & (dist < 150)
    if dashed: on &= ((dist + speed * t) % 12.0) < 3.0
    y = np.where(on, 235, y)
  return y, u, v

def road_scene(frame: NV12Frame, focal: float, t: float = 0.0, speed: float = 20.0, seed: int = 0) -> np.ndarray:
  """One camera buffer (uint8, frame.size bytes) at time `t` seconds, driving at `speed` m/s; padding bytes are zero."""
  rng = np.random.default_rng(seed)
  buf = np.zeros(frame.size, np.uint8)
  rows, cols = np.mgrid[0:frame.height, 0:frame.width].astype(np.float32)
  y, _, _ = _ground(frame.width, frame.height, focal, rows, cols, t, speed)
  y = y + rng.normal(0, 3, y.shape)  # sensor noise, so flat areas are not perfectly flat
  y_plane, uv = frame.planes(buf)
  y_plane[:] = np.clip(y, 0, 255).astype(np.uint8)
  rows, cols = np.mgrid[0:frame.height // 2, 0:frame.width // 2].astype(np.float32) * 2 + 0.5
  _, u, v = _ground(frame.width, frame.height, focal, rows, cols, t, speed)
  uv[:, 0:frame.width:2], uv[:, 1:frame.width:2] = u.astype(np.uint8), v.astype(np.uint8)
  return buf
