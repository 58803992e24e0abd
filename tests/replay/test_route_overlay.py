"""The overlay's plan follows the calibration and camera height it is given: the far end of the drawn path lands on the pixel row that
openpilot's projection (intrinsics @ view_from_device @ device_from_calib, written out here for the ar0231 road camera: focal 2648,
principal point (964, 604), commaai/openpilot common/transformations/camera.py) gives for the plan's last point on the ground."""
from types import SimpleNamespace

import numpy as np
import pytest

from sunnypilot.modeld_v2.replay.route_overlay import SCALE, draw_model

def far_row(pitch: float, height: float, x: float) -> float:
  """Pixel row (full size) of the ground point x metres ahead (calibrated frame: forward, right, down) with rpyCalib (0, pitch, 0)."""
  # device_from_calib = Ry(pitch) (openpilot's rot_from_euler with roll and yaw 0): [[cos, 0, sin], [0, 1, 0], [-sin, 0, cos]] @ (x, 0, h)
  forward, down = x * np.cos(pitch) + height * np.sin(pitch), -x * np.sin(pitch) + height * np.cos(pitch)
  return 604.0 + 2648.0 * down / forward  # view (right, down, forward): row = cy + f * down / forward

def drawn_top_row(pitch: float, height: float) -> int:
  from PIL import Image
  x = np.linspace(0.0, 80.0, 33)
  model = SimpleNamespace(position=SimpleNamespace(x=x.tolist(), y=[0.0] * 33, z=[0.0] * 33), laneLines=[], laneLineProbs=[], roadEdges=[],
                          roadEdgeStds=[], leadsV3=[])
  image = Image.new("RGB", (int(1928 * SCALE), int(1208 * SCALE)))
  draw_model(image, model, (0.0, pitch, 0.0), height, "ar0231")
  rows = np.flatnonzero(np.asarray(image).any(axis=(1, 2)))
  assert len(rows), "the path was drawn"
  return int(rows[0])

@pytest.mark.parametrize("pitch, height", [(0.0, 1.22), (0.03, 1.22), (-0.02, 1.22), (0.0, 1.6)])
def test_the_path_ends_where_the_calibration_puts_the_ground(pitch, height):
  assert abs(drawn_top_row(pitch, height) - far_row(pitch, height, 80.0) * SCALE) <= 1.5

def test_a_pitch_and_a_height_move_the_path():
  level, pitched, higher = drawn_top_row(0.0, 1.22), drawn_top_row(0.03, 1.22), drawn_top_row(0.0, 1.6)
  assert level - pitched >= 30 and higher > level  # 0.03 rad at f 2648 is ~79 px full size, ~40 px here: the path's end rises
