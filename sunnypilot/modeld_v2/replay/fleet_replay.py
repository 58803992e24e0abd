"""Many segments replayed at once, by one of two executors, into one report (fleet_report): local processes (route_replay --jobs N) or
Ray tasks on this machine or a cluster (route_replay --ray [ADDRESS]).

Either way a segment is one `route_replay SEGMENT --result FILE` process with its own modeld and its own msgq OPENPILOT_PREFIX, as a
single replay is; its record comes back through FILE. A replay whose process or modeld was killed (its worker died, the kernel's OOM
killer, a kill) is replayed once more, then reported as an error; a segment that cannot be replayed (bad input) is reported and the
others go on. Ctrl-C or SIGTERM stops the replays running, starts no other and writes the report of those done.

Ray: each segment is a task reserving --replay-cpus CPUs (default 1), so a node runs at most its CPU count of replays at a time. Without
an address a local Ray instance is started for the run; with one (`auto`, or the head's HOST:PORT) the run joins that cluster. The
artifacts folder's bundles and the reference files are put once in Ray's object store; each node fetches them once and writes them to a
folder of this run under its temporary directory, removed at the end. The segment folders and --out are read and written at the same
paths on every node: on a cluster, a shared filesystem.
"""
from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

from sunnypilot.modeld_v2.common.cli import child_env, interrupts_handled, on_interrupt
from sunnypilot.modeld_v2.compile.model_plan import model_files
from sunnypilot.modeld_v2.replay.fleet_report import FleetReport, error_record, read_record
from sunnypilot.modeld_v2.replay.route_segment import RouteError

REPLAY = "sunnypilot.modeld_v2.replay.route_replay"
STOP_S = 60.0  # a replay told to stop ends its modeld in seconds
RAY_ADDRESS = re.compile(r"^(auto|local|(ray://)?[\w.\-]+:\d+)$")

log = logging.getLogger(__name__)

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
  """Each segment is tried at most twice, the second time only when the first was lost; the final record goes into the report."""
  def __init__(self, report: FleetReport):
    self.report = report
    self.first: dict[str, str] = {}  # segment -> why its first replay was lost

  def settle(self, folder: str, record: dict) -> bool:
    """True when the segment is to be replayed again."""
    name = segment_name(folder)
    if record["status"] == "lost" and name not in self.first:
      self.first[name] = record["reason"]
      log.info(f"{name}: replaying once more: {record['reason']}")
      return True
    if record["status"] == "lost": record["status"], record["reason"] = "error", f"lost twice: {self.first[name]}; then {record['reason']}"
    record["attempts"] = 1 + (name in self.first)
    self.report.add(record)
    return False

# *** local processes (--jobs N) ***

def run_jobs(folders: list[str], flags: list[str], jobs: int, report: FleetReport) -> bool:
  """Each segment in a process of its own, `jobs` at a time, their output passed on as it comes; True when interrupted. Interrupted, the
  replays running are told to stop (each stops its modeld and says what it wrote) and waited for, and no segment starts after that."""
  attempts, pending, running = Attempts(report), list(folders), {}
  records = tempfile.mkdtemp(prefix="route_replay_records_")
  env = child_env()  # each replay's OpenMP/BLAS threads sized to its share of the cores, as Ray sizes a task's: left at every core, N
  env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // jobs)))  # replays on N cores ran 15-20% slower (2 cores, N = 2)
  try:
    while pending or running:
      while pending and len(running) < jobs:
        folder = pending.pop(0)
        path = os.path.join(records, f"{uuid.uuid4().hex}.json")
        running[subprocess.Popen(replay_command(folder, flags, path), env=env)] = folder, path, time.time()
      for proc in [p for p in running if p.poll() is not None]:
        folder, path, started = running.pop(proc)
        if attempts.settle(folder, outcome(folder, proc.returncode, path) | timed(started)): pending.append(folder)
      time.sleep(0.1)
  except KeyboardInterrupt:
    for proc in running: proc.send_signal(signal.SIGTERM)  # a Ctrl-C at the terminal reached them already; a SIGTERM to this process did not
    for proc in running: stop(proc)
    print(f"route_replay: interrupted: {len(report.records)} of {len(folders)} segments done, {len(running)} stopped, {len(pending)} not started",
          file=sys.stderr, flush=True)
    return True
  finally: shutil.rmtree(records, ignore_errors=True)
  return False

# *** Ray tasks (--ray [ADDRESS]) ***

def shipped_files(args) -> tuple[dict[str, bytes], list[str]]:
  """What every node needs besides the segment: the artifacts' bundles and the reference files, by a path relative to the node's copy, and
  the flags that point the replay at that copy (given after the user's: argparse takes the last)."""
  files, flags = {}, []
  for path in sorted(glob.glob(os.path.join(args.artifacts, "*.bin"))):
    with open(path, "rb") as f: files[os.path.join("artifacts", os.path.basename(path))] = f.read()
  flags += ["--artifacts", "artifacts"]
  for key, path in [*model_files(args).items(), *[("against", args.against)] * bool(args.against)]:
    with open(path, "rb") as f: files[name := os.path.join(key, os.path.basename(path))] = f.read()
    flags += [f"--{key.replace('_', '-')}", name]
  return files, flags

def node_folder(run: str) -> str: return os.path.join(tempfile.gettempdir(), f"route_replay_fleet_{run}")

def node_copy(shipped: list, run: str) -> str:
  """This node's copy of the shipped files, written by the first task of the run on this node (whole, then renamed into place)."""
  folder = node_folder(run)
  if not os.path.isdir(folder):
    import ray
    files, staging = ray.get(shipped[0]), f"{folder}.tmp{os.getpid()}"
    try:
      for name, data in files.items():
        os.makedirs(os.path.dirname(os.path.join(staging, name)), exist_ok=True)
        with open(os.path.join(staging, name), "wb") as f: f.write(data)
      with contextlib.suppress(OSError): os.rename(staging, folder)  # another task on this node was first: its copy is the same
    finally: shutil.rmtree(staging, ignore_errors=True)
  return folder

def replay_task(folder: str, flags: list[str], shipped: list, node_flags: list[str], run: str) -> dict:
  """A Ray task: one segment replayed by a route_replay process on this node, its output kept for the error line; the record."""
  task_started = time.time()
  copy = node_copy(shipped, run)
  local = [os.path.join(copy, a) if k % 2 else a for k, a in enumerate(node_flags)]
  with tempfile.TemporaryDirectory(prefix="task_", dir=copy) as tmp:  # in the run's folder: a killed worker's goes with it at the end
    with open(output := os.path.join(tmp, "output.log"), "w") as out:
      record_path, started = os.path.join(tmp, "record.json"), time.time()
      proc = subprocess.Popen(replay_command(folder, flags + local, record_path), stdout=out, stderr=subprocess.STDOUT, env=child_env())
      try: proc.wait()
      except KeyboardInterrupt:  # ray.cancel: stop the replay, then end as cancelled
        stop(proc)
        raise
      times = timed(started, task_started=task_started)
    with open(output) as f: lines = [line.strip() for line in f if line.strip()]
    record = outcome(folder, proc.returncode, record_path, lines[-1] if lines else "")
  return record | times | {"node": socket.gethostname(), "task_ended": time.time()}

def remove_node_copy(run: str) -> None: shutil.rmtree(node_folder(run), ignore_errors=True)

@contextlib.contextmanager
def ray_session(address: str) -> Iterator[None]:
  """Ray for this run: the one this process already joined, a local instance started here (`local`), or the cluster at `address`."""
  import ray
  if ray.is_initialized():
    yield
    return
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves this machine unasked
  options: dict = {"log_to_driver": False, "logging_level": logging.WARNING}  # each task keeps its replay's output; errors come back in records
  temp = None
  if address == "local":
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # the workers import this package, this copy
    temp = tempfile.mkdtemp(prefix="ray")  # Ray's session files and logs, for this run only (a short path: Ray's sockets live in it)
    options |= {"include_dashboard": False, "_temp_dir": temp}
  try:
    try: ray.init(address=None if address == "local" else address, **options)
    except Exception as e:
      raise RouteError(f"cannot {'start Ray' if address == 'local' else f'join the Ray cluster at {address}'}: {type(e).__name__}: {e}") from None
    try: yield
    finally: ray.shutdown()
  finally:
    if temp: shutil.rmtree(temp, ignore_errors=True)

def run_ray(folders: list[str], flags: list[str], args, report: FleetReport) -> bool:
  """Each segment a Ray task; True when interrupted. Interrupted, the tasks not done are cancelled (a running one stops its replay) and
  waited for."""
  import ray
  from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

  on_interrupt()  # ray.init put its own SIGTERM handler (sys.exit) in place of the one that stops the replays
  attempts, run = Attempts(report), uuid.uuid4().hex[:12]
  files, node_flags = shipped_files(args)
  shipped = [ray.put(files)]  # in a list: a task fetches it only when its node has no copy yet
  flags = flags + ["--out", os.path.abspath(args.out)]
  task = ray.remote(replay_task).options(num_cpus=args.replay_cpus, max_retries=0)  # a lost replay is retried here, once, and said so
  submit = lambda folder: task.remote(os.path.abspath(folder), flags, shipped, node_flags, run)
  refs = {submit(folder): folder for folder in folders}
  log.info(f"{len(folders)} segments as Ray tasks of {args.replay_cpus:g} CPU(s) on {sum(n['Alive'] for n in ray.nodes())} node(s), "
           f"{ray.cluster_resources().get('CPU', 0):g} CPUs")
  try:
    while refs:
      ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
      for ref in ready:
        folder = refs.pop(ref)
        if attempts.settle(folder, task_record(ref, folder)): refs[submit(folder)] = folder
    return False
  except KeyboardInterrupt:
    for ref in refs: ray.cancel(ref)
    ray.wait(list(refs), num_returns=len(refs), timeout=STOP_S)
    print(f"route_replay: interrupted: {len(report.records)} of {len(folders)} segments done, {len(refs)} cancelled", file=sys.stderr, flush=True)
    return True
  finally:
    cleanup = ray.remote(num_cpus=0)(remove_node_copy)
    nodes = [cleanup.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)).remote(run) for n in ray.nodes() if n["Alive"]]
    ray.wait(nodes, num_returns=len(nodes), timeout=30)
    remove_node_copy(run)

def task_record(ref, folder: str) -> dict:
  """A finished task's record; a worker or node that died is a lost replay."""
  import ray
  try: return ray.get(ref)
  except ray.exceptions.RayTaskError as e: return error_record(segment_name(folder), f"the task failed: {type(e.cause).__name__}: {e.cause}")
  except ray.exceptions.RayError as e: return error_record(segment_name(folder), f"{type(e).__name__}: {str(e).splitlines()[0]}", lost=True)

# *** the fleet ***

def replay_fleet(folders: list[str], flags: list[str], args) -> int:
  """Replay `folders` with --jobs processes or as Ray tasks (args.ray); the fleet report in args.out and its summary line on stdout; the
  exit code: 130 interrupted, else 2 when a segment could not be replayed, else 1 when one is past its tolerance, else 0."""
  names = [segment_name(f) for f in folders]
  if len(set(names)) < len(names):
    twice = sorted({n for n in names if names.count(n) > 1})[0]
    raise RouteError(f"two segments named {twice}: their outputs would go to one folder ({', '.join(f for f in folders if segment_name(f) == twice)})")
  report = FleetReport(names, args.out, "ray" if args.ray else f"{args.jobs} local processes")
  with interrupts_handled():
    try:
      if args.ray:
        with ray_session(args.ray): interrupted = run_ray(folders, flags, args, report)
      else: interrupted = run_jobs(folders, flags, args.jobs, report)
    except KeyboardInterrupt: interrupted = True  # before the first replay started (Ray starting) or after the last
    print(report.write(interrupted), flush=True)
  return 130 if interrupted else report.exit_code()
