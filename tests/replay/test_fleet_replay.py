"""route_replay on several segments: the fleet report (fleet_report) checked against records and check.json files written out here, and
route_replay --ray on a local Ray instance of two CPUs (one per test module, as CI's two cores): a bad segment among good ones, killed
workers and modelds, Ctrl-C. Each segment's check.json (written by its own replay) is the reference for the fleet's figures."""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

import pytest

from sunnypilot.modeld_v2.replay import fleet_replay, fleet_report
from sunnypilot.modeld_v2.replay.fleet_report import FleetReport, error_record
from sunnypilot.modeld_v2.replay.ray_fleet import node_folder
from sunnypilot.modeld_v2.replay.route_replay import main
from sunnypilot.modeld_v2.replay.synthetic_route import write_log, write_segment

from conftest import ROOT

FRAMES = 12
LONG_FRAMES = 100  # 5 s of drive, replayed in about as long on two cores
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
    try: yield ray.get_runtime_context().gcs_address  # route_replay's Ray driver joins it there
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

def spy_runs(monkeypatch) -> list[str]:
  """The fleet runs started from now on (their ids, as the fleet cleans up after each)."""
  runs, clean_run = [], fleet_replay.clean_run
  def spied(run: str, segments: int) -> None:
    runs.append(run)
    clean_run(run, segments)
  monkeypatch.setattr(fleet_replay, "clean_run", spied)
  return runs

def fleet(segments: list[str], out, address: str, *flags: str) -> tuple[int, dict]:
  code = main([*segments, *flags, "--no-pictures", "--out", str(out), "--ray", address])
  return code, json.loads((out / "fleet.json").read_text())

@pytest.mark.ray
def test_ray_replays_a_fleet_with_a_bad_segment(drive, native_artifacts, local_ray, tmp_path, capfd, monkeypatch):
  """Each segment a task on the local Ray instance: the good ones pass, the bad one is reported with its reason and fails none of the others
  (exit 2 after all ran); the fleet's head figures are those of the segments' own check.json files."""
  runs = spy_runs(monkeypatch)
  code, got = fleet([drive], out := tmp_path / "out", local_ray, "--artifacts", native_artifacts, "--onnx", os.path.join(native_artifacts, "native.onnx"),
                    "--tolerance", "1e-4")
  stdout, err = capfd.readouterr()
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
  assert len(runs) == 1 and not os.path.exists(node_folder(runs[0])), "each node's copy of the artifacts is removed at the end"

@pytest.mark.ray
def test_ray_replays_a_segment_again_once_when_its_worker_replay_or_modeld_is_killed(good_drive, native_artifacts, local_ray, tmp_path, capfd):
  """The Ray worker running the first segment is killed once: replayed again, it passes. The second segment's route_replay is SIGKILLed
  on its first try, its modeld on the second: reported as lost twice. The third, untouched but for 150 ms stalls of its worker, replay
  and modeld and of the Ray driver, passes on its first try (it stalled 60 s and was reported as an error in 2 of 3 runs). What the
  killed replays left (a msgq folder and a VisionIPC socket: a replay removed them only in its own `finally`) is gone, and nothing of the
  run is left."""
  segments = [os.path.join(good_drive, s) for s in sorted(os.listdir(good_drive))]
  killed: dict[str, list[int]] = {"worker": [], "replay": [], "modeld": []}
  stalled: set[str] = set()
  def act(run: Run, procs: dict) -> None:
    first, second, third = (run.replay_of(s) for s in segments)
    if not killed["worker"] and first and run.modeld_of(first):
      os.kill(procs[first][0], signal.SIGKILL)  # the Ray worker running the task
      killed["worker"].append(procs[first][0])
    if second and (modeld := run.modeld_of(second)) and second not in killed["replay"] and not killed["modeld"]:
      kind, pid = ("modeld", modeld) if killed["replay"] else ("replay", second)  # route_replay itself on the first try, its modeld on the second
      os.kill(pid, signal.SIGKILL)
      killed[kind].append(pid)
    if third and (modeld := run.modeld_of(third)):
      stalls = {"worker": procs[third][0], "replay": third, "modeld": modeld, "driver": run.driver()}
      for what in [w for w, pid in stalls.items() if pid and w not in stalled]:
        stalled.add(what)
        stall(stalls[what])
  with Run(good_drive, act) as run:
    code, got = fleet(segments, tmp_path / "out", local_ray, "--artifacts", native_artifacts, "--against", os.path.join(native_artifacts, "model.bin"))
  err = capfd.readouterr().err
  assert [len(pids) for pids in killed.values()] == [1, 1, 1] and stalled == {"worker", "replay", "modeld", "driver"}, (killed, stalled)
  assert code == 2, err
  first, second, third = got["per_segment"]
  assert (first["status"], first["attempts"], first["max"]) == ("passed", 2, 0.0), first
  assert second["status"] == "error" and second["attempts"] == 2, second
  assert second["reason"].startswith("lost twice: route_replay was killed (SIGKILL) before its end") and "then modeld exited (-9)" in second["reason"], second
  assert (third["status"], third["attempts"], third["max"]) == ("passed", 1, 0.0), third
  assert "replaying once more" in err
  assert len(run.namespaces) == 5, run.namespaces  # three replays, the first two once more each
  assert run.left() == {"processes": [], "namespaces": [], "folders": []}

@pytest.mark.ray
def test_ctrl_c_cancels_the_tasks_left_and_reports_those_done(drive, native_artifacts, local_ray, tmp_path, capfd, monkeypatch):
  """Ctrl-C as the first segment is done: the running task stops its replay, the queued one never starts; 130, and fleet.json holds those
  done (the first, and any that finished meanwhile) and names the others."""
  segments = sorted(os.listdir(drive))
  add = FleetReport.add
  def add_then_interrupt(self, record):
    add(self, record)
    os.kill(os.getpid(), signal.SIGINT)
  monkeypatch.setattr(fleet_report.FleetReport, "add", add_then_interrupt)
  handler = signal.getsignal(signal.SIGINT)
  code, got = fleet([drive], tmp_path / "out", local_ray, "--artifacts", native_artifacts)
  err = capfd.readouterr().err
  assert code == 130 and f"route_replay: interrupted: {got['done']} of 3 segments done" in err, err
  assert got["interrupted"] and got["done"] >= 1 and got["done"] + len(got["not_done"]) == 3 and signal.getsignal(signal.SIGINT) is handler
  assert not wait_gone(lambda: [p for s in segments for p in replays_of(os.path.join(drive, s))])

# *** what a fleet leaves, however it ends ***

@pytest.fixture(scope="module")
def good_drive(tmp_path_factory) -> str:
  """Three good segments of FRAMES frames (one video, three calibrations)."""
  folder = tmp_path_factory.mktemp("good") / "realdata"
  write_segment(str(first := folder / "2026-12-03--07-00-00--0"), (1344, 760), FRAMES)
  for k, rpy in ((1, (0.0, 0.05, 0.02)), (2, (0.0, -0.03, 0.0))):
    shutil.copytree(first, other := folder / f"2026-12-03--07-00-00--{k}")
    write_log(str(other / "rlog.zst"), FRAMES, "os04c10", rpy=rpy)
  return str(folder)

@pytest.fixture(scope="module")
def long_drive(tmp_path_factory) -> str:
  """Three copies of a LONG_FRAMES segment: replays that run for seconds, long enough to be interrupted or lose their node mid-way."""
  folder = tmp_path_factory.mktemp("long") / "realdata"
  write_segment(str(first := folder / "2026-12-03--08-00-00--0"), (1344, 760), LONG_FRAMES, 20, driver=False)
  for k in (1, 2): shutil.copytree(first, folder / f"2026-12-03--08-00-00--{k}")
  return str(folder)

def environ(pid: int) -> dict[str, str]:
  try:
    with open(f"/proc/{pid}/environ", "rb") as f: items = f.read().decode(errors="replace").split("\0")
  except OSError: return {}
  return dict(item.split("=", 1) for item in items if "=" in item)

def namespace_left(prefix: str) -> list[str]:
  """What a msgq namespace leaves in the filesystem, written out here: msgq's folder /dev/shm/msgq_<prefix> and the VisionIPC server's
  socket /tmp/<prefix>_visionipc_camerad (msgq-ipc's names)."""
  return [p for p in (f"/dev/shm/msgq_{prefix}", f"/tmp/{prefix}_visionipc_camerad") if os.path.lexists(p)]

def stall(pid: int) -> None:
  """A 150 ms stall of `pid` (SIGSTOP, then SIGCONT): the sleep is the stall's length, not a wait for a condition."""
  try:
    os.kill(pid, signal.SIGSTOP)
    time.sleep(0.15)
    os.kill(pid, signal.SIGCONT)
  except ProcessLookupError: pass

class Run:
  """A fleet run over the segments of `folder` as the process table shows it, read every 20 ms in a thread while the block runs: its
  processes (those with `folder` in their command line: the fleet, its Ray driver, the replays; and their children: the modelds, Ray's own
  processes when the fleet started Ray), the msgq namespace of each modeld, folders named in their command lines, and `act(self, procs)`
  on each reading (the test's kills and stalls)."""
  def __init__(self, folder: str, act=lambda run, procs: None):
    self.folder, self.act = folder, act
    self.seen: dict[int, list[str]] = {}  # pid -> argv
    self.namespaces: set[str] = set()
    self.stop, self.error = threading.Event(), None
    self.thread = threading.Thread(target=self.watch, daemon=True)

  def __enter__(self) -> "Run":
    self.thread.start()
    return self

  def __exit__(self, *exc) -> None:
    self.stop.set()
    self.thread.join()
    if self.error is not None and exc[0] is None: raise self.error

  def watch(self) -> None:
    try:
      while not self.stop.is_set():
        self.procs = processes()
        ours = {pid for pid, (_, argv) in self.procs.items() if self.folder in " ".join(argv) and pid != os.getpid()}
        for pid in sorted(self.procs):  # children after parents: pids grow
          if self.procs[pid][0] in ours: ours.add(pid)
        for pid in [p for p in ours if self.procs[p][1] != [""]]:  # not an exited one (a zombie's command line is empty)
          self.seen.setdefault(pid, self.procs[pid][1])
          if MODELD in self.procs[pid][1] and (prefix := environ(pid).get("OPENPILOT_PREFIX")): self.namespaces.add(prefix)
        self.act(self, self.procs)
        time.sleep(0.02)  # how often the process table is read
    except Exception as e: self.error = e

  def replay_of(self, segment: str) -> int | None:
    """The running replay (route_replay ... --result) of `segment`."""
    return next((pid for pid, (_, argv) in self.procs.items() if REPLAY in argv and "--result" in argv and segment in argv), None)

  def modeld_of(self, replay: int) -> int | None:
    return next((pid for pid, (ppid, argv) in self.procs.items() if ppid == replay and MODELD in argv), None)

  def driver(self) -> int | None:
    """route_replay --ray's Ray driver."""
    return next((pid for pid, (_, argv) in self.procs.items() if REPLAY in argv and "--driver" in argv and self.folder in " ".join(argv)), None)

  def folders(self, marker: str) -> set[str]:
    """The folders of the temporary directory whose names start with `marker` that the run's command lines name (a node's copy of the
    artifacts, a Ray instance's folder)."""
    root, found = os.path.join(tempfile.gettempdir(), marker), set()
    for argv in self.seen.values():
      for arg in argv:
        path = arg.partition("=")[2] if arg.startswith("--") else arg
        if path.startswith(root): found.add(path[:len(root)] + path[len(root):].split(os.sep)[0])
    return found

  def left(self) -> dict:
    """What the run left: processes still running, namespaces' files, the folders its command lines named."""
    procs = processes()
    return {"processes": [f"{pid}: {' '.join(argv)[:200]}" for pid, argv in self.seen.items() if pid in procs and procs[pid][1] == argv],
            "namespaces": [p for prefix in self.namespaces for p in namespace_left(prefix)],
            "folders": [f for marker in ("route_replay_fleet_", "ray") for f in self.folders(marker) if os.path.exists(f)]}

def route_replay(*args: str) -> tuple[subprocess.Popen, list[str]]:
  """route_replay in a session of its own (as a terminal runs a command: its process group gets the Ctrl-C), its stderr lines collected."""
  proc = subprocess.Popen([sys.executable, "-m", REPLAY, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, env={**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"})
  lines: list[str] = []
  threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True).start()
  return proc, lines

def wait_for_line(proc: subprocess.Popen, lines: list[str], text: str, timeout: float = 120.0) -> None:
  deadline = time.monotonic() + timeout
  while not any(text in line for line in lines):
    assert proc.poll() is None and time.monotonic() < deadline, "".join(lines)
    time.sleep(0.05)

def test_jobs_end_what_each_replay_leaves_however_it_ends(good_drive, native_artifacts, tmp_path):
  """route_replay --jobs 2 on three segments: the first segment's route_replay is SIGKILLed while it runs (its msgq folder and VisionIPC
  socket were left behind: the replay removed them only in its own `finally`), the second's modeld is SIGKILLed, and each process of the
  fleet is stopped for 150 ms once (SIGSTOP, SIGCONT): the fleet, a replay, a modeld. The killed ones are replayed once more and pass;
  the stalled one passes on its first try; at the fleet's exit nothing of any replay is left."""
  segments = [os.path.join(good_drive, s) for s in sorted(os.listdir(good_drive))]
  done: set[str] = set()
  proc, lines = route_replay(good_drive, "--artifacts", native_artifacts, "--against", os.path.join(native_artifacts, "model.bin"), "--jobs", "2",
                             "--no-pictures", "--out", str(tmp_path / "out"))
  def act(run: Run, procs: dict) -> None:
    first, second, third = (run.replay_of(s) for s in segments)
    modelds = [r and run.modeld_of(r) for r in (first, second, third)]
    targets = {"fleet": proc.pid, "kill replay": first if modelds[0] else None, "kill modeld": modelds[1], "replay": third if modelds[2] else None,
               "modeld": modelds[2]}  # a replay once its modeld runs
    for what in [w for w, pid in targets.items() if pid and w not in done]:
      done.add(what)
      if what.startswith("kill"): os.kill(targets[what], signal.SIGKILL)
      else: stall(targets[what])
  with Run(good_drive, act) as run: assert proc.wait(timeout=300) == 0, "".join(lines)
  assert done == {"fleet", "kill replay", "kill modeld", "replay", "modeld"}, done
  got = json.loads((tmp_path / "out" / "fleet.json").read_text())
  assert [(s["status"], s["attempts"], s["max"]) for s in got["per_segment"]] == [("passed", 2, 0.0), ("passed", 2, 0.0), ("passed", 1, 0.0)], got
  assert len(run.namespaces) == 5, run.namespaces  # three replays and two replayed once more
  assert run.left() == {"processes": [], "namespaces": [], "folders": []}

@pytest.mark.ray
def test_ctrl_c_to_a_ray_fleet_stops_its_replays_and_keeps_what_finished(long_drive, native_artifacts, local_ray, tmp_path):
  """Ctrl-C (SIGINT to route_replay --ray's process group) once a segment is done and another's replay runs: that replay ran on to its end
  (Ray's cancel raises KeyboardInterrupt in a task blocked in a wait for its replay, which never sees it), and its result was dropped from
  the report. Now it exits 130 within 5 s, the replays running are stopped, the report holds exactly the segments whose replays finished,
  and nothing of the run is left."""
  proc, lines = route_replay(long_drive, "--artifacts", native_artifacts, "--no-pictures", "--out", str(out := tmp_path / "out"), "--ray", local_ray)
  segments = sorted(os.listdir(long_drive))
  with Run(long_drive) as run:
    wait_for_line(proc, lines, "segments done")
    said_done = {line.split(": ")[-1].split()[0] for line in lines if "segments done" in line}
    while not any((r := run.replay_of(os.path.join(long_drive, s))) and run.modeld_of(r) for s in segments if s not in said_done):
      assert proc.poll() is None, "".join(lines)
      time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    assert proc.wait(timeout=5) == 130, "".join(lines)
  got = json.loads((out / "fleet.json").read_text())
  done = {s["segment"] for s in got["per_segment"]}
  finished = {s for s in segments if (out / s / "modeld_rlog.zst").exists()}
  assert got["interrupted"] and said_done <= done == finished and len(done) + len(got["not_done"]) == 3, (said_done, finished, got)
  assert len(done) < 3 and f"interrupted: {len(done)} of 3 segments done" in "".join(lines), "a replay was stopped mid-way"
  assert run.left() == {"processes": [], "namespaces": [], "folders": []}

@pytest.mark.ray
def test_a_lost_ray_node_ends_with_the_report_of_what_finished(long_drive, native_artifacts, tmp_path):
  """route_replay --ray on a local Ray instance of its own, whose node is lost while replays run (its dashboard agent killed: the raylet
  goes with it): it exited 1 with no summary and no fleet.json, leaving its node copy, msgq folders, sockets and Ray's folder behind. Now
  the summary and fleet.json say what finished and what was not replayed, exit 2, and nothing of the run is left."""
  proc, lines = route_replay(long_drive, "--artifacts", native_artifacts, "--no-pictures", "--out", str(out := tmp_path / "out"), "--ray")
  killed: list[int] = []
  def act(run: Run, procs: dict) -> None:
    if killed or not any(MODELD in argv for pid, argv in run.seen.items() if pid in procs): return
    agent = next((pid for pid in run.seen if pid in procs and any("dashboard/agent.py" in a for a in procs[pid][1])), None)
    if agent is not None:
      os.kill(agent, signal.SIGKILL)
      killed.append(agent)
  with Run(long_drive, act) as run: assert proc.wait(timeout=240) == 2, "".join(lines)
  assert killed, "".join(lines)
  summary = proc.stdout.read().strip().splitlines()[-1]
  got = json.loads((out / "fleet.json").read_text())
  assert got["done"] == 3 and got["error"] >= 1 and summary.startswith(f"fleet (ray): 3/3 segments: 0 passed, 0 failed, {got['error']} errors"), summary
  assert all(s["status"] == "replayed" or "not replayed" in s["reason"] or "lost twice" in s["reason"] for s in got["per_segment"]), got
  assert run.folders("ray") and run.folders("route_replay_fleet_"), "the run named Ray's folder and its node copy"
  assert run.left() == {"processes": [], "namespaces": [], "folders": []}
