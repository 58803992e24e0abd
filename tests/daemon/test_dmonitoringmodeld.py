"""dmonitoringmodeld on real msgq/VisionIPC: a driver-camera server and a subscriber in this process, the daemon in a subprocess. Frames
in, driver states out (float32 and float16, today's layout and the previous one); camerad restarts, geometry changes and cameras it
cannot run."""
import os
import shutil
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.model.camera_frame import unpadded_frame

import dm_daemon
from dm_daemon import BIG_FRAME, FRAME, RPY, DMDaemon, reference

folder = dm_daemon.folder  # the daemon tests' fixture, by name: both daemons' artifacts

# openpilot's head sizes and activations, written out: sigmoid with its exponent clipped at 11 (safe_exp), the face_descs' last 6 exp'd
sig = lambda x: 1.0 / (1.0 + np.exp(np.minimum(-np.asarray(x, np.float32), 11)))
exp = lambda x: np.exp(np.minimum(np.asarray(x, np.float32), 11))

def check_fields(state, slices: dict) -> None:
  """Each published field by openpilot's fill from the message's own rawPredictions (the bundled schema's fields: faceProb and the
  face's orientation and position; the current layout's eyes and phone fields are not in it)."""
  raw = np.frombuffer(bytes(state.rawPredictions), np.float32)
  head = lambda name: raw[slices[name][0]:slices[name][1]]
  assert state.wheelOnRightProb == pytest.approx(sig(head("wheel_on_right")[0]), rel=1e-6)
  for side, data in (("lhd", state.leftDriverData), ("rhd", state.rightDriverData)):
    descs = head(f"face_descs_{side}")
    np.testing.assert_array_equal(list(data.faceOrientation), descs[:3])
    np.testing.assert_allclose(list(data.faceOrientationStd), exp(descs[6:9]), rtol=1e-6)
    np.testing.assert_array_equal(list(data.facePosition), descs[3:5])
    np.testing.assert_allclose(list(data.facePositionStd), exp(descs[9:11]), rtol=1e-6)
    assert data.faceProb == pytest.approx(sig(head(f"face_prob_{side}")[0]), rel=1e-6)

def test_frames_in_driver_states_out(folder, openpilot_prefix):
  """30 frames, the calibration published from frame 10 on: every frame's driverStateV2, openpilot's fields, the outputs of the pair run
  directly on the same frames and calibrations; the driving model's files in the folder passed over without a word."""
  slices = read_bundle(os.path.join(folder, "dmonitoring_model.bin"))[0]["extras"]["metadata"]["output_slices"]
  daemon = DMDaemon(folder)
  for frame_id in range(30):
    daemon.send(frame_id, RPY if frame_id >= 10 else None)
    state = daemon.receive(frame_id)
    assert 0 < state.gpuExecutionTime <= state.modelExecutionTime < 5 and daemon.messages[frame_id][1], "timed, and valid"
    check_fields(state, slices)
  t = time.monotonic()
  assert daemon.stop() == 0 and time.monotonic() - t < 1.0, "SIGTERM ends it within a second"
  assert daemon.published == list(range(30)) and daemon.left_no_cycles(), daemon.lines[-3:]
  calibs = dict.fromkeys(range(10, 30), RPY)
  assert [daemon.raw(i).tobytes() for i in range(30)] == reference(folder, range(30), calibs=calibs), "the same frames, transform and calib"
  lines = "".join(daemon.lines)
  assert "skipping" not in lines and "model.bin" not in lines.replace("dmonitoring_model.bin", ""), "modeld's files are passed over silently"
  lacking = [line for line in lines.splitlines() if "driverStateV2: this cereal schema has no" in line]
  assert len(lacking) == 1 and all(f"leftDriverData.{field}" in lacking[0] for field in ("eyesVisibleProb", "eyesClosedProb", "phoneProb")), lines

def test_a_float16_driver_monitoring_model_end_to_end(dm_artifacts, tmp_path, openpilot_prefix):
  """The DM stand-in built in float16 (what a device builds), fused with the dm_warp: every frame's driverStateV2 by openpilot's formulas
  from its own rawPredictions, the outputs of the pair run directly."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  compile_model(str(tmp_path / "dmonitoring_model.bin"), onnx=os.path.join(dm_artifacts, "dmonitoring_model.onnx"), log=lambda s: None,
                precision="float16")
  shutil.copy(os.path.join(dm_artifacts, "dm_warp_1344x760.bin"), tmp_path / "dm_warp_1344x760.bin")
  meta = read_bundle(str(tmp_path / "dmonitoring_model.bin"))[0]["extras"]["metadata"]
  assert meta["precision"] == "float16"
  daemon = DMDaemon(str(tmp_path))
  for frame_id in range(10):
    daemon.send(frame_id, RPY)
    check_fields(daemon.receive(frame_id), meta["output_slices"])
  assert daemon.stop() == 0 and daemon.published == list(range(10))
  assert [daemon.raw(i).tobytes() for i in range(10)] == reference(str(tmp_path), range(10), calibs=dict.fromkeys(range(10), RPY))

def test_the_previous_layout_publishes_its_eye_fields(dm_artifacts, tmp_path, openpilot_prefix):
  """A DM model of openpilot's previous layout (per-eye and blink probabilities, sunglasses): each field by openpilot's formula."""
  import onnx

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools.stand_in_models import build_dmonitoring
  onnx.save(build_dmonitoring("tiny", 5, layout="previous")[0], tmp_path / "dm.onnx")
  compile_model(str(tmp_path / "dmonitoring_model.bin"), onnx=str(tmp_path / "dm.onnx"), log=lambda s: None)
  shutil.copy(os.path.join(dm_artifacts, "dm_warp_1344x760.bin"), tmp_path / "dm_warp_1344x760.bin")
  slices = read_bundle(str(tmp_path / "dmonitoring_model.bin"))[0]["extras"]["metadata"]["output_slices"]
  daemon = DMDaemon(str(tmp_path))
  assert any("(previous layout)" in line for line in daemon.lines)
  for frame_id in range(5):
    daemon.send(frame_id)
    state = daemon.receive(frame_id)
    check_fields(state, slices)
    raw = daemon.raw(frame_id)
    for side, data in (("lhd", state.leftDriverData), ("rhd", state.rightDriverData)):
      for key, field in (("left_eye_prob", "leftEyeProb"), ("right_eye_prob", "rightEyeProb"), ("left_blink_prob", "leftBlinkProb"),
                         ("right_blink_prob", "rightBlinkProb"), ("sunglasses_prob", "sunglassesProb")):
        assert getattr(data, field) == pytest.approx(sig(raw[slices[f"{key}_{side}"][0]]), rel=1e-6), field
  assert daemon.stop() == 0
  assert sum("this cereal schema has no" in line and "leftDriverData.phoneProb" in line for line in daemon.lines) == 1, "phoneProb: not in the bundled schema"

def test_camerad_restarts_and_geometry_changes_are_followed(folder, openpilot_prefix):
  daemon = DMDaemon(folder)
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("reconnected to camerad", after=seen)
  daemon.exchange(range(5, 10))
  for frame, ids in ((BIG_FRAME, range(100, 105)), (FRAME, range(200, 205))):
    seen = len(daemon.lines)
    daemon.restart_camerad(frame)
    daemon.wait_for_line(f"driver camera geometry changed to {frame.width}x{frame.height}", after=seen)
    daemon.exchange(ids)
    assert [daemon.raw(i).tobytes() for i in ids] == reference(folder, ids, frame), f"{frame.width}x{frame.height} through its own warp"
  assert daemon.stop() == 0 and daemon.left_no_cycles()
  assert [daemon.raw(i).tobytes() for i in range(10)] == reference(folder, range(10)), "the new buffers after a restart"

@pytest.mark.parametrize("case", ["no dm_warp for the geometry", "a size no comma camera has", "no driver stream"])
def test_it_waits_with_one_line_then_runs(folder, tmp_path, openpilot_prefix, case):
  """camerad back with buffers it cannot run: no dm_warp built for them, a size no comma camera has, or no driver stream at all. One line,
  nothing published, SIGTERM still honoured; once camerad serves the comma 4 driver camera again, frames run."""
  artifacts = folder
  if case == "no dm_warp for the geometry":
    for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"): shutil.copy(os.path.join(folder, name), tmp_path / name)
    artifacts, bad, line = str(tmp_path), {"frame": BIG_FRAME}, "no dm_warp bundle in"
  elif case == "a size no comma camera has": bad, line = {"frame": unpadded_frame(640, 480)}, "driver camera: no known sensor has 640x480 frames"
  else: bad, line = {"frame": FRAME, "driver": False, "road": True}, "but no driver stream (1): waiting for one"
  daemon = DMDaemon(artifacts)
  daemon.exchange(range(3))
  seen = len(daemon.lines)
  daemon.restart_camerad(**bad)
  daemon.wait_for_line(line, after=seen)
  for frame_id in range(100, 110): daemon.send(frame_id)
  daemon.restart_camerad(FRAME)
  # the same buffers as before the driver stream went away: a reconnect; else the geometry changed back
  daemon.wait_for_line("reconnected to camerad" if case == "no driver stream" else "driver camera geometry changed to 1344x760", after=seen)
  daemon.exchange(range(200, 203))
  assert daemon.stop() == 0
  assert not set(daemon.published) & set(range(100, 110)) and sum(line in x for x in daemon.lines) == 1, "".join(daemon.lines)

@pytest.mark.parametrize("case", ["a size no comma camera has", "no driver stream"])
def test_it_waits_from_the_start_with_one_line(folder, openpilot_prefix, case):
  """camerad is there from the start with buffers the daemon cannot run: one line, nothing published, frames run once camerad serves the
  comma 4 driver camera."""
  if case == "a size no comma camera has": bad, line = {"frame": unpadded_frame(640, 480)}, "driver camera: no known sensor has 640x480 frames"
  else: bad, line = {"frame": FRAME, "driver": False, "road": True}, "but no driver stream (1): waiting for one"
  daemon = DMDaemon(folder, ready=None, **bad)
  daemon.wait_for_line(line)
  for frame_id in range(10): daemon.send(frame_id)
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("running:", after=seen)
  daemon.exchange(range(100, 103))
  assert daemon.stop() == 0
  assert not set(daemon.published) & set(range(10)) and sum(line in x for x in daemon.lines) == 1, "".join(daemon.lines)
  assert "Traceback" not in "".join(daemon.lines)
