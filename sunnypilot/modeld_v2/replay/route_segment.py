"""One recorded openpilot segment on disk, read with the ecosystem's tools and checked before a replay: the log through openpilot_logging's
LogReader, the HEVC videos through PyAV.

  segment = open_segment("/data/media/0/realdata/2024-05-01--10-00-00--3")   # fcamera.hevc, ecamera.hevc, rlog or qlog (plain/.bz2/.zst)
  for road, wide in FrameDecoder(segment): ...                                 # camerad NV12 buffers, decoded ahead in a thread
  for buf in FrameDecoder(segment, driver=True): ...                           # dcamera.hevc's, when the segment has one

Each video frame k is the camera frame the log's k-th roadEncodeIdx names (segmentId k; every rlog and qlog has them), else the k-th
roadCameraState; dcamera.hevc's by driverEncodeIdx, else driverCameraState. Problems are a RouteError with one line; what can fall back
(no calibration, no carState, no ecamera, a dcamera.hevc the log does not name) is a warning.
"""
from __future__ import annotations

import itertools
import os
import queue
import re
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame

# what modeld subscribes to besides the cameras (roadCameraState goes out with each frame): published in log-time order
INPUT_SERVICES = ("liveCalibration", "carState", "carControl", "deviceState", "driverMonitoringState", "liveDelay")
DECODE_AHEAD = 16  # frames the decoder thread may be ahead of the replay

class RouteError(Exception):
  """A segment that cannot be replayed, in one line."""

@dataclass(frozen=True)
class CameraFrame:
  frame_id: int
  sof: int  # ns, as camerad stamps it
  eof: int
  log_time: int  # logMonoTime of the event that names this frame: inputs logged up to it are published before it

@dataclass(frozen=True)
class InputEvent:
  log_time: int
  service: str
  raw: bytes  # the Event as logged, published as is
  data: Any  # the service's struct (a reader), what a SubMaster would hold after receiving it

@dataclass
class Segment:
  name: str
  log_path: str
  road_video: str
  wide_video: str | None
  frame: NV12Frame  # camerad's layout for the video's size
  sensor: str
  frames: list[CameraFrame]
  events: list[InputEvent]  # INPUT_SERVICES, in log order
  warnings: list[str] = field(default_factory=list)
  driver_video: str | None = None  # dcamera.hevc, when it is there and the log names its frames (the driver camera is the road camera's size)
  driver_frames: list[CameraFrame] = field(default_factory=list)

def _first(folder: str, names) -> str | None:
  return next((os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))), None)

def is_segment(folder: str) -> bool:
  from openpilot_logging.route import CAMERA_FILENAMES, LOG_FILENAMES, QLOG_FILENAMES
  return any(_first(folder, names) for names in (CAMERA_FILENAMES, LOG_FILENAMES, QLOG_FILENAMES))

def segment_folders(path: str) -> list[str]:
  """`path` itself when it is a segment folder, else the segment folders in it (a device's realdata, a route's download) by segment number."""
  if not os.path.isdir(path): raise RouteError(f"{path}: no such segment or route folder")
  if is_segment(path): return [path]
  found = [os.path.join(path, d) for d in os.listdir(path) if os.path.isdir(os.path.join(path, d)) and is_segment(os.path.join(path, d))]
  if not found: raise RouteError(f"{path}: no segment here (a segment folder holds fcamera.hevc and rlog or qlog)")
  number = lambda p: (re.sub(r"--\d+$", "", os.path.basename(p)), int(m[1]) if (m := re.search(r"--(\d+)$", os.path.basename(p))) else -1)
  return sorted(found, key=number)

def _video_info(path: str) -> tuple[int, int, int]:
  """(width, height, frames) of an HEVC stream, from its packets (no decoding)."""
  import av
  try:
    with av.open(path) as container:
      stream = container.streams.video[0]
      width, height = stream.codec_context.width, stream.codec_context.height
      return width, height, sum(1 for p in container.demux(stream) if p.size)
  except (av.FFmpegError, IndexError) as e: raise RouteError(f"{path}: not a readable video ({e})") from None

def _read_log(path: str, services: set[str]) -> tuple[list, list[str]]:
  """The log's events of `services` as readers, and a warning if it ends in a corrupted event (LogReader then stops there)."""
  from openpilot_logging.logreader import LogReader
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    try: events = [e for e in LogReader(path) if e.which() in services]
    except Exception as e: raise RouteError(f"{path}: not a readable openpilot log ({type(e).__name__}: {e})") from None
  return events, [f"{path}: {w.message}: replaying the events before it" for w in caught if issubclass(w.category, RuntimeWarning)]

def _camera_frames(events: list, video: str, count: int, camera: str = "road") -> tuple[list[CameraFrame], list[str]]:
  """Video frame k -> the camera frame: <camera>EncodeIdx by segmentId, else the k-th <camera>CameraState; checked against the video's frame
  count."""
  index, state = f"{camera}EncodeIdx", f"{camera}CameraState"
  idx = {getattr(e, index).segmentId: e for e in events if e.which() == index}
  if idx:
    source = index
    named = [(getattr(e, index).frameId, getattr(e, index).timestampSof, getattr(e, index).timestampEof, e.logMonoTime) for _, e in sorted(idx.items())]
  else:
    source = state
    named = [(getattr(e, state).frameId, getattr(e, state).timestampSof, getattr(e, state).timestampEof, e.logMonoTime)
             for e in events if e.which() == state]
  if not named: raise RouteError(f"the log has no {index} or {state}: nothing says which camera frame each video frame is")
  if len(named) != count:
    raise RouteError(f"frames and log out of step: {os.path.basename(video)} has {count} frames, the log names {len(named)} ({source}): "
                     "a truncated video, or a log of another segment")
  notes = []
  ids = [n[0] for n in named]
  if any(b != a + 1 for a, b in zip(ids, ids[1:])):
    notes.append(f"the log's frame ids skip (camera drops on the device): served as consecutive ids from {ids[0]} so modeld runs every frame")
  frames = [CameraFrame(ids[0] + k, sof or t, eof or (sof or t) + 20_000_000, t) for k, (_, sof, eof, t) in enumerate(named)]
  return frames, notes

def open_segment(folder: str) -> Segment:
  """Find and check a segment's files; RouteError on what cannot be replayed, `warnings` for each fallback taken."""
  from openpilot_logging.route import CAMERA_FILENAMES, DCAMERA_FILENAMES, ECAMERA_FILENAMES, LOG_FILENAMES, QLOG_FILENAMES
  if not os.path.isdir(folder): raise RouteError(f"{folder}: no such segment folder")
  notes = []
  if (log_path := _first(folder, LOG_FILENAMES) or _first(folder, QLOG_FILENAMES)) is None:
    raise RouteError(f"{folder}: no log (looked for {', '.join(LOG_FILENAMES + QLOG_FILENAMES)})")
  if (road := _first(folder, CAMERA_FILENAMES)) is None: raise RouteError(f"{folder}: no road camera video (looked for {', '.join(CAMERA_FILENAMES)})")
  width, height, count = _video_info(road)
  try: sensor = sensor_for_size(width, height)
  except ValueError: raise RouteError(f"{road}: {width}x{height} frames are no known comma camera's (1928x1208: comma 3/3X, 1344x760: comma 4)") from None
  events, log_notes = _read_log(log_path, {"roadEncodeIdx", "roadCameraState", "driverEncodeIdx", "driverCameraState", *INPUT_SERVICES})
  frames, frame_notes = _camera_frames(events, road, count)
  if (wide := _first(folder, ECAMERA_FILENAMES)) is None:
    notes.append(f"{folder}: no ecamera.hevc: the road camera's frames stand in for the wide camera")
  elif (info := _video_info(wide)) != (width, height, count):
    raise RouteError(f"frames out of step: {os.path.basename(wide)} is {info[0]}x{info[1]} with {info[2]} frames, {os.path.basename(road)} "
                     f"{width}x{height} with {count} (a truncated video?)")
  logged = next((str(e.roadCameraState.sensor) for e in events if e.which() == "roadCameraState"), None)
  if logged in SENSOR_CAMERAS and logged != sensor:
    same_size = (SENSOR_CAMERAS[logged][0].width, SENSOR_CAMERAS[logged][0].height) == (width, height)
    if same_size: sensor = logged  # ar0231 and ox03c10 share a size: the log tells them apart
    else: notes.append(f"the log's camera is {logged} but {os.path.basename(road)} is {width}x{height}: replayed as {sensor}")
  seen = {e.which() for e in events}
  if "liveCalibration" not in seen: notes.append(f"{log_path}: no liveCalibration: modeld uses the default calibration (a perfectly mounted device)")
  if "carState" not in seen: notes.append(f"{log_path}: no carState: vEgo 0, no blinkers, no desire")
  driver, driver_frames = _driver_camera(_first(folder, DCAMERA_FILENAMES), events, (width, height), notes)
  inputs = [InputEvent(e.logMonoTime, e.which(), e.as_builder().to_bytes(), getattr(e, e.which())) for e in events if e.which() in INPUT_SERVICES]
  return Segment(os.path.basename(os.path.normpath(folder)), log_path, road, wide, camerad_frame(width, height), sensor, frames, inputs,
                 log_notes + frame_notes + notes, driver, driver_frames)

def _driver_camera(video: str | None, events: list, size: tuple[int, int], notes: list[str]) -> tuple[str | None, list[CameraFrame]]:
  """dcamera.hevc and its frames, or (None, []) with a note on why it is passed over: the segment still replays for modeld."""
  if video is None: return None, []
  width, height, count = _video_info(video)
  if (width, height) != size:
    notes.append(f"{os.path.basename(video)} is {width}x{height}, the road camera {size[0]}x{size[1]}: a comma device's driver camera is the road "
                 "camera's sensor; the driver camera is not replayed")
    return None, []
  try: frames, frame_notes = _camera_frames(events, video, count, "driver")
  except RouteError as e:
    notes.append(f"{e}: the driver camera is not replayed")
    return None, []
  notes.extend(frame_notes)
  return video, frames

class EventFeed:
  """A segment's input events in log order, handed out up to each frame's log time."""
  def __init__(self, events: list[InputEvent]):
    self.events, self.next = events, 0

  def until(self, log_time: int) -> list[InputEvent]:
    start = self.next
    while self.next < len(self.events) and self.events[self.next].log_time <= log_time: self.next += 1
    return self.events[start:self.next]

def camerad_buffer(picture, frame: NV12Frame) -> np.ndarray:
  """A decoded PyAV picture, scaled to the camera size if it differs, in camerad's padded NV12 layout (padding bytes zero)."""
  yuv = picture.reformat(width=frame.width, height=frame.height, format="nv12").to_ndarray()  # (h*3/2, w)
  buf = np.zeros(frame.size, np.uint8)
  y, uv = frame.planes(buf)
  y[:], uv[:] = yuv[:frame.height], yuv[frame.height:]
  return buf

def _decode(path: str, frame: NV12Frame) -> Iterator[np.ndarray]:
  import av

  try:
    with av.open(path) as container:
      for k, picture in enumerate(container.decode(video=0)):
        if (picture.width, picture.height) != (frame.width, frame.height):  # the buffers, intrinsics and warp are the first size's
          raise RouteError(f"{path}: the video changes from {frame.width}x{frame.height} to {picture.width}x{picture.height} at frame {k}: a segment "
                           "replays at one camera size (split it where the size changes)")
        yield camerad_buffer(picture, frame)
  except av.FFmpegError as e: raise RouteError(f"{path}: decoding failed ({e})") from None

class FrameDecoder:
  """Decodes a segment's road and wide videos (with `driver`, its dcamera.hevc) in a thread, up to DECODE_AHEAD frames ahead; iterating
  yields (road, wide) buffers (driver buffers) in camerad's layout and raises the decoder's RouteError where it failed (a video shorter than
  its packets said is one)."""
  def __init__(self, segment: Segment, stop: int | None = None, driver: bool = False):
    if driver and segment.driver_video is None: raise ValueError(f"{segment.name} has no driver camera video")
    self.segment, self.driver = segment, driver
    self.stop = len(segment.driver_frames if driver else segment.frames) if stop is None else stop
    self.queue: queue.Queue = queue.Queue(DECODE_AHEAD)
    self.closed = threading.Event()
    self.thread = threading.Thread(target=self._run, daemon=True)
    self.thread.start()

  def _run(self) -> None:
    s = self.segment
    video = s.driver_video if self.driver else s.road_video
    pairs: Iterator[np.ndarray | tuple[np.ndarray, np.ndarray]]  # driver frames one by one, road frames in (road, wide) pairs
    try:
      if self.driver: pairs = _decode(cast(str, video), s.frame)  # checked in __init__: the segment has a driver video
      elif s.wide_video: pairs = zip(_decode(s.road_video, s.frame), _decode(s.wide_video, s.frame))
      else: pairs = ((b, b) for b in _decode(s.road_video, s.frame))
      decoded = 0
      for pair in itertools.islice(pairs, self.stop):
        if not self._put(pair): return
        decoded += 1
      if decoded < self.stop: raise RouteError(f"{video}: only {decoded} of {self.stop} frames decode (a truncated stream?)")
    except RouteError as e: self._put(e)
    except Exception as e: self._put(RouteError(f"{video}: decoding failed ({type(e).__name__}: {e})"))
    self._put(None)

  def _put(self, item) -> bool:
    while not self.closed.is_set():
      try:
        self.queue.put(item, timeout=0.1)
        return True
      except queue.Full: continue
    return False

  def __iter__(self) -> Iterator[Any]:
    while (item := self.queue.get()) is not None:
      if isinstance(item, RouteError): raise item
      yield item

  def close(self) -> None:
    self.closed.set()
    self.thread.join(timeout=5)
