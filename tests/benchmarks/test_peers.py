"""The benchmark's peers compute what the bundle computes: onnxruntime behind peer_step (openpilot's queues in numpy, the numpy warp) against
the fused warp + model adapter, frame by frame with state fed back, for generations with each kind of queue. The torch peers share
peer_step; they run where torch sees a GPU (the benchmark's diff column checks them there on every frame)."""

import numpy as np
import pytest

from benchmarks.frame_inputs import CameraBuffer, set_inputs
from benchmarks.peers import OrtPeer, PeerAdapter
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
from sunnypilot.modeld_v2.tools import stand_in_models

FRAME = camerad_frame(1344, 760)


# native: states; split_09: desire, features pushed between vision and policy, prev_desired_curv; supercombo_20hz: one float16 model at
# frame_skip 1, features pushed after its run; multi_policy: two policies after one vision model
@pytest.mark.parametrize("generation", ["native", "split_09", "supercombo_20hz", "multi_policy"])
def test_onnxruntime_peer_matches_the_fused_adapter(native_artifacts, tmp_path, generation):
  files = stand_in_models.write(generation, "tiny", str(tmp_path / f"{generation}.onnx"), seed=3)["files"]
  compile_model(str(tmp_path / "model.bin"), **files, log=lambda s: None)
  adapter = ModelRunner(str(tmp_path / "model.bin"), f"{native_artifacts}/warp_split.bin")
  peer = PeerAdapter(OrtPeer(files, FRAME))
  rng = np.random.default_rng(5)
  m_inv = np.array([[2, 0, 40], [0, 2, 60], [0, 0, 1]], np.float32)  # integer source coordinates: no rounding ties between the two warps
  for step in range(12):
    bufs = {k: CameraBuffer(rng.integers(0, 256, FRAME.size, dtype=np.uint8)) for k in ("img", "big_img")}
    outs = []
    for path in (adapter, peer):
      set_inputs(path, step, np.stack([m_inv, m_inv]))
      path.copy_frames(bufs)
      path.run()
      outs.append(np.array(path.output_array()))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5, err_msg=f"{generation} step {step}")
  # prepare_only gates the queues on the frame after a drop: the benchmarks drop none, so it stays 0 and the peers have no such input
  assert set(peer.numpy_inputs) - {"tfm"} == set(adapter.numpy_inputs) - {"tfm", "prepare_only"}, "the peer takes the bundle's host inputs by name"
  adapter.close()

def test_the_driver_monitoring_peer_matches_the_fused_dm_frame(dm_artifacts):
  """bench_dm's onnxruntime peer (peer_step.DMPeerStep over the numpy dm_input warp) against the fused dm_warp + DM model, frame by frame,
  on the comma 4's driver camera: its M_inv (0.75 px per model pixel) lands on exact halves, rounded to even by both warps, and a fifth of
  the model's pixels fall outside the image (border 16)."""
  from benchmarks.frame_inputs import set_dm_inputs
  from benchmarks.peers import OrtDMPeer
  from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
  from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
  adapter = ModelRunner(f"{dm_artifacts}/dmonitoring_model.bin", f"{dm_artifacts}/dm_warp_1344x760.bin")
  peer = PeerAdapter(OrtDMPeer(f"{dm_artifacts}/dmonitoring_model.onnx", FRAME, (1440, 960), 16), cameras=("driver",), transform=(3, 3))
  assert set(peer.numpy_inputs) == set(adapter.numpy_inputs) == {"tfm", "calib"}
  for step in range(4):
    buf, outs = {"driver": CameraBuffer(cabin_scene(FRAME, step * 9))}, []
    for path in (adapter, peer):
      set_dm_inputs(path, step, dm_warp_matrix("os04c10"))
      path.copy_frames(buf)
      path.run()
      outs.append(np.array(path.output_array()))
    np.testing.assert_allclose(outs[1], outs[0], rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
  adapter.close()

@pytest.mark.parametrize("generation", ["native", "split_current"])
def test_float16_peers_run_the_float16_model_within_the_tolerance(native_artifacts, tmp_path, generation):
  """--precision float16: the peers run the float16 ONNX the bundle computes (onnxruntime's CPU EP runs it here), and the fused float16
  adapter's outputs stay within peer_models' float16 tolerance of theirs, frame by frame with states fed back; but not within float32's
  reach of the float32 ONNX: both really compute in half."""
  from benchmarks.peers import output_difference, peer_models
  files = stand_in_models.write(generation, "tiny", str(tmp_path / f"{generation}.onnx"), seed=3)["files"]
  compile_model(str(tmp_path / "model.bin"), **files, log=lambda s: None, precision="float16")
  models = peer_models(files, "float16", str(tmp_path), lambda s: None)
  assert models["ort_label"].endswith("float16") and models["relative"] and set(models["torch"]) == set(files)
  adapter = ModelRunner(str(tmp_path / "model.bin"), f"{native_artifacts}/warp_split.bin")
  peers = [PeerAdapter(OrtPeer(models["ort"], FRAME)), PeerAdapter(OrtPeer(files, FRAME))]
  rng, worst = np.random.default_rng(5), [0.0, 0.0]
  m_inv = np.array([[2, 0, 40], [0, 2, 60], [0, 0, 1]], np.float32)
  for step in range(8):
    bufs = {k: CameraBuffer(rng.integers(0, 256, FRAME.size, dtype=np.uint8)) for k in ("img", "big_img")}
    outs = []
    for path in (adapter, *peers):
      set_inputs(path, step, np.stack([m_inv, m_inv]))
      path.copy_frames(bufs)
      path.run()
      outs.append(np.array(path.output_array()))
    worst = [max(w, output_difference(o, outs[0], True)) for w, o in zip(worst, outs[1:])]
  assert worst[0] <= models["tolerance"] and worst[1] <= models["tolerance"] / 2, (worst, models["tolerance"])
  assert worst[1] > 1e-5, "the float16 bundle's outputs are not float32's"
  adapter.close()

def test_bench_dm_in_float16_writes_its_precision_and_the_check(tmp_path):
  import json

  from benchmarks.bench_dm import main
  assert main(["--model", "tiny", "--camera", "1344x760", "--frames", "2", "--precision", "float16", "--workdir", str(tmp_path / "work"),
               "--json", str(tmp_path / "dm.json")]) == 0
  out = json.loads((tmp_path / "dm.json").read_text())
  result = out["results"][0]
  assert out["precision"] == result["precision"] == "float16" and result["relative"] and 0 < result["tolerance"] < 0.05
  assert all(row["within_tolerance"] for row in result["paths"].values()) and "onnxruntime (CPU EP, numpy warp), float16" in result["paths"]
