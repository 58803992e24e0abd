"""A synthetic openpilot segment folder, for trying route_replay with no drive at hand (and for its tests and benchmark).

  python -m sunnypilot.modeld_v2.replay.synthetic_route out/route/2026-01-01--00-00-00--0 [--camera 1928x1208] [--frames 200]

fcamera.hevc and ecamera.hevc: road_scene frames of the camera's road and wide lenses encoded to HEVC with PyAV (libx265), 20 fps;
dcamera.hevc (unless --no-driver): cabin_scene frames of the driver camera (a face that sways, turns and blinks), the same size;
rlog.zst: a liveCalibration, then per frame a carState and a roadCameraState (frame id, timestamps, sensor) and, 25 ms later, a
driverCameraState (the driver camera's own frame counter), written with the schema through openpilot_logging's save_log.
"""
from __future__ import annotations

import functools
import logging
import os
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.logs import Progress
from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, parse_camera_size, sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame

T0, FIRST_ID = 10**9, 100

log = logging.getLogger(__name__)

def visible_nv12(buf: np.ndarray, frame: NV12Frame) -> np.ndarray:
  """A camerad buffer's visible Y rows then UV rows, (h * 3/2, w): what an NV12 video frame holds."""
  return np.concatenate(frame.planes(buf))

SILENT = Progress(lambda line: None)

def encode_hevc(path: str, pictures: Iterable[np.ndarray], width: int, height: int, progress: Progress = SILENT, count: int | None = None) -> None:
  """NV12 pictures (h * 3/2, w) as a raw HEVC stream, as comma's encoder writes fcamera.hevc; `progress` says how far it is (of `count`)."""
  import av
  name = os.path.basename(path)
  progress.start(f"{name}: encoding{f' {count}' if count else ''} frames ...")
  with av.open(path, "w", format="hevc") as container:
    stream = container.add_stream("libx265", rate=20)
    stream.width, stream.height, stream.pix_fmt, stream.options = width, height, "yuv420p", {"x265-params": "log-level=error"}
    for k, p in enumerate(pictures):
      for packet in stream.encode(av.VideoFrame.from_ndarray(p, format="nv12")): container.mux(packet)
      progress.step(f"{name}: {k + 1}{f' of {count}' if count else ''} frames encoded")
    progress.step(f"{name}: the encoder's last frames ...")
    for packet in stream.encode(): container.mux(packet)

def write_log(path: str, frames: int, sensor: str, rpy=(0.0, 0.02, -0.01), height: float = 1.3, v_ego=lambda k: 15 + 0.1 * k,
              calibration: bool = True, car_state: bool = True, frame_ids: list[int] | None = None, encode_idx: bool = False,
              camera_state_every: int = 1, recalibrations: dict[int, tuple] | None = None, driver: bool = False) -> None:
  """An rlog: liveCalibration before the first frame (unless not `calibration`), then per frame carState (unless not `car_state`) 10 ms
  before its roadCameraState (and, with `encode_idx`, a roadEncodeIdx 5 ms after it, as encoderd logs each encoded frame); frame ids
  from FIRST_ID (or `frame_ids`), 50 ms apart. `camera_state_every` N > 1 logs every Nth roadCameraState only, as a qlog does.
  `recalibrations` {frame index: (rpy, height)}: another liveCalibration 20 ms before those frames (calibrationd publishes at 4 Hz).
  `driver`: per frame a driverCameraState 25 ms after the road frame (and with `encode_idx` a driverEncodeIdx 5 ms after it), ids from
  FIRST_ID: the driver camera runs at 20 Hz on its own counter and clock."""
  from openpilot_logging.logreader import save_log

  from sunnypilot.modeld_v2.daemon.messaging import log
  def event(t: int, service: str):
    msg = log.Event.new_message(logMonoTime=t)
    msg.init(service)
    return msg
  def calibration_event(t: int, rpy, height: float):
    cal = event(t, "liveCalibration")
    cal.liveCalibration.rpyCalib, cal.liveCalibration.calStatus, cal.liveCalibration.height = list(rpy), "calibrated", [height]
    return cal
  events, recalibrations = [calibration_event(T0 - 10**8, rpy, height)] if calibration else [], recalibrations or {}
  for k in range(frames):
    t = T0 + k * 50_000_000
    if k in recalibrations: events.append(calibration_event(t - 20_000_000, *recalibrations[k]))
    if car_state:
      cs = event(t - 10_000_000, "carState")
      cs.carState.vEgo = v_ego(k)
      events.append(cs)
    frame_id = FIRST_ID + k if frame_ids is None else frame_ids[k]
    rc = event(t, "roadCameraState")
    rc.roadCameraState.frameId, rc.roadCameraState.timestampSof, rc.roadCameraState.timestampEof = frame_id, t - 30_000_000, t - 10_000_000
    rc.roadCameraState.sensor = sensor
    if k % camera_state_every == 0: events.append(rc)
    if encode_idx:
      idx = event(t + 5_000_000, "roadEncodeIdx")
      idx.roadEncodeIdx.frameId, idx.roadEncodeIdx.segmentId, idx.roadEncodeIdx.encodeId = frame_id, k, frame_id
      idx.roadEncodeIdx.timestampSof, idx.roadEncodeIdx.timestampEof = t - 30_000_000, t - 10_000_000
      events.append(idx)
    if driver: events += driver_events(event, t + 25_000_000, FIRST_ID + k, k, sensor, encode_idx)
  save_log(path, [e.as_reader() for e in events])

def driver_events(event, t: int, frame_id: int, k: int, sensor: str, encode_idx: bool) -> list:
  """The driver camera's events of its k-th frame at log time `t`: driverCameraState, and driverEncodeIdx 5 ms later as encoderd logs it."""
  dc = event(t, "driverCameraState")
  dc.driverCameraState.frameId, dc.driverCameraState.timestampSof, dc.driverCameraState.timestampEof = frame_id, t - 30_000_000, t - 10_000_000
  dc.driverCameraState.sensor = sensor
  if not encode_idx: return [dc]
  idx = event(t + 5_000_000, "driverEncodeIdx")
  idx.driverEncodeIdx.frameId, idx.driverEncodeIdx.segmentId, idx.driverEncodeIdx.encodeId = frame_id, k, frame_id
  idx.driverEncodeIdx.timestampSof, idx.driverEncodeIdx.timestampEof = t - 30_000_000, t - 10_000_000
  return [dc, idx]

def road_picture(frame: NV12Frame, focal_length: float, seed: int, k: int) -> np.ndarray:
  """The k-th road scene of a lens as an NV12 picture."""
  from sunnypilot.modeld_v2.replay.road_scene import road_scene
  return visible_nv12(road_scene(frame, focal_length, t=k * 0.05, seed=seed + k), frame)

def rendered(render: Callable[[int], np.ndarray], count: int, what: str, progress: Progress) -> Iterator[np.ndarray]:
  """render(k) for k < count, one at a time, saying how far it is."""
  for k in range(count):
    yield render(k)
    progress.step(f"{what}: {k + 1} of {count} frames rendered")

def write_segment(folder: str, camera: tuple[int, int] = (1344, 760), frames: int = 24, distinct: int | None = None, driver: bool = True,
                  progress: Progress = SILENT, **log_options) -> None:
  """A segment folder of `frames` frames (the first `distinct` rendered, then looped: rendering is the slow part), with `driver` a
  dcamera.hevc of the synthetic cabin (every frame rendered: the face's blinks and turns do not loop), and its rlog.zst. `progress` gets a
  line per stage and one every few seconds within it."""
  from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
  frame, sensor = camerad_frame(*camera), sensor_for_size(*camera)
  road, wide = SENSOR_CAMERAS[sensor]
  n = min(frames, distinct or frames)
  os.makedirs(folder, exist_ok=True)
  for name, lens, seed in (("fcamera.hevc", road, 0), ("ecamera.hevc", wide, 1000)):
    progress.start(f"{name}: rendering {n} road scenes ...")
    scenes = list(rendered(functools.partial(road_picture, frame, lens.focal_length, seed), n, name, progress))
    encode_hevc(os.path.join(folder, name), (scenes[k % n] for k in range(frames)), *camera, progress, frames)
  if driver:
    cabin = rendered(lambda k: visible_nv12(cabin_scene(frame, k), frame), frames, "dcamera.hevc", progress)
    encode_hevc(os.path.join(folder, "dcamera.hevc"), cabin, *camera, progress, frames)
  progress.start(f"rlog.zst: {frames} frames of events ...")
  write_log(os.path.join(folder, "rlog.zst"), frames, sensor, driver=driver, **log_options)

def missing_parents(folder: str) -> list[str]:
  """The parent folders of `folder` that do not exist yet, innermost first."""
  missing, up = [], os.path.dirname(os.path.abspath(folder))
  while not os.path.exists(up):
    missing.append(up)
    up = os.path.dirname(up)
  return missing

@interruptible("synthetic_route")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("synthetic_route", __doc__)
  parser.add_argument("folder", help="the segment folder to write, new or empty (route_replay takes it, or its parent); missing parent folders are made")
  parser.add_argument("--camera", type=checked(parse_camera_size), default="1928x1208", help="1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--frames", type=positive_int, default=200, help="frames in the segment (default 200: 10 s)")
  parser.add_argument("--distinct", type=positive_int, default=40, help="road frames rendered; the rest repeat them (rendering is slow)")
  parser.add_argument("--no-driver", action="store_true", help="no dcamera.hevc (the driver camera) and no driver camera events")
  args = parser.parse_args(argv)
  folder = os.path.abspath(args.folder)
  if os.path.exists(folder) and (not os.path.isdir(folder) or os.listdir(folder)): parser.error(f"{args.folder} exists and is not an empty folder")
  made, tmp = missing_parents(folder), f"{folder}.tmp{os.getpid()}"  # the segment appears whole or not at all
  try:
    try: os.makedirs(os.path.dirname(folder), exist_ok=True)  # a route folder under out/ on a fresh clone: its parents are made
    except OSError as e: parser.error(f"cannot make the folder {os.path.dirname(folder)}: {e.strerror or e}")
    log.info(f"rendering and encoding {args.frames} frames of {args.camera[0]}x{args.camera[1]}, a line every few seconds ...")
    write_segment(tmp, args.camera, args.frames, args.distinct, driver=not args.no_driver, progress=Progress(log.info))
    if os.path.isdir(folder): os.rmdir(folder)
    os.rename(tmp, folder)
  except BaseException:
    for parent in made: shutil.rmtree(parent, ignore_errors=True)  # a failed run leaves no folder it made behind
    raise
  finally: shutil.rmtree(tmp, ignore_errors=True)
  log.info(f"wrote {args.folder}")
  return 0

if __name__ == "__main__":
  sys.exit(main())
