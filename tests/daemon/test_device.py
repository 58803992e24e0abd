"""modeld and dmonitoringmodeld started as a comma device starts them: no arguments, from the package's own folder in sunnypilot's slot, in
a device's Python environment (tests/device_tree.py: today's openpilot.cereal, opendbc's car.capnp, hardware saying it is a device, a
Params that raises UnknownKeyName like openpilot's, openpilot-logging not importable), driven by a camera stand-in and the car's messages
under the schema's own topic names (tests/device_driver.py), their messages decoded with that schema. The same on the 2025 tree.

The checks are openpilot's formulas, written out here (selfdrive/modeld/modeld.py, dmonitoringmodeld.py and controls/lib/drive_helpers.py
@084747c): the action from the model's action head, curvature = action[0] / max(1, v)^2 smoothed with LAT_SMOOTH_SECONDS 0 above
MIN_LAT_CONTROL_SPEED 0.3 m/s and held below it, acceleration = action[1] smoothed with LONG_SMOOTH_SECONDS 0.3 against the last one,
shouldStop = v < 0.3 and the unsmoothed acceleration < 0.1; modelV2.big false with no USB GPU; driverStateV2's probabilities the sigmoid
of their heads (phoneProb of using_phone_prob, sleepProb of sleep_prob); every message valid once a calibration arrived."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import ROOT
from daemon_process import DaemonProcess
from device_tree import UPSTREAM, older, today

pytestmark = pytest.mark.skipif(not os.path.isdir(UPSTREAM), reason=f"today's openpilot files are not at {UPSTREAM}: no device tree to build")

CALIBRATED, SLOW = 10, 60  # tests/device_driver.py: the calibration from this frame on, carState's speed 0.1 m/s from this one on
V_EGO, V_SLOW, DT = 20.0, 0.1, 0.05

def sig(x) -> float: return float(1 / (1 + np.exp(-np.float64(x))))

@pytest.fixture(scope="module")
def models(native_artifacts, tmp_path_factory):
  """The default set a device ships: the native stand-in with its 1344x760 warp, and a DM stand-in of today's layout (sleep_prob per
  side) with its warp."""
  import onnx

  from sunnypilot.modeld_v2.compile_dm_warp import compile_dm_warp
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools.stand_in_models import build_dmonitoring
  folder = tmp_path_factory.mktemp("device_models")
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  onnx.save(build_dmonitoring("tiny", 7, layout="sleep")[0], folder / "dm.onnx")
  compile_model(str(folder / "dmonitoring_model.bin"), onnx=str(folder / "dm.onnx"), log=lambda s: None)
  compile_dm_warp(camerad_frame(1344, 760).spec, str(folder / "dm_warp_1344x760.bin"), log=lambda s: None)
  os.remove(folder / "dm.onnx")
  return folder

def slices_of(path) -> dict:
  from sunnypilot.modeld_v2.format.bundle import read_header
  return read_header(str(path))["extras"]["metadata"]["output_slices"]

def run_device(root, pkg, layout, prefix, tmp_path, params_raise=False) -> tuple[dict, list[str], list[str], str]:
  """The driver and both daemons on the tree at `root`: (what the driver decoded, modeld's lines, dmonitoringmodeld's, the realtime log)."""
  params, realtime = tmp_path / "params", tmp_path / "realtime.log"
  params.mkdir()
  env = {"PYTHONPATH": str(root), "OPENPILOT_PREFIX": prefix, "SEND_RAW_PRED": "1", "FAKE_PARAMS_DIR": str(params),
         "FAKE_REALTIME_LOG": str(realtime)} | ({"FAKE_PARAMS_RAISE": "1"} if params_raise else {})
  out = tmp_path / "driver.json"
  driver = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "device_driver.py"), layout, str(out), "--car-params", str(params)],
                            env=os.environ | env, stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 60
    while not os.path.exists(str(out) + ".ready"):
      assert driver.poll() is None and time.monotonic() < deadline, f"the driver did not start: {driver.stderr.read() if driver.poll() is not None else ''}"
      time.sleep(0.05)
    daemons = [DaemonProcess((str(pkg / name),), env=env, ready=None) for name in ("modeld", "dmonitoringmodeld")]
    try:
      for daemon in daemons: daemon.wait_for_line("running:", timeout=180)
      assert driver.wait(timeout=300) == 0, driver.stderr.read()
    finally:
      codes = [daemon.stop() for daemon in daemons]
    assert codes == [0, 0], [daemon.lines for daemon in daemons]
  finally:
    if driver.poll() is None: driver.kill()
    driver.wait()
  return json.loads(out.read_text())["messages"], *(daemon.lines for daemon in daemons), realtime.read_text()

def check_actions(model_v2: list[dict], slices: dict) -> None:
  """modelV2's action on every frame from its own rawPredictions and the last published action, by today's get_action_from_model."""
  (a0, a1), prev_curv, prev_accel, checked = slices["action"], 0.0, 0.0, 0
  for msg in model_v2:
    f, action = msg["fields"], msg["fields"].get("action", {})
    raw = np.frombuffer(bytes.fromhex(f["rawPredictions"]), np.float32)
    frame = f["frameId"]
    if abs(frame - SLOW) > 2:  # the speed the daemon read is the driver's of this frame (not at the change)
      v = V_SLOW if frame > SLOW else V_EGO
      accel = float(np.float32(raw[a0 + 1]))
      curvature = float(raw[a0]) / max(1.0, v) ** 2 if v > 0.3 else prev_curv
      alpha = 1 - np.exp(-DT / 0.3)
      assert action.get("desiredAcceleration", 0.0) == pytest.approx(alpha * accel + (1 - alpha) * prev_accel, rel=1e-4, abs=1e-6), frame
      assert action.get("desiredCurvature", 0.0) == pytest.approx(curvature, rel=1e-4, abs=1e-9), frame
      assert action.get("shouldStop", False) == (v < 0.3 and accel < 0.1), frame
      checked += 1
    prev_curv, prev_accel = action.get("desiredCurvature", 0.0), action.get("desiredAcceleration", 0.0)
  slow = sum(m["fields"]["frameId"] > SLOW + 2 for m in model_v2)
  assert a1 - a0 == 2 and checked >= 30 and slow >= 5, (checked, slow)

def check_driver_states(states: list[dict], slices: dict, fields=("phoneProb", "sleepProb")) -> None:
  """driverStateV2's probabilities from its own rawPredictions: the sigmoid of each side's heads (dmonitoringmodeld.py @084747c)."""
  heads = {"faceProb": "face_prob", "leftEyeProb": "left_eye_prob", "phoneProb": "using_phone_prob", "sleepProb": "sleep_prob"}
  for msg in states:
    raw = np.frombuffer(bytes.fromhex(msg["fields"]["rawPredictions"]), np.float32)
    for side, data in (("lhd", "leftDriverData"), ("rhd", "rightDriverData")):
      for field in ("faceProb", "leftEyeProb", *fields):
        assert msg["fields"][data][field] == pytest.approx(sig(raw[slices[f"{heads[field]}_{side}"][0]]), rel=1e-5), (field, side)
    assert msg["valid"]

def test_todays_device_runs_both_daemons_with_no_arguments(models, tmp_path, openpilot_prefix):
  root = tmp_path / "device"
  pkg = today(root, models)
  got, modeld, dm, realtime = run_device(root, pkg, "today", openpilot_prefix, tmp_path)
  said = "".join(modeld)
  assert "cereal: openpilot.cereal; reads" in said and all(t in said for t in ("narrowRoadCameraState", "extrinsicsCalibration", "lateralDelay"))
  assert "extrinsicsCalibration (calibration)" in "".join(dm) and f"loaded set default ({pkg / 'models'}" in said
  assert sorted(line.split()[1:] for line in realtime.splitlines()) == [["7", "5"], ["7", "54"]], "openpilot's config_realtime_process(7, 54), (7, 5)"
  lacking = [line for line in modeld if "this cereal schema has no" in line]
  assert not any(f in line for line in lacking for f in ("desiredAcceleration", "shouldStop", "big")), lacking
  for key in ("ModelManager_ActiveBundle", "ModelManager_ActiveBundleChestnut"):  # sunnypilot's, unknown to openpilot: unset, each said once
    assert sum(f"Params {key}:" in line and "UnknownKeyName" in line for line in modeld) == 1, (key, modeld)
  model_v2 = got["modelV2"]
  assert len(model_v2) >= 40 and all(m["valid"] == (m["fields"]["frameId"] > CALIBRATED) for m in model_v2
                                     if abs(m["fields"]["frameId"] - CALIBRATED) > 1), "invalid until calibrated, valid after"
  assert all(m["fields"].get("big", False) is False for m in model_v2)
  check_actions(model_v2, slices_of(models / "model.bin"))
  actions = {m["fields"]["frameId"]: m["fields"]["action"] for m in model_v2}
  assert all(d["fields"]["action"] == actions[d["fields"]["frameId"]] for d in got["drivingModelData"] if d["fields"]["frameId"] in actions)
  assert all(c["valid"] for c in got["cameraOdometry"] if c["fields"]["frameId"] > CALIBRATED + 1 and c["fields"]["frameId"] - 1 in actions)
  check_driver_states(got["driverStateV2"], slices_of(models / "dmonitoring_model.bin"))

def test_the_2025_device_runs_them_the_same(models, tmp_path, openpilot_prefix):
  """A device of openpilot-logging 0.1.5's era: a top-level cereal, openpilot.system.hardware, the flat layout, the old topic names."""
  root = tmp_path / "device"
  pkg = older(root, models)
  got, modeld, dm, _ = run_device(root, pkg, "2025", openpilot_prefix, tmp_path)
  said = "".join(modeld)
  assert "cereal: cereal; reads" in said and "liveCalibration (calibration)" in said and "roadCameraState (road camera state)" in said
  lacking = [line for line in modeld if "this cereal schema has no" in line]
  assert len(lacking) == 2 and all(f in lacking[0] for f in ("modelV2:", "action.desiredAcceleration", "big")), "named once, a line per message"
  model_v2 = got["modelV2"]
  assert len(model_v2) >= 40 and all(m["valid"] for m in model_v2 if m["fields"]["frameId"] > CALIBRATED + 1)
  check_driver_states(got["driverStateV2"], slices_of(models / "dmonitoring_model.bin"), fields=())

def test_a_params_that_raises_on_every_key_is_unset(models, tmp_path, openpilot_prefix):
  """CarParams unreadable: a typical car's delays, said once; the daemons run on."""
  root = tmp_path / "device"
  pkg = today(root, models)
  got, modeld, _, _ = run_device(root, pkg, "today", openpilot_prefix, tmp_path, params_raise=True)
  assert any("delays from a typical car (CarParams unreadable)" in line for line in modeld), modeld
  assert sum("Params CarParams: reading it failed" in line for line in modeld) == 1 and len(got["modelV2"]) >= 40

@pytest.mark.parametrize("fault", ["no calibration topic", "no models folder", "no device schema"])
def test_a_device_that_cannot_run_exits_2_in_one_line(models, tmp_path, openpilot_prefix, fault):
  root = tmp_path / "device"
  edit = (lambda text: text.replace('"extrinsicsCalibration"', '"someOtherCalibration"')) if fault == "no calibration topic" else None
  pkg = today(root, None if fault == "no models folder" else models, services_edit=edit)
  if fault == "no device schema": shutil.rmtree(root / "openpilot" / "cereal")
  env = os.environ | {"PYTHONPATH": str(root), "FAKE_PARAMS_DIR": str(tmp_path), "FAKE_REALTIME_LOG": str(tmp_path / "rt")}
  for name in ("modeld", "dmonitoringmodeld"):
    out = subprocess.run([sys.executable, str(pkg / name)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, out.stderr
    expected = {"no calibration topic": "no calibration topic (any of extrinsicsCalibration, liveCalibration)",
                "no models folder": "no default model set on this device", "no device schema": "neither of its cereal schemas imports"}[fault]
    assert f"{name}: error: " in out.stderr and expected in out.stderr, out.stderr

def test_a_services_list_that_names_a_topic_twice_is_refused():
  from sunnypilot.modeld_v2.daemon.topics import resolve
  with pytest.raises(ValueError, match="names carState more than once"): resolve(["carState", "liveCalibration", "carState"])
  topics = resolve(["carState", "liveCalibration", "extrinsicsCalibration", "liveDelay"])
  assert (topics.calibration, topics.lateral_delay, topics.road_camera_state) == ("extrinsicsCalibration", "liveDelay", None), "today's first"
