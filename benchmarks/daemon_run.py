"""A model daemon as a user meets it, for the daemon benchmarks: modeld (or dmonitoringmodeld) in its own process with --timings, camerad's
stand-in (FakeCamerad) serving its frames and a car's messages published before each, its messages taken off the bus here; what a frame
costs from the VisionIPC send to the message received, the daemon's CPU time, and its own stamps split into stages."""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from benchmarks.car_bus import BUS_SERVICES, bus_traffic
from benchmarks.common import percentiles
from sunnypilot.modeld_v2.daemon.status import STAGE_STAMPS

WARMUP = 40  # lockstep frames before timing: the bundle's first runs, the camera buffers' first bindings (2 x 18)

def cpu_seconds(pid: int) -> float:
  """utime + stime of a process so far (clock ticks of /proc/<pid>/stat)."""
  with open(f"/proc/{pid}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

# the daemons bench_daemon --daemon runs and the message whose arrival ends a frame's latency
DAEMONS = {"modeld": "modelV2", "dmonitoringmodeld": "driverStateV2"}

class Receiver:
  """`service` (modelV2, or dmonitoringmodeld's driverStateV2) arrivals: frame id -> monotonic ns when the message was taken off the socket
  (before it is parsed)."""
  def __init__(self, service: str = "modelV2"):
    import msgq
    self.poller, self.service = msgq.Poller(), service
    self.sock = msgq.sub_sock(service, poller=self.poller, conflate=False)
    self.arrived: dict[int, int] = {}

  def wait(self, until_ns: int, frame_id: int | None = None) -> None:
    """Take every modelV2 that arrives until monotonic `until_ns`, or until the one of `frame_id` has arrived."""
    from sunnypilot.modeld_v2.daemon.messaging import log
    while (left := until_ns - time.monotonic_ns()) > 0 and (frame_id is None or frame_id not in self.arrived):
      if not self.poller.poll(max(1, left // 1_000_000)): continue
      while (raw := self.sock.receive(non_blocking=True)) is not None:
        t = time.monotonic_ns()
        with log.Event.from_bytes(raw) as event: self.arrived[getattr(event, self.service).frameId] = t

STAGES = STAGE_STAMPS[1:]  # each named for the stamp that ends it, from modeld's receive on
# the model run is inputs -> readback (copy, run, readback); modelV2 is sent at "send"
INPUTS, READBACK, SENT = STAGE_STAMPS.index("inputs"), STAGE_STAMPS.index("readback"), STAGE_STAMPS.index("send")

def modeld_split(stamps: list[list[int]]) -> dict:
  """From per-frame STAGE_STAMPS (ns): percentiles (ms) of modeld's added latency (receive -> modelV2 sent, minus the model run), the model
  run and each stage."""
  ms = lambda ns: ns / 1e6
  return {"added_in_modeld_ms": percentiles([ms(r[SENT] - r[0] - (r[READBACK] - r[INPUTS])) for r in stamps]),
          "model_run_ms": percentiles([ms(r[READBACK] - r[INPUTS]) for r in stamps]),
          "stages_ms": {name: percentiles([ms(r[i + 1] - r[i]) for r in stamps]) for i, name in enumerate(STAGES)}}

def run_rate(artifacts: str, frame: Any, rate: float, frames: int, log: Callable[[str], None], core: int | None = None, bus: bool = True,
             daemon: str = "modeld") -> dict:
  """One modeld process (or `daemon`: dmonitoringmodeld, fed the driver stream, a cabin_scene face, after one liveCalibration; pinned to
  `core` if given: --core), `frames` timed frames at `rate` Hz (0: lockstep) after WARMUP lockstep frames; with `bus`, bus_traffic()
  published before each frame."""
  from sunnypilot.modeld_v2.daemon.messaging import pub_master
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad, synthetic_frames
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  prefix = f"bench_daemon_{uuid.uuid4().hex[:10]}"
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}", exist_ok=True)
  dm = daemon == "dmonitoringmodeld"
  if dm:
    from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
    source = [cabin_scene(frame, i) for i in range(40)]
  else: source = synthetic_frames(frame)
  timings = os.path.join(tempfile.mkdtemp(prefix="bench_daemon_"), "timings.json")
  replay = FakeCamerad(frame, driver=dm)
  receiver = Receiver(DAEMONS[daemon])
  traffic, bus_pm = (bus_traffic(), pub_master(list(BUS_SERVICES))) if bus else ({}, None)
  modeld = Modeld(artifacts, ["--timings", timings, *(["--core", str(core)] if core is not None else [])], echo=False, daemon=daemon)
  try:
    modeld.wait_running(300)
    if dm: replay.send_calibration()  # dmonitoringmodeld's calib (FakeCamerad.send publishes it with road frames)
    sent, publish_ns, sof0 = {}, {}, time.monotonic_ns()
    def send(frame_id: int) -> None:
      for service, raw in traffic.items(): bus_pm.send(service, raw)  # before the frame: the car's messages of the last 50 ms
      t = time.monotonic_ns()
      # start-of-frame on camerad's 20 Hz sensor clock whatever the send rate: modeld pairs road and wide frames by it (25 ms)
      if dm: sent[frame_id] = replay.send_driver(frame_id, source[frame_id % len(source)], sof=sof0 + frame_id * 50_000_000)
      else: sent[frame_id] = replay.send(frame_id, *source[frame_id % len(source)], sof=sof0 + frame_id * 50_000_000)
      publish_ns[frame_id] = time.monotonic_ns() - t
    def lockstep(frame_id: int) -> None:
      send(frame_id)
      receiver.wait(time.monotonic_ns() + 2_000_000_000, frame_id)
    for frame_id in range(WARMUP): lockstep(frame_id)
    cpu0, start = cpu_seconds(modeld.proc.pid), time.monotonic_ns()
    timed = range(WARMUP, WARMUP + frames)
    for i, frame_id in enumerate(timed):
      if rate: receiver.wait(start + int(i * 1e9 / rate))
      if rate: send(frame_id)
      else: lockstep(frame_id)
    elapsed_s = (time.monotonic_ns() - start) / 1e9  # the frames' span: the achieved rate
    receiver.wait(time.monotonic_ns() + 500_000_000)  # the last frames' messages
    cpu_s = cpu_seconds(modeld.proc.pid) - cpu0
  finally:
    modeld.stop()  # SIGTERM: modeld writes its timings on the way out
    replay.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  with open(timings) as f: stamps = {row[0]: row[1:] for row in json.load(f)["frames"]}
  shutil.rmtree(os.path.dirname(timings), ignore_errors=True)
  got = [f for f in timed if f in receiver.arrived]
  own = [f for f in got if f in stamps]
  ms = lambda ns: ns / 1e6
  return {"rate_hz": rate, "frames": frames, "received": len(got), "drops": frames - len(got), "wall_s": elapsed_s,
          "achieved_hz": len(got) / elapsed_s if elapsed_s else 0.0, "modeld_cpu_ms_per_frame": 1e3 * cpu_s / max(len(got), 1),
          "latency_ms": percentiles([ms(receiver.arrived[f] - sent[f]) for f in got]),
          "added_ms": percentiles([ms(stamps[f][SENT] - sent[f] - (stamps[f][READBACK] - stamps[f][INPUTS])) for f in own]),
          "delivery_ms": percentiles([ms(stamps[f][0] - sent[f]) for f in own]),
          "bus_ms": percentiles([ms(receiver.arrived[f] - stamps[f][SENT]) for f in own]),
          **modeld_split([stamps[f] for f in own]),
          "fake_camerad_publish_ms": percentiles([ms(publish_ns[f]) for f in timed if f in publish_ns]),
          "modeld_log_tail": modeld.lines[-3:]}
