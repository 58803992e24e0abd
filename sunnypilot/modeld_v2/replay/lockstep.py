"""The serving side of a replay, camerad's and the log's: a segment's frames over VisionIPC and its logged input events over msgq, in log
time order, each frame once its daemon has published the one before (lockstep: nothing drops, a run is deterministic) or at 20 Hz
(realtime); every message the daemons publish is kept (Published)."""
from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

import msgq
import numpy as np

from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.daemon.messaging import has_service, pub_master
from sunnypilot.modeld_v2.daemon.messaging import log as capnp_log
from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
from sunnypilot.modeld_v2.replay.log_state import LogState
from sunnypilot.modeld_v2.replay.model_daemons import DRIVER_SERVICE, FRAME_TIMEOUT_S, OUTPUT_SERVICES, Modeld
from sunnypilot.modeld_v2.replay.route_segment import INPUT_SERVICES, CameraFrame, EventFeed, InputEvent, RouteError, Segment

# A road frame not answered in this long goes out again, alone. The replay stopped (a loaded machine, a debugger) between a frame's road and
# wide buffers for over the 100 ms modeld's camera sync waits for the wide one: modeld took the road frame and dropped it, and would wait
# for the next while lockstep waits for this one. Sent again, the road frame pairs with the wide one modeld holds; a modeld that paired
# them already skips it (openpilot's sync takes a road frame only 25 ms past the last wide one), and the driver stream has no pairs.
RESEND_S = 1.0

class Published:
  """What the daemons publish (`services`), every message (no conflation), by service and frame id, and in arrival order for the log."""
  def __init__(self, services: tuple[str, ...] = OUTPUT_SERVICES):
    self.socks = {s: msgq.sub_sock(s, conflate=False, timeout=10) for s in services}
    self.raw: list[bytes] = []
    self.by_frame: dict[str, dict[int, Any]] = {s: {} for s in services}

  def poll(self) -> bool:
    got = False
    for service, sock in self.socks.items():
      while (raw := sock.receive(non_blocking=True)) is not None:
        self.raw.append(raw)
        event = next(iter(capnp_log.Event.read_multiple_bytes(raw)))
        self.by_frame[service][getattr(event, service).frameId] = getattr(event, service)
        got = True
    return got

  def wait(self, frame_ids: list[int], modeld: Modeld, timeout: float, services=OUTPUT_SERVICES) -> bool:
    """Until every service in `services` published each of `frame_ids`; False at the timeout."""
    deadline = time.monotonic() + timeout
    while not all(f in self.by_frame[s] for s in services for f in frame_ids):
      if not self.poll():
        modeld.check()
        if time.monotonic() > deadline: return False
        time.sleep(0.0005)
    return True

def lockstep_wait(published: Published, modeld: Modeld, frame_id: int, service: str = "modelV2", resend: Callable[[], object] | None = None) -> None:
  """Until `service` (modeld's modelV2, dmonitoringmodeld's driverStateV2) for frame_id arrived. With `resend`, a frame not answered in
  RESEND_S is sent again, then after twice as long, and so on (a few times in FRAME_TIMEOUT_S, far fewer than camerad's buffers)."""
  deadline, wait = time.monotonic() + FRAME_TIMEOUT_S, RESEND_S if resend is not None else FRAME_TIMEOUT_S
  while not published.wait([frame_id], modeld, min(wait, deadline - time.monotonic()), services=(service,)):
    if time.monotonic() >= deadline:
      raise RouteError(f"{modeld.name} published nothing for frame {frame_id} in {FRAME_TIMEOUT_S:.0f} s: {modeld.last_line()}")
    if resend is not None: resend()
    wait *= 2

class Lockstep:
  """camerad (FakeCamerad, with the driver stream when `driver`) and the log's publishers for one segment, and what the daemons publish.
  `run` serves the segment; `sent`, `driver_sent` and `seconds` say what it served and how long the frames took."""
  def __init__(self, segment: Segment, driver: bool, realtime: bool):
    self.segment, self.realtime = segment, realtime
    self.camerad = FakeCamerad(segment.frame, wide=True, rpy=None, driver=driver)
    self.inputs = pub_master([s for s in INPUT_SERVICES if has_service(s)])
    self.published = Published(OUTPUT_SERVICES + (DRIVER_SERVICE,) * driver)
    self.state = LogState()
    self.sent = self.driver_sent = 0
    self.seconds = 0.0

  def send_events(self, events: list[InputEvent]) -> None:
    for event in events:
      if event.service in self.state.seen:
        self.inputs.send(event.service, event.raw)
        self.state.update(event.service, event.data)

  def run(self, daemons: list[Modeld], frames: list[CameraFrame], driver_frames: list[CameraFrame], decoders: list,
          on_road: Callable[[LogState, CameraFrame, np.ndarray, np.ndarray], None], on_driver: Callable[[LogState, CameraFrame, np.ndarray], None],
          report: Callable[[str], None]) -> None:
    """Serve `frames` (decoded by decoders[0]) to daemons[0] and `driver_frames` (decoders[1]) to daemons[1], each after the events logged
    before it (the driver camera runs on its own clock); on_road and on_driver see each frame as it goes out, with the log state modeld
    reads with it."""
    for daemon in daemons: daemon.wait_running()
    published, camerad, state = self.published, self.camerad, self.state
    published.poll()  # a msgq reader re-registers on its first receive after the publisher appeared, skipping what was sent before
    feed, t0, (roads, drivers) = EventFeed(self.segment.events), time.monotonic(), [iter(d) for d in decoders] + [None] * (2 - len(decoders))
    timeline = sorted([(f.log_time, 0, k) for k, f in enumerate(frames)] + [(f.log_time, 1, j) for j, f in enumerate(driver_frames)])
    for _, is_driver, k in timeline:
      cam = (driver_frames if is_driver else frames)[k]
      self.send_events(feed.until(cam.log_time))
      if is_driver:
        camerad.send_driver(cam.frame_id, buf := next(drivers), sof=cam.sof, eof=cam.eof)
        on_driver(state, cam, buf)
        if self.realtime: published.poll()
        else: lockstep_wait(published, daemons[1], cam.frame_id, DRIVER_SERVICE)
        self.driver_sent += 1
        continue
      road, wide = next(roads)
      camerad.send(cam.frame_id, road, wide, sof=cam.sof, eof=cam.eof)
      self.sent += 1
      on_road(state, cam, road, wide)  # the reference computes while modeld runs
      state.next_frame()  # the events sent from now on reach modeld with the next frame
      if self.realtime:
        published.poll()
        time.sleep(max(0.0, t0 + k * 0.05 + 0.05 - time.monotonic()))
      else: lockstep_wait(published, daemons[0], cam.frame_id,
                          resend=functools.partial(camerad.send_frame, VisionStreamType.ROAD, road, cam.frame_id, cam.sof, cam.eof))
      if (k + 1) % 200 == 0: report(f"{self.segment.name}: {k + 1}/{len(frames)} frames, {(k + 1) / (time.monotonic() - t0):.1f} frames/s")
    self.seconds = time.monotonic() - t0
    self.wait_for_last(daemons, frames, driver_frames, report)

  def wait_for_last(self, daemons: list[Modeld], frames: list[CameraFrame], driver_frames: list[CameraFrame], report: Callable[[str], None]) -> None:
    """After the last frame went out: modeld's (and dmonitoringmodeld's) messages still on their way. In realtime the frames in flight
    are not drops: up to 2 s for the last one's."""
    published = self.published
    if self.realtime: published.wait([frames[-1].frame_id], daemons[0], 2.0, services=("modelV2",))
    done = sorted(published.by_frame["modelV2"]) if self.realtime else [f.frame_id for f in frames]
    if not published.wait(done, daemons[0], 10.0, services=OUTPUT_SERVICES): report("warning: some drivingModelData/cameraOdometry messages never arrived")
    if driver_frames and self.realtime: published.wait([driver_frames[-1].frame_id], daemons[1], 2.0, services=(DRIVER_SERVICE,))

  def close(self) -> None: self.camerad.close()
