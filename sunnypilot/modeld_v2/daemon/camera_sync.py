"""The daemons' cameras: connecting to camerad's VisionIPC streams, the live buffers' geometry, openpilot's main/extra frame sync and
reconnecting when camerad restarts. Each link's `recv()` gives the next `Frames` (or None): `CameraSync` modeld's synced road/wide pair,
`DriverCamera` dmonitoringmodeld's driver frame. The frame loop is daemon/frame_daemon.py's."""
from __future__ import annotations

import enum
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS, DRIVER_BUFFER

log = logging.getLogger(__name__)

SYNC_NS = 25_000_000  # main and extra frames belong together when their starts are within 25 ms
OUT_OF_SYNC_NS = 10_000_000
SYNC_MAX_SKIP = 20  # frames one sync may skip on a camera (1 s at 20 Hz) before giving up: the cameras' timestamps disagree

class VisionStreamType(enum.IntEnum):  # msgq-ipc has no enum for these
  ROAD = 0
  DRIVER = 1
  WIDE_ROAD = 2

@dataclass
class FrameMeta:
  frame_id: int = 0
  timestamp_sof: int = 0
  timestamp_eof: int = 0

  @staticmethod
  def of(client) -> FrameMeta: return FrameMeta(client.frame_id, client.timestamp_sof, client.timestamp_eof)

@dataclass(frozen=True)
class Frames:
  """One received frame of each camera a daemon reads: its buffers by the model runner's names (runtime/frame_feeds: CAMERA_BUFFERS
  road and wide, DRIVER_BUFFER), the main camera's metadata and the extra one's (the main's again with one camera)."""
  bufs: dict[str, Any]
  meta: FrameMeta
  meta_extra: FrameMeta
  clock_frozen: bool = False  # a camera's timestamps stopped while its frame ids go on (CameraSync.clock_frozen)

def live_frame(client: Any) -> NV12Frame:
  """A connected VisionIPC client's buffer layout (its UV plane taken as the visible rows); ValueError for one no warp can read."""
  if client.uv_offset % client.stride: raise ValueError(f"camera buffers with uv_offset {client.uv_offset} not a whole number of {client.stride} byte rows")
  return NV12Frame(client.width, client.height, client.stride, client.uv_offset // client.stride, client.height // 2, client.buffer_len)

@dataclass(frozen=True)
class Geometry:
  """What the warp and the intrinsics depend on: which camera streams exist and the live buffers' layouts."""
  streams: tuple[int, ...]
  main: NV12Frame
  extra: NV12Frame | None  # the extra (wide) stream's layout, if one is used

  def __str__(self) -> str:
    m = self.main
    return f"{m.width}x{m.height} frames (stride {m.stride}, uv_offset {m.uv_offset}, {m.size} bytes, streams {list(self.streams)})"

class CameraLink:
  """What a daemon's link to camerad keeps whatever streams it reads: waiting for camerad, and when a frame last arrived (a stall is
  camerad gone away or restarted). A subclass connects (`connect`)."""
  def __init__(self, exit_event: threading.Event, episodes: Episodes):
    self.exit, self.episodes = exit_event, episodes
    self.streams: tuple[int, ...] = ()
    self.last_frame = time.monotonic()  # when a camera frame last arrived

  def connect(self) -> bool: raise NotImplementedError
  def recv(self) -> Frames | None: raise NotImplementedError
  def live_geometry(self) -> Geometry: raise NotImplementedError

  def wait_for_camerad(self) -> bool:
    log.info("waiting for camerad")
    while not self.exit.is_set():
      if self.connect(): return True
      self.exit.wait(0.05)
    return False

  def alive(self) -> None:
    """The camera counts as alive from now (a frame arrived, or the daemon just finished loading for it)."""
    self.last_frame = time.monotonic()

  def stalled(self, after_s: float) -> bool:
    """No frame for `after_s` seconds: camerad may have gone away or restarted."""
    return time.monotonic() - self.last_frame > after_s

class DriverCamera(CameraLink):
  """camerad's driver stream, as openpilot's dmonitoringmodeld reads it (VISION_STREAM_DRIVER, conflated: the newest frame)."""
  def __init__(self, exit_event: threading.Event, episodes: Episodes):
    super().__init__(exit_event, episodes)
    self.client: Any = None

  def connect(self) -> bool:
    """Connected to the driver stream; False while camerad is not there or serves no driver stream (said once while it lasts)."""
    from msgq.visionipc import VisionIpcClient
    if not (streams := VisionIpcClient.available_streams("camerad", False)): return False
    if VisionStreamType.DRIVER not in streams:
      self.episodes.happened("driver stream", f"camerad serves streams {sorted(int(s) for s in streams)} but no driver stream "
                             f"({int(VisionStreamType.DRIVER)}): waiting for one")
      return False
    client = VisionIpcClient("camerad", VisionStreamType.DRIVER, True)
    if not client.connect(False): return False
    self.episodes.ended("driver stream", "camerad serves a driver stream again")
    self.client, self.streams = client, tuple(sorted(int(s) for s in streams))
    return True

  def live_geometry(self) -> Geometry:
    """The driver stream's geometry; ValueError for buffers no warp can read."""
    return Geometry(self.streams, live_frame(self.client), None)

  def recv(self) -> Frames | None:
    """The next driver frame within 100 ms, or None."""
    if (buf := self.client.recv(100)) is None: return None
    self.alive()
    meta = FrameMeta.of(self.client)
    return Frames({DRIVER_BUFFER: buf}, meta, meta)

class CameraSync(CameraLink):
  """camerad's road (main) and wide (extra) streams, or the wide one alone as main when there is no road camera."""
  def __init__(self, exit_event: threading.Event, episodes: Episodes):
    super().__init__(exit_event, episodes)
    self.main_wide = self.use_extra = False
    self.client_main: Any = None
    self.client_extra: Any = None
    self.meta_extra = FrameMeta()  # the last extra frame: the next sync starts past it
    self.previous: dict[str, FrameMeta] = {}  # per stream ("main", "extra"), its last frame: a clock that stops is seen against it
    self.frozen: set[str] = set()  # the streams whose timestamps stopped while their frame ids go on

  def connect(self) -> bool:
    from msgq.visionipc import VisionIpcClient
    streams = VisionIpcClient.available_streams("camerad", False)
    if not streams: return False
    self.main_wide = VisionStreamType.ROAD not in streams
    self.use_extra = not self.main_wide and VisionStreamType.WIDE_ROAD in streams
    main = VisionStreamType.WIDE_ROAD if self.main_wide else VisionStreamType.ROAD
    self.client_main = VisionIpcClient("camerad", main, True)
    self.client_extra = VisionIpcClient("camerad", VisionStreamType.WIDE_ROAD, False) if self.use_extra else None
    for client in filter(None, (self.client_main, self.client_extra)):
      if not client.connect(False): return False
    self.streams = tuple(sorted(int(s) for s in streams))
    self.meta_extra, self.previous, self.frozen = FrameMeta(), {}, set()
    return True

  def live_geometry(self) -> Geometry:
    """The connected streams' geometry; ValueError for buffers no warp can read."""
    return Geometry(self.streams, live_frame(self.client_main), live_frame(self.client_extra) if self.client_extra is not None else None)

  @property
  def clock_frozen(self) -> bool:
    """A camera's timestamps stopped while its frame ids go on: frames are paired by frame id, and their times cannot be trusted."""
    return bool(self.frozen)

  def recv_from(self, client, stream: str) -> tuple[Any, FrameMeta] | None:
    """A frame of `client` within 100 ms, or None. Any frame, used or skipped, shows the camera is alive."""
    if (buf := client.recv(100)) is None: return None
    self.alive()
    meta, last = FrameMeta.of(client), self.previous.get(stream)
    self.previous[stream] = meta
    if last is not None and meta.frame_id > last.frame_id and meta.timestamp_sof <= last.timestamp_sof:
      if stream not in self.frozen:
        self.frozen.add(stream)
        how = "stopped" if meta.timestamp_sof == last.timestamp_sof else "went back"
        self.episodes.happened("clock", f"camera timestamps {how} ({stream} stream: frame {meta.frame_id} starts at {meta.timestamp_sof / 1e9:.3f} s, "
                               f"frame {last.frame_id} at {last.timestamp_sof / 1e9:.3f} s): frames paired by frame id, messages valid=False")
    elif last is not None and meta.timestamp_sof > last.timestamp_sof and stream in self.frozen:
      self.frozen.discard(stream)
      if not self.frozen: self.episodes.ended("clock", "camera timestamps advance again")
    return buf, meta

  def after(self, meta: FrameMeta, last: FrameMeta) -> bool:
    """openpilot's sync rule, `meta` starts at least 25 ms after `last`; by frame id while a camera clock is stopped."""
    return meta.frame_id > last.frame_id if self.frozen else meta.timestamp_sof >= last.timestamp_sof + SYNC_NS

  def recv(self) -> Frames | None:
    """openpilot's sync: main frames until at least one past the last extra, then extra frames until they match main. Bounded: after
    SYNC_MAX_SKIP frames skipped on a camera it gives up (a camera clock jumped back), says why once per episode and starts the next sync
    afresh; it returns as soon as the daemon is told to exit."""
    if (got := self.recv_from(self.client_main, "main")) is None: return None
    (buf_main, meta_main), skipped = got, 0
    while not self.after(meta_main, self.meta_extra):
      if self.exit.is_set() or skipped == SYNC_MAX_SKIP: self.sync_lost(meta_main, self.meta_extra); return None
      if (got := self.recv_from(self.client_main, "main")) is None: return None
      (buf_main, meta_main), skipped = got, skipped + 1
    buf_extra, meta_extra = buf_main, meta_main
    if self.use_extra:
      skipped = 0
      while True:
        if self.exit.is_set() or skipped == SYNC_MAX_SKIP: self.sync_lost(meta_main, meta_extra); return None
        if (got := self.recv_from(self.client_extra, "extra")) is None: return None
        (buf_extra, meta_extra), skipped = got, skipped + 1
        if self.frozen and meta_extra.frame_id >= meta_main.frame_id: break
        if not self.frozen and meta_main.timestamp_sof < meta_extra.timestamp_sof + SYNC_NS: break
      if self.frozen: pass  # no clock to compare: the frame ids paired them
      elif abs(meta_main.timestamp_sof - meta_extra.timestamp_sof) > OUT_OF_SYNC_NS:
        self.episodes.happened("out of sync", f"frames out of sync! main {meta_main.frame_id} ({meta_main.timestamp_sof / 1e9:.5f}), "
                               f"extra {meta_extra.frame_id} ({meta_extra.timestamp_sof / 1e9:.5f})")
      else:
        self.episodes.ended("out of sync", "frames in sync again after out-of-sync pairs")
        self.episodes.ended("sync", "frame sync: the cameras' timestamps agree again")
    self.meta_extra = meta_extra
    return Frames(dict(zip(CAMERA_BUFFERS, (buf_main, buf_extra), strict=True)), meta_main, meta_extra, self.clock_frozen)

  def sync_lost(self, meta_main: FrameMeta, meta_extra: FrameMeta) -> None:
    if self.exit.is_set(): pass
    elif self.use_extra:
      self.episodes.happened("sync", f"frame sync: no extra frame within {SYNC_NS / 1e6:.0f} ms of a main frame after {SYNC_MAX_SKIP} frames (main "
                             f"{meta_main.timestamp_sof / 1e9:.3f} s, extra {meta_extra.timestamp_sof / 1e9:.3f} s): waiting for the timestamps to agree")
    else:
      self.episodes.happened("sync", f"frame sync: {SYNC_MAX_SKIP} frames of the {'wide' if self.main_wide else 'road'} camera start before the last "
                             f"one used ({meta_extra.timestamp_sof / 1e9:.3f} s, now {meta_main.timestamp_sof / 1e9:.3f} s): its clock went back; "
                             "waiting for it to pass the last frame")
    self.meta_extra = FrameMeta()  # the next sync starts afresh, not from a timestamp that may never come back,
    if self.use_extra:  # and from fresh extra frames: those queued while main frames were skipped are as far off as the last one
      for _ in range(SYNC_MAX_SKIP * 2):
        if self.client_extra.recv(0) is None: break
    return None
