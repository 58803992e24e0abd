"""modeld on real msgq/VisionIPC: a camerad stand-in (in this process, or fake_camerad processes), modeld in a subprocess, a subscriber here."""
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.daemon.status import FrameDrops
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.model.constants import DT_MDL
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from conftest import ROOT
from daemon_process import DaemonProcess
from openpilot_reference import T, openpilot_plan_t_idxs, sig

FRAME, BIG_FRAME = camerad_frame(1344, 760), camerad_frame(1928, 1208)
SOF0 = 10**9  # camera timestamps start well after zero, as monotonic clocks do
V_EGO = 20.0
# modeld's defaults on a PC, a typical car (opendbc's Toyota TSS2): lateral = steerActuatorDelay 0.12 + lagd's 0.2, longitudinal 0.15
LAT_DELAY, LONG_DELAY = 0.32, 0.15

@pytest.fixture(scope="module")
def artifacts(native_artifacts, tmp_path_factory) -> str:
  """The shared tiny native stand-in and its 1344x760 warps, a 1928x1208 warp, and an unrelated truncated *.bin modeld must skip."""
  folder = tmp_path_factory.mktemp("artifacts")
  for name in ("model.bin", "warp_split.bin", "warp_packed.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  compile_warp(BIG_FRAME.spec, "512x256", str(folder / "warp_big_split.bin"), split_frames=True)
  (folder / "notes.bin").write_bytes(open(folder / "warp_packed.bin", "rb").read()[:5000])
  return str(folder)

def stand_in_artifacts(generation: str, artifacts: str, tmp_path_factory, precision: str = "float32") -> str:
  """A generation's tiny stand-in compiled (in `precision`) into an artifacts folder with the 1344x760 warp."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools import stand_in_models
  folder = tmp_path_factory.mktemp(generation)
  files = stand_in_models.write(generation, "tiny", str(folder / f"{generation}.onnx"), seed=6)["files"]
  compile_model(str(folder / "model.bin"), **files, log=lambda s: None, precision=precision)
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), folder / "warp_split.bin")
  return str(folder)

@pytest.fixture(scope="module")
def split_09(artifacts, tmp_path_factory) -> str:
  """A 0.9.7-0.9.9 vision+policy stand-in (lateral_control_params, prev_desired_curv, a desired_curvature head)."""
  return stand_in_artifacts("split_09", artifacts, tmp_path_factory)

@pytest.fixture(scope="module")
def split_current(artifacts, tmp_path_factory) -> str:
  """openpilot's current layout: single-hypothesis lead in the vision model, single-hypothesis plan in the policy."""
  return stand_in_artifacts("split_current", artifacts, tmp_path_factory)

@pytest.fixture(scope="module")
def split_action(artifacts, tmp_path_factory) -> str:
  """A vision+policy stand-in whose policy takes action_t."""
  return stand_in_artifacts("split_action", artifacts, tmp_path_factory)

def frames_for(frame_id: int, frame=FRAME) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(frame_id)
  return rng.integers(0, 256, frame.size, dtype=np.uint8), rng.integers(0, 256, frame.size, dtype=np.uint8)

class Daemon(DaemonProcess):
  """modeld in a subprocess (its own OPENPILOT_PREFIX via the fixture), a camerad stand-in and a subscriber in this process. Every modelV2
  published is recorded, and every line modeld logs. `command`: what starts modeld, if not its module; `args`, `env`: added to its own."""
  def __init__(self, artifacts: str, frame=FRAME, args: tuple[str, ...] = (), env: dict | None = None,
               command: tuple[str, ...] = ("-m", "sunnypilot.modeld_v2.modeld")):
    from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
    from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
    self.frame, self.replay = frame, FakeCamerad(frame)
    self.sm = sub_master(["modelV2", "cameraOdometry", "drivingModelData"])
    self.car = pub_master(["carState", "selfdriveState"])
    self.engaged = False  # selfdriveState.enabled, published with each frame
    self.messages: dict[int, dict] = {}  # frameId -> {service: message}
    self.published: list[int] = []  # every modelV2 frameId, in arrival order
    self.made_at: dict[int, dict[str, int]] = {}  # frameId -> {service: Event.logMonoTime}, when modeld serialized it
    super().__init__(command, ("--artifacts", artifacts, "--send-raw", *args), env)
    self.name = "modeld"

  def send(self, frame_id: int, v_ego: float = V_EGO) -> None:
    from sunnypilot.modeld_v2.daemon.messaging import new_message
    msg = new_message("carState")
    msg.carState.vEgo = v_ego
    self.car.send("carState", msg)
    state = new_message("selfdriveState")
    state.selfdriveState.enabled = self.engaged
    self.car.send("selfdriveState", state)
    self.replay.send(frame_id, *frames_for(frame_id, self.frame), sof=SOF0 + frame_id * int(DT_MDL * 1e9))

  def collect(self) -> None:
    self.sm.update(20)
    for service in ("modelV2", "cameraOdometry", "drivingModelData"):
      if self.sm.updated[service]:
        self.messages.setdefault(self.sm[service].frameId, {})[service] = (self.sm[service], self.sm.valid[service])
        self.made_at.setdefault(self.sm[service].frameId, {})[service] = self.sm.logMonoTime[service]
        if service == "modelV2": self.published.append(self.sm[service].frameId)

  def receive(self, frame_id: int, timeout: float = 10) -> dict:
    """Collect messages until modelV2 for frame_id and its companions arrived."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      self.collect()
      if len(got := self.messages.get(frame_id, {})) == 3: return {k: m for k, (m, _) in got.items()}
    raise AssertionError(f"no complete output for frame {frame_id}: got {sorted(self.messages.get(frame_id, {}))}; modeld: {''.join(self.lines)}")

  def exchange(self, frame_ids) -> None:
    """Send each frame and wait for its messages, one after the other."""
    for frame_id in frame_ids:
      self.send(frame_id)
      self.receive(frame_id)

  def restart_camerad(self, frame) -> None:
    from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
    self.replay.close()  # camerad dies; its buffers go with it
    self.frame, self.replay = frame, FakeCamerad(frame)

  def raw(self, frame_id: int) -> bytes: return bytes(self.messages[frame_id]["modelV2"][0].rawPredictions)

  def stop(self, signum: int = signal.SIGTERM) -> int:
    code = super().stop(signum)
    self.replay.close()
    return code

def reference(artifacts: str, frame_ids: list[int], frame=FRAME, warp: str = "warp_split.bin", sensor: str = "os04c10", lat_delay: float = LAT_DELAY,
              long_delay: float = LONG_DELAY, prepare_only: tuple[int, ...] = ()) -> list[bytes]:
  """The adapter run directly on the same frames, from fresh states, with the inputs modeld derives when cameras, calibration and carState
  (vEgo, no blinkers, no lateral control: no desire) are published."""
  adapter = ModelRunner(os.path.join(artifacts, "model.bin"), os.path.join(artifacts, warp))
  road, wide = SENSOR_CAMERAS[sensor]
  # openpilot's inputs: action_t = [lat + 1.5 DT, long + LONG_SMOOTH_SECONDS 0.3 + 1.5 DT] and 0.9.x's lateral_control_params [vEgo, lat],
  # each delay once; the prepare_only gate off
  values = {"tfm": np.stack([get_warp_matrix(DEFAULT_RPY, road.intrinsics), get_warp_matrix(DEFAULT_RPY, wide.intrinsics, True)]), "desire": 0,
            "traffic_convention": [1, 0], "action_t": [lat_delay + 1.5 * DT_MDL, long_delay + 0.3 + 1.5 * DT_MDL],
            "lateral_control_params": [V_EGO, lat_delay], "prepare_only": 0}
  outs = []
  for frame_id in frame_ids:
    values["prepare_only"] = float(frame_id in prepare_only)  # the frames after a drop: the gate on
    for name, view in adapter.numpy_inputs.items(): view.reshape(-1)[:] = np.reshape(values[name], -1)
    road_buf, wide_buf = frames_for(frame_id, frame)
    adapter.copy_frames({"img": road_buf, "big_img": wide_buf})
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def check_fields(msgs: dict, slices: dict, todays: bool = False) -> None:
  """Published fields against openpilot's formulas, computed here from the message's own rawPredictions. `todays`: a generation today's
  openpilot runs (modeld.py @084747c get_action_from_model): the curvature from the action head, action[0] / max(1, v)^2, when it has one."""
  m, d = msgs["modelV2"], msgs["drivingModelData"]
  raw = np.frombuffer(bytes(m.rawPredictions), np.float32)
  head = lambda name: raw[slices[name][0]:slices[name][1]]
  hyps = head("plan").reshape(5, -1)
  plan = hyps[np.argmax(hyps[:, -1])][:495].reshape(33, 15)  # the hypothesis with the largest selection logit
  np.testing.assert_allclose(list(m.position.x), plan[:, 0], rtol=1e-6)
  np.testing.assert_allclose(list(m.temporalPose.trans), plan[0, 3:6], rtol=1e-6)  # no sim_pose head: the plan's velocity at t=0
  np.testing.assert_allclose(list(m.laneLineProbs), sig(head("lane_lines_prob"))[1::2], rtol=1e-5)
  assert m.leadsV3[0].prob == pytest.approx(sig(head("lead_prob")[0]), rel=1e-5)
  lat_t = LAT_DELAY + 1.5 * DT_MDL  # get_curvature_from_plan at lat_action_t, no lateral smoothing; the model's own head when it has one
  curvature = head("desired_curvature")[0] if "desired_curvature" in slices else 2 * np.interp(lat_t, T, plan[:, 11]) / (V_EGO * lat_t) - plan[0, 14] / V_EGO
  if todays and "action" in slices: curvature = head("action")[0] / max(1.0, V_EGO) ** 2
  assert m.action.desiredCurvature == pytest.approx(curvature, rel=1e-4, abs=1e-7) == d.action.desiredCurvature
  coeffs = np.linalg.lstsq(np.stack([T ** k for k in range(5)], axis=1), plan[:, 1].astype(np.float64), rcond=None)[0]  # degree 4, lowest first
  np.testing.assert_allclose(list(d.path.yCoefficients), coeffs, rtol=1e-3, atol=1e-4)

def test_100_frames_in_100_frames_out(artifacts, openpilot_prefix):
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  slices = load_bundle(os.path.join(artifacts, "model.bin")).metadata["output_slices"]
  daemon = Daemon(artifacts)
  assert any("skipping" in line and "notes.bin" in line for line in daemon.lines), "the truncated unrelated bundle is skipped with one line"
  for frame_id in range(100):
    daemon.send(frame_id)
    msgs = daemon.receive(frame_id)
    m = msgs["modelV2"]
    assert (m.frameId, m.frameIdExtra, m.timestampEof) == (frame_id, frame_id, SOF0 + frame_id * 50_000_000 + 20_000_000)
    assert m.frameDropPerc == 0 and m.modelExecutionTime > 0
    assert msgs["cameraOdometry"].timestampEof == m.timestampEof and msgs["drivingModelData"].frameIdExtra == frame_id
    check_fields(msgs, slices, todays=True)
  assert daemon.stop() == 0, "SIGTERM is a clean exit"
  # the collector is off while frames run (openpilot's config_realtime_process): a reference cycle made per frame would never be freed
  assert daemon.left_no_cycles(), daemon.lines[-3:]
  made = [daemon.made_at[i] for i in range(100)]
  assert all(m["modelV2"] < min(m["drivingModelData"], m["cameraOdometry"]) for m in made), "modelV2 is made before the other two"
  assert all(daemon.messages[i]["modelV2"][1] for i in range(21, 100)), "valid once a calibration arrived (camerad's replay sends one per second)"
  assert [daemon.raw(i) for i in range(100)] == reference(artifacts, list(range(100))), "outputs equal the adapter run directly on the same frames"

def test_split_09_frames_in_messages_out(split_09, openpilot_prefix):
  """A 0.9.x vision+policy pair end to end: every frame published, host inputs filled by name as openpilot did, fields from its heads."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  slices = load_bundle(os.path.join(split_09, "model.bin")).metadata["output_slices"]
  core = max(os.sched_getaffinity(0))
  daemon = Daemon(split_09, args=("--core", str(core)))  # pinned as openpilot's modeld is on a device (SCHED_FIFO only there)
  assert os.sched_getaffinity(daemon.proc.pid) == {core} and any(f"pinned to core {core}" in line for line in daemon.lines)
  for frame_id in range(30):
    daemon.send(frame_id)
    check_fields(daemon.receive(frame_id), slices)
  assert daemon.stop() == 0 and daemon.published == list(range(30))
  assert not any("has no source" in line for line in daemon.lines), "every host input of the generation has a source"
  assert [daemon.raw(i) for i in range(30)] == reference(split_09, list(range(30))), "the same inputs as openpilot's modeld, frame by frame"

def expected_drop_perc(frame_ids: list[int]) -> list[float]:
  """openpilot selfdrive/modeld/modeld.py @6c6be47b main(), independently: filter min(dropped, 10) with rc=10 s at 20 Hz, zero for the
  first 10 runs; perc = 100 f / (1 + f)."""
  x, out, last, k = 0.0, [], None, DT_MDL / (10.0 + DT_MDL)
  for run, frame_id in enumerate(frame_ids):
    dropped = 0 if last is None else max(0, frame_id - last - 1)
    last = frame_id
    x = 0.0 if run < 10 else (1 - k) * x + k * min(dropped, 10)
    out.append(100 * x / (1 + x))
  return out

def test_todays_generation_publishes_the_frame_after_a_drop_with_drops_filtered(artifacts, openpilot_prefix):
  """Today's openpilot (selfdrive/modeld/modeld.py @084747c) runs and publishes every frame, the one after a drop too (prepare-only frames
  went in #38252): the native stand-in's frames after each gap are published, cameraOdometry invalid on them (fill_pose_msg's
  `vipc_dropped_frames < 1`), modelV2 valid, and frameDropPerc filtered as openpilot's FirstOrderFilter does."""
  daemon = Daemon(artifacts)
  sent = [i for i in range(40) if i not in (20, 21, 30)]
  for frame_id in sent: daemon.exchange([frame_id])
  assert daemon.stop() == 0 and daemon.left_no_cycles()
  assert daemon.published == sent, "every frame sent, published once, in order"
  expected = dict(zip(sent, expected_drop_perc(sent)))
  for frame_id in daemon.published:
    (m, valid), (d, _) = daemon.messages[frame_id]["modelV2"], daemon.messages[frame_id]["drivingModelData"]
    assert m.frameDropPerc == pytest.approx(expected[frame_id], rel=1e-4, abs=1e-6) and d.frameDropPerc == m.frameDropPerc
    assert daemon.messages[frame_id]["cameraOdometry"][1] == (valid and frame_id not in (22, 31)), frame_id
  assert daemon.messages[39]["modelV2"][0].frameDropPerc > 0.5 and daemon.messages[22]["modelV2"][1], "calibrated by frame 21: valid"
  assert not any("prepare-only" in line for line in daemon.lines)

def test_prepare_only_frames_run_the_gate(split_current, openpilot_prefix):
  """Today's layout: the frame after each gap runs with the gate on (only the image queues advance) and publishes nothing; every published
  output equals the bundle run directly on the same frames with the gate on exactly there."""
  daemon = Daemon(split_current)
  sent = [i for i in range(30) if i not in (10, 11, 20)]
  for frame_id in sent:
    daemon.send(frame_id)
    if frame_id in (12, 21): daemon.wait_for_line(f"frame {frame_id}: ")
    else: daemon.receive(frame_id)
  assert daemon.stop() == 0
  published = [i for i in sent if i not in (12, 21)]
  assert daemon.published == published
  outs = dict(zip(sent, reference(split_current, sent, prepare_only=(12, 21)), strict=True))
  assert [daemon.raw(i) for i in published] == [outs[i] for i in published]
  ungated = dict(zip(sent, reference(split_current, sent), strict=True))
  assert daemon.raw(13) != ungated[13], "the gate changed what the model saw after the drop"

def test_camerad_restart(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  daemon.exchange(range(20))
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("reconnected to camerad", after=seen)
  daemon.exchange(range(20, 30))
  assert daemon.stop() == 0 and daemon.left_no_cycles(), "nor does a reconnect and reload"
  assert [daemon.raw(i) for i in range(30)] == reference(artifacts, list(range(30))), "every output came from the new buffers"

def test_camera_geometry_change_loads_the_matching_warp(artifacts, openpilot_prefix):
  """camerad comes back with 1928x1208 buffers: modeld loads that geometry's warp and intrinsics, then back to 1344x760 (smaller buffers)."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(10))
  for frame, ids, warp, sensor in ((BIG_FRAME, range(100, 110), "warp_big_split.bin", "ar0231"), (FRAME, range(200, 210), "warp_split.bin", "os04c10")):
    seen = len(daemon.lines)
    daemon.restart_camerad(frame)
    daemon.wait_for_line(f"camera geometry changed to {frame.width}x{frame.height}", after=seen)
    daemon.exchange(ids)
    assert [daemon.raw(i) for i in ids] == reference(artifacts, list(ids), frame, warp, sensor), f"{frame.width}x{frame.height} through its own warp"
  assert daemon.stop() == 0

def test_camera_geometry_without_a_warp_waits(artifacts, tmp_path, openpilot_prefix):
  folder = tmp_path / "artifacts"
  folder.mkdir()
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), folder / name)
  daemon = Daemon(str(folder))
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("no warp bundle", after=seen)
  for frame_id in range(100, 120): daemon.send(frame_id)
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("camera geometry changed to 1344x760", after=seen)
  daemon.exchange(range(200, 205))
  assert daemon.stop() == 0, "it waited instead of exiting"
  assert not set(daemon.published) & set(range(100, 120)), "nothing published while no warp fit the camera"
  assert sum("no warp bundle" in line for line in daemon.lines) == 1, "one clear line while waiting"

def test_readme_order_fake_camerad_first(artifacts):
  """The README starts fake_camerad, then modeld, under a fresh OPENPILOT_PREFIX whose folder does not exist yet."""
  prefix = f"sp_test_{uuid.uuid4().hex[:10]}"
  env = os.environ | {"OPENPILOT_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
  replay = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.replay.fake_camerad", "--camera", "1344x760"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
  try:
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--max-frames", "5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "exiting after 5 published frames" in out.stderr, out.stderr
    assert replay.poll() is None, f"fake_camerad died ({replay.returncode})"
  finally:
    replay.send_signal(signal.SIGTERM)
    code = replay.wait(timeout=20)
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  assert code == 0

def test_bad_artifacts_fail_at_start_in_one_line(artifacts, tmp_path, monkeypatch):
  """Checked before waiting for camerad: a model for another device, no warp at all, no model."""
  from sunnypilot.modeld_v2.format import bundle
  from sunnypilot.modeld_v2.format.bundle import read_parts, write_bundle
  qcom, no_warp, empty = (tmp_path / n for n in ("qcom", "no_warp", "empty"))
  for folder in (qcom, no_warp, empty): folder.mkdir()
  parts, extras = read_parts(os.path.join(artifacts, "model.bin"))
  real = bundle.provenance
  monkeypatch.setattr(bundle, "provenance", lambda device, flags=None: real(device, flags) | {"device": "QCOM"})
  write_bundle(str(qcom / "model.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras)
  monkeypatch.undo()
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), qcom / "warp_split.bin")
  shutil.copy(os.path.join(artifacts, "model.bin"), no_warp / "model.bin")
  for folder, message in ((qcom, "built for device QCOM, this process runs on CPU"), (no_warp, "no warp bundle for this device"),
                          (empty, "model.bin not found")):
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(folder)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr

def test_frame_drop_filter():
  drops = FrameDrops()
  ids = list(range(15)) + [18, 19, 20]
  assert [round(drops.update(i)[1], 9) for i in ids] == [round(x, 9) for x in expected_drop_perc(ids)]

def test_demo_runs(artifacts, native_artifacts, dm_artifacts, tmp_path):
  """Both daemons on the demo's folder: modeld's bundles and dmonitoringmodeld's, each beside the stand-in it records it was built from."""
  folder = tmp_path / "artifacts"
  folder.mkdir()
  shutil.copy(os.path.join(artifacts, "model.bin"), folder / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "native.onnx"), folder / "native_tiny_stand_in.onnx")
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), folder / "warp_1344x760_split.bin")
  for src, dst in (("dmonitoring_model.bin", "dmonitoring_model.bin"), ("dmonitoring_model.onnx", "dmonitoring_tiny_stand_in.onnx"),
                   ("dm_warp_1344x760.bin", "dm_warp_1344x760.bin")): shutil.copy(os.path.join(dm_artifacts, src), folder / dst)
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.tools.demo", "--frames", "20", "--camera", "1344x760", "--artifacts", str(folder),
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "frames out (modelV2 published):   20" in out.stdout and "random-weight stand-in" in out.stdout
  assert "frames out (driverStateV2 published): 20, 0 with valid=False" in out.stdout, out.stdout
  assert "modeld exit code 0, dmonitoringmodeld exit code 0, fake_camerad exit code 0" in out.stdout
  assert "compiling" not in out.stderr, "the demo reused the prebuilt bundles"
  assert (tmp_path / "demo_latency.png").stat().st_size > 1000 and (tmp_path / "demo_preview.png").stat().st_size > 1000

# *** today's layout, every field; delays ***

class Expected:
  """Every field of today's single-hypothesis layout from rawPredictions, by openpilot's and sunnypilot's formulas written out here, with the
  history they keep: FCW's last 5/2 hard-brake probabilities, the 2 s confidence buffer. An mlsim generation: curvature from the plan."""
  def __init__(self, slices: dict, lat_t: float):
    self.slices, self.lat_t = slices, lat_t
    self.brake5, self.brake3, self.buffer = np.zeros(5), np.zeros(2), np.zeros(25)

  def check(self, msgs: dict) -> None:
    m, d, o = msgs["modelV2"], msgs["drivingModelData"], msgs["cameraOdometry"]
    raw = np.frombuffer(bytes(m.rawPredictions), np.float32).astype(np.float64)
    head = lambda name: raw[self.slices[name][0]:self.slices[name][1]]
    exp = lambda x: np.exp(np.minimum(x, 11))  # safe_exp
    def eq(got, want, rtol=1e-5, atol=1e-6): np.testing.assert_allclose(np.asarray(list(got), np.float64), want, rtol=rtol, atol=atol)
    assert head("plan").size == 990 and head("lead").size == 144, "one mean/std pair each: no hypotheses"
    plan, plan_std = head("plan")[:495].reshape(33, 15), exp(head("plan")[495:]).reshape(33, 15)
    for field, cols in (("position", slice(0, 3)), ("velocity", slice(3, 6)), ("acceleration", slice(6, 9)), ("orientation", slice(9, 12)),
                        ("orientationRate", slice(12, 15))):
      xyz = getattr(m, field)
      for axis, col in zip("xyz", range(cols.start, cols.stop)): eq(getattr(xyz, axis), plan[:, col])
      eq(xyz.t, T)
    for axis, col in zip("xyz", range(3)): eq(getattr(m.position, f"{axis}Std"), plan_std[:, col])
    eq(m.temporalPose.trans, plan[0, 3:6]), eq(m.temporalPose.transStd, plan_std[0, 3:6]), eq(m.temporalPose.rot, plan[0, 12:15])
    lanes, lanes_std = head("lane_lines")[:264].reshape(4, 33, 2), exp(head("lane_lines")[264:]).reshape(4, 33, 2)
    edges, edges_std = head("road_edges")[:132].reshape(2, 33, 2), exp(head("road_edges")[132:]).reshape(2, 33, 2)
    t = openpilot_plan_t_idxs(plan[:, 0])
    for lines, values in ((m.laneLines, lanes), (m.roadEdges, edges)):
      assert len(lines) == len(values)
      for line, value in zip(lines, values):
        eq(line.x, [192.0 * (i / 32) ** 2 for i in range(33)]), eq(line.y, value[:, 0]), eq(line.z, value[:, 1]), eq(line.t, t)
    eq(m.laneLineStds, lanes_std[:, 0, 0]), eq(m.roadEdgeStds, edges_std[:, 0, 0])
    line_probs = sig(head("lane_lines_prob"))[1::2]
    eq(m.laneLineProbs, line_probs)
    lead, lead_std, lead_prob = head("lead")[:72].reshape(3, 6, 4), exp(head("lead")[72:]).reshape(3, 6, 4), sig(head("lead_prob"))
    for i, lv3 in enumerate(m.leadsV3):
      for k, name in enumerate("xyva"): eq(getattr(lv3, name), lead[i, :, k]), eq(getattr(lv3, f"{name}Std"), lead_std[i, :, k])
      assert lv3.prob == pytest.approx(lead_prob[i], rel=1e-5) and lv3.probTime == [0.0, 2.0, 4.0][i]
      eq(lv3.t, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    softmax = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
    eq(m.meta.desireState, softmax(head("desire_state"))), eq(m.meta.desirePrediction, softmax(head("desire_pred").reshape(4, 8)).reshape(-1))
    meta = sig(head("meta"))  # the 55-entry layout: engaged, then gas/brake/steer/hard-brake 3/4/5 interleaved by 2 s step, then presses
    dp = m.meta.disengagePredictions
    assert m.meta.engagedProb == pytest.approx(meta[0], rel=1e-5)
    for field, start in (("gasDisengageProbs", 1), ("brakeDisengageProbs", 2), ("steerOverrideProbs", 3), ("brake3MetersPerSecondSquaredProbs", 4),
                         ("brake4MetersPerSecondSquaredProbs", 5), ("brake5MetersPerSecondSquaredProbs", 6)): eq(getattr(dp, field), meta[start:31:6])
    eq(dp.gasPressProbs, meta[31:55:4]), eq(dp.brakePressProbs, meta[32:55:4]), eq(dp.t, [2.0, 4.0, 6.0, 8.0, 10.0])
    self.brake5 = np.append(self.brake5[1:], np.float32(meta[6]))
    self.brake3 = np.append(self.brake3[1:], np.float32(meta[4]))
    assert m.meta.hardBrakePredicted == bool((self.brake5 > [0.05, 0.05, 0.15, 0.15, 0.15]).all() and (self.brake3 > [0.7, 0.7]).all())
    if m.frameId % 40 == 0:
      any_p = 1 - (1 - meta[2:31:6]) * (1 - meta[1:31:6]) * (1 - meta[3:31:6])
      self.buffer = np.concatenate([self.buffer[5:], [any_p[0], *(np.diff(any_p) / (1 - any_p[:-1]))]])
    score = sum(self.buffer[i * 5 + 4 - i] for i in range(5)) / 5
    assert str(m.confidence) == ("green" if score < 0.01165 else "yellow" if score < 0.06157 else "red")
    curvature = 2 * np.interp(self.lat_t, T, plan[:, 11]) / (V_EGO * self.lat_t) - plan[0, 14] / V_EGO  # mlsim: the plan, no smoothing
    assert m.action.desiredCurvature == pytest.approx(curvature, rel=1e-4, abs=1e-7) == d.action.desiredCurvature
    coeffs = np.linalg.lstsq(np.stack([T ** k for k in range(5)], axis=1), plan[:, 0:3], rcond=None)[0]
    for i, axis in enumerate("xyz"): eq(getattr(d.path, f"{axis}Coefficients"), coeffs[:, i], rtol=1e-3, atol=1e-4)
    meta_d = d.laneLineMeta
    assert (meta_d.leftY, meta_d.rightY) == pytest.approx((lanes[1, 0, 0], lanes[2, 0, 0]), rel=1e-5)
    assert (meta_d.leftProb, meta_d.rightProb) == pytest.approx((line_probs[1], line_probs[2]), rel=1e-5)
    pose, pose_std = head("pose")[:6], exp(head("pose")[6:])
    eq(o.trans, pose[:3]), eq(o.rot, pose[3:]), eq(o.transStd, pose_std[:3]), eq(o.rotStd, pose_std[3:])
    eq(o.wideFromDeviceEuler, head("wide_from_device_euler")[:3]), eq(o.wideFromDeviceEulerStd, exp(head("wide_from_device_euler")[3:]))
    eq(o.roadTransformTrans, head("road_transform")[:3]), eq(o.roadTransformTransStd, exp(head("road_transform")[6:9]))

def test_todays_layout_every_field_from_raw_predictions(split_current, openpilot_prefix):
  """openpilot's current vision + policy layout end to end: every published field equals the reference computed from rawPredictions."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  meta = load_bundle(os.path.join(split_current, "model.bin")).metadata
  assert (meta["generation"], meta["generation_source"]) == ("split_current", "onnx")
  daemon, expected = Daemon(split_current), Expected(meta["output_slices"], LAT_DELAY + 1.5 * DT_MDL)
  for frame_id in range(45):  # past frame 40: a confidence update
    daemon.send(frame_id)
    expected.check(daemon.receive(frame_id))
  assert daemon.stop() == 0 and daemon.published == list(range(45))
  assert any("generation split_current (recorded, from the ONNX)" in line for line in daemon.lines)
  assert [daemon.raw(i) for i in range(45)] == reference(split_current, list(range(45))), "the same inputs as openpilot's modeld"

def test_a_float16_bundle_end_to_end(artifacts, tmp_path_factory, openpilot_prefix):
  """openpilot's current layout built in float16 (what a device builds), fused with the float32-built warp: modeld on CPU publishes every
  frame, every field from its own rawPredictions by openpilot's formulas (the in-graph parse reads the half model's float32 outputs), and
  the outputs the adapter gives run directly on the same frames."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  folder = stand_in_artifacts("split_current", artifacts, tmp_path_factory, precision="float16")
  meta = load_bundle(os.path.join(folder, "model.bin")).metadata
  assert meta["precision"] == "float16"
  daemon, expected = Daemon(folder), Expected(meta["output_slices"], LAT_DELAY + 1.5 * DT_MDL)
  for frame_id in range(45):
    daemon.send(frame_id)
    expected.check(daemon.receive(frame_id))
  assert daemon.stop() == 0 and daemon.published == list(range(45))
  assert [daemon.raw(i) for i in range(45)] == reference(folder, list(range(45))), "the same inputs as openpilot's modeld"

def fake_openpilot_params(folder, steer: float, long: float) -> dict:
  """An `openpilot.common.params` whose Params hands out a CarParams with these actuator delays: modeld's device path on a PC."""
  from openpilot_logging.cereal import car
  (folder / "openpilot" / "common").mkdir(parents=True)
  (folder / "openpilot" / "__init__.py").write_text(""), (folder / "openpilot" / "common" / "__init__.py").write_text("")
  (folder / "car_params.bin").write_bytes(car.CarParams.new_message(steerActuatorDelay=steer, longitudinalActuatorDelay=long).to_bytes())
  (folder / "openpilot" / "common" / "params.py").write_text(f"""
class Params:
  def get(self, key, block=False, return_default=False):
    return open({str(folder / 'car_params.bin')!r}, 'rb').read() if key == 'CarParams' else None
""")
  return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}

@pytest.mark.parametrize("source", ["flags", "CarParams"])
def test_each_delay_counts_once(split_action, split_09, openpilot_prefix, tmp_path, source):
  """action_t = [lat + 1.5 DT, long + 0.3 + 1.5 DT], lateral_control_params [vEgo, lat] (lat holds lagd's 0.2 once) and the published
  curvature at lat + 1.5 DT: from the flags on a PC, from CarParams (steerActuatorDelay + 0.2, longitudinalActuatorDelay) on a device."""
  f32 = lambda x: float(np.float32(x))  # CarParams holds float32s
  lat, long = (0.41, 0.27) if source == "flags" else (f32(0.17) + 0.2, f32(0.33))
  args, env = (("--lat-delay", "0.41", "--long-delay", "0.27"), None) if source == "flags" else ((), fake_openpilot_params(tmp_path, 0.17, 0.33))
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  for folder in (split_action, split_09):
    slices = load_bundle(os.path.join(folder, "model.bin")).metadata["output_slices"]
    daemon = Daemon(folder, args=args, env=env)
    assert any(f"delays from {'--lat-delay/--long-delay' if source == 'flags' else 'CarParams'}: lateral {lat:.3f} s" in line for line in daemon.lines)
    for frame_id in range(12):
      daemon.send(frame_id)
      m = daemon.receive(frame_id)["modelV2"]
      raw = np.frombuffer(bytes(m.rawPredictions), np.float32)
      if "desired_curvature" not in slices:  # split_action is mlsim: the plan at lat_action_t, once
        plan = raw[slices["plan"][0]:slices["plan"][1]].reshape(5, -1)
        plan = plan[np.argmax(plan[:, -1])][:495].reshape(33, 15)
        lat_t = lat + 1.5 * DT_MDL
        assert m.action.desiredCurvature == pytest.approx(2 * np.interp(lat_t, T, plan[:, 11]) / (V_EGO * lat_t) - plan[0, 14] / V_EGO, rel=1e-4)
    assert daemon.stop() == 0
    assert [daemon.raw(i) for i in range(12)] == reference(folder, list(range(12)), lat_delay=lat, long_delay=long), \
      f"{folder}: action_t and lateral_control_params with each delay once"

def test_the_graph_parse_publishes_what_the_host_parse_does(artifacts, native_artifacts, tmp_path_factory, openpilot_prefix):
  """One model compiled with the output parse in its graph (the default) and with --host-parse (as bundles built before it), fed the same
  frames: each says once how it parses, and publishes the same fields of all three messages with the same values (floats within 1e-6
  relative: the graph's float32 arithmetic), the same raw outputs, and once both are calibrated the same valid flags."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.replay.reference_check import flatten
  host = tmp_path_factory.mktemp("host_parse")
  compile_model(str(host / "model.bin"), onnx=os.path.join(native_artifacts, "native.onnx"), log=lambda s: None, host_parse=True)
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), host / "warp_split.bin")
  published, said = [], []
  for folder in (artifacts, str(host)):
    daemon = Daemon(folder)
    daemon.exchange(range(30))
    assert daemon.stop() == 0
    published.append({i: {s: (flatten(m.to_dict()), valid) for s, (m, valid) in daemon.messages[i].items()} for i in range(30)})
    said.append("".join(daemon.lines))
  assert said[0].count("the output parse runs in the model's graph") == 1 and "parsed on the host" not in said[0]
  assert said[1].count("has no output parse in its graph") == 1
  for i in range(30):
    for service, (graph, valid) in published[0][i].items():
      hosted, host_valid = published[1][i][service]
      assert graph.keys() == hosted.keys() and (valid == host_valid or i < 21), f"frame {i} {service}"  # calibrated by frame 21 in both
      for path, value in graph.items():
        if path == "modelExecutionTime": continue  # the time each took
        if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
          np.testing.assert_allclose(value, hosted[path], rtol=1e-6, atol=1e-37, err_msg=f"frame {i} {service}.{path}")
        else: assert value == hosted[path], f"frame {i} {service}.{path}"
