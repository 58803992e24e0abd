"""The synthetic cabin scene: a face where its pose puts it, inside the driver-monitoring warp's view, moving, blinking, deterministic."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE, dm_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.replay.cabin_scene import blinking, cabin_scene, face_pose

# openpilot's driver cameras (common/transformations/camera.py: _ar_ox_fisheye and _os_fisheye focal lengths), written out here
CAMERAS = {"ar0231": (1928, 1208, 567.0), "os04c10": (1344, 760, 567.0 * 3 / 4)}

def head_pixel(pose, width, height, focal):
  return width / 2 + focal * pose.x / pose.z, height / 2 + focal * pose.y / pose.z

@pytest.mark.parametrize("sensor", CAMERAS)
def test_the_face_is_where_its_pose_projects_and_inside_the_dm_view(sensor):
  width, height, focal = CAMERAS[sensor]
  frame = camerad_frame(width, height)
  model_from_camera = np.linalg.inv(dm_warp_matrix(sensor))
  for index in (0, 25, 90):
    buf = cabin_scene(frame, index)
    y, uv = frame.planes(buf)
    pose = face_pose(index)
    hx, hy = head_pixel(pose, width, height, focal)
    half_w = focal * 0.075 / pose.z
    cheek = y[int(hy) + int(half_w // 2), int(hx) - 3:int(hx) + 4]  # below the eyes, on the face
    beside = y[int(hy), int(hx + 2.5 * half_w):int(hx + 2.5 * half_w) + 7]  # the cabin beside the head
    assert cheek.mean() > beside.mean() + 60, f"frame {index}: no bright face at its pose's pixel ({hx:.0f}, {hy:.0f})"
    p = model_from_camera @ np.array([hx, hy, 1.0])
    u, v = p[:2] / p[2]
    assert 0.1 * DM_INPUT_SIZE[0] < u < 0.9 * DM_INPUT_SIZE[0] and 0.1 * DM_INPUT_SIZE[1] < v < 0.9 * DM_INPUT_SIZE[1], "the DM warp crops the face off"
    assert (uv == 128).all(), "an infrared camera: neutral chroma"
    visible = np.zeros(frame.size, bool)
    vy, vuv = frame.planes(visible)
    vy[:], vuv[:] = True, True
    assert not buf[~visible].any(), "padding bytes are zero"

def test_deterministic_moving_and_blinking():
  frame = camerad_frame(1344, 760)
  assert np.array_equal(cabin_scene(frame, 7), cabin_scene(frame, 7)) and not np.array_equal(cabin_scene(frame, 7), cabin_scene(frame, 8))
  poses = [face_pose(i) for i in range(200)]
  xs, yaws = np.array([p.x for p in poses]), np.array([p.yaw for p in poses])
  assert np.ptp(xs) > 0.04 and np.ptp(yaws) > 0.5, "the head sways and turns"
  closed = [i for i, p in enumerate(poses) if not p.eyes_open]
  assert 4 <= len(closed) <= 20 and all(blinking(i) for i in closed), "blinks now and then, not all the time"
  assert face_pose(3, rhd=True).x == -face_pose(3).x, "a right-hand-drive driver sits on the other side"

def test_blinking_closes_the_eyes_in_the_image():
  """The darkest pixels along the eye row are eye (35) when open; a closed eye is a thin line the row through the eye's centre still
  crosses, but a row a few pixels above it (inside an open eye) is face."""
  width, height, focal = CAMERAS["ar0231"]
  frame = camerad_frame(width, height)
  open_i = next(i for i in range(100) if face_pose(i).eyes_open and abs(face_pose(i).yaw) < 0.05)
  shut_i = next(i for i in range(100) if not face_pose(i).eyes_open)
  for index, want_dark in ((open_i, True), (shut_i, False)):
    pose = face_pose(index)
    hx, hy = head_pixel(pose, width, height, focal)
    scale = focal / pose.z
    ex = hx + 0.07 * np.sin(pose.yaw) * scale + 0.032 * np.cos(pose.yaw) * scale  # the right eye (eye geometry written out from the module)
    ey = hy + (-0.025 + 0.07 * np.sin(pose.pitch)) * scale + 2.5
    y, _ = frame.planes(cabin_scene(frame, index))
    patch = y[int(ey) - 1:int(ey) + 2, int(ex) - 3:int(ex) + 4]
    assert (patch.mean() < 80) == want_dark, f"frame {index}: eye patch mean {patch.mean():.0f}"
