"""modeld in a subprocess for the daemon tests (its own OPENPILOT_PREFIX through the fixture): a camerad stand-in and a subscriber in
this process, the bundles it runs (the daemon tests' fixtures, module-scoped: each test module imports them by name), and what its
outputs are held to: the adapter run directly on the same frames, openpilot's formulas on the published rawPredictions."""
import os
import shutil
import signal
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.model.constants import DT_MDL
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from daemon_process import DaemonProcess
from openpilot_reference import T, sig

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

def finite_and_valid(daemon: Daemon, frame_id: int) -> bool:
  msgs = daemon.messages[frame_id]
  return all(valid for _, valid in msgs.values()) and bool(np.isfinite(np.frombuffer(daemon.raw(frame_id), np.float32)).all())

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
