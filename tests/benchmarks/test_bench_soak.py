"""bench_soak: the slope and verdict against series worked out by hand, the pycapnp path leaving nothing in reference cycles with the
collector off, and a short soak of both daemons that samples them and leaves no process or shared memory behind."""
import gc
import os
import shutil

import pytest

from benchmarks.bench_soak import HOUR_FRAMES, THRESHOLDS, pycapnp_frames, slope, soak, verdict

def test_the_slope_is_the_least_squares_line_after_the_warm_up():
  # frames 2000, 4000, 6000 of 10000 (warm-up 20%: frame 2000 is the first kept) with 0, 10, 8: mean frame 4000, mean value 6;
  # sum (x - 4000)(y - 6) = (-2000)(-6) + 0 + 2000 * 2 = 16000, sum (x - 4000)^2 = 8e6: 0.002 a frame, 2 per 1000 frames
  assert slope([0, 1000, 2000, 4000, 6000], [1e9, -1e9, 0, 10, 8], 0.2, 10000) == pytest.approx(2.0)
  # an exact line, 3 per frame, after a warm-up that jumps: 3000 per 1000 frames, whatever the warm-up did
  frames = list(range(0, 10001, 500))
  assert slope(frames, [5e6 if f < 2000 else 1000 + 3 * f for f in frames], 0.2, 10000) == pytest.approx(3000.0)
  assert slope(frames, [7.0] * len(frames), 0.2, 10000) == 0.0
  assert slope([0, 100], [1.0, 2.0], 0.5, 100) is None  # one sample after the warm-up: no line

def test_the_verdict_projects_the_slope_over_an_hour():
  assert HOUR_FRAMES == 72_000 and THRESHOLDS["anon"] == 8 * 1024 * 1024
  # 8 MiB = 8388608 bytes over 72 thousands of frames: 116508.44 bytes per 1000 frames is the boundary
  assert verdict(116508.0, THRESHOLDS["anon"]) == (116508.0 * 72, "flat")
  assert verdict(116509.0, THRESHOLDS["anon"]) == (116509.0 * 72, "grows")
  assert verdict(0.01, THRESHOLDS["fds"]) == (0.72, "flat") and verdict(0.014, THRESHOLDS["fds"])[1] == "grows"  # 1.008 fds an hour
  assert verdict(None, THRESHOLDS["fds"]) == (None, "too few samples")

def test_the_pycapnp_path_leaves_nothing_in_reference_cycles_with_the_collector_off():
  """openpilot's way through pycapnp (new_message with keyword fields, set_fields, to_bytes, from_bytes kept): pycapnp 2.2.0-2.2.2 leave
  ~148 objects a new_message in cycles (bench_soak --pycapnp), which the collector-off daemons would never free; the pinned range none."""
  samples = []
  try:
    pycapnp_frames(100, False, lambda i: samples.append(i))
    assert not gc.isenabled() and gc.collect() == 0
  finally: gc.enable()
  assert samples == list(range(101))

def test_a_short_soak_samples_both_daemons_and_leaves_nothing_behind(native_artifacts, dm_artifacts, tmp_path):
  folder = tmp_path / "artifacts"
  folder.mkdir()
  for source in (native_artifacts, dm_artifacts):
    for name in os.listdir(source):
      if name.endswith(".bin") and "packed" not in name: shutil.copy(os.path.join(source, name), folder / name)
  prefix = os.environ.get("OPENPILOT_PREFIX")
  run = soak(str(folder), (1344, 760), frames=120, rate=0, every=40, log=lambda s: None)
  assert [s["frame"] for s in run["samples"]] == [0, 40, 80, 120]
  for name in ("modeld", "dmonitoringmodeld"):
    assert all(s[name]["rss"] > s[name]["anon"] > 0 and s[name]["fds"] > 0 and s[name]["shm_maps"] > 0 for s in run["samples"])
    assert run["published"][name] == 120 and run["exit_codes"][name] == 0 and not os.path.exists(f"/proc/{run['pids'][name]}")
  assert run["cycles_left_on_exit"] == {"modeld": 0, "dmonitoringmodeld": 0}, "the frame loops run with the collector off: they must make no cycles"
  assert run["left_in_dev_shm"] == [] and not any(run["prefix"] in name for name in os.listdir("/dev/shm"))  # others' entries may come and go
  assert os.environ.get("OPENPILOT_PREFIX") == prefix
