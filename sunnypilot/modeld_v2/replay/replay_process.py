"""A segment's replay as a process of its own (`route_replay SEGMENT --result FILE`), owned by whoever starts it (route_replay --jobs, a
Ray task, a Ray run's nodes). Its msgq namespace is named before it starts and given to it in NAMESPACE_ENV, which it passes on to its
daemons; when it ends, however it ends (its own exit, a SIGKILL of it or of its parent), end_namespaces ends what is left: the processes
still carrying the name, the namespace's msgq folder and VisionIPC sockets. Its record says how it went (outcome); a replay that was
lost (killed) is tried once more (Attempts)."""
from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable

from sunnypilot.modeld_v2.replay.fleet_report import error_record, read_record

REPLAY = "sunnypilot.modeld_v2.replay.route_replay"
NAMESPACE_ENV = "ROUTE_REPLAY_PREFIX"  # the namespace a fleet chose for the replay it starts; the replay's daemons inherit it
STOP_S = 60.0  # a replay told to stop ends its modeld in seconds
END_S = 10.0  # a replay's daemons end on their own in a second once it is gone (cli.end_with_parent); then they are killed

def records_folder(run: str) -> str:
  """Where a fleet run's records come in (each segment's final one, written whole), named by the run before any replay starts."""
  return os.path.join(tempfile.gettempdir(), f"route_replay_records_{run}")

def new_namespace() -> str: return f"route_replay_{uuid.uuid4().hex[:10]}"

def fleet_namespace(run: str, segment: int, attempt: int) -> str:
  """The namespace of a fleet run's `segment` (its index) on its `attempt` (0, then 1 after a loss): named by the run, before any start."""
  return f"route_replay_{run}_{segment}_{attempt}"

def namespace_files(prefix: str) -> list[str]:
  """What a namespace leaves in the filesystem: msgq's folder of queues (/dev/shm/msgq_<prefix>) and the VisionIPC servers' sockets
  (msgq-ipc binds /tmp/<prefix>_visionipc_<server>, in /tmp whatever TMPDIR says)."""
  return [f"/dev/shm/msgq_{prefix}", *glob.glob(f"/tmp/{glob.escape(prefix)}_visionipc_*")]

def remove_namespace_files(prefix: str) -> None:
  for path in namespace_files(prefix):
    if os.path.isdir(path): shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path): os.remove(path)

def namespace_processes(prefixes: Iterable[str]) -> list[int]:
  """The processes, this one aside, started with NAMESPACE_ENV one of `prefixes`: a replay and its daemons, wherever they were reparented
  when their parent died (a process's environment at its start stays readable in /proc while it runs)."""
  tags, found = {f"{NAMESPACE_ENV}={p}".encode() for p in prefixes}, []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/environ", "rb") as f: env = f.read().split(b"\0")
    except OSError: continue  # gone, or not ours
    if int(pid) != os.getpid() and tags.intersection(env): found.append(int(pid))
  return found

def end_namespaces(prefixes: Iterable[str], grace_s: float = END_S) -> None:
  """End what is left of the replays in `prefixes`: their processes told to stop (SIGTERM), killed after grace_s, gone; then the
  namespaces' files removed."""
  prefixes = list(prefixes)
  for pid in namespace_processes(prefixes): signal_process(pid, signal.SIGTERM)
  deadline = time.monotonic() + grace_s
  while (left := namespace_processes(prefixes)) and time.monotonic() < deadline: time.sleep(0.05)
  for pid in left: signal_process(pid, signal.SIGKILL)
  deadline = time.monotonic() + grace_s
  while namespace_processes(prefixes) and time.monotonic() < deadline: time.sleep(0.05)  # a killed process's environment goes with its memory
  for prefix in prefixes: remove_namespace_files(prefix)

def signal_process(pid: int, sig: int) -> None:
  try: os.kill(pid, sig)
  except ProcessLookupError: pass

# *** the replay process ***

def segment_name(folder: str) -> str: return os.path.basename(os.path.normpath(folder))

def replay_command(folder: str, flags: list[str], record: str) -> list[str]:
  return [sys.executable, "-m", REPLAY, folder, *flags, "--result", record]

def stop(proc: subprocess.Popen) -> None:
  """Tell a replay to stop (it stops its modeld and removes its msgq namespace) and wait for it; killed if it does not end."""
  if proc.poll() is None: proc.send_signal(signal.SIGTERM)
  try: proc.wait(timeout=STOP_S)
  except subprocess.TimeoutExpired:
    proc.kill()
    proc.wait()

def timed(started: float, **more: float) -> dict:
  """When a replay process started and ended (seconds since the epoch, as its executor saw them) and its wall time."""
  ended = time.time()
  return {"started": started, "ended": ended, "wall_s": ended - started, **more}

def outcome(folder: str, returncode: int, record_path: str, last_line: str = "") -> dict:
  """The record the replay wrote, or what its exit says when it wrote none (killed by a signal, or stopped by one it did not expect:
  lost, which a retry may get past)."""
  if (record := read_record(record_path)) is not None: return record
  killed = returncode < 0 or returncode == 130
  how = f"was killed ({signal.Signals(-returncode).name})" if returncode < 0 else "was stopped" if killed else f"exited {returncode}"
  return error_record(segment_name(folder), f"route_replay {how} before its end" + (f": {last_line}" if last_line else ""), lost=killed)

class Attempts:
  """Each segment is tried at most twice, the second time only when the first was lost; the final record goes to `settled`."""
  def __init__(self, settled: Callable[[dict], None], report: Callable[[str], None]):
    self.settled, self.report = settled, report
    self.first: dict[str, str] = {}  # segment -> why its first replay was lost

  def attempt(self, folder: str) -> int:
    """0 for a segment's first replay, 1 for the one after it was lost."""
    return int(segment_name(folder) in self.first)

  def settle(self, folder: str, record: dict) -> bool:
    """True when the segment is to be replayed again."""
    name = segment_name(folder)
    if record["status"] == "lost" and name not in self.first:
      self.first[name] = record["reason"]
      self.report(f"{name}: replaying once more: {record['reason']}")
      return True
    if record["status"] == "lost": record["status"], record["reason"] = "error", f"lost twice: {self.first[name]}; then {record['reason']}"
    record["attempts"] = 1 + (name in self.first)
    self.settled(record)
    return False
