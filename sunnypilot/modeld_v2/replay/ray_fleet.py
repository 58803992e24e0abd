"""route_replay --ray's Ray driver, run by the fleet (fleet_replay) in a process of its own, `route_replay ... --driver RUN`: Ray ends its
driver's process when the driver's node is lost, and the fleet then still reports what finished and removes what is left.

Each segment is a task reserving --replay-cpus CPUs (default 1), so a node runs at most its CPU count of replays at a time; each task
runs one `route_replay SEGMENT --result FILE` process in the namespace the run names for it (replay_process.fleet_namespace) and ends
what is left of it when it ends. Each settled record goes to the run's records folder as it comes. Without an address a local Ray
instance is started for the run, its files in ray_temp(RUN); with one (`auto`, or the head's HOST:PORT) the run joins that cluster.
The artifacts folder's bundles and the reference files are put once in Ray's object store; each node fetches them once and writes them to
node_folder(RUN), removed at the end. The segment folders and --out are read and written at the same paths on every node: on a cluster,
a shared filesystem."""
from __future__ import annotations

import argparse
import contextlib
import glob
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator

from sunnypilot.modeld_v2.common.cli import child_env, interrupts_handled, on_interrupt
from sunnypilot.modeld_v2.compile.model_plan import model_files
from sunnypilot.modeld_v2.replay.fleet_report import error_record, write_record
from sunnypilot.modeld_v2.replay.replay_process import (
  NAMESPACE_ENV,
  REPLAY,
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

CANCEL_S = 2.0  # interrupted: how long cancelled tasks get to stop their replays before the driver ends (the fleet kills it after DRIVER_STOP_S)
CLEAN_S = 20.0  # the nodes' clean-up at the end of a run: each ends what is left of the run's replays and removes its copy

log = logging.getLogger(__name__)

def node_folder(run: str) -> str: return os.path.join(tempfile.gettempdir(), f"route_replay_fleet_{run}")

def ray_temp(run: str) -> str:
  """A local Ray instance's session files and logs, for this run only (a short path: Ray's sockets live in it)."""
  return os.path.join(tempfile.gettempdir(), f"ray_{run}")

def shipped_files(args: argparse.Namespace) -> tuple[dict[str, bytes], list[str]]:
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

def replay_task(folder: str, flags: list[str], shipped: list, node_flags: list[str], run: str, prefix: str) -> dict:
  """A Ray task: one segment replayed by a route_replay process on this node in the namespace `prefix`, its output kept for the error
  line; the record."""
  task_started = time.time()
  copy = node_copy(shipped, run)
  local = [os.path.join(copy, a) if k % 2 else a for k, a in enumerate(node_flags)]
  with tempfile.TemporaryDirectory(prefix="task_", dir=copy) as tmp:  # in the run's folder: a killed worker's goes with it at the end
    with open(output := os.path.join(tmp, "output.log"), "w") as out:
      record_path, started = os.path.join(tmp, "record.json"), time.time()
      proc = subprocess.Popen(replay_command(folder, flags + local, record_path), stdout=out, stderr=subprocess.STDOUT,
                              env=child_env() | {NAMESPACE_ENV: prefix})
      try:
        try:
          while proc.poll() is None: time.sleep(0.1)  # not proc.wait(): ray.cancel's KeyboardInterrupt lands between Python calls, never in one
        except KeyboardInterrupt:  # ray.cancel: stop the replay, then end as cancelled
          stop(proc)
          raise
        times = timed(started, task_started=task_started)
      finally: end_namespaces([prefix])
    with open(output) as f: lines = [line.strip() for line in f if line.strip()]
    record = outcome(folder, proc.returncode, record_path, lines[-1] if lines else "")
  return record | times | {"node": socket.gethostname(), "task_ended": time.time()}

def clean_node(run: str, prefixes: list[str]) -> None:
  """What a run leaves on a node: the replays of `prefixes` still there (a worker was killed) and the node's copy of the shipped files."""
  end_namespaces(prefixes)
  shutil.rmtree(node_folder(run), ignore_errors=True)

@contextlib.contextmanager
def ray_session(address: str, run: str) -> Iterator[None]:
  """Ray for this run: a local instance started here (`local`, its files in ray_temp(run)), or the cluster at `address`."""
  import ray
  os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # nothing leaves this machine unasked
  options: dict = {"log_to_driver": False, "logging_level": logging.WARNING}  # each task keeps its replay's output; errors come back in records
  if address == "local":
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))  # the workers import this package, this copy
    os.makedirs(temp := ray_temp(run), exist_ok=True)
    options |= {"include_dashboard": False, "_temp_dir": temp}
  try: ray.init(address=None if address == "local" else address, **options)
  except Exception as e:
    raise RouteError(f"cannot {'start Ray' if address == 'local' else f'join the Ray cluster at {address}'}: {type(e).__name__}: {e}") from None
  try: yield
  finally: ray.shutdown()

def task_record(ref, folder: str) -> dict | None:
  """A finished task's record; a worker or node that died is a lost replay; None for a task cancelled here."""
  import ray
  try: return ray.get(ref)
  except ray.exceptions.TaskCancelledError: return None
  except ray.exceptions.RayTaskError as e: return error_record(segment_name(folder), f"the task failed: {type(e.cause).__name__}: {e.cause}")
  except ray.exceptions.RayError as e: return error_record(segment_name(folder), f"{type(e).__name__}: {str(e).splitlines()[0]}", lost=True)

class RayRun:
  """The tasks of a run, each segment's record settled (Attempts: a lost replay once more) as its task ends."""
  def __init__(self, folders: list[str], flags: list[str], args: argparse.Namespace, run: str, settled: Callable[[dict], None]):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    self.ray, self.affinity, self.run = ray, NodeAffinitySchedulingStrategy, run
    self.folders, self.attempts = folders, Attempts(settled, log.info)
    files, self.node_flags = shipped_files(args)
    self.shipped = [ray.put(files)]  # in a list: a task fetches it only when its node has no copy yet
    self.flags = flags + ["--out", os.path.abspath(args.out)]
    self.task = ray.remote(replay_task).options(num_cpus=args.replay_cpus, max_retries=0)  # a lost replay is retried here, once, and said so
    self.ender, self.cleaner = ray.remote(num_cpus=0)(end_namespaces), ray.remote(num_cpus=0)(clean_node)
    self.refs: dict = {}  # task -> (segment folder, its namespace)
    self.cleaning: list = []  # the nodes' clean-ups after a lost task
    for folder in folders: self.submit(folder)
    log.info(f"{len(folders)} segments as Ray tasks of {args.replay_cpus:g} CPU(s) on {sum(n['Alive'] for n in ray.nodes())} node(s), "
             f"{ray.cluster_resources().get('CPU', 0):g} CPUs")

  def submit(self, folder: str) -> None:
    prefix = fleet_namespace(self.run, self.folders.index(folder), self.attempts.attempt(folder))
    self.refs[self.task.remote(os.path.abspath(folder), self.flags, self.shipped, self.node_flags, self.run, prefix)] = folder, prefix

  def on_every_node(self, fn, *args) -> list:
    """`fn` (a remote function) on every node alive: a task's worker may have died on any of them."""
    return [fn.options(scheduling_strategy=self.affinity(n["NodeID"], soft=False)).remote(*args) for n in self.ray.nodes() if n["Alive"]]

  def settle(self, ref, retry: bool = True) -> None:
    folder, prefix = self.refs.pop(ref)
    if (record := task_record(ref, folder)) is None: return
    if record["status"] == "lost": self.cleaning += self.on_every_node(self.ender, [prefix])  # its worker died: what it left is ended where it is
    if self.attempts.settle(folder, record) and retry: self.submit(folder)

  def wait(self) -> None:
    """Until every segment settled."""
    while self.refs:
      ready, _ = self.ray.wait(list(self.refs), num_returns=1, timeout=0.1)  # a SIGTERM's KeyboardInterrupt lands when it returns
      for ref in ready: self.settle(ref)

  def cancel(self) -> None:
    """Interrupted: the tasks that finished settled, those running cancelled (each stops its replay), and those that finish meanwhile
    settled too; no task starts after."""
    self.settle_done(0.0)
    for ref in self.refs: self.ray.cancel(ref)
    self.settle_done(CANCEL_S)

  def settle_done(self, timeout: float) -> None:
    """The tasks done within `timeout` settled, none retried."""
    if self.refs:
      for ref in self.ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout)[0]: self.settle(ref, retry=False)

  def clean(self) -> None:
    """Every node's share of the run removed (its copy, what a killed worker left), waited for a while."""
    prefixes = [fleet_namespace(self.run, k, a) for k in range(len(self.folders)) for a in (0, 1)]
    cleaning = self.cleaning + self.on_every_node(self.cleaner, self.run, prefixes)
    self.ray.wait(cleaning, num_returns=len(cleaning), timeout=CLEAN_S)

def drive(folders: list[str], flags: list[str], args: argparse.Namespace, run: str) -> int:
  """The Ray driver of fleet run `run`: each segment a task, each settled record written into records_folder(run); 0 when every segment
  settled, 130 when interrupted (SIGTERM from the fleet, or Ctrl-C)."""
  records = records_folder(run)
  settled = lambda record: write_record(os.path.join(records, f"{record['segment']}.json"), record)
  with interrupts_handled():
    try:
      with ray_session(args.ray, run):
        on_interrupt()  # ray.init put its own SIGTERM handler (sys.exit) in place of the one that stops the replays
        tasks = RayRun(folders, flags, args, run, settled)
        try:
          try: tasks.wait()
          except KeyboardInterrupt:
            tasks.cancel()
            return 130
        finally: tasks.clean()
    except KeyboardInterrupt: return 130  # while Ray started, or cleaning up
    finally: shutil.rmtree(ray_temp(run), ignore_errors=True)
  return 0

def driver_command(folders: list[str], flags: list[str], run: str) -> list[str]: return [sys.executable, "-m", REPLAY, *folders, *flags, "--driver", run]
