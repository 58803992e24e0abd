"""NumpyRunner on every kind of bundle: a warp and a dm_warp (whose run returns one tensor, named by its output spec) against the numpy
warps of conftest, frames and transforms in, arrays out."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, dm_warp_matrix, warp_matrices
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner

from conftest import reference_dm_warp, reference_warp

FRAME = camerad_frame(1344, 760)

@pytest.mark.parametrize("name", ["warp_split.bin", "warp_packed.bin"])
def test_a_warp_bundle_on_numpy_arrays(native_artifacts, name):
  """It failed with AttributeError: 'Tensor' object has no attribute 'items'."""
  run = NumpyRunner(f"{native_artifacts}/{name}")
  rng = np.random.default_rng(5)
  bufs, m_inv = rng.integers(0, 256, (2, FRAME.size), dtype=np.uint8), warp_matrices(SENSOR_CAMERAS["os04c10"]).astype(np.float32)
  frames = {"frame": bufs[0], "big_frame": bufs[1]} if "split" in name else {"input_frame": bufs}
  out = run(**frames, M_inv=m_inv)
  assert list(out) == ["warped"] and out["warped"].shape == (2, 6, 128, 256) and out["warped"].dtype == np.uint8
  for cam in range(2):
    expected, ties = reference_warp(bufs[cam], FRAME, m_inv[cam])
    assert not ((out["warped"][cam] != expected) & ~ties).any() and ties.mean() < 0.1, f"camera {cam} differs from the numpy warp"
  kept = out["warped"].copy()
  again = run(**frames, M_inv=m_inv[::-1].copy())["warped"]
  assert np.array_equal(out["warped"], kept) and not np.array_equal(again, kept), "each call's result is a copy of its own"

def test_a_dm_warp_bundle_on_numpy_arrays(dm_artifacts):
  run = NumpyRunner(f"{dm_artifacts}/dm_warp_1344x760.bin")
  buf, m = np.random.default_rng(6).integers(0, 256, FRAME.size, dtype=np.uint8), dm_warp_matrix("os04c10").astype(np.float32)
  out = run(frame=buf, M_inv=m)
  expected, ties = reference_dm_warp(buf, FRAME, m, 1440, 960)
  assert list(out) == ["warped"] and out["warped"].shape == (1, 1440 * 960) and out["warped"].dtype == np.uint8
  assert (out["warped"][~ties] == expected[~ties]).all() and ties.mean() < 0.5
