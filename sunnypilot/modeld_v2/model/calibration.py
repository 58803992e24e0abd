"""Camera intrinsics per sensor and openpilot's warp matrix: model pixel -> camera pixel, from the calibration's roll/pitch/yaw.

Numbers are openpilot's public facts (common/transformations/camera.py and model.py), written here as data.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

@dataclass(frozen=True)
class CameraConfig:
  width: int
  height: int
  focal_length: float

  @property
  def intrinsics(self) -> np.ndarray:
    return np.array([[self.focal_length, 0.0, self.width / 2], [0.0, self.focal_length, self.height / 2], [0.0, 0.0, 1.0]])

# sensor -> (road camera, wide road camera); OS04C10 (comma 4) is read out scaled by half
SENSOR_CAMERAS: dict[str, tuple[CameraConfig, CameraConfig]] = {
  "ar0231": (CameraConfig(1928, 1208, 2648.0), CameraConfig(1928, 1208, 567.0)),
  "ox03c10": (CameraConfig(1928, 1208, 2648.0), CameraConfig(1928, 1208, 567.0)),
  "os04c10": (CameraConfig(1344, 760, 1522.0 * 3 / 4), CameraConfig(1344, 760, 567.0 * 3 / 4)),
}

MODEL_SIZE = (512, 256)
MEDMODEL_CY = 47.6
# the road camera's model frame (medmodel) and the wide camera's (sbigmodel: the big model's view at the small model's size)
MEDMODEL_INTRINSICS = np.array([[910.0, 0.0, MODEL_SIZE[0] / 2], [0.0, 910.0, MEDMODEL_CY], [0.0, 0.0, 1.0]])
SBIGMODEL_INTRINSICS = np.array([[455.0, 0.0, MODEL_SIZE[0] / 2], [0.0, 455.0, (256 + MEDMODEL_CY) / 2], [0.0, 0.0, 1.0]])
VIEW_FROM_DEVICE = np.array([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])  # device (fwd, right, down) -> view (right, down, fwd)
DEFAULT_RPY = (0.0, 0.0, 0.0)  # before liveCalibration is published: a perfectly mounted device

def sensor_for_size(width: int, height: int) -> str:
  """The sensor whose road camera has this frame size (comma 3/3X: 1928x1208, comma 4: 1344x760)."""
  for sensor, (road, _) in SENSOR_CAMERAS.items():
    if (road.width, road.height) == (width, height): return sensor
  raise ValueError(f"no known sensor has {width}x{height} frames; known: {sorted({(c[0].width, c[0].height) for c in SENSOR_CAMERAS.values()})}")

def parse_camera_size(text: str) -> tuple[int, int]:
  """`"1928x1208"` -> (1928, 1208): the frame size of a camera whose geometry is known (comma 3/3X or comma 4); ValueError otherwise."""
  from sunnypilot.modeld_v2.model.camera_frame import parse_size
  size = parse_size(text)
  sensor_for_size(*size)
  return size

def rot_from_euler(rpy: Sequence[float] | np.ndarray) -> np.ndarray:
  """Rotation for [roll, pitch, yaw] about the device's x, y, z axes: Rz(yaw) @ Ry(pitch) @ Rx(roll)."""
  r, p, y = rpy
  rx = np.array([[1, 0, 0], [0, np.cos(r), -np.sin(r)], [0, np.sin(r), np.cos(r)]])
  ry = np.array([[np.cos(p), 0, np.sin(p)], [0, 1, 0], [-np.sin(p), 0, np.cos(p)]])
  rz = np.array([[np.cos(y), -np.sin(y), 0], [np.sin(y), np.cos(y), 0], [0, 0, 1]])
  return rz @ ry @ rx

def camera_from_calib(device_from_calib_euler: Sequence[float] | np.ndarray, intrinsics: np.ndarray) -> np.ndarray:
  """Calibrated frame (forward, right, down metres) -> camera pixel, homogeneous: the warp's camera side and openpilot's UI projection
  (commaai/openpilot selfdrive/ui/onroad/augmented_road_view.py @550a5978: intrinsics @ view_from_calib)."""
  return intrinsics @ VIEW_FROM_DEVICE @ rot_from_euler(device_from_calib_euler)

def get_warp_matrix(device_from_calib_euler: Sequence[float] | np.ndarray, intrinsics: np.ndarray, bigmodel_frame: bool = False) -> np.ndarray:
  """M_inv: model pixel -> camera pixel. Only rotation is compensated; the model frame is the calibrated frame seen by a virtual camera."""
  model_intrinsics = SBIGMODEL_INTRINSICS if bigmodel_frame else MEDMODEL_INTRINSICS
  calib_from_model = np.linalg.inv(model_intrinsics @ VIEW_FROM_DEVICE)
  return camera_from_calib(device_from_calib_euler, intrinsics) @ calib_from_model

def warp_matrices(cameras: tuple[CameraConfig, CameraConfig], rpy: Sequence[float] | np.ndarray = DEFAULT_RPY) -> np.ndarray:
  """M_inv for the (main, extra) cameras as modeld feeds them to the warp (the extra into the big model frame): float32 (2, 3, 3). The
  main camera is the road one, or the wide one when there is no road camera."""
  main, extra = cameras
  return np.stack([get_warp_matrix(rpy, main.intrinsics), get_warp_matrix(rpy, extra.intrinsics, bigmodel_frame=True)]).astype(np.float32)

# the driver-monitoring model's frame (openpilot common/transformations/model.py, DM_INPUT_SIZE and dmonitoringmodel_intrinsics, as
# dmonitoringmodeld.py @63cf2e70 uses them): the AR0231/OX03C10 fisheye's focal length, centred horizontally, its rows shifted up by half
# the height the model crops off that camera's 1208 rows
DM_INPUT_SIZE = (1440, 960)

def driver_camera(sensor: str) -> CameraConfig:
  """The driver camera of a sensor: openpilot's fisheye config (_ar_ox_fisheye 1928x1208, _os_fisheye 1344x760), the wide road camera's."""
  return SENSOR_CAMERAS[sensor][1]

def dmonitoring_intrinsics(size: tuple[int, int] = DM_INPUT_SIZE) -> np.ndarray:
  """openpilot's dmonitoringmodel_intrinsics for a model input of `size` (width, height)."""
  fisheye = driver_camera("ar0231")
  w, h = size
  return np.array([[fisheye.focal_length, 0.0, w / 2], [0.0, fisheye.focal_length, h / 2 - (fisheye.height - h) / 2], [0.0, 0.0, 1.0]])

def dm_warp_matrix(sensor: str, size: tuple[int, int] = DM_INPUT_SIZE) -> np.ndarray:
  """M_inv of the driver camera's warp (model pixel -> camera pixel), float32 (3, 3), as openpilot's dmonitoringmodeld computes its
  model_transform: inv(dmonitoringmodel_intrinsics @ inv(camera intrinsics)). No calibration enters it: the model takes calib itself."""
  return np.linalg.inv(dmonitoring_intrinsics(size) @ np.linalg.inv(driver_camera(sensor).intrinsics)).astype(np.float32)

CALIBRATION_HEIGHT = 1.22  # metres: the camera height sunnypilot assumes before liveCalibration reports one

def apply_camera_offset(m_inv: np.ndarray, intrinsics: np.ndarray, height: float, offset: float) -> np.ndarray:
  """M_inv of a camera moved `offset` metres sideways (sunnypilot modeld_v2/camera_offset_helper.py @5b23aa70): for a ground point the
  camera pixel shifts by offset/height times its row's distance below the principal point, a shear of the camera-pixel side."""
  shear = np.eye(3)
  shear[0, 1], shear[0, 2] = offset / height, -offset / height * intrinsics[1, 2]
  return shear @ m_inv
