"""route_replay on several segments: the fleet report (fleet_report) checked against records and check.json files written out here, and
route_replay --ray on a local Ray instance of two CPUs (one per test module, as CI's two cores): a bad segment among good ones, killed
workers and modelds, Ctrl-C. Each segment's check.json (written by its own replay) is the reference for the fleet's figures."""
import json
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

from sunnypilot.modeld_v2.replay import fleet_report
from sunnypilot.modeld_v2.replay.fleet_report import FleetReport, error_record
from sunnypilot.modeld_v2.replay.route_replay import main
from sunnypilot.modeld_v2.replay.synthetic_route import write_log, write_segment

from conftest import ROOT

FRAMES = 12
REPLAY, MODELD = "sunnypilot.modeld_v2.replay.route_replay", "sunnypilot.modeld_v2.modeld"

def checked_record(segment: str, frames: int, heads: dict[str, tuple[float, float, int]], tolerance: float = 1e-3) -> dict:
  """A record as a replay with a check writes it: heads {name: (max, mean, peak frame)}."""
  check = {"frames": frames, "tolerance": tolerance, "heads": {n: {"max": m, "mean": a, "peak_frame": f} for n, (m, a, f) in heads.items()},
           "fields_past_tolerance": {}, "passed": all(m <= tolerance for m, _, _ in heads.values())}
  return {"segment": segment, "status": "passed" if check["passed"] else "failed", "reason": None if check["passed"] else "past", "sent": frames,
          "published": frames, "seconds": frames / 20, "check": check, "files": []}

def test_the_fleet_report_over_records(tmp_path, caplog):
  """Per head the max over segments and the mean per frame over all of them (a segment's mean weighted by its frames), the segments where it
  peaks, worst first; statuses, frames; exit 2 with an error, 1 with a failure only, 0 when all passed."""
  records = [checked_record("a--0", 100, {"plan": (2e-4, 1e-5, 130), "lead": (1e-6, 1e-7, 101)}),
             checked_record("a--1", 300, {"plan": (5e-3, 3e-5, 250), "lead": (0.0, 0.0, 100)}),
             checked_record("a--2", 200, {"plan": (1e-4, 2e-5, 120), "lead": (3e-6, 2e-7, 110)}),
             error_record("a--3", "frames and log out of step"), checked_record("a--4", 50, {"plan": (0.0, 0.0, 100), "lead": (0.0, 0.0, 100)})]
  report = FleetReport([r["segment"] for r in records] + ["a--5"], str(tmp_path / "out"), "test")
  with caplog.at_level("INFO"):
    for r in records: report.add(r)
  assert "5/6 segments done" in caplog.text and "ETA" in caplog.text and "a--3 error: frames and log out of step" in caplog.text
  line = report.write(interrupted=True)
  got = json.loads((tmp_path / "out" / "fleet.json").read_text())
  assert got["heads"]["plan"]["max"] == 5e-3 and got["heads"]["lead"]["max"] == 3e-6
  assert got["heads"]["plan"]["mean"] == pytest.approx((1e-5 * 100 + 3e-5 * 300 + 2e-5 * 200) / 650)
  assert [p["segment"] for p in got["heads"]["plan"]["peak_segments"]] == ["a--1", "a--0", "a--2"]
  assert got["heads"]["plan"]["peak_segments"][0]["peak_frame"] == 250
  assert (got["passed"], got["failed"], got["error"], got["done"], got["not_done"], got["frames"]) == (3, 1, 1, 5, ["a--5"], 650)
  assert [s["max"] for s in got["per_segment"]] == [2e-4, 5e-3, 1e-4, None, 0.0] and got["interrupted"]
  assert line.startswith("fleet (test): 5/6 segments (interrupted): 3 passed, 1 failed, 1 errors; 650 frames") and "worst head plan 0.005 (a--1)" in line
  assert (tmp_path / "out" / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert report.exit_code() == 2
  del report.records["a--3"]
  assert report.exit_code() == 1
  del report.records["a--1"]
  assert report.exit_code() == 0

@pytest.fixture(scope="module")
def drive(tmp_path_factory) -> str:
  """Two good segments (one video, two calibrations: their outputs differ) and one whose road video is cut short."""
  folder = tmp_path_factory.mktemp("fleet") / "realdata"
  first = folder / "2026-12-03--05-00-00--0"
  write_segment(str(first), (1344, 760), FRAMES)
  shutil.copytree(first, second := folder / "2026-12-03--05-00-00--1")
  write_log(str(second / "rlog.zst"), FRAMES, "os04c10", rpy=(0.0, 0.05, 0.02))
  shutil.copytree(first, bad := folder / "2026-12-03--05-00-00--2")
  (bad / "fcamera.hevc").write_bytes((first / "fcamera.hevc").read_bytes()[:8000])
  return str(folder)

@pytest.fixture(scope="module")
def local_ray():
  """A local Ray instance of 2 CPUs for the module, its files in a folder of its own (removed after), with no token written to ~/.ray;
  its processes are gone after."""
  import ray
  temp, sigterm = tempfile.mkdtemp(prefix="ray"), signal.getsignal(signal.SIGTERM)  # short: Ray's socket paths live under it
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("RAY_AUTH_MODE", "disabled")
    mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))  # the workers import this checkout
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 << 20, _temp_dir=temp, logging_level="WARNING")
    try: yield
    finally:
      ray.shutdown()
      signal.signal(signal.SIGTERM, sigterm)  # ray.init put its own
      left = wait_gone(lambda: [pid for pid, (_, argv) in processes().items() if any(temp in a for a in argv)])
      shutil.rmtree(temp, ignore_errors=True)
      assert not left, f"Ray processes left: {left}"

@pytest.mark.parametrize("argv, message", [
  (["{seg}", "{seg}/", "--ray"], "two segments named 2026-12-03--05-00-00--0: their outputs would go to one folder"),
  (["--ray", "{seg}"], "argument --ray: expected a Ray address (auto, HOST:PORT or ray://HOST:PORT), got"),
  (["{drive}", "--ray", "auto", "--jobs", "2"], "give --jobs (local processes) or --ray (Ray tasks), not both"),
  (["{drive}", "--result", "{out}/r.json"], "--result is one segment's record: give one segment"),
  (["{drive}", "--replay-cpus", "0", "--ray"], "argument --replay-cpus: expected a number above 0"),
])
def test_fleet_flags_are_refused_in_one_line_before_any_work(drive, native_artifacts, tmp_path, capsys, argv, message):
  seg = os.path.join(drive, sorted(os.listdir(drive))[0])
  argv = [a.format(seg=seg, drive=drive, out=tmp_path) for a in argv] + ["--artifacts", native_artifacts, "--out", str(tmp_path / "out")]
  with pytest.raises(SystemExit) as e: main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err.strip().splitlines()[-1] and "Traceback" not in err, err
  assert not (tmp_path / "out").exists() and not os.listdir(tmp_path)

def processes() -> dict[int, tuple[int, list[str]]]:
  """pid -> (parent pid, argv) of every process."""
  found = {}
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      argv = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace").split("\0")
      ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError): continue
    found[int(pid)] = ppid, argv
  return found

def wait_gone(find, timeout: float = 30.0) -> list:
  """Until `find()` is empty or the timeout; what it found last."""
  deadline = time.monotonic() + timeout
  while (left := find()) and time.monotonic() < deadline: time.sleep(0.1)
  return left

def replays_of(folder: str) -> list[int]:
  """The replay processes of `folder` and their modelds."""
  procs = processes()
  replays = [pid for pid, (_, argv) in procs.items() if REPLAY in argv and folder in argv]
  return replays + [pid for pid, (ppid, argv) in procs.items() if ppid in replays]

def node_copies() -> set[str]: return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("route_replay_fleet_")}

def fleet(segments: list[str], out, *flags: str) -> tuple[int, dict]:
  code = main([*segments, *flags, "--no-pictures", "--out", str(out), "--ray"])
  return code, json.loads((out / "fleet.json").read_text())

@pytest.mark.ray
def test_ray_replays_a_fleet_with_a_bad_segment(drive, native_artifacts, local_ray, tmp_path, capsys):
  """Each segment a task on the local Ray instance: the good ones pass, the bad one is reported with its reason and fails none of the others
  (exit 2 after all ran); the fleet's head figures are those of the segments' own check.json files."""
  copies = node_copies()
  code, got = fleet([drive], out := tmp_path / "out", "--artifacts", native_artifacts, "--onnx", os.path.join(native_artifacts, "native.onnx"),
                    "--tolerance", "1e-4")
  stdout, err = capsys.readouterr()
  assert code == 2, err
  segments = sorted(os.listdir(drive))
  statuses = {s["segment"]: (s["status"], s["reason"]) for s in got["per_segment"]}
  assert statuses[segments[0]] == statuses[segments[1]] == ("passed", None), statuses
  assert statuses[segments[2]][0] == "error" and "frames and log out of step: fcamera.hevc has" in statuses[segments[2]][1], statuses
  checks = [json.loads((out / s / "check.json").read_text()) for s in segments[:2]]
  assert not (out / segments[2]).exists() and all(c["frames"] == FRAMES for c in checks)
  for head, fleet_head in got["heads"].items():
    maxes = [c["heads"][head]["max"] for c in checks]
    assert fleet_head["max"] == max(maxes) and fleet_head["mean"] == pytest.approx(sum(c["heads"][head]["mean"] for c in checks) / 2)
    assert [p["max"] for p in fleet_head["peak_segments"]] == sorted(maxes, reverse=True)
  assert got["frames"] == 2 * FRAMES and got["frames_per_s"] > 0 and got["executor"] == "ray" and all(s["node"] for s in got["per_segment"])
  assert all(s["task_started"] <= s["started"] < s["ended"] <= s["task_ended"] and s["wall_s"] > 0 for s in got["per_segment"]), got["per_segment"]
  assert "3/3 segments done" in err and "fleet (ray): 3/3 segments: 2 passed, 0 failed, 1 errors; 24 frames" in stdout.strip().splitlines()[-1]
  assert (out / "fleet.png").read_bytes()[:4] == b"\x89PNG"
  assert node_copies() == copies, "each node's copy of the artifacts is removed at the end"

@pytest.mark.ray
def test_ray_replays_a_segment_again_once_when_its_worker_or_modeld_is_killed(drive, native_artifacts, local_ray, tmp_path, capsys):
  """The worker running the first segment is killed once: replayed again, it passes. The second segment's modeld is killed on both tries:
  reported as lost twice. Nothing of theirs is left running."""
  segments = [os.path.join(drive, s) for s in sorted(os.listdir(drive))[:2]]
  killed: dict[str, list[int]] = {"worker": [], "modeld": []}
  stop = threading.Event()
  def kill() -> None:
    while not stop.is_set() and (not killed["worker"] or len(killed["modeld"]) < 2):
      procs = processes()
      for pid, (ppid, argv) in procs.items():
        if not killed["worker"] and REPLAY in argv and segments[0] in argv and ppid != os.getpid():
          os.kill(ppid, signal.SIGKILL)  # the Ray worker running the task
          killed["worker"].append(ppid)
        parent = procs.get(ppid, (0, []))[1]
        if MODELD in argv and REPLAY in parent and segments[1] in parent and pid not in killed["modeld"]:
          os.kill(pid, signal.SIGKILL)
          killed["modeld"].append(pid)
      time.sleep(0.02)  # how often the process table is read
  killer = threading.Thread(target=kill, daemon=True)
  killer.start()
  try: code, got = fleet(segments, tmp_path / "out", "--artifacts", native_artifacts, "--against",
                         os.path.join(native_artifacts, "model.bin"))
  finally:
    stop.set()
    killer.join()
  err = capsys.readouterr().err
  assert len(killed["worker"]) == 1 and len(killed["modeld"]) == 2, killed
  assert code == 2, err
  first, second = got["per_segment"]
  assert (first["status"], first["attempts"], first["max"]) == ("passed", 2, 0.0), first
  assert second["status"] == "error" and second["attempts"] == 2 and second["reason"].count("modeld exited (-9)") == 2, second
  assert second["reason"].startswith("lost twice: "), second
  assert "replaying once more" in err
  assert not wait_gone(lambda: replays_of(segments[0]) + replays_of(segments[1]))

@pytest.mark.ray
def test_ctrl_c_cancels_the_tasks_left_and_reports_those_done(drive, native_artifacts, local_ray, tmp_path, capsys, monkeypatch):
  """Ctrl-C as the first segment is done: the running task stops its replay, the queued one never starts; 130, and fleet.json holds the one
  done and names the others."""
  segments = sorted(os.listdir(drive))
  add = FleetReport.add
  def add_then_interrupt(self, record):
    add(self, record)
    os.kill(os.getpid(), signal.SIGINT)
  monkeypatch.setattr(fleet_report.FleetReport, "add", add_then_interrupt)
  handler = signal.getsignal(signal.SIGINT)
  code, got = fleet([drive], tmp_path / "out", "--artifacts", native_artifacts)
  err = capsys.readouterr().err
  assert code == 130 and "route_replay: interrupted: 1 of 3 segments done" in err, err
  assert got["interrupted"] and got["done"] == 1 and len(got["not_done"]) == 2 and signal.getsignal(signal.SIGINT) is handler
  assert not wait_gone(lambda: [p for s in segments for p in replays_of(os.path.join(drive, s))])
