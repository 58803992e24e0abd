"""A model daemon's periodic status line, and openpilot's frame-drop accounting it counts drops with."""
from __future__ import annotations

import json
import time

from sunnypilot.modeld_v2.common.files import replaced_atomically
from sunnypilot.modeld_v2.model.constants import DT_MDL

STATUS_EVERY_S = 5.0  # seconds between a daemon's status lines (frames, drops, execution time)
# what a daemon's --timings records per published frame, in monotonic ns: frames received and synced, host inputs filled, camera frames
# bound, model launched, outputs read back (the device done), outputs parsed and the first message filled, serialized, sent (modeld's
# modelV2: what controls wait for, so it goes first), then the other messages filled, serialized and sent (modeld's drivingModelData and
# cameraOdometry; dmonitoringmodeld has none: its "others" is its "send"), then the models in the shadow run on the frame (a set warming
# up, the other model of a big/small pair; none: right after "others"): the frame's end
STAGE_STAMPS = ("received", "inputs", "copy", "run", "readback", "parse_fill", "serialize", "send", "others", "shadow")

def write_timings(path: str, frames: list) -> None:
  """--timings on exit: per published frame [frame_id, monotonic ns at each of STAGE_STAMPS], as JSON (benchmarks.bench_daemon reads it)."""
  with replaced_atomically(path) as (tmp,), open(tmp, "w") as f: json.dump({"stamps": ["frame_id", *STAGE_STAMPS], "frames": frames}, f)

class FirstOrderFilter:
  def __init__(self, x0: float, rc: float, dt: float):
    self.x, self.k = x0, dt / (rc + dt)

  def update(self, x: float) -> float:
    self.x = (1 - self.k) * self.x + self.k * x
    return self.x

class FrameDrops:
  """openpilot's drop accounting: dropped = frame ids skipped since the last one; filtered with rc=10 s; 0 for the first 10 runs."""
  def __init__(self):
    self.filter, self.runs, self.last_frame_id = FirstOrderFilter(0.0, 10.0, DT_MDL), 0, None

  def update(self, frame_id: int) -> tuple[int, float]:
    """(frames dropped before this one, frameDropPerc)."""
    dropped = 0 if self.last_frame_id is None else max(0, frame_id - self.last_frame_id - 1)
    self.last_frame_id = frame_id
    filtered = self.filter.update(min(dropped, 10))
    if self.runs < 10: self.filter.x = filtered = 0.0
    self.runs += 1
    return dropped, 100 * filtered / (1 + filtered)

class Status:
  """A daemon's periodic status line: frames published, dropped and the model's execution time since the last line, every `every_s`
  seconds of frames (never with 0)."""
  def __init__(self, every_s: float = STATUS_EVERY_S):
    self.every_ns = int(every_s * 1e9) if every_s > 0 else 1 << 62
    self.published = 0
    self.times: list[float] = []  # modelExecutionTime of each frame published since the last line
    self.dropped = 0  # frames dropped since the last line
    self.start(time.monotonic_ns())

  def start(self, now_ns: int) -> None:
    """Count from `now_ns` (frames start running)."""
    self.since_ns, self.next_ns = now_ns, now_ns + self.every_ns

  def line(self, now_ns: int, published: int) -> str:
    times, elapsed = sorted(self.times), (now_ns - self.since_ns) / 1e9  # lines come with frames: after a stall, more than every_s
    ms = f", modelExecutionTime p50 {times[len(times) // 2] * 1e3:.1f} ms, max {times[-1] * 1e3:.1f} ms" if times else ""
    line = f"status: {published} frames published, {published - self.published} in the last {elapsed:.1f} s, {self.dropped} dropped{ms}"
    self.times, self.dropped, self.published = [], 0, published
    self.start(now_ns)
    return line
