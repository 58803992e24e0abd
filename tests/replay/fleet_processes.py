"""What the fleet tests share: the segments they replay (`good_drive`: three good ones), a local Ray instance of two CPUs per test
module (`local_ray`; CI has two cores), and a fleet run seen through the process table (`Run`: its processes, msgq namespaces and
folders, and what they leave). Fixtures are module-scoped: each test module imports them by name."""
import os
import shutil
import signal
import tempfile
import threading
import time

import pytest

from sunnypilot.modeld_v2.replay.synthetic_route import write_log, write_segment

from conftest import ROOT

FRAMES = 12
LONG_FRAMES = 100  # 5 s of drive, replayed in about as long on two cores
REPLAY, MODELD = "sunnypilot.modeld_v2.replay.route_replay", "sunnypilot.modeld_v2.modeld"

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

@pytest.fixture(scope="module")
def good_drive(tmp_path_factory) -> str:
  """Three good segments of FRAMES frames (one video, three calibrations)."""
  folder = tmp_path_factory.mktemp("good") / "realdata"
  write_segment(str(first := folder / "2026-12-03--07-00-00--0"), (1344, 760), FRAMES)
  for k, rpy in ((1, (0.0, 0.05, 0.02)), (2, (0.0, -0.03, 0.0))):
    shutil.copytree(first, other := folder / f"2026-12-03--07-00-00--{k}")
    write_log(str(other / "rlog.zst"), FRAMES, "os04c10", rpy=rpy)
  return str(folder)

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
