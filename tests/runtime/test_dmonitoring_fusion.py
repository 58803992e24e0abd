"""The driver-monitoring pair fused: dmonitoring_model.bin with a dm_warp in front, one graph per frame, the driver camera read in place,
against onnxruntime on the stand-in ONNX fed the numpy warp's input_img."""
import os

import numpy as np
import onnxruntime as ort
import pytest

from benchmarks.frame_inputs import CameraBuffer
from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.frame_feeds import InPlaceFrames
from sunnypilot.modeld_v2.runtime.loader import load_fused
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from conftest import reference_dm_warp

FRAME = camerad_frame(1928, 1208)

@pytest.fixture(scope="module")
def runner(dm_artifacts):
  runner = ModelRunner(os.path.join(dm_artifacts, "dmonitoring_model.bin"), os.path.join(dm_artifacts, "dm_warp_1928x1208.bin"))
  yield runner
  runner.close()

def test_the_fused_part_takes_one_camera_and_the_dm_host_inputs(runner):
  assert {k: v.shape for k, v in runner.numpy_inputs.items()} == {"tfm": (3, 3), "calib": (1, 3)}
  assert runner.split == ["frame"] and runner.camera_buffers == ("driver",) and runner.states == {}
  assert runner.output_array().shape == (1, runner.output_slices["features"][1])
  assert isinstance(runner.frame_feed, InPlaceFrames) and runner.in_place

def test_frames_match_onnxruntime_on_the_numpy_warp(runner, dm_artifacts):
  """openpilot's transform for the comma 3/3X driver camera is a whole-pixel shift (no rounding ties): the numpy warp's input_img is the
  warp's, and the fused graph's outputs are onnxruntime's on it."""
  session = ort.InferenceSession(os.path.join(dm_artifacts, "dmonitoring_model.onnx"), providers=["CPUExecutionProvider"])
  rng, m = np.random.default_rng(2), dm_warp_matrix("ar0231")
  bufs = [CameraBuffer(rng.integers(0, 256, FRAME.size, dtype=np.uint8)) for _ in range(3)]
  runner.reset_warmup_buffers()
  runner.numpy_inputs["tfm"][:] = m
  for step in range(6):
    calib = rng.uniform(-0.1, 0.1, (1, 3)).astype(np.float32)
    runner.numpy_inputs["calib"][:] = calib
    buf = bufs[step % len(bufs)]
    runner.copy_frames({"driver": buf})
    runner.run()
    img, tie = reference_dm_warp(np.frombuffer(buf.data, np.uint8), FRAME, m, 1440, 960)
    assert not tie.any()
    want = session.run(["outputs"], {"input_img": img, "calib": calib})[0]
    np.testing.assert_allclose(runner.output_array(), want, rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
  assert runner.frame_feed.reads_in_place and len(runner.frame_feed.camera_tensors) == 3, "each driver buffer mapped once, read in place"

def test_a_warp_of_the_other_kind_is_refused(dm_artifacts, native_artifacts):
  dm_model, dm_warp = os.path.join(dm_artifacts, "dmonitoring_model.bin"), os.path.join(dm_artifacts, "dm_warp_1344x760.bin")
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  for pair in ((dm_model, warp), (model, dm_warp), (dm_warp, dm_model)):
    with pytest.raises(ArtifactError, match="fusion takes a model bundle and a warp bundle, or a dmonitoring_model bundle and a dm_warp bundle"):
      load_fused(*pair)
