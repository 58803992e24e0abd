"""route_replay on several segments as Ray tasks on a local Ray instance of two CPUs (one per test module, as CI's two cores): flags
refused before any work, a bad segment among good ones, killed workers, replays and modelds replayed once more, Ctrl-C. Each segment's
check.json (written by its own replay) is the reference for the fleet's figures."""
import json
import os
import shutil
import signal

import pytest

from sunnypilot.modeld_v2.replay import fleet_replay, fleet_report
from sunnypilot.modeld_v2.replay.fleet_report import FleetReport
from sunnypilot.modeld_v2.replay.ray_fleet import node_folder
from sunnypilot.modeld_v2.replay.route_replay import main
from sunnypilot.modeld_v2.replay.synthetic_route import write_log, write_segment

import fleet_processes
from fleet_processes import FRAMES, REPLAY, Run, processes, stall, wait_gone

local_ray, good_drive = fleet_processes.local_ray, fleet_processes.good_drive  # the fleet tests' fixtures, by name

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
