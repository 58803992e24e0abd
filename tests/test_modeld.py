"""modeld on real msgq/VisionIPC: a camerad stand-in (in this process, or camera_replay processes), modeld in a subprocess, a subscriber here."""
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid

import numpy as np
import pytest
from test_model_outputs import T, sig

from sunnypilot.modeld_v2.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.model_adapters import NativeTinygradAdapter
from sunnypilot.modeld_v2.model_constants import DT_MDL
from sunnypilot.modeld_v2.modeld import FrameDrops
from sunnypilot.modeld_v2.warp import camerad_frame

from conftest import ROOT

FRAME, BIG_FRAME = camerad_frame(1344, 760), camerad_frame(1928, 1208)
SOF0 = 10**9  # camera timestamps start well after zero, as monotonic clocks do
V_EGO = 20.0

@pytest.fixture(scope="module")
def artifacts(native_artifacts, tmp_path_factory) -> str:
  """The shared tiny native stand-in and its 1344x760 warps, a 1928x1208 warp, and an unrelated truncated *.bin modeld must skip."""
  folder = tmp_path_factory.mktemp("artifacts")
  for name in ("model.bin", "warp_split.bin", "warp_packed.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  compile_warp(BIG_FRAME.spec, "512x256", str(folder / "warp_big_split.bin"), split_frames=True)
  (folder / "notes.bin").write_bytes(open(folder / "warp_packed.bin", "rb").read()[:5000])
  return str(folder)

@pytest.fixture(scope="module")
def split_09(artifacts, tmp_path_factory) -> str:
  """A 0.9.7-0.9.9 vision+policy stand-in (lateral_control_params, prev_desired_curv, a desired_curvature head) with the 1344x760 warp."""
  from sunnypilot.modeld_v2 import stand_in_models
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  folder = tmp_path_factory.mktemp("split_09")
  files = stand_in_models.write("split_09", "tiny", str(folder / "split_09.onnx"), seed=6)["files"]
  compile_model(str(folder / "model.bin"), **files, log=lambda s: None)
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), folder / "warp_split.bin")
  return str(folder)

def frames_for(frame_id: int, frame=FRAME) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(frame_id)
  return rng.integers(0, 256, frame.size, dtype=np.uint8), rng.integers(0, 256, frame.size, dtype=np.uint8)

class Daemon:
  """modeld in a subprocess (its own OPENPILOT_PREFIX via the fixture), a camera replay and a subscriber in this process. Every modelV2
  published is recorded, and every line modeld logs. `command`: what starts modeld, if not its module."""
  def __init__(self, artifacts: str, frame=FRAME, command: tuple[str, ...] = ("-m", "sunnypilot.modeld_v2.modeld")):
    from sunnypilot.modeld_v2.camera_replay import CameraReplay
    from sunnypilot.modeld_v2.messaging import pub_master, sub_master
    self.frame, self.replay = frame, CameraReplay(frame)
    self.sm = sub_master(["modelV2", "cameraOdometry", "drivingModelData"])
    self.car = pub_master(["carState"])
    self.proc = subprocess.Popen([sys.executable, *command, "--artifacts", artifacts, "--send-raw"], cwd=ROOT,
                                 stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    self.lines: list[str] = []
    threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True).start()
    self.messages: dict[int, dict] = {}  # frameId -> {service: message}
    self.published: list[int] = []  # every modelV2 frameId, in arrival order
    self.wait_for_line("running:")

  def wait_for_line(self, text: str, timeout: float = 60, after: int = 0) -> int:
    """Wait until modeld logged a line containing `text` (after line number `after`); returns the number of lines seen then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if any(text in line for line in self.lines[after:]): return len(self.lines)
      assert self.proc.poll() is None, f"modeld exited: {''.join(self.lines)}"
      time.sleep(0.02)
    raise AssertionError(f"modeld never said {text!r}: {''.join(self.lines)}")

  def send(self, frame_id: int, v_ego: float = V_EGO) -> None:
    from sunnypilot.modeld_v2.messaging import new_message
    msg = new_message("carState")
    msg.carState.vEgo = v_ego
    self.car.send("carState", msg)
    self.replay.send(frame_id, *frames_for(frame_id, self.frame), sof=SOF0 + frame_id * int(DT_MDL * 1e9))

  def collect(self) -> None:
    self.sm.update(20)
    for service in ("modelV2", "cameraOdometry", "drivingModelData"):
      if self.sm.updated[service]:
        self.messages.setdefault(self.sm[service].frameId, {})[service] = (self.sm[service], self.sm.valid[service])
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
    from sunnypilot.modeld_v2.camera_replay import CameraReplay
    self.replay.close()  # camerad dies; its buffers go with it
    self.frame, self.replay = frame, CameraReplay(frame)

  def raw(self, frame_id: int) -> bytes: return bytes(self.messages[frame_id]["modelV2"][0].rawPredictions)

  def stop(self) -> int:
    self.proc.send_signal(signal.SIGTERM)
    code = self.proc.wait(timeout=20)
    self.replay.close()
    return code

def reference(artifacts: str, frame_ids: list[int], frame=FRAME, warp: str = "warp_split.bin", sensor: str = "os04c10") -> list[bytes]:
  """The adapter run directly on the same frames, from fresh states, with the inputs modeld derives when cameras, calibration and carState
  (vEgo, no blinkers, no lateral control: no desire) are published."""
  adapter = NativeTinygradAdapter(os.path.join(artifacts, "model.bin"), os.path.join(artifacts, warp), cache=False)
  road, wide = SENSOR_CAMERAS[sensor]
  # openpilot's inputs with the default 0.2 s steering delay: action_t (lat, long) and 0.9.x's lateral_control_params [vEgo, delay]
  values = {"tfm": np.stack([get_warp_matrix(DEFAULT_RPY, road.intrinsics), get_warp_matrix(DEFAULT_RPY, wide.intrinsics, True)]), "desire": 0,
            "traffic_convention": [1, 0], "action_t": [0.2 + 1.5 * DT_MDL, 0.3 + 1.5 * DT_MDL], "lateral_control_params": [V_EGO, 0.2]}
  outs = []
  for frame_id in frame_ids:
    for name, view in adapter.numpy_inputs.items(): view.reshape(-1)[:] = np.reshape(values[name], -1)
    road_buf, wide_buf = frames_for(frame_id, frame)
    adapter.copy_frames({"img": road_buf, "big_img": wide_buf})
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def check_fields(msgs: dict, slices: dict) -> None:
  """Published fields against openpilot's formulas, computed here from the message's own rawPredictions."""
  m, d = msgs["modelV2"], msgs["drivingModelData"]
  raw = np.frombuffer(bytes(m.rawPredictions), np.float32)
  head = lambda name: raw[slices[name][0]:slices[name][1]]
  hyps = head("plan").reshape(5, -1)
  plan = hyps[np.argmax(hyps[:, -1])][:495].reshape(33, 15)  # the hypothesis with the largest selection logit
  np.testing.assert_allclose(list(m.position.x), plan[:, 0], rtol=1e-6)
  np.testing.assert_allclose(list(m.temporalPose.trans), plan[0, 3:6], rtol=1e-6)  # no sim_pose head: the plan's velocity at t=0
  np.testing.assert_allclose(list(m.laneLineProbs), sig(head("lane_lines_prob"))[1::2], rtol=1e-5)
  assert m.leadsV3[0].prob == pytest.approx(sig(head("lead_prob")[0]), rel=1e-5)
  lat_t = 0.2 + 1.5 * DT_MDL  # get_curvature_from_plan at lat_action_t, no lateral smoothing; the model's own head when it has one
  curvature = head("desired_curvature")[0] if "desired_curvature" in slices else 2 * np.interp(lat_t, T, plan[:, 11]) / (V_EGO * lat_t) - plan[0, 14] / V_EGO
  assert m.action.desiredCurvature == pytest.approx(curvature, rel=1e-4, abs=1e-7) == d.action.desiredCurvature
  coeffs = np.linalg.lstsq(np.stack([T ** k for k in range(5)], axis=1), plan[:, 1].astype(np.float64), rcond=None)[0]  # degree 4, lowest first
  np.testing.assert_allclose(list(d.path.yCoefficients), coeffs, rtol=1e-3, atol=1e-4)

def test_100_frames_in_100_frames_out(artifacts, openpilot_prefix):
  from sunnypilot.modeld_v2.loader import load_model
  slices = load_model(os.path.join(artifacts, "model.bin"))["metadata"]["output_slices"]
  daemon = Daemon(artifacts)
  assert any("skipping" in line and "notes.bin" in line for line in daemon.lines), "the truncated unrelated bundle is skipped with one line"
  for frame_id in range(100):
    daemon.send(frame_id)
    msgs = daemon.receive(frame_id)
    m = msgs["modelV2"]
    assert (m.frameId, m.frameIdExtra, m.timestampEof) == (frame_id, frame_id, SOF0 + frame_id * 50_000_000 + 20_000_000)
    assert m.frameDropPerc == 0 and m.modelExecutionTime > 0
    assert msgs["cameraOdometry"].timestampEof == m.timestampEof and msgs["drivingModelData"].frameIdExtra == frame_id
    check_fields(msgs, slices)
  assert daemon.stop() == 0, "SIGTERM is a clean exit"
  assert all(daemon.messages[i]["modelV2"][1] for i in range(21, 100)), "valid once a calibration arrived (camerad's replay sends one per second)"
  assert [daemon.raw(i) for i in range(100)] == reference(artifacts, list(range(100))), "outputs equal the adapter run directly on the same frames"

def test_split_09_frames_in_messages_out(split_09, openpilot_prefix):
  """A 0.9.x vision+policy pair end to end: every frame published, host inputs filled by name as openpilot did, fields from its heads."""
  from sunnypilot.modeld_v2.loader import load_model
  slices = load_model(os.path.join(split_09, "model.bin"))["metadata"]["output_slices"]
  daemon = Daemon(split_09)
  for frame_id in range(30):
    daemon.send(frame_id)
    check_fields(daemon.receive(frame_id), slices)
  assert daemon.stop() == 0 and daemon.published == list(range(30))
  assert not any("has no source" in line for line in daemon.lines), "every host input of the generation has a source"
  assert [daemon.raw(i) for i in range(30)] == reference(split_09, list(range(30))), "the same inputs as openpilot's modeld, frame by frame"

def expected_drop_perc(frame_ids: list[int]) -> list[float]:
  """FACTS 5, independently: filter min(dropped, 10) with rc=10 s at 20 Hz, zero for the first 10 runs; perc = 100 f / (1 + f)."""
  x, out, last, k = 0.0, [], None, DT_MDL / (10.0 + DT_MDL)
  for run, frame_id in enumerate(frame_ids):
    dropped = 0 if last is None else max(0, frame_id - last - 1)
    last = frame_id
    x = 0.0 if run < 10 else (1 - k) * x + k * min(dropped, 10)
    out.append(100 * x / (1 + x))
  return out

def test_skipped_frames_are_prepare_only_and_filtered(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  sent = [i for i in range(40) if i not in (20, 21, 30)]
  for frame_id in sent:
    daemon.send(frame_id)
    if frame_id in (22, 31): daemon.wait_for_line(f"frame {frame_id}: ")  # the frame after a gap went through the model, unpublished
    else: daemon.receive(frame_id)
  assert daemon.stop() == 0
  daemon.collect()
  assert daemon.published == [i for i in sent if i not in (22, 31)], "every published frame id, in order: none for the prepare-only frames"
  expected = dict(zip(sent, expected_drop_perc(sent)))
  for frame_id in daemon.published:
    (m, _), (d, _) = daemon.messages[frame_id]["modelV2"], daemon.messages[frame_id]["drivingModelData"]
    assert m.frameDropPerc == pytest.approx(expected[frame_id], rel=1e-4, abs=1e-6) and d.frameDropPerc == m.frameDropPerc
  assert daemon.messages[39]["modelV2"][0].frameDropPerc > 0.5

def test_camerad_restart(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  daemon.exchange(range(20))
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("reconnected to camerad", after=seen)
  daemon.exchange(range(20, 30))
  assert daemon.stop() == 0
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

def test_readme_order_camera_replay_first(artifacts):
  """The README starts camera_replay, then modeld, under a fresh OPENPILOT_PREFIX whose folder does not exist yet."""
  prefix = f"sp_test_{uuid.uuid4().hex[:10]}"
  env = os.environ | {"OPENPILOT_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
  replay = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.camera_replay", "--camera", "1344x760"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
  try:
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--max-frames", "5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "exiting after 5 published frames" in out.stderr, out.stderr
    assert replay.poll() is None, f"camera_replay died ({replay.returncode})"
  finally:
    replay.send_signal(signal.SIGTERM)
    code = replay.wait(timeout=20)
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  assert code == 0

def test_bad_artifacts_fail_at_start_in_one_line(artifacts, tmp_path, monkeypatch):
  """Checked before waiting for camerad: a model for another device, no warp at all, no model."""
  from sunnypilot.modeld_v2 import bundle
  from sunnypilot.modeld_v2.bundle import read_parts, write_bundle
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

def test_demo_runs(artifacts, tmp_path):
  folder = tmp_path / "artifacts"
  folder.mkdir()
  shutil.copy(os.path.join(artifacts, "model.bin"), folder / "model.bin")
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), folder / "warp_1344x760_split.bin")
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.demo", "--frames", "20", "--camera", "1344x760", "--artifacts", str(folder),
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "frames out (modelV2 published):   20" in out.stdout and "random-weight stand-in" in out.stdout
  assert "compiling" not in out.stderr, "the demo reused the prebuilt bundles"
  assert (tmp_path / "demo_latency.png").stat().st_size > 1000 and (tmp_path / "demo_preview.png").stat().st_size > 1000
