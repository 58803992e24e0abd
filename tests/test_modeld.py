import os
import select
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2 import stand_in_models
from sunnypilot.modeld_v2.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.model_adapters import NativeTinygradAdapter
from sunnypilot.modeld_v2.model_constants import DT_MDL
from sunnypilot.modeld_v2.model_outputs import POLICY_SLICES, VISION_SLICES, parse_outputs, slices_of
from sunnypilot.modeld_v2.modeld import FrameDrops
from sunnypilot.modeld_v2.warp import camerad_frame

from conftest import ROOT

FRAME = camerad_frame(1344, 760)
SOF0 = 10**9  # camera timestamps start well after zero, as monotonic clocks do

@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
  folder = tmp_path_factory.mktemp("artifacts")
  stand_in_models.write("native", "tiny", str(folder / "native.onnx"), seed=4)
  compile_model(str(folder / "model.bin"), onnx=str(folder / "native.onnx"), log=lambda s: None)
  compile_warp(FRAME.spec, "512x256", str(folder / "warp_split.bin"), split_frames=True)
  compile_warp(FRAME.spec, "512x256", str(folder / "warp_packed.bin"))
  return str(folder)

def frames_for(frame_id: int) -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(frame_id)
  return rng.integers(0, 256, FRAME.size, dtype=np.uint8), rng.integers(0, 256, FRAME.size, dtype=np.uint8)

class Daemon:
  """modeld in a subprocess (its own OPENPILOT_PREFIX via the fixture), a camera replay and a subscriber in this process."""
  def __init__(self, artifacts: str):
    from sunnypilot.modeld_v2.camera_replay import CameraReplay
    from sunnypilot.modeld_v2.messaging import sub_master
    self.replay = CameraReplay(FRAME)
    self.sm = sub_master(["modelV2", "cameraOdometry", "drivingModelData"])
    self.proc = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--send-raw"], cwd=ROOT,
                                 stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
    self.stderr: list[str] = []
    self.wait_for_line("running:")
    self.messages: list[dict] = []

  def wait_for_line(self, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      assert self.proc.poll() is None, f"modeld exited: {''.join(self.stderr)}"
      if select.select([self.proc.stderr], [], [], 0.1)[0]:
        self.stderr.append(line := self.proc.stderr.readline())
        if text in line: return
    raise AssertionError(f"modeld never said {text!r}: {''.join(self.stderr)}")

  def send(self, frame_id: int) -> None:
    self.replay.send(frame_id, *frames_for(frame_id), sof=SOF0 + frame_id * int(DT_MDL * 1e9))

  def receive(self, frame_id: int, timeout: float = 10) -> dict:
    """Collect messages until modelV2 for frame_id (and its companions) arrived."""
    deadline = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < deadline:
      self.sm.update(50)
      for service in ("modelV2", "cameraOdometry", "drivingModelData"):
        if self.sm.updated[service] and self.sm[service].frameId == frame_id: got[service] = self.sm[service]
      if len(got) == 3:
        self.messages.append(got)
        return got
    raise AssertionError(f"no complete output for frame {frame_id}: got {sorted(got)}; modeld: {''.join(self.stderr)}")

  def stop(self) -> int:
    self.proc.send_signal(signal.SIGTERM)
    code = self.proc.wait(timeout=20)
    self.replay.close()
    return code

def reference(artifacts: str, frame_ids: list[int]) -> list[bytes]:
  """The adapter run directly on the same frames with the inputs modeld derives when nothing but cameras and calibration is published."""
  adapter = NativeTinygradAdapter(os.path.join(artifacts, "model.bin"), os.path.join(artifacts, "warp_split.bin"), cache=False)
  road, wide = SENSOR_CAMERAS["os04c10"]
  outs = []
  for frame_id in frame_ids:
    adapter.numpy_inputs["tfm"][:] = np.stack([get_warp_matrix(DEFAULT_RPY, road.intrinsics), get_warp_matrix(DEFAULT_RPY, wide.intrinsics, True)])
    adapter.numpy_inputs["desire"][:] = 0
    adapter.numpy_inputs["traffic_convention"][:] = [1, 0]
    adapter.numpy_inputs["action_t"][:] = [0.2 + 1.5 * DT_MDL, 0.3 + 1.5 * DT_MDL]
    road_buf, wide_buf = frames_for(frame_id)
    adapter.copy_frames({"img": road_buf, "big_img": wide_buf})
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def test_100_frames_in_100_frames_out(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  for frame_id in range(100):
    daemon.send(frame_id)
    msgs = daemon.receive(frame_id)
    m = msgs["modelV2"]
    assert (m.frameId, m.frameIdExtra, m.timestampEof) == (frame_id, frame_id, SOF0 + frame_id * 50_000_000 + 20_000_000)
    assert m.frameDropPerc == 0 and m.modelExecutionTime > 0
    assert msgs["cameraOdometry"].timestampEof == m.timestampEof and msgs["drivingModelData"].frameIdExtra == frame_id
  assert daemon.stop() == 0, "SIGTERM is a clean exit"
  assert [bytes(m["modelV2"].rawPredictions) for m in daemon.messages] == reference(artifacts, list(range(100))), \
    "outputs equal the adapter run directly on the same frames"

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
    if frame_id in (22, 31):  # the frame after a gap is prepare-only: nothing is published for it
      time.sleep(0.5)
      continue
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  published = [m["modelV2"].frameId for m in daemon.messages]
  assert 22 not in published and 31 not in published and len(published) == len(sent) - 2
  expected = dict(zip(sent, expected_drop_perc(sent)))
  for m in daemon.messages:
    assert m["modelV2"].frameDropPerc == pytest.approx(expected[m["modelV2"].frameId], rel=1e-4, abs=1e-6)
    assert m["drivingModelData"].frameDropPerc == m["modelV2"].frameDropPerc
  assert daemon.messages[-1]["modelV2"].frameDropPerc > 0.5

def test_camerad_restart(artifacts, openpilot_prefix):
  from sunnypilot.modeld_v2.camera_replay import CameraReplay
  daemon = Daemon(artifacts)
  for frame_id in range(20):
    daemon.send(frame_id)
    daemon.receive(frame_id)
  daemon.replay.close()  # camerad dies; its buffers go with it
  time.sleep(0.3)
  daemon.replay = CameraReplay(FRAME)
  restarted = time.monotonic()
  got = None
  while got is None and time.monotonic() - restarted < 2.0:
    daemon.send(20)
    try: got = daemon.receive(20, timeout=0.1)
    except AssertionError: pass
  assert got is not None, f"modeld did not reconnect within 2 s: {''.join(daemon.stderr)}"
  for frame_id in range(21, 30):
    daemon.send(frame_id)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  ids = [m["modelV2"].frameId for m in daemon.messages]
  assert [bytes(m["modelV2"].rawPredictions) for m in daemon.messages] == reference(artifacts, ids), "every output came from the new buffers"

def test_frame_drop_filter():
  drops = FrameDrops()
  ids = list(range(15)) + [18, 19, 20]
  assert [round(drops.update(i)[1], 9) for i in ids] == [round(x, 9) for x in expected_drop_perc(ids)]

def test_parse_outputs_activations():
  slices = {k: [v.start, v.stop] for k, v in slices_of(VISION_SLICES | POLICY_SLICES).items()}
  vec = np.random.default_rng(0).standard_normal(max(b for _, b in slices.values())).astype(np.float32)
  parsed = parse_outputs(vec, slices)
  assert parsed["plan"].shape == (33, 15) and (parsed["plan_std"] > 0).all()
  plan = vec[slice(*slices["plan"])].reshape(5, -1)
  best = plan[np.argmax(plan[:, -1])]
  assert np.array_equal(parsed["plan"].reshape(-1), best[:495]) and np.allclose(parsed["plan_std"].reshape(-1), np.exp(best[495:990]))
  assert np.allclose(parsed["desire_pred"].sum(axis=1), 1) and np.allclose(parsed["desire_state"].sum(), 1)
  assert ((parsed["meta"] > 0) & (parsed["meta"] < 1)).all() and parsed["lead"].shape == (3, 6, 4)
  assert np.array_equal(parsed["hidden_state"], vec[slice(*slices["hidden_state"])])

def test_demo_runs(tmp_path):
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.demo", "--frames", "20", "--camera", "1344x760", "--artifacts",
                        str(tmp_path / "artifacts"), "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "frames out (modelV2 published):   20" in out.stdout and "random-weight stand-in" in out.stdout
  assert (tmp_path / "demo_latency.png").stat().st_size > 1000 and (tmp_path / "demo_preview.png").stat().st_size > 1000
