"""Synthetic NV12 cabin scenes: what the driver camera sees, a face-like blob (head ellipse, two eyes) that sways, turns and blinks.

The driver camera looks back into the cabin from the windshield, so a left-hand-drive driver, on the car's left, is on the image's
right. The head is placed in metres in front of the camera and projected with the sensor's driver-camera focal length (openpilot's
fisheye configs: 567 px on the 1928x1208 AR0231/OX03C10, 567*3/4 on the 1344x760 OS04C10), so both camera sizes see the same scene and
the driver-monitoring warp's crop holds the face. The camera is infrared and monochrome: the chroma is neutral (128).
Used by fake_camerad's driver stream and the demo, to run dmonitoringmodeld without cabin footage. Deterministic in (frame, index, seed).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from sunnypilot.modeld_v2.model.calibration import driver_camera, sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame

FPS = 20  # the driver camera runs at the road camera's rate
HEAD = (0.38, 0.10, 0.75)  # metres from the camera: right (the image's right), down, forward; a left-hand-drive driver
HEADREST, HEADREST_HALF = (0.38, 0.02, 1.10), (0.13, 0.11)  # behind the head, a little higher
HEAD_HALF = (0.075, 0.105)  # the head ellipse's half width and half height, metres
EYE_SPREAD, EYE_UP, EYE_DEPTH = 0.032, 0.025, 0.07  # eyes' half spacing, height above the head's centre, depth in front of its axis
EYE_HALF = (0.014, 0.006)  # an open eye's half width and half height, metres
BLINK_FRAMES = 3  # 150 ms at 20 Hz
SKIN, EYE, CABIN = 170.0, 35.0, 60.0  # Y levels

@dataclass(frozen=True)
class FacePose:
  """The head at one frame: its centre in metres from the camera (right, down, forward), yaw and pitch in radians, whether the eyes are open."""
  x: float
  y: float
  z: float
  yaw: float
  pitch: float
  eyes_open: bool

def blinking(index: int) -> bool:
  """Blinks now and then: every 67 frames and every 97 frames, two offset rhythms (irregular, like a person), BLINK_FRAMES frames each."""
  return (index + 20) % 67 < BLINK_FRAMES or (index + 31) % 97 < BLINK_FRAMES

def face_pose(index: int, rhd: bool = False) -> FacePose:
  """The head's pose at frame `index`: slow sway (a few cm) and looking around (up to 20 degrees of yaw, 8 of pitch), periods of a few seconds."""
  t = index / FPS
  x = HEAD[0] + 0.03 * np.sin(2 * np.pi * t / 5.0)
  y = HEAD[1] + 0.02 * np.sin(2 * np.pi * t / 3.7)
  yaw, pitch = 0.35 * np.sin(2 * np.pi * t / 6.0), 0.14 * np.sin(2 * np.pi * t / 4.3 + 1.0)
  return FacePose(-x if rhd else x, y, HEAD[2], float(yaw), float(pitch), not blinking(index))

@dataclass(frozen=True)
class FaceInImage:
  """A pose projected to pixels: the head ellipse's centre and half axes, and each eye's centre and half axes."""
  head: tuple[float, float]
  head_half: tuple[float, float]
  eyes: tuple[tuple[float, float], tuple[float, float]]
  eye_half: tuple[float, float]

def project(pose: FacePose, width: int, height: int, focal: float) -> FaceInImage:
  """Where a pose's head and eyes fall in a width x height driver camera of this focal length (pinhole, centred principal point)."""
  scale = focal / pose.z
  head = (width / 2 + pose.x * scale, height / 2 + pose.y * scale)
  # turning moves the eyes across the face (they sit in front of the head's axis) and narrows their spacing; pitch moves them up and down
  ex = head[0] + EYE_DEPTH * np.sin(pose.yaw) * scale
  ey = head[1] + (-EYE_UP + EYE_DEPTH * np.sin(pose.pitch)) * scale
  spread = EYE_SPREAD * np.cos(pose.yaw) * scale
  eye_h = EYE_HALF[1] if pose.eyes_open else EYE_HALF[1] / 6
  return FaceInImage((float(head[0]), float(head[1])), (HEAD_HALF[0] * scale, HEAD_HALF[1] * scale),
                     ((float(ex - spread), float(ey)), (float(ex + spread), float(ey))), (float(EYE_HALF[0] * np.cos(pose.yaw) * scale), eye_h * scale))

@functools.lru_cache(maxsize=4)
def _cabin(width: int, height: int, focal: float, rhd: bool, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """The still cabin behind the driver (dark interior, a brighter rear window across the top, the driver's headrest) and a noise field."""
  rows, cols = np.mgrid[0:height, 0:width].astype(np.float32)
  y = CABIN + 25 * (1 - rows / height)
  y = np.where(rows < height * 0.28, 150 - 40 * np.abs(cols / width - 0.5), y)  # the rear window
  scale = focal / HEADREST[2]
  centre = (width / 2 + (-HEADREST[0] if rhd else HEADREST[0]) * scale, height / 2 + HEADREST[1] * scale)
  y = np.where(_ellipse(rows, cols, centre, (HEADREST_HALF[0] * scale, HEADREST_HALF[1] * scale)), 45, y).astype(np.float32)
  noise = np.random.default_rng(seed).normal(0, 3, (height + 64, width)).astype(np.float32)
  return y, noise

def _ellipse(rows: np.ndarray, cols: np.ndarray, centre: tuple[float, float], half: tuple[float, float]) -> np.ndarray:
  return ((cols - centre[0]) / half[0]) ** 2 + ((rows - centre[1]) / half[1]) ** 2 < 1

def cabin_scene(frame: NV12Frame, index: int, focal: float | None = None, rhd: bool = False, seed: int = 0) -> np.ndarray:
  """One driver-camera buffer (uint8, frame.size bytes) at frame `index`; `focal` defaults to the driver camera of the sensor with this
  frame size. Padding bytes are zero, the chroma neutral."""
  if focal is None: focal = driver_camera(sensor_for_size(frame.width, frame.height)).focal_length
  pose = face_pose(index, rhd)
  face = project(pose, frame.width, frame.height, focal)
  cabin, noise = _cabin(frame.width, frame.height, focal, rhd, seed)
  y = cabin.copy()
  # draw only the head's bounding box: the rest of the frame is the still cabin
  (hx, hy), (hw, hh) = face.head, face.head_half
  r0, r1 = max(int(hy - hh) - 1, 0), min(int(hy + hh) + 2, frame.height)
  c0, c1 = max(int(hx - hw) - 1, 0), min(int(hx + hw) + 2, frame.width)
  rows, cols = np.mgrid[r0:r1, c0:c1].astype(np.float32)
  patch = y[r0:r1, c0:c1]
  shade = SKIN - 30 * np.clip((cols - hx) / hw, -1, 1) * np.sin(pose.yaw)  # the side turned away is darker
  patch[:] = np.where(_ellipse(rows, cols, face.head, face.head_half), shade, patch)
  for eye in face.eyes: patch[:] = np.where(_ellipse(rows, cols, eye, face.eye_half), EYE, patch)
  shift = index % 64  # the noise moves from frame to frame without drawing a new field
  y += noise[shift:shift + frame.height]
  buf = np.zeros(frame.size, np.uint8)
  y_plane, uv = frame.planes(buf)
  y_plane[:] = np.clip(y, 0, 255).astype(np.uint8)
  uv[:] = 128
  return buf
