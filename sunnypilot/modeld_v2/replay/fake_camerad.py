"""A camerad stand-in: serves road and wide (and with --driver, driver) NV12 frames over VisionIPC at 20 Hz, with camerad's buffer layout and count.

  python -m sunnypilot.modeld_v2.replay.fake_camerad [--camera 1928x1208] [--video drive.mp4] [--frames 200] [--skip 30,31] [--driver]
  python -m sunnypilot.modeld_v2.replay.fake_camerad --route SEGMENT_FOLDER

Frames come from the synthetic road-scene generator (lane lines in perspective, moving dashes) or from a video file (PyAV, optional),
and it publishes roadCameraState / wideRoadCameraState per frame and liveCalibration once a second, like camerad and calibrationd.
--driver adds the driver camera (VISION_STREAM_DRIVER, the same size on comma devices) showing a synthetic cabin (replay/cabin_scene.py:
a face that sways, turns and blinks), with driverCameraState per frame: its own frame counter and timestamps, as camerad runs each
camera on its own (--skip drops road frames only; the driver counter runs on).
With --route it serves a recorded segment once at --hz instead: its fcamera/ecamera frames with the log's frame ids and timestamps,
and the log's liveCalibration, carState, carControl, deviceState, driverMonitoringState (and liveDelay) in log-time order
(route_replay does the same in lockstep with modeld, and records and checks what modeld publishes).
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, finite_float, int_list, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.daemon.messaging import claim_bus
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY, SENSOR_CAMERAS, parse_camera_size, sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame
from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
from sunnypilot.modeld_v2.replay.route_segment import camerad_buffer

CAMERAD_BUFFERS = 18

log = logging.getLogger(__name__)

def synthetic_frames(frame: NV12Frame, count: int = 40) -> list[tuple[np.ndarray, np.ndarray]]:
  """(road, wide) buffers for `count` consecutive frames at 20 Hz, rendered once and then looped."""
  from sunnypilot.modeld_v2.replay.road_scene import road_scene
  road, wide = SENSOR_CAMERAS[sensor_for_size(frame.width, frame.height)]
  return [(road_scene(frame, road.focal_length, t=i * 0.05, seed=i), road_scene(frame, wide.focal_length, t=i * 0.05, seed=1000 + i)) for i in range(count)]

def video_frames(path: str, frame: NV12Frame) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """A video's frames, scaled to the camera size and laid out like camerad's NV12 (the same picture on both cameras)."""
  import av  # optional: pip install av
  with av.open(path) as container:
    for picture in container.decode(video=0):
      buf = camerad_buffer(picture, frame)
      yield buf, buf

class FakeCamerad:
  """The VisionIPC server and the camera state publishers; `send(frame_id, road, wide)` publishes one frame pair, `send_driver(frame_id,
  buf)` one driver frame (with driver=True)."""
  def __init__(self, frame: NV12Frame, wide: bool = True, rpy: tuple | None = DEFAULT_RPY, driver: bool = False):
    """`rpy`: the calibration published once a second (calibrationd's role); None when the caller publishes liveCalibration itself.
    `driver`: serve the driver stream too (the same geometry: comma devices' driver cameras are the road camera's sensor)."""
    from msgq.visionipc import VisionIpcServer

    from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir, pub_master
    self.frame, self.wide, self.rpy, self.driver = frame, wide, rpy, driver
    self.sensor = sensor_for_size(frame.width, frame.height)
    ensure_prefix_dir()  # VisionIpcServer opens sockets under /dev/shm/msgq_<prefix> and crashes if the folder is missing
    self.server = VisionIpcServer("camerad")
    self.streams = [VisionStreamType.ROAD] + ([VisionStreamType.WIDE_ROAD] if wide else [])
    for stream in self.streams + ([VisionStreamType.DRIVER] if driver else []):
      self.server.create_buffers_with_sizes(stream, CAMERAD_BUFFERS, frame.width, frame.height, frame.size, frame.stride, frame.uv_offset)
    self.server.start_listener()
    self.pm = pub_master(["roadCameraState", "wideRoadCameraState", "liveCalibration"] + (["driverCameraState"] if driver else []))

  def send(self, frame_id: int, road: np.ndarray, wide: np.ndarray, sof: int | None = None, eof: int | None = None) -> int:
    """Publish one frame pair; returns when (monotonic ns) its last VisionIPC send returned: the frame is modeld's from then on."""
    sof = time.monotonic_ns() if sof is None else sof
    eof = sof + 20_000_000 if eof is None else eof
    for stream, data, service in zip(self.streams, (road, wide), ("roadCameraState", "wideRoadCameraState")):
      delivered = self._send(stream, service, data, frame_id, sof, eof)
    if frame_id % 20 == 0 and self.rpy is not None: self.send_calibration()
    return delivered

  def send_driver(self, frame_id: int, buf: np.ndarray, sof: int | None = None, eof: int | None = None) -> int:
    """Publish one driver-camera frame and its driverCameraState; returns when its VisionIPC send returned."""
    if not self.driver: raise ValueError("this FakeCamerad serves no driver stream (driver=False)")
    sof = time.monotonic_ns() if sof is None else sof
    return self._send(VisionStreamType.DRIVER, "driverCameraState", buf, frame_id, sof, sof + 20_000_000 if eof is None else eof)

  def send_frame(self, stream: int, data: np.ndarray, frame_id: int, sof: int, eof: int) -> int:
    """One buffer over VisionIPC alone, without its camera state message; returns when its send returned."""
    self.server.send(stream, np.ascontiguousarray(data[:self.frame.size]).tobytes(), frame_id, sof, eof)
    return time.monotonic_ns()

  def _send(self, stream: int, service: str, data: np.ndarray, frame_id: int, sof: int, eof: int) -> int:
    """One buffer over VisionIPC, then its camera state message, as camerad sends them (frame first: a reader of the state finds it)."""
    from sunnypilot.modeld_v2.daemon.messaging import new_message
    delivered = self.send_frame(stream, data, frame_id, sof, eof)
    msg = new_message(service)
    state = getattr(msg, service)
    state.frameId, state.timestampSof, state.timestampEof, state.sensor = frame_id, sof, eof, self.sensor
    self.pm.send(service, msg)
    return delivered

  def send_calibration(self) -> None:
    from sunnypilot.modeld_v2.daemon.messaging import new_message
    msg = new_message("liveCalibration")
    assert self.rpy is not None, "sent only with a calibration"
    msg.liveCalibration.calStatus, msg.liveCalibration.rpyCalib = "calibrated", list(self.rpy)
    self.pm.send("liveCalibration", msg)

  def close(self) -> None:
    del self.server

def serve_route(parser: argparse.ArgumentParser, args) -> int:
  """--route: a segment's frames and input events, once, at args.hz."""
  from sunnypilot.modeld_v2.daemon.messaging import has_service, pub_master
  from sunnypilot.modeld_v2.replay.route_segment import INPUT_SERVICES, EventFeed, FrameDecoder, RouteError, open_segment
  try: segment = open_segment(args.route)
  except RouteError as e: parser.exit(2, f"fake_camerad: error: {e}\n")
  for line in segment.warnings: log.warning(f"warning: {line}")
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: stop.set())
  replay, decoder = FakeCamerad(segment.frame, rpy=None), FrameDecoder(segment, args.frames)
  inputs, feed = pub_master([s for s in INPUT_SERVICES if has_service(s)]), EventFeed(segment.events)
  stop.wait(args.start_delay)
  log.info(f"serving {segment.name}: {len(segment.frames)} frames at {args.hz:g} Hz")
  try:
    next_t = time.monotonic()
    for cam, (road, wide) in zip(segment.frames, decoder):
      if stop.is_set(): break
      for event in feed.until(cam.log_time):
        if has_service(event.service): inputs.send(event.service, event.raw)
      replay.send(cam.frame_id, road, wide, sof=cam.sof, eof=cam.eof)
      next_t += 1 / args.hz
      stop.wait(max(0.0, next_t - time.monotonic()))
  except RouteError as e: parser.exit(2, f"fake_camerad: error: {e}\n")
  finally:
    decoder.close()
    replay.close()
  return 0

@interruptible("fake_camerad")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("fake_camerad", __doc__)
  parser.add_argument("--camera", default="1928x1208", type=checked(parse_camera_size), help="sensor frame size: 1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--video", help="a video file to serve instead of synthetic road scenes (needs PyAV: pip install av)")
  parser.add_argument("--frames", type=positive_int, help="stop after this many frame ids (default: run until SIGINT/SIGTERM)")
  parser.add_argument("--hz", type=finite_float(0, 1000, low_open=True), default=20.0, help="frames per second, above 0 up to 1000 (default 20)")
  parser.add_argument("--skip", type=int_list, default=set(), help="frame ids not to send (to exercise modeld's drop handling), e.g. 30,31")
  parser.add_argument("--no-wide", action="store_true", help="serve the road camera only")
  parser.add_argument("--start-delay", type=finite_float(0, 3600), default=0.0, help="seconds to wait after starting the server before the first frame")
  parser.add_argument("--driver", action="store_true", help="serve the driver camera too (VISION_STREAM_DRIVER, driverCameraState), a synthetic "
                      "cabin with a moving, blinking face, for dmonitoringmodeld")
  parser.add_argument("--route", help="a recorded segment folder (fcamera.hevc, ecamera.hevc, rlog or qlog) to serve once with its log")
  args = parser.parse_args(argv)
  if args.route and args.driver: parser.error("--driver serves a synthetic cabin beside synthetic or --video road frames, not beside --route")
  if args.video and not os.path.isfile(args.video): parser.error(f"--video {args.video} is not a regular file")
  # one camerad per bus, as one modeld: msgq lets a second publisher take the camera topics and kills the first with MultiplePublishersError
  if (claim := claim_bus("fake_camerad")) is None:
    prefix = os.environ.get("OPENPILOT_PREFIX")
    parser.exit(2, f"fake_camerad: error: another fake_camerad is already serving the bus{f' OPENPILOT_PREFIX={prefix}' if prefix else ''}\n")
  try: return serve_route(parser, args) if args.route else serve_synthetic(args)
  finally: claim.close()

def serve_synthetic(args) -> int:
  """Synthetic road scenes (or --video) looped at args.hz, with --driver a synthetic cabin, until --frames or SIGINT/SIGTERM."""
  frame, skip = camerad_frame(*args.camera), args.skip
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: stop.set())
  log.info(f"rendering frames for {frame.width}x{frame.height} ...")
  source = list(video_frames(args.video, frame)) if args.video else synthetic_frames(frame)
  replay = FakeCamerad(frame, wide=not args.no_wide, driver=args.driver)
  stop.wait(args.start_delay)
  next_t, frame_id, driver_id = time.monotonic(), 0, 0
  log.info(f"serving {len(source)} looped frames at {args.hz:g} Hz{' and a synthetic driver camera' if args.driver else ''}")
  while not stop.is_set() and (args.frames is None or frame_id < args.frames):
    if frame_id not in skip: replay.send(frame_id, *source[frame_id % len(source)])
    if args.driver:  # rendered per frame (a few ms: only the face is drawn), so blinks and turns do not loop every 2 s
      replay.send_driver(driver_id, cabin_scene(frame, driver_id))
      driver_id += 1
    frame_id += 1
    next_t += 1 / args.hz
    stop.wait(max(0.0, next_t - time.monotonic()))
  replay.close()
  return 0

if __name__ == "__main__":
  sys.exit(main())
