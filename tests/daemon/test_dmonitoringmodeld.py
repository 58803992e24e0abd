"""dmonitoringmodeld on real msgq/VisionIPC: a driver-camera server and a subscriber in this process, the daemon in a subprocess."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from test_modeld_switch import poisoned

from sunnypilot.modeld_v2.compile_dm_warp import compile_dm_warp
from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_DM_FILE, LAST_RAN_FILE, folder_roles
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, unpadded_frame
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from conftest import ROOT
from daemon_process import DaemonProcess, exchange_until

FRAME, BIG_FRAME = camerad_frame(1344, 760), camerad_frame(1928, 1208)
SENSORS = {FRAME: "os04c10", BIG_FRAME: "ar0231"}
SOF0 = 10**9
RPY = (0.01, 0.05, -0.02)
# openpilot's head sizes and activations, written out: sigmoid with its exponent clipped at 11 (safe_exp), the face_descs' last 6 exp'd
sig = lambda x: 1.0 / (1.0 + np.exp(np.minimum(-np.asarray(x, np.float32), 11)))
exp = lambda x: np.exp(np.minimum(np.asarray(x, np.float32), 11))

@pytest.fixture(scope="module")
def folder(dm_artifacts, native_artifacts, tmp_path_factory) -> str:
  """One artifacts folder with both daemons' files: the driver-monitoring model and its warps, the driving model and its warp."""
  folder = tmp_path_factory.mktemp("both")
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin", "dm_warp_1928x1208.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  return str(folder)

def driver_frame(frame_id: int, frame: NV12Frame) -> np.ndarray:
  return np.random.default_rng(frame_id).integers(0, 256, frame.size, dtype=np.uint8)

class DriverCamerad:
  """camerad's VisionIPC server with a driver stream of `frame` buffers (18, as camerad allocates), and a road stream with `road`."""
  def __init__(self, frame: NV12Frame, driver: bool = True, road: bool = False):
    from msgq.visionipc import VisionIpcServer

    from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir
    ensure_prefix_dir()
    self.frame, self.server = frame, VisionIpcServer("camerad")
    self.streams = [VisionStreamType.DRIVER] * driver + [VisionStreamType.ROAD] * road
    for stream in self.streams: self.server.create_buffers_with_sizes(stream, 18, frame.width, frame.height, frame.size, frame.stride, frame.uv_offset)
    self.server.start_listener()

  def send(self, frame_id: int) -> None:
    sof = SOF0 + frame_id * 50_000_000
    for stream in self.streams: self.server.send(stream, driver_frame(frame_id, self.frame).tobytes(), frame_id, sof, sof + 20_000_000)

  def close(self) -> None:
    del self.server

class DMDaemon(DaemonProcess):
  """dmonitoringmodeld (--send-raw) with a DriverCamerad, a liveCalibration publisher and a driverStateV2 subscriber here."""
  def __init__(self, artifacts: str, frame: NV12Frame = FRAME, args: tuple[str, ...] = (), command: tuple[str, ...] | None = None,
               ready: str | None = "running:", **camera):
    from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
    self.camera = DriverCamerad(frame, **camera)
    self.sm, self.calibration = sub_master(["driverStateV2"]), pub_master(["liveCalibration"])
    self.messages: dict[int, tuple] = {}  # frameId -> (driverStateV2, valid)
    self.published: list[int] = []
    super().__init__(command or ("-m", "sunnypilot.modeld_v2.dmonitoringmodeld"), ("--artifacts", artifacts, "--send-raw", *args), ready=ready)

  def send(self, frame_id: int, rpy: tuple | None = None) -> None:
    """A frame, after the calibration it is to run with, if any (published first, so the daemon's next update sees it)."""
    from sunnypilot.modeld_v2.daemon.messaging import new_message
    if rpy is not None:
      msg = new_message("liveCalibration")
      msg.liveCalibration.rpyCalib = list(rpy)
      self.calibration.send("liveCalibration", msg)
    self.camera.send(frame_id)

  def receive(self, frame_id: int, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      self.sm.update(20)
      if self.sm.updated["driverStateV2"]:
        state = self.sm["driverStateV2"]
        self.messages[state.frameId] = (state, self.sm.valid["driverStateV2"])
        self.published.append(state.frameId)
      if frame_id in self.messages: return self.messages[frame_id][0]
    raise AssertionError(f"no driverStateV2 for frame {frame_id}: {''.join(self.lines)}")

  def exchange(self, frame_ids, rpy: tuple | None = None) -> None:
    for frame_id in frame_ids:
      self.send(frame_id, rpy)
      self.receive(frame_id)

  def restart_camerad(self, frame: NV12Frame, **camera) -> None:
    self.camera.close()
    self.camera = DriverCamerad(frame, **camera)

  def raw(self, frame_id: int) -> np.ndarray: return np.frombuffer(bytes(self.messages[frame_id][0].rawPredictions), np.float32)

  def stop(self, signum: int = signal.SIGTERM) -> int:
    code = super().stop(signum)
    self.camera.close()
    return code

def reference(artifacts: str, frame_ids, frame: NV12Frame = FRAME, calibs: dict | None = None) -> list[bytes]:
  """The pair run directly on the same frames, with openpilot's transform for the frame's camera and the calibration each frame ran with."""
  w, h = frame.width, frame.height
  runner = ModelRunner(os.path.join(artifacts, "dmonitoring_model.bin"), os.path.join(artifacts, f"dm_warp_{w}x{h}.bin"))
  runner.numpy_inputs["tfm"][:] = dm_warp_matrix(SENSORS[frame])
  outs = []
  for frame_id in frame_ids:
    runner.numpy_inputs["calib"][:] = (calibs or {}).get(frame_id, (0.0, 0.0, 0.0))
    runner.copy_frames({"driver": driver_frame(frame_id, frame)})
    runner.run()
    outs.append(runner.output_array().tobytes())
  runner.close()
  return outs

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

# the calibration check switched off: a NaN calib reaches the model, and only the output check stands between it and the bus
UNCHECKED_CALIB = ("-c", "import sys; from sunnypilot.modeld_v2 import dmonitoringmodeld; from sunnypilot.modeld_v2.daemon import bus_inputs; "
                   "bus_inputs.BusInputs.calibration = lambda self, sm: tuple(sm['liveCalibration'].rpyCalib) if sm.seen['liveCalibration'] else (0, 0, 0); "
                   "sys.exit(dmonitoringmodeld.main())")

def test_bad_calibrations_are_refused_and_non_finite_outputs_published_invalid(folder, openpilot_prefix):
  nan = (float("nan"), 0.0, 0.0)
  daemon = DMDaemon(folder)
  daemon.exchange(range(3), RPY)
  daemon.exchange(range(3, 6), nan)
  daemon.exchange(range(6, 8), RPY)
  assert daemon.stop(signal.SIGINT) == 130 and "Traceback" not in "".join(daemon.lines), "Ctrl-C: 130, no traceback"
  assert all(daemon.messages[i][1] for i in range(8)) and daemon.raw(4).tobytes() == reference(folder, [4], calibs={4: RPY})[0], "the last good one"
  assert sum("liveCalibration.rpyCalib = [nan, 0.0, 0.0] refused" in line for line in daemon.lines) == 1, daemon.lines
  unchecked = DMDaemon(folder, command=UNCHECKED_CALIB)
  unchecked.exchange(range(3), RPY)
  unchecked.exchange(range(3, 5), nan)
  unchecked.exchange(range(5, 8), RPY)
  assert unchecked.stop() == 0
  assert [unchecked.messages[i][1] for i in range(8)] == [True] * 3 + [False] * 2 + [True] * 3, "valid=False exactly while outputs are NaN"
  assert np.isfinite(unchecked.raw(3)).all() and not unchecked.raw(3).any(), "published zeroed, no NaN on the bus"
  assert sum("non-finite model outputs" in line for line in unchecked.lines) == 1, unchecked.lines

def test_one_dmonitoringmodeld_per_bus(folder, openpilot_prefix):
  daemon = DMDaemon(folder)
  daemon.exchange(range(3))
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", folder], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr == f"dmonitoringmodeld: error: another dmonitoringmodeld is already running on the bus OPENPILOT_PREFIX={openpilot_prefix}\n"
  from sunnypilot.modeld_v2.daemon.messaging import claim_bus
  assert (claim := claim_bus("modeld")) is not None, "modeld's claim is its own: both daemons run on one bus"
  claim.close()
  daemon.exchange(range(3, 6))
  assert daemon.stop() == 0, "the first one kept running"

def crafted(src: str, dst, edit) -> str:
  """A copy of bundle `src` with its header dict passed through `edit`, the hash recomputed (a file that passes the integrity check)."""
  head, blob = read_bundle(src)
  edit(head)
  data = json.dumps(head).encode()
  dst.write_bytes(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + bytes(blob)).digest()) + data + bytes(blob))
  return str(dst)

def test_bad_artifacts_are_one_line_and_exit_2(folder, native_artifacts, tmp_path):
  """Checked before waiting for camerad: no model, a warp where the model should be, a model without output_slices or with a head of the
  wrong size; a driving model, a driving warp or a dm_warp for another model input where a dm_warp is expected (each skipped with a line)
  and so no dm_warp at all."""
  model, warp = os.path.join(folder, "dmonitoring_model.bin"), os.path.join(folder, "dm_warp_1344x760.bin")
  slices = lambda head: head["extras"]["metadata"]["output_slices"]
  def shorter(head):  # face_descs_rhd one value short
    slices(head)["face_descs_rhd"][1] -= 1
  cases = {"no model": ({"dm_warp_1344x760.bin": warp}, "dmonitoring_model.bin not found (build it with compile_modeld --onnx dmonitoring_model.onnx)"),
           "a warp as the model": ({"dmonitoring_model.bin": warp, "dm_warp_1344x760.bin": warp},
                                   "is not a driver-monitoring model bundle: its metadata kind is dm_warp, not dmonitoring_model"),
           "no output_slices": ({"dmonitoring_model.bin": lambda d: crafted(model, d, lambda h: h["extras"]["metadata"].pop("output_slices")),
                                 "dm_warp_1344x760.bin": warp}, "a driver-monitoring model needs output_slices"),
           "a head of the wrong size": ({"dmonitoring_model.bin": lambda d: crafted(model, d, shorter), "dm_warp_1344x760.bin": warp},
                                        "face_descs_rhd has 11 values, openpilot's driver-monitoring parse reads 12"),
           "a model where a warp is expected": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": os.path.join(native_artifacts, "model.bin")},
                                                "no dm_warp bundle for this device and model"),
           "a driving warp where a dm_warp is expected": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": os.path.join(folder, "warp_split.bin")},
                                                          "no dm_warp bundle for this device and model"),
           "a dm_warp for another model size": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": lambda d: compile_dm_warp(FRAME.spec, str(d),
                                                 "720x480", log=lambda s: None)}, "no dm_warp bundle for this device and model")}
  skips = {"a model where a warp is expected": "a model bundle, not a dm_warp (only dmonitoring_model.bin is read as the model)",
           "a driving warp where a dm_warp is expected": "a warp bundle, not a dm_warp",
           "a dm_warp for another model size": f"it makes [1, {720 * 480}] planes, the model takes input_img [1, {1440 * 960}]"}
  for case, (files, message) in cases.items():
    case_dir = tmp_path / case.replace(" ", "_")
    case_dir.mkdir()
    for name, src in files.items():
      if callable(src): src(case_dir / name)
      else: shutil.copy(src, case_dir / name)
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", str(case_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and message in lines[-1] and lines[-1].startswith("dmonitoringmodeld: error:"), (case, out.stderr)
    assert "Traceback" not in out.stderr
    skipped = [line for line in lines if "skipping" in line]
    assert skipped == ([f"dmonitoringmodeld: skipping {case_dir}/dm_warp_1344x760.bin: {skips[case]}"] if case in skips else []), (case, lines)
    assert len(lines) == 1 + len(skipped), (case, lines)

def test_with_trusted_keys_only_a_signed_pair_runs(dm_artifacts, tmp_path, openpilot_prefix):
  """--trusted-keys as modeld takes it: the unsigned DM model is refused with one line before waiting for camerad (exit 2); once the model
  and its warp are signed by the trusted publisher (each its own .sig), frames run."""
  from sunnypilot.modeld_v2.format.bundle import content_digest
  from sunnypilot.modeld_v2.format.signature import Signed, generate_key, load_private_key, sign
  keys, folder = tmp_path / "keys", tmp_path / "dm"
  os.makedirs(keys / "trusted")
  os.makedirs(folder)
  publisher, public = generate_key(str(keys / "publisher.pem"))
  shutil.copy(public, keys / "trusted" / "publisher.pem")
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  run = [sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", str(folder), "--trusted-keys", str(keys / "trusted")]
  out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "dmonitoring_model.bin.sig" in out.stderr, out.stderr
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"):
    path = str(folder / name)
    sign(path, Signed("bundle", name, content_digest(path), os.path.getsize(path)), load_private_key(publisher))
  daemon = DMDaemon(str(folder), args=("--trusted-keys", str(keys / "trusted")))
  daemon.exchange(range(3))
  assert daemon.stop() == 0 and daemon.published == [0, 1, 2]
  assert any("must be signed by one of 1 trusted keys" in line for line in daemon.lines), daemon.lines

@pytest.fixture(scope="module")
def dm_sets(dm_artifacts, native_artifacts, tmp_path_factory):
  """Installed sets, each with a manifest as install_models leaves it: b (another tiny DM stand-in, seed 7, with the default's dm_warp),
  driving (modeld's driving model and warp, no DM model), broken (b's files, its model's last byte changed after the install: its content
  no longer matches the hash its preamble and manifest declare), inf (b with an infinite weight in its first convolution: finite on the
  warm-up's zero frame, not on camera frames), nan (b with a NaN weight in its heads: fails its warm-up)."""
  import onnx

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools.stand_in_models import build_dmonitoring
  root, work = tmp_path_factory.mktemp("dm_sets"), tmp_path_factory.mktemp("dm_sources")
  names = ("b", "driving", "broken", "inf", "nan")
  for name in names: os.makedirs(root / name)
  onnx.save(build_dmonitoring("tiny", 7)[0], work / "b.onnx")
  compile_model(str(root / "b" / "dmonitoring_model.bin"), onnx=str(work / "b.onnx"), log=lambda s: None)
  shutil.copy(os.path.join(dm_artifacts, "dm_warp_1344x760.bin"), root / "b" / "dm_warp_1344x760.bin")
  for name in ("broken", "inf", "nan"): shutil.copy(root / "b" / "dm_warp_1344x760.bin", root / name / "dm_warp_1344x760.bin")
  shutil.copy(root / "b" / "dmonitoring_model.bin", root / "broken" / "dmonitoring_model.bin")
  poisoned(str(root / "b" / "dmonitoring_model.bin"), str(root / "inf" / "dmonitoring_model.bin"), str(work / "b.onnx"), np.inf)
  poisoned(str(root / "b" / "dmonitoring_model.bin"), str(root / "nan" / "dmonitoring_model.bin"), str(work / "b.onnx"), np.nan, head=True)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), root / "driving" / name)
  for name in names:
    folder = root / name
    write_manifest(str(folder / MANIFEST_NAME), name, [entry_of(str(folder / f), role) for f, role in folder_roles(str(folder)).items()])
  data = bytearray((root / "broken" / "dmonitoring_model.bin").read_bytes())  # damaged after it was installed
  data[-1] ^= 0xFF
  (root / "broken" / "dmonitoring_model.bin").write_bytes(bytes(data))
  return root

@pytest.fixture
def sets_root(dm_sets, tmp_path):
  """A fresh copy of the installed sets per test (the daemon writes last_ran_dm; tests write active)."""
  shutil.copytree(dm_sets, tmp_path / "sets")
  return tmp_path / "sets"

def test_a_switch_publishes_every_frame_and_runs_the_new_dm_model(folder, sets_root, openpilot_prefix):
  """Set b asked for while frames run: it loads beside them and takes over between two frames. Every frame sent is published once; up
  to the change each is the default pair's outputs on that frame, from the change on b's pair's, run directly."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(25))  # the default passes its first 20 frames
  (sets_root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 25)
  end = exchange_until(daemon, "set b passed its first 20 frames", end)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0 and daemon.left_no_cycles()
  sent = list(range(end + 5))
  assert daemon.published == sent, "every frame published once, in order"
  raws, b = [daemon.raw(i).tobytes() for i in sent], reference(str(sets_root / "b"), sent)
  first_b = next(i for i, (raw, ref) in enumerate(zip(raws, b, strict=True)) if raw == ref)
  assert first_b > 25, "frames ran on the default while b loaded"
  assert raws[:first_b] == reference(folder, sent[:first_b]) and raws[first_b:] == b[first_b:], "the default's pair, then b's"
  assert (sets_root / LAST_RAN_DM_FILE).read_text() == "b\n" and not (sets_root / LAST_RAN_FILE).exists(), "its own record, not modeld's"
  assert sum("switched to set b" in line for line in daemon.lines) == 1

def test_a_set_that_cannot_run_leaves_the_running_model_alone(folder, sets_root, openpilot_prefix):
  """A set with no DM model (a driving model only), one whose DM model is damaged, one whose warm-up gives NaN, one that is not there: one
  line each, and every frame runs on the default's pair."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  end = 0
  cases = (("driving", "no driver-monitoring model bundles"), ("broken", "content hash mismatch"), ("nan", "outputs on zero frames are not finite"),
           ("missing", "no set missing in"))
  for name, line in cases:
    (sets_root / "active").write_text(name + "\n")
    end = exchange_until(daemon, line, end)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  sent = list(range(end + 3))
  assert daemon.published == sent and [daemon.raw(i).tobytes() for i in sent] == reference(folder, sent), "the default ran every frame"
  for name, _ in cases:
    said = [line for line in daemon.lines if f"cannot switch to set {name}" in line]
    assert len(said) == 1 and said[0].rstrip().endswith("set default keeps running"), (name, said)
  assert "Traceback" not in "".join(daemon.lines)

def test_start_falls_back_to_the_last_dm_model_that_ran(folder, sets_root, openpilot_prefix):
  """The set asked for cannot load at start: the daemon starts on the last set whose DM model ran (its own record), saying so in one line."""
  (sets_root / "active").write_text("broken\n")
  (sets_root / LAST_RAN_DM_FILE).write_text("b\n")
  (sets_root / LAST_RAN_FILE).write_text("driving\n")  # modeld's record: not dmonitoringmodeld's to follow
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(3))
  assert daemon.stop() == 0
  assert [daemon.raw(i).tobytes() for i in range(3)] == reference(str(sets_root / "b"), range(3)), "".join(daemon.lines)
  failed = [line for line in daemon.lines if "cannot run set broken" in line]
  assert len(failed) == 1 and failed[0].rstrip().endswith("falling back to set b"), failed

def test_non_finite_outputs_in_the_first_frames_go_back_to_the_previous_set(folder, sets_root, openpilot_prefix):
  """Set inf passes its warm-up and gives non-finite outputs on its first camera frame: that frame is published invalid (zeroed), and
  from the next one the default, kept loaded meanwhile, runs again; inf is never recorded as the last DM model that ran."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(25))
  (sets_root / "active").write_text("inf\n")
  end = exchange_until(daemon, "dropped, back to set default", 25)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0
  sent = list(range(end + 5))
  assert daemon.published == sent
  invalid = [i for i in sent if not daemon.messages[i][1]]
  assert len(invalid) == 1 and not daemon.raw(invalid[0]).any(), "one frame on inf, published invalid and zeroed"
  valid = [i for i in sent if i != invalid[0]]
  assert [daemon.raw(i).tobytes() for i in valid] == reference(folder, valid), "the default before and after it"
  assert (sets_root / LAST_RAN_DM_FILE).read_text() == "default\n", "a set that failed is never the last that ran"
  assert sum("set inf gave non-finite outputs in its first frames: dropped, back to set default" in line for line in daemon.lines) == 1

def test_new_cameras_the_running_set_has_no_warp_for_fall_back_to_the_default(folder, sets_root, openpilot_prefix):
  """Set b runs (a dm_warp for 1344x760 only) and camerad comes back with 1928x1208 driver frames: one line says b cannot run on them,
  and the default (a dm_warp for both) runs them through its own warp."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  (sets_root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 0)
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("driver camera geometry changed to 1928x1208", after=seen)
  ids = range(100, 105)
  daemon.exchange(ids)
  assert daemon.stop() == 0 and daemon.published == [*range(end), *ids]
  assert [daemon.raw(i).tobytes() for i in ids] == reference(folder, ids, BIG_FRAME)
  said = [line for line in daemon.lines[seen:] if "set b cannot run on these cameras" in line]
  assert len(said) == 1 and "none of its dm_warp bundles fits 1928x1208" in said[0] and said[0].rstrip().endswith("falling back to set default"), said

def test_model_sets_naming_a_file_is_one_line(folder, tmp_path):
  (tmp_path / "file").write_text("")
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", folder, "--model-sets", str(tmp_path / "file")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr == f"dmonitoringmodeld: error: --model-sets {tmp_path / 'file'}: is a file, not a folder\n", out.stderr
