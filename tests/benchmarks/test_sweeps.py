"""The sweeps' machinery on the CPU with tiny stand-ins: each variant built in a fresh process with its own knobs, timed per precision
against one reference path, a build that fails or does not fit the budget said in one line while the rest go on, a build reused."""
import importlib.util
import json
import os

import numpy as np
import pytest

from benchmarks import bench_dm_sweep, bench_driving_sweep
from benchmarks.sweep_timing import TimedPath, goals, reference_first
from benchmarks.sweep_variants import DM_VARIANTS, DRIVING_VARIANTS, Variant, resolve

@pytest.fixture(scope="module")
def dm_workdir(tmp_path_factory) -> str: return str(tmp_path_factory.mktemp("dm_sweep"))

def test_each_variant_builds_with_its_knobs_and_a_failed_build_is_one_line(dm_workdir, monkeypatch, capsys):
  # a variant whose knob tinygrad cannot take: its build fails in its own process, the others are built and timed
  monkeypatch.setitem(DM_VARIANTS, "broken", Variant("broken", "float32", env={"DEFAULT_FLOAT": "nonsense"}))
  out = os.path.join(dm_workdir, "dm.json")
  assert bench_dm_sweep.main(["--model", "tiny", "--variants", "f32,broken,f16,f16_tc", "--frames", "3", "--torch-modes", "graph",
                              "--workdir", dm_workdir, "--json", out]) == 0
  err = capsys.readouterr().err
  failed = [line for line in err.splitlines() if line.startswith("benchmarks.bench_dm_sweep: broken: the build failed")]
  assert len(failed) == 1 and "AttributeError" in failed[0], err
  result = json.load(open(out))
  assert "the build failed" in result["variants"]["broken"]["missing"]
  groups = {r["precision"]: r for r in result["results"]}
  ours = lambda g: {label for label, row in groups[g]["paths"].items() if row["tinygrad"]}  # torch's peers join them where torch sees a GPU
  assert ours("float32") == {"tinygrad f32"} and ours("float16") == {"tinygrad f16", "tinygrad f16_tc"}
  # float32 paths within 1e-3; float16 within twice 3 L u relative, L = the tiny DM's 4 layers (2 convs, 2 linear) and u = 2^-11
  assert groups["float32"]["paths"]["tinygrad f32"]["tolerance"] == 1e-3
  for row in (groups["float16"]["paths"][label] for label in ours("float16")):
    assert row["tolerance"] == 2 * 3 * 4 * 2.0 ** -11 and row["relative"] and row["within_tolerance"]
    assert row["interleaved"]["p50"] > 0 and row["alone"]["p50"] > 0 and row["floor_ms"] > 0
  if importlib.util.find_spec("torch") is None: assert "torch is not installed here: no torch peers" in err
  # the child ran with the variant's knobs and a BEAM cache of its own knobs; the plain variants share the default one
  records = {n: json.load(open(os.path.join(dm_workdir, n, "built.json"))) for n in ("f16", "f16_tc")}
  assert records["f16_tc"]["env"]["TC_OPT"] == "2" and "TC_OPT" not in records["f16"]["env"]
  assert os.path.basename(records["f16_tc"]["env"]["CACHEDB"]) == "TC_OPT=2.db" and os.path.basename(records["f16"]["env"]["CACHEDB"]) == "default.db"

def test_a_build_is_reused_and_what_does_not_fit_the_budget_is_dropped(dm_workdir, capsys):
  out = os.path.join(dm_workdir, "budget.json")
  assert bench_dm_sweep.main(["--model", "tiny", "--variants", "f32,f32_b2", "--frames", "3", "--torch-modes", "none", "--budget-s", "5",
                              "--workdir", dm_workdir, "--json", out]) == 0
  err = capsys.readouterr().err
  assert "f32: reusing its build" in err and "dropping variant f32_b2: about 150 s" in err, err
  result = json.load(open(out))
  assert result["dropped"] == ["variant f32_b2"] and result["variants"]["f32"]["build"]["reused"]
  assert [set(r["paths"]) for r in result["results"]] == [{"tinygrad f32"}]

def test_a_runtime_variant_replays_another_variants_bundles(tmp_path, monkeypatch, capsys):
  """A *_1graph variant builds nothing: it loads the bundles of the variant it names (brought in when not asked for) under its own
  tinygrad settings, and computes exactly what that variant computes."""
  monkeypatch.setitem(DRIVING_VARIANTS, "f32_1graph", Variant("f32_1graph", "float32", runtime={"JIT_BATCH_SIZE": 0}, builds_as="f32"))
  assert [v.name for v in resolve("driving", "f32_1graph")] == ["f32", "f32_1graph"]
  out = str(tmp_path / "driving.json")
  assert bench_driving_sweep.main(["--model", "tiny", "--variants", "f32_1graph", "--frames", "3", "--torch-modes", "none",
                                   "--workdir", str(tmp_path), "--json", out]) == 0
  assert not os.path.exists(tmp_path / "f32_1graph") and os.path.isfile(tmp_path / "f32" / "built.json")
  (group,) = json.load(open(out))["results"]
  assert group["paths"]["tinygrad f32_1graph"]["max_diff_vs_reference"] == 0 and group["reference"] == "tinygrad f32"
  assert "driving frame sweep" in capsys.readouterr().out

def test_bad_arguments_are_one_line(capsys):
  with pytest.raises(SystemExit) as e: bench_dm_sweep.main(["--variants", "f32,nope"])
  assert e.value.code == 2 and "unknown dm variants ['nope']" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e: bench_dm_sweep.main(["--torch-modes", "graph,fast"])
  assert e.value.code == 2 and "unknown --torch-modes ['fast']" in capsys.readouterr().err

def path(label: str, tinygrad: bool, half: bool = False, mode: str | None = None, tf32: bool = False) -> TimedPath:
  return TimedPath(label, None, "float32", half, tinygrad, {} if mode is None else {"mode": mode, "tf32": tf32})

def test_the_reference_is_strict_float32_and_the_goal_counts_checked_paths_only():
  paths = [path("tf32 variant", True, half=True), path("torch graph, TF32", False, True, "graph", tf32=True), path("f32 variant", True),
           path("torch graph, strict", False, mode="graph-strict")]
  assert [p.label for p in reference_first(paths)] == ["torch graph, strict", "f32 variant", "tf32 variant", "torch graph, TF32"]
  assert [p.label for p in reference_first(paths[:3])][0] == "f32 variant"  # no strict peer: a variant that keeps float32's mantissa
  row = lambda p50, ok, tinygrad, mode=None: {"alone": {"p50": p50}, "within_tolerance": ok, "tinygrad": tinygrad, "mode": mode}
  rows = {"fast but wrong": row(0.5, False, True), "checked": row(1.0, True, True), "torch.compile": row(8.4, True, False, "compile"),
          "torch graph": row(3.0, True, False, "graph")}
  (g,) = goals(bench_driving_sweep.DRIVING, rows)
  assert g["best"] == "checked" and g["ratio"] == 8.4 and g["met"] and g["goal"] == 8.0

def test_roofline_profiles_frames_side_by_side_and_skips_one_it_cannot(tmp_path, capsys):
  """A sweep variant's folder profiles as its fused frame (the model and its warp); the frame's bound is the sum of its calls' bounds,
  each max(FLOPs / peak, bytes / bandwidth); a folder that holds no build is one line and the others go on."""
  from benchmarks import bench_roofline
  assert bench_dm_sweep.main(["--model", "tiny", "--variants", "f32", "--frames", "2", "--torch-modes", "none", "--workdir", str(tmp_path)]) == 0
  out = str(tmp_path / "roofline.json")
  assert bench_roofline.main([f"dm={tmp_path}/f32", f"gone={tmp_path}/nothing", "--rounds", "1", "--peak-tflops", "0.5", "--peak-tbs", "0.05",
                              "--json", out]) == 0
  captured = capsys.readouterr()
  assert "gone: cannot profile" in captured.err and "| dm | " in captured.out
  (dm,) = json.load(open(out)).values()
  assert dm["warp"].endswith("dm_warp_1928x1208.bin") and any(c["name"].startswith("E_") for c in dm["calls"])
  bounds = [max((c["ops"] or 0) / 0.5e12, c["bytes"] / 0.05e12) for c in dm["calls"]]
  assert dm["bound_s"] == pytest.approx(sum(bounds), rel=1e-12)

@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the build's processes in /proc")
def test_sigterm_stops_the_sweep_and_the_build_it_runs(tmp_path):
  """`timeout` ends a sweep with SIGTERM: the sweep exits 130 and the variant's build (its own process group: the compile and BEAM's
  worker processes) is gone with it, not left searching on the device. Its worker pool's named semaphores go too: a SIGKILL to the group
  killed multiprocessing's resource tracker with it and left six /dev/shm/sem.mp-* per build behind."""
  import signal
  import subprocess
  import sys
  import time
  cmd = [sys.executable, "-m", "benchmarks.bench_dm_sweep", "--model", "tiny", "--variants", "f32_b2", "--torch-modes", "none", "--workdir", str(tmp_path)]
  sems = lambda: {n for n in os.listdir("/dev/shm") if n.startswith("sem.mp-")} if os.path.isdir("/dev/shm") else set()
  before = sems()
  proc = subprocess.Popen(cmd, cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), stderr=subprocess.PIPE, text=True)
  for line in proc.stderr:  # the build is searching once its child captures
    if "f32_b2: capturing" in line: break
  def cmdline(pid: str) -> bytes:
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f: return f.read()
    except OSError: return b""  # gone meanwhile
  builds = lambda: [pid for pid in os.listdir("/proc") if pid.isdigit() and int(pid) != proc.pid and str(tmp_path).encode() in cmdline(pid)]
  assert builds(), "the build runs in a process of its own"
  time.sleep(1)  # the search's worker pool is up
  pool = sems() - before  # (a process of another test run may add its own meanwhile: only names that appeared during this build count)
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=60) == 130
  deadline = time.monotonic() + 10
  while builds() and time.monotonic() < deadline: time.sleep(0.1)
  assert not builds(), "the build outlived the sweep"
  while pool & sems() and time.monotonic() < deadline + 10: time.sleep(0.1)
  assert not pool & sems(), f"the build's semaphores were left in /dev/shm: {sorted(pool & sems())}"
  proc.stderr.close()

def test_a_later_group_starts_every_path_from_zeroed_states(native_artifacts):
  # the sweep times a precision group, then again with torch.compile's fresh peer beside the same tinygrad paths: a recurrent model's
  # states (native: its hidden state) must not carry the first group's frames into the second, or the fresh peer looks wrong
  from benchmarks.frame_inputs import synthetic_buffers
  from benchmarks.peers import OrtPeer, PeerAdapter
  from benchmarks.sweep_timing import time_interleaved
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  frame = camerad_frame(1344, 760)
  kind = bench_driving_sweep.DRIVING
  bufs, m_inv = synthetic_buffers(frame, 3), np.stack([np.array([[2, 0, 40], [0, 2, 60], [0, 0, 1]], np.float32)] * 2)
  ours = TimedPath("tinygrad", ModelRunner(f"{native_artifacts}/model.bin", f"{native_artifacts}/warp_split.bin"), "float32", False, True)
  tolerance = lambda p, ref: (1e-3, False)
  try:
    time_interleaved([ours], bufs, kind, m_inv, 4, tolerance, print)
    peer = TimedPath("onnxruntime", PeerAdapter(OrtPeer({"onnx": f"{native_artifacts}/native.onnx"}, frame)), "float32", False, False)
    rows = time_interleaved([ours, peer], bufs, kind, m_inv, 4, tolerance, print)
    assert rows["onnxruntime"]["max_diff_vs_reference"] <= 1e-4 and rows["onnxruntime"]["within_tolerance"], rows
  finally: ours.adapter.close()
