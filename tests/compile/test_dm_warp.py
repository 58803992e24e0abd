"""The driver camera's warp (compile_dm_warp) against an independent numpy warp, its bundle's rules, and its command line."""
import json
import subprocess
import sys

import numpy as np
import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile_dm_warp import compile_dm_warp, main
from sunnypilot.modeld_v2.format.bundle import read_bundle, read_parts
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame
from sunnypilot.modeld_v2.runtime.loader import load_bundle

from conftest import ROOT, realized, reference_dm_warp

FRAME = NV12Frame(72, 40, 128, 48, 24, 128 * 72)  # a padded layout of tiny frames: rows of 128 bytes, 72 visible
W, H = 40, 32

def transforms(rng) -> dict[str, np.ndarray]:
  out = {"inside": np.array([[1.3, 0.1, 4.3], [-0.05, 1.1, 2.7], [0, 0, 1]]), "crossing": np.array([[2.1, 0.3, -9.6], [0.2, 1.9, -4.4], [0, 0, 1]]),
         "behind": np.array([[1, 0, 0], [0, 1, 0], [0, 0.001, -1]]), "nan": np.full((3, 3), np.nan),
         "huge": np.array([[1e30, 0, 0], [0, 1e30, 0], [0, 0, 1]])}
  jitter = np.array([[0.1, 0.1, 5], [0.1, 0.1, 5], [1e-3, 1e-3, 0.01]])
  for i in range(3): out[f"perspective{i}"] = np.array([[1.5, 0, 10], [0, 1.2, 5], [0, 0, 1]]) + rng.standard_normal((3, 3)) * jitter
  return {k: v.astype(np.float32) for k, v in out.items()}

@pytest.fixture(scope="module")
def tiny_warps(tmp_path_factory) -> dict:
  folder = tmp_path_factory.mktemp("dm_warps")
  paths = {fill: str(folder / f"dm_warp_{fill}.bin") for fill in (16, None)}
  for fill, path in paths.items(): compile_dm_warp(FRAME.spec, path, f"{W}x{H}", fill, log=lambda s: None)
  return paths

@pytest.mark.parametrize("fill", [16, None], ids=["border fill 16", "clamped"])
def test_matches_the_numpy_warp(tiny_warps, fill):
  """Every pixel the numpy warp computes, but those within 1e-3 of a rounding tie (float32 arithmetic may round them either way)."""
  rng = np.random.default_rng(0)
  run = load_bundle(tiny_warps[fill]).run
  for name, m in transforms(rng).items():
    buf = rng.integers(0, 256, FRAME.size, dtype=np.uint8)
    got = run(frame=realized(buf), M_inv=realized(m)).numpy()
    want, tie = reference_dm_warp(buf, FRAME, m, W, H, fill)
    assert got.shape == (1, W * H) and got.dtype == np.uint8
    assert (got[~tie] == want[~tie]).all(), f"{name}: {(got != want).sum()} of {W * H} pixels differ"
    if fill is not None and name in ("crossing", "behind", "nan", "huge"): assert (got == fill).any(), f"{name} leaves the image: filled"

def test_the_comma_4_driver_camera_at_openpilots_size(dm_artifacts):
  """The 1344x760 fisheye through openpilot's transform to 1440x960: a 0.75 scale, so rows below the camera's last are border fill."""
  frame, m = camerad_frame(1344, 760), dm_warp_matrix("os04c10")
  buf = np.random.default_rng(1).integers(0, 256, frame.size, dtype=np.uint8)
  got = load_bundle(f"{dm_artifacts}/dm_warp_1344x760.bin").run(frame=realized(buf), M_inv=realized(m)).numpy()
  want, tie = reference_dm_warp(buf, frame, m, 1440, 960)
  assert (got[~tie] == want[~tie]).all() and tie.mean() < 0.5
  assert (got.reshape(960, 1440)[-90:] == 16).all() and (got.reshape(960, 1440)[:800] != 16).any(), "the bottom rows map below the camera image"

def test_the_bundle_declares_what_it_reads_and_makes(tiny_warps):
  head, _ = read_bundle(tiny_warps[16])
  extras = head["extras"]
  assert extras["metadata"] == {"kind": "dm_warp", "frame": FRAME.spec, "model_size": [W, H], "border_fill": 16}
  assert {k: v[0] for k, v in extras["input_specs"].items()} == {"frame": [FRAME.size], "M_inv": [3, 3]}
  assert extras["output_specs"]["warped"][0] == [1, W * H]
  assert read_bundle(tiny_warps[None])[0]["extras"]["metadata"]["border_fill"] is None

@pytest.mark.parametrize("edit,message", [
  (lambda e: e["input_specs"]["frame"][0].__setitem__(0, FRAME.size - 1), "inputs"),
  (lambda e: e["output_specs"]["warped"][0].__setitem__(1, W * H + 2), "makes"),
  (lambda e: e["metadata"].__setitem__("border_fill", 300), "border_fill"),
  (lambda e: e["metadata"].__setitem__("model_size", [W, 0]), "model_size")])
def test_a_dm_warp_that_breaks_its_rules_is_refused_when_read(tiny_warps, tmp_path, edit, message):
  import hashlib

  from sunnypilot.modeld_v2.format import bundle
  head, blob = read_bundle(tiny_warps[16])
  edit(head["extras"])
  data = json.dumps(head).encode()
  path = tmp_path / "crafted.bin"
  path.write_bytes(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + bytes(blob)).digest()) + data + bytes(blob))
  with pytest.raises(ArtifactError, match=message): read_parts(str(path))

def test_bad_arguments_are_one_line(tmp_path, capsys):
  out = str(tmp_path / "w.bin")
  for argv, message in ((["--frame", "640,480,640,480,240,460800", "--output", out], "no known sensor has 640x480 frames"),
                        (["--frame", camerad_frame(1344, 760).spec, "--border-fill", "300", "--output", out], "expected a pixel value 0-255"),
                        (["--frame", camerad_frame(1344, 760).spec, "--warp-to", "5000x5000", "--output", out], "more than"),
                        (["--frame", "1,2", "--output", out], "six integers")):
    with pytest.raises(SystemExit) as exited: main(argv)
    assert exited.value.code == 2, argv
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("compile_dm_warp: error:"), err
  with pytest.raises(ValueError, match="pixel value"): compile_dm_warp(FRAME.spec, out, f"{W}x{H}", 256)

def test_the_command_builds_a_warp_for_any_camera(tmp_path):
  out = tmp_path / "dm_warp.bin"
  proc = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.compile_dm_warp", "--frame", FRAME.spec, "--any-camera", "--warp-to", f"{W}x{H}",
                         "--border-fill", "clamp", "--output", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and "Saved driver-monitoring warp" in proc.stdout, proc.stderr
  assert read_bundle(str(out))[0]["extras"]["metadata"]["border_fill"] is None
