"""A camerad stand-in: serves road and wide NV12 frames over VisionIPC at 20 Hz, with camerad's buffer layout and count.

  python -m sunnypilot.modeld_v2.camera_replay [--camera 1928x1208] [--video drive.mp4] [--frames 200] [--skip 30,31]

Frames come from the synthetic road-scene generator (lane lines in perspective, moving dashes) or from a video file (PyAV, optional),
and it publishes roadCameraState / wideRoadCameraState per frame and liveCalibration once a second, like camerad and calibrationd.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from collections.abc import Iterator

import numpy as np

from sunnypilot.modeld_v2.calibration import DEFAULT_RPY, SENSOR_CAMERAS, sensor_for_size
from sunnypilot.modeld_v2.modeld import VisionStreamType
from sunnypilot.modeld_v2.warp import NV12Frame, camerad_frame

CAMERAD_BUFFERS = 18

def synthetic_frames(frame: NV12Frame, count: int = 40) -> list[tuple[np.ndarray, np.ndarray]]:
  """(road, wide) buffers for `count` consecutive frames at 20 Hz, rendered once and then looped."""
  from sunnypilot.modeld_v2.road_scene import road_scene
  road, wide = SENSOR_CAMERAS[sensor_for_size(frame.width, frame.height)]
  return [(road_scene(frame, road.focal_length, t=i * 0.05, seed=i), road_scene(frame, wide.focal_length, t=i * 0.05, seed=1000 + i)) for i in range(count)]

def video_frames(path: str, frame: NV12Frame) -> Iterator[tuple[np.ndarray, np.ndarray]]:
  """A video's frames, scaled to the camera size and laid out like camerad's NV12 (the same picture on both cameras)."""
  import av  # optional: pip install av
  with av.open(path) as container:
    for picture in container.decode(video=0):
      yuv = picture.reformat(width=frame.width, height=frame.height, format="nv12").to_ndarray()  # (h*3/2, w)
      buf = np.zeros(frame.size, np.uint8)
      buf[:frame.stride * frame.height].reshape(frame.height, frame.stride)[:, :frame.width] = yuv[:frame.height]
      buf[frame.uv_offset:frame.uv_offset + frame.stride * (frame.height // 2)].reshape(frame.height // 2, frame.stride)[:, :frame.width] = \
        yuv[frame.height:]
      yield buf, buf

class CameraReplay:
  """The VisionIPC server and the camera state publishers; `send(frame_id, road, wide)` publishes one frame pair."""
  def __init__(self, frame: NV12Frame, wide: bool = True, rpy=DEFAULT_RPY):
    from msgq.visionipc import VisionIpcServer

    from sunnypilot.modeld_v2.messaging import ensure_prefix_dir, pub_master
    self.frame, self.wide, self.rpy = frame, wide, rpy
    self.sensor = sensor_for_size(frame.width, frame.height)
    ensure_prefix_dir()  # VisionIpcServer opens sockets under /dev/shm/msgq_<prefix> and crashes if the folder is missing
    self.server = VisionIpcServer("camerad")
    self.streams = [VisionStreamType.ROAD] + ([VisionStreamType.WIDE_ROAD] if wide else [])
    for stream in self.streams:
      self.server.create_buffers_with_sizes(stream, CAMERAD_BUFFERS, frame.width, frame.height, frame.size, frame.stride, frame.uv_offset)
    self.server.start_listener()
    self.pm = pub_master(["roadCameraState", "wideRoadCameraState", "liveCalibration"])

  def send(self, frame_id: int, road: np.ndarray, wide: np.ndarray, sof: int | None = None) -> int:
    """Publish one frame pair; returns when (monotonic ns) its last VisionIPC send returned: the frame is modeld's from then on."""
    from sunnypilot.modeld_v2.messaging import new_message
    sof = time.monotonic_ns() if sof is None else sof
    eof = sof + 20_000_000
    for stream, data, service in zip(self.streams, (road, wide), ("roadCameraState", "wideRoadCameraState")):
      self.server.send(stream, np.ascontiguousarray(data[:self.frame.size]).tobytes(), frame_id, sof, eof)
      delivered = time.monotonic_ns()
      msg = new_message(service)
      state = getattr(msg, service)
      state.frameId, state.timestampSof, state.timestampEof, state.sensor = frame_id, sof, eof, self.sensor
      self.pm.send(service, msg)
    if frame_id % 20 == 0: self.send_calibration()
    return delivered

  def send_calibration(self) -> None:
    from sunnypilot.modeld_v2.messaging import new_message
    msg = new_message("liveCalibration")
    msg.liveCalibration.calStatus, msg.liveCalibration.rpyCalib = "calibrated", list(self.rpy)
    self.pm.send("liveCalibration", msg)

  def close(self) -> None:
    del self.server

def main(argv: list[str] | None = None) -> int:
  from sunnypilot.modeld_v2.warp import parse_size
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--camera", default="1928x1208", help="sensor frame size: 1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--video", help="a video file to serve instead of synthetic road scenes (needs PyAV: pip install av)")
  parser.add_argument("--frames", type=int, help="stop after this many frame ids (default: run until SIGINT/SIGTERM)")
  parser.add_argument("--hz", type=float, default=20.0)
  parser.add_argument("--skip", default="", help="frame ids not to send (to exercise modeld's drop handling), e.g. 30,31")
  parser.add_argument("--no-wide", action="store_true", help="serve the road camera only")
  parser.add_argument("--start-delay", type=float, default=0.0, help="seconds to wait after starting the server before the first frame")
  args = parser.parse_args(argv)
  try: frame = camerad_frame(*parse_size(args.camera))
  except ValueError as e: parser.error(str(e))
  skip = {int(x) for x in args.skip.split(",") if x.strip()}
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: stop.set())
  print(f"camera_replay: rendering frames for {args.camera} ...", file=sys.stderr, flush=True)
  source = list(video_frames(args.video, frame)) if args.video else synthetic_frames(frame)
  replay = CameraReplay(frame, wide=not args.no_wide)
  stop.wait(args.start_delay)
  next_t, frame_id = time.monotonic(), 0
  print(f"camera_replay: serving {len(source)} looped frames at {args.hz:g} Hz", file=sys.stderr, flush=True)
  while not stop.is_set() and (args.frames is None or frame_id < args.frames):
    if frame_id not in skip: replay.send(frame_id, *source[frame_id % len(source)])
    frame_id += 1
    next_t += 1 / args.hz
    stop.wait(max(0.0, next_t - time.monotonic()))
  replay.close()
  return 0

if __name__ == "__main__":
  sys.exit(main())
