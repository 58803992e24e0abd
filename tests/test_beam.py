"""Searched kernels in the bundle: --beam on the compilers, recorded in provenance, replayed with no search and no compiler, refused on NULL."""
import os
import subprocess
import sys

import numpy as np
import pytest

from sunnypilot.modeld_v2.bundle import read_bundle
from sunnypilot.modeld_v2.compile_warp import main as compile_warp_main
from sunnypilot.modeld_v2.warp import unpadded_frame

from conftest import ROOT, reference_warp, warp_in_fresh_process

TINY = unpadded_frame(64, 32)  # a warp small enough to search in seconds

def test_searched_warp_replays_without_a_compiler(tmp_path, capfd):
  path = str(tmp_path / "warp.bin")
  assert compile_warp_main(["--frame", TINY.spec, "--warp-to", "32x16", "--split-frames", "--beam", "1", "--output", path]) == 0
  err = capfd.readouterr().err
  assert "searching 3 kernels with BEAM=1" in err and "BEAM=1: kernel 3 of ~3" in err, err
  assert read_bundle(path)[0]["provenance"]["flags"]["BEAM"] == 1
  rng = np.random.default_rng(0)
  bufs, m = rng.integers(0, 256, (2, TINY.size), dtype=np.uint8), np.stack([np.eye(3), [[2, 0.1, 3], [0, 2, 1], [0, 0, 1]]]).astype(np.float32)
  got = warp_in_fresh_process(path, bufs, m, tmp_path).reshape(2, 6, 8, 16)
  for cam in range(2):
    expected, ties = reference_warp(bufs[cam], TINY, m[cam], 32, 16)
    assert not ((got[cam] != expected) & ~ties).any(), f"camera {cam}: the searched warp differs from the numpy reference"

@pytest.mark.parametrize("how", [{"argv": ["--beam", "2"]}, {"env": {"BEAM": "2"}}], ids=["--beam", "BEAM env"])
def test_search_on_null_is_refused_before_any_work(tmp_path, how):
  out = str(tmp_path / "warp.bin")
  cmd = [sys.executable, "-m", "sunnypilot.modeld_v2.compile_warp", "--frame", TINY.spec, "--warp-to", "32x16", "--output", out, *how.get("argv", [])]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ | {"DEV": "NULL"} | how.get("env", {}))
  assert proc.returncode == 2 and "needs the target device" in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr, proc.stderr
  assert not os.path.exists(out) and "capturing" not in proc.stderr
