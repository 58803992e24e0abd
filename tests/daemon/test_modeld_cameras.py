"""modeld and camerad: restarts and geometry changes (the matching warp, or a wait), and cameras that misbehave: clocks an hour apart,
a camera up but idle, frame ids that jump, a pause in lockstep, clocks that stop, buffers a geometry change leaves. Each fault test
reproduces a failure seen before the fix."""
import os
import re
import shutil
import signal
import threading
import time

import pytest

import modeld_daemon
from modeld_daemon import BIG_FRAME, FRAME, SOF0, Daemon, finite_and_valid, frames_for, reference

artifacts, split_09 = modeld_daemon.artifacts, modeld_daemon.split_09  # the daemon tests' fixtures, by name

HOUR_NS = 3600 * 10**9

def test_camerad_restart(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  daemon.exchange(range(20))
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("reconnected to camerad", after=seen)
  daemon.exchange(range(20, 30))
  assert daemon.stop() == 0 and daemon.left_no_cycles(), "nor does a reconnect and reload"
  assert [daemon.raw(i) for i in range(30)] == reference(artifacts, list(range(30))), "every output came from the new buffers"

def test_camera_geometry_change_loads_the_matching_warp(artifacts, openpilot_prefix):
  """camerad comes back with 1928x1208 buffers: modeld loads that geometry's warp and intrinsics, then back to 1344x760 (smaller buffers)."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(10))
  for frame, ids, warp, sensor in ((BIG_FRAME, range(100, 110), "warp_big_split.bin", "ar0231"), (FRAME, range(200, 210), "warp_split.bin", "os04c10")):
    seen = len(daemon.lines)
    daemon.restart_camerad(frame)
    daemon.wait_for_line(f"camera geometry changed to {frame.width}x{frame.height}", after=seen)
    daemon.exchange(ids)
    assert [daemon.raw(i) for i in ids] == reference(artifacts, list(ids), frame, warp, sensor), f"{frame.width}x{frame.height} through its own warp"
  assert daemon.stop() == 0

def test_camera_geometry_without_a_warp_waits(artifacts, tmp_path, openpilot_prefix):
  folder = tmp_path / "artifacts"
  folder.mkdir()
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), folder / name)
  daemon = Daemon(str(folder))
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("no warp bundle", after=seen)
  for frame_id in range(100, 120): daemon.send(frame_id)
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("camera geometry changed to 1344x760", after=seen)
  daemon.exchange(range(200, 205))
  assert daemon.stop() == 0, "it waited instead of exiting"
  assert not set(daemon.published) & set(range(100, 120)), "nothing published while no warp fit the camera"
  assert sum("no warp bundle" in line for line in daemon.lines) == 1, "one clear line while waiting"

def send_pair(daemon: Daemon, frame_id: int, wide_ahead_ns: int = 0) -> None:
  """One road + wide frame straight through the VisionIPC server, the wide one's timestamps shifted by `wide_ahead_ns`."""
  from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
  road, wide = frames_for(frame_id)
  sof = SOF0 + frame_id * 50_000_000
  daemon.replay.server.send(VisionStreamType.ROAD, road.tobytes(), frame_id, sof, sof + 20_000_000)
  daemon.replay.server.send(VisionStreamType.WIDE_ROAD, wide.tobytes(), frame_id, sof + wide_ahead_ns, sof + wide_ahead_ns + 20_000_000)

class Camera:
  """camerad at 20 Hz in a thread: frame ids counting up from `first`, the wide timestamps `wide_ahead_ns` ahead (changeable)."""
  def __init__(self, daemon: Daemon, first: int, wide_ahead_ns: int):
    self.frame_id, self.wide_ahead_ns, self.stop = first, wide_ahead_ns, threading.Event()
    def serve():
      while not self.stop.wait(0.05):  # camerad's rate, not a wait for a condition
        send_pair(daemon, self.frame_id, self.wide_ahead_ns)
        self.frame_id += 1
    self.thread = threading.Thread(target=serve, daemon=True)
    self.thread.start()

  def close(self) -> None:
    self.stop.set()
    self.thread.join()

def published_after(daemon: Daemon, frame_id: int, timeout: float = 10) -> int:
  """Collect until modelV2 for a frame id after `frame_id` arrived; that id."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    daemon.collect()
    if later := [i for i in daemon.published if i > frame_id]: return later[0]
    assert daemon.proc.poll() is None, "".join(daemon.lines)
  raise AssertionError(f"nothing published after frame {frame_id}: {''.join(daemon.lines[-20:])}")

def test_wide_camera_an_hour_ahead_then_sigterm(artifacts, openpilot_prefix):
  """The frame sync used to skip road frames forever while the wide camera's timestamps were an hour ahead: nothing published, nothing
  said, SIGTERM ignored. Now it gives up after a second, says so once per episode, recovers, and SIGTERM ends it within a second."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(10))
  camera = Camera(daemon, 10, HOUR_NS)
  try:
    daemon.wait_for_line("frame sync:", timeout=10)
    camera.wide_ahead_ns = 0
    back = camera.frame_id
    recovered = published_after(daemon, back)
    assert daemon.messages[recovered]["modelV2"][0].frameIdExtra == recovered, "published again once the clocks agree, pairs in sync"
    camera.wide_ahead_ns = HOUR_NS
    daemon.wait_for_line("frame sync:", after=len(daemon.lines))
    t = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(timeout=10)
    elapsed = time.monotonic() - t
  finally:
    camera.close()
    daemon.replay.close()
  assert code == 0 and elapsed < 1.0, f"exit {code} after {elapsed:.2f} s"
  assert sum("frame sync: no extra frame" in line for line in daemon.lines) == 2, "one line per episode: " + "".join(daemon.lines)

def test_idle_camera_and_frame_id_jumps_log_once_per_episode(split_09, openpilot_prefix):
  """A camera up but idle logged 'reconnected' every 0.5 s; frames arriving with jumping ids logged a line each (a generation whose frames
  after a drop are prepare-only, the ones that say so)."""
  daemon = Daemon(split_09)
  daemon.exchange(range(5))
  time.sleep(2.6)  # the stimulus: camerad up, no frames for 2.6 s (5 reconnect periods)
  daemon.exchange(range(5, 10))
  pace = threading.Event()
  for frame_id in range(12, 42, 2):  # every id a jump, at camerad's rate
    send_pair(daemon, frame_id)
    pace.wait(0.05)
  daemon.exchange(range(41, 46))
  assert daemon.stop() == 0
  lines = "".join(daemon.lines)
  assert lines.count("reconnected to camerad") == 1 and re.search(r"frames again after reconnecting to camerad \((\d+) times\)", lines), lines
  jumps = re.search(r"frame ids jumped on consecutive frames \((\d+) times\)", lines)
  assert lines.count("dropped before it") == 1 and jumps and 2 <= int(jumps[1]) <= 15, lines

def test_reconnect_after_keeps_the_camera_through_a_pause(artifacts, openpilot_prefix):
  """--reconnect-after 30 (route_replay's lockstep: its frames pause while the reference catches up): camerad idle for 1.5 s, three
  times the default 0.5 s, is no re-attachment; the frame after the pause is published."""
  daemon = Daemon(artifacts, args=("--reconnect-after", "30"))
  daemon.exchange(range(5))
  time.sleep(1.5)  # the stimulus: camerad up, no frames
  daemon.exchange(range(5, 8))
  assert daemon.stop() == 0
  assert not any("reconnect" in line for line in daemon.lines), "".join(daemon.lines)

def memory(pid: int) -> tuple[int, int]:
  """(resident kB, shared mappings) of process `pid`, from /proc: camera buffers and tinygrad's CPU buffers are shared mappings."""
  rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
  return rss, sum(1 for line in open(f"/proc/{pid}/maps") if line.split()[1].endswith("s"))

def test_camera_geometry_changes_release_the_old_buffers(artifacts, openpilot_prefix):
  """Each geometry change used to leave the old adapter's buffers mapped until the cycle collector happened to run: ~9 MB RSS and
  ~9 shared mappings more per change here (a tiny model; a real one's buffers are larger)."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  samples = []
  for change in range(12):
    frame = BIG_FRAME if change % 2 == 0 else FRAME
    seen = len(daemon.lines)
    daemon.restart_camerad(frame)
    daemon.wait_for_line(f"camera geometry changed to {frame.width}x{frame.height}", after=seen)
    daemon.exchange(range(100 * (change + 1), 100 * (change + 1) + 3))
    samples.append(memory(daemon.proc.pid))
  assert daemon.stop() == 0
  (rss0, maps0), (rss1, maps1) = samples[1], samples[-1]  # both geometries loaded once, then 10 changes later, on the same geometry
  assert maps1 <= maps0, f"shared mappings grew from {maps0} to {maps1}: {samples}"
  assert rss1 - rss0 < 10_000, f"RSS grew by {(rss1 - rss0) / 1000:.0f} MB over 10 geometry changes: {samples}"

def send_clocked(daemon: Daemon, frame_id: int, road_sof: int, wide_sof: int) -> None:
  """A road + wide pair with the given start-of-frame times, a calibration every 20 frames (as fake_camerad sends it)."""
  from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
  road, wide = frames_for(frame_id)
  daemon.replay.server.send(VisionStreamType.ROAD, road.tobytes(), frame_id, road_sof, road_sof + 20_000_000)
  daemon.replay.server.send(VisionStreamType.WIDE_ROAD, wide.tobytes(), frame_id, wide_sof, wide_sof + 20_000_000)
  if frame_id % 20 == 0: daemon.replay.send_calibration()

@pytest.mark.parametrize("clock", ["both zero", "road zero", "frozen"])
def test_camera_timestamps_that_stop_are_paired_by_frame_id_and_published_invalid(artifacts, openpilot_prefix, clock):
  """Camera timestamps all 0 (both cameras, or the road one alone), or a frozen clock: nothing was published, and the one line blamed the
  extra camera. Now a clock that stops while frame ids go on is said once, frames are paired by frame id and published valid=False; once
  the clock runs again they are valid."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(20))
  start = SOF0 + 20 * 50_000_000
  stopped = {"both zero": lambda i: (0, 0), "road zero": lambda i: (0, start + i * 50_000_000), "frozen": lambda i: (start, start)}[clock]
  send_clocked(daemon, 20, *stopped(20))  # the first frame of the stop is skipped (its clock looks 25 ms short), the next pair by frame id
  for frame_id in range(21, 40):
    send_clocked(daemon, frame_id, *stopped(frame_id))
    daemon.receive(frame_id)
  for frame_id in range(40, 50):
    send_clocked(daemon, frame_id, start + frame_id * 50_000_000, start + frame_id * 50_000_000)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(daemon.messages[i]["modelV2"][0].frameIdExtra == i for i in range(21, 50)), "road and wide frames of one id paired"
  assert not any(valid for i in range(21, 40) for _, valid in daemon.messages[i].values()), "no message of a stopped clock is valid"
  assert all(finite_and_valid(daemon, i) for i in range(41, 50)), "valid again once the clock runs"
  lines = "".join(daemon.lines)
  said = re.findall(r"camera timestamps (stopped|went back)", lines)  # to 0 the clock first goes back, a frozen one stops
  assert said == ["stopped" if clock == "frozen" else "went back"] and "no extra frame within" not in lines, lines
