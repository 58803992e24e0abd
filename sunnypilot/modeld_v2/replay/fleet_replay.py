"""Many segments replayed at once, by one of two executors, into one report (fleet_report): local processes (route_replay --jobs N) or
Ray tasks on this machine or a cluster (route_replay --ray [ADDRESS], driven by ray_fleet).

Either way a segment is one `route_replay SEGMENT --result FILE` process with its own modeld in its own msgq namespace, as a single
replay is. This process owns the run: it names everything the run makes before the run starts (each replay's namespace, the records
folder, the Ray run's node copy and a local Ray instance's folder) and removes all of it at the end, however the replays, the Ray driver
or its node ended. A replay whose process or modeld was killed (its worker died, the kernel's OOM killer, a kill) is replayed once more,
then reported as an error; a segment that cannot be replayed (bad input) is reported and the others go on. Ctrl-C or SIGTERM stops the
replays running, starts no other and writes the report of those done. With --ray, Ray runs in a process of its own (Ray ends that process
when its node is lost): the segments it did not finish are then reported as errors.
"""
from __future__ import annotations

import argparse
import glob
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid

from sunnypilot.modeld_v2.common.cli import child_env, interrupts_handled
from sunnypilot.modeld_v2.replay.fleet_report import FleetReport, error_record, read_record
from sunnypilot.modeld_v2.replay.ray_fleet import driver_command, node_folder, ray_temp
from sunnypilot.modeld_v2.replay.replay_process import (
  NAMESPACE_ENV,
  Attempts,
  end_namespaces,
  fleet_namespace,
  outcome,
  records_folder,
  replay_command,
  segment_name,
  stop,
  timed,
)
from sunnypilot.modeld_v2.replay.route_segment import RouteError

RAY_ADDRESS = re.compile(r"^(auto|local|(ray://)?[\w.\-]+:\d+)$")
DRIVER_STOP_S = 3.0  # interrupted: the Ray driver gets this long to cancel its tasks and keep what finished, then it is killed

log = logging.getLogger(__name__)

def interrupted_line(report: FleetReport, what: str) -> None:
  print(f"route_replay: interrupted: {len(report.records)} of {len(report.segments)} segments done, {what}", file=sys.stderr, flush=True)

# *** local processes (--jobs N) ***

def run_jobs(folders: list[str], flags: list[str], jobs: int, run: str, report: FleetReport) -> bool:
  """Each segment in a process of its own, `jobs` at a time, their output passed on as it comes; True when interrupted. Each process ends
  what is left of its namespace when it ends (end_namespaces). Interrupted, the replays running are told to stop (each stops its modeld
  and says what it wrote) and waited for, those that finished are reported, and no segment starts after that."""
  attempts, pending = Attempts(report.add, log.info), list(folders)
  running: dict[subprocess.Popen, tuple[str, str, float, str]] = {}
  env = child_env()  # each replay's OpenMP/BLAS threads sized to its share of the cores, as Ray sizes a task's: left at every core, N
  env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))  # replays on N cores ran 15-20% slower (2 cores, N = 2)
  def ended(proc: subprocess.Popen) -> dict:
    folder, path, started, prefix = running.pop(proc)
    times = timed(started)
    end_namespaces([prefix])
    return outcome(folder, proc.returncode, path) | times
  try:
    while pending or running:
      while pending and len(running) < jobs:
        folder = pending.pop(0)
        prefix = fleet_namespace(run, folders.index(folder), attempts.attempt(folder))
        path = os.path.join(records_folder(run), f"{prefix}.json")
        running[subprocess.Popen(replay_command(folder, flags, path), env=env | {NAMESPACE_ENV: prefix})] = folder, path, time.time(), prefix
      for proc in [p for p in running if p.poll() is not None]:
        folder = running[proc][0]
        if attempts.settle(folder, ended(proc)): pending.append(folder)
      time.sleep(0.1)
  except KeyboardInterrupt:
    for proc in running: proc.send_signal(signal.SIGTERM)  # a Ctrl-C at the terminal reached them already; a SIGTERM to this process did not
    stopped = 0
    for proc in list(running):
      stop(proc)
      folder, record = running[proc][0], ended(proc)
      if record["status"] == "lost": stopped += 1  # stopped here: not done, not retried
      else: attempts.settle(folder, record)  # it finished before it was told
    interrupted_line(report, f"{stopped} stopped, {len(pending)} not started")
    return True
  return False

# *** Ray (--ray [ADDRESS]) ***

def run_ray(folders: list[str], flags: list[str], run: str, report: FleetReport) -> bool:
  """The Ray driver (ray_fleet) in a process of its own, in a session of its own (a Ctrl-C at the terminal reaches this process, which tells
  the driver), each record it settles reported as it comes; True when interrupted. When the driver ends before its end (Ray ends it when
  its node is lost), the segments it did not finish are reported as errors."""
  records, seen = records_folder(run), set()
  def collect() -> None:
    for path in sorted(glob.glob(os.path.join(records, "*.json"))):
      if path not in seen and (record := read_record(path)) is not None:
        seen.add(path)
        report.add(record)
  proc = subprocess.Popen(driver_command(folders, flags, run), env=child_env(), start_new_session=True)
  try:
    while proc.poll() is None:
      collect()
      time.sleep(0.1)
  except KeyboardInterrupt:
    proc.send_signal(signal.SIGTERM)
    try: proc.wait(timeout=DRIVER_STOP_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
    collect()
    interrupted_line(report, "the others cancelled")
    return True
  collect()
  if proc.returncode != 0:
    how = f"was killed ({signal.Signals(-proc.returncode).name})" if proc.returncode < 0 else f"exited {proc.returncode}"
    for name in [s for s in report.segments if s not in report.records]:
      report.add(error_record(name, f"not replayed: the Ray driver {how} first (Ray ends it when the node it runs on is lost)"))
  return False

# *** the fleet ***

def clean_run(run: str, segments: int) -> None:
  """Everything the run named, on this machine: what is left of each replay (a namespace per segment and attempt), the records, the Ray
  run's node copy and a local Ray instance's folder."""
  end_namespaces([fleet_namespace(run, k, a) for k in range(segments) for a in (0, 1)])
  for folder in (records_folder(run), node_folder(run), ray_temp(run)): shutil.rmtree(folder, ignore_errors=True)

def replay_fleet(folders: list[str], flags: list[str], args: argparse.Namespace) -> int:
  """Replay `folders` with --jobs processes or as Ray tasks (args.ray); the fleet report in args.out and its summary line on stdout; the
  exit code: 130 interrupted, else 2 when a segment could not be replayed, else 1 when one is past its tolerance, else 0."""
  names = [segment_name(f) for f in folders]
  if len(set(names)) < len(names):
    twice = sorted({n for n in names if names.count(n) > 1})[0]
    raise RouteError(f"two segments named {twice}: their outputs would go to one folder ({', '.join(f for f in folders if segment_name(f) == twice)})")
  report = FleetReport(names, args.out, "ray" if args.ray else f"{args.jobs} local processes")
  run = uuid.uuid4().hex[:10]
  with interrupts_handled():
    try:
      os.makedirs(records_folder(run))
      try:
        if args.ray: interrupted = run_ray(folders, flags, run, report)
        else: interrupted = run_jobs(folders, flags, args.jobs, run, report)
      except KeyboardInterrupt: interrupted = True  # before the first replay started or after the last
      print(report.write(interrupted), flush=True)
    finally: clean_run(run, len(folders))
  return 130 if interrupted else report.exit_code()
