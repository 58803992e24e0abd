"""What a fleet leaves, however it ends: route_replay --jobs with killed and stalled replays and modelds, Ctrl-C to a Ray fleet, a lost
Ray node. Each ends with the report of what finished and nothing of the run left: no process, msgq namespace or folder."""
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from sunnypilot.modeld_v2.replay.synthetic_route import write_segment

import fleet_processes
from conftest import ROOT
from fleet_processes import LONG_FRAMES, MODELD, REPLAY, Run, stall

local_ray, good_drive = fleet_processes.local_ray, fleet_processes.good_drive  # the fleet tests' fixtures, by name

@pytest.fixture(scope="module")
def long_drive(tmp_path_factory) -> str:
  """Three copies of a LONG_FRAMES segment: replays that run for seconds, long enough to be interrupted or lose their node mid-way."""
  folder = tmp_path_factory.mktemp("long") / "realdata"
  write_segment(str(first := folder / "2026-12-03--08-00-00--0"), (1344, 760), LONG_FRAMES, 20, driver=False)
  for k in (1, 2): shutil.copytree(first, folder / f"2026-12-03--08-00-00--{k}")
  return str(folder)

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
