"""One segment replayed: modeld (and dmonitoringmodeld, for a driver camera the artifacts can read) started in this process's msgq
namespace, the segment served to them (lockstep), checked against the reference (reference_check), and OUT/<segment>/ written
(segment_report)."""
from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

import numpy as np

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, find_warp, model_planes, warp_command
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.replay.lockstep import Lockstep
from sunnypilot.modeld_v2.replay.log_state import LogState
from sunnypilot.modeld_v2.replay.model_daemons import DRIVER_SERVICE, start_daemons
from sunnypilot.modeld_v2.replay.reference_check import DriverCheck, ReferenceCheck, check_tolerance, checked_report, make_driver_check, make_reference
from sunnypilot.modeld_v2.replay.route_segment import CameraFrame, FrameDecoder, RouteError, Segment, open_segment
from sunnypilot.modeld_v2.replay.segment_report import CHECK_NAME, LOG_NAME, Result, draw, write_check, write_log

log = logging.getLogger(__name__)

def artifacts_warp(artifacts: str, segment: Segment, new_img: list | None) -> str:
  """The warp bundle modeld picks for the segment's frames on both cameras and a model taking `new_img` planes (artifacts.find_warp)."""
  if (path := find_warp(artifacts, segment.frame, segment.frame, report=log.warning, new_img=new_img)) is None:
    raise RouteError(f"no warp bundle in {artifacts} for {segment.frame.width}x{segment.frame.height} frames "
                     f"(build one: compile_warp --frame {segment.frame.spec} --warp-to 512x256 --split-frames)")
  return path

def driver_monitoring(args: argparse.Namespace, segment: Segment, report: Callable[[str], None]) -> tuple[str, str] | None:
  """(dmonitoring_model.bin, its dm_warp for the segment's driver camera) when dmonitoringmodeld replays the segment's dcamera.hevc; None,
  with a line when there is a driver video, when it cannot; RouteError when --dm-onnx asks for a check that cannot run."""
  model, why = os.path.join(args.artifacts, DRIVER_MONITORING.model_name), None
  if segment.driver_video is None: why = f"{segment.name} has no driver camera video (dcamera.hevc) with its frames named in the log"
  elif not os.path.isfile(model): why = f"no {DRIVER_MONITORING.model_name} in {args.artifacts} (build one: {DRIVER_MONITORING.build_model})"
  if why is None:
    planes = model_planes(read_bundle(model)[0])
    if (warp := find_warp(args.artifacts, segment.frame, None, report=lambda line: None, new_img=planes, kind=DRIVER_MONITORING)) is not None:
      return model, warp
    why = f"no dm_warp bundle in {args.artifacts} for {segment.frame.width}x{segment.frame.height} frames (build one: " \
          f"{warp_command(segment.frame, DRIVER_MONITORING, planes)})"
  if args.dm_onnx: raise RouteError(f"--dm-onnx: {why}")
  if segment.driver_video is not None: report(f"{segment.name}: the driver camera is not replayed: {why}")
  return None

def intro_line(segment: Segment, args: argparse.Namespace, reference, driver_check: DriverCheck | None, tolerance: float | None,
               driver_frames: int) -> str:
  """What a segment's replay is about to do, in one line."""
  return (f"{segment.name}: {len(segment.frames)} frames {segment.frame.width}x{segment.frame.height} ({segment.sensor}), {len(segment.events)} "
          f"input events from {os.path.basename(segment.log_path)}, {'realtime 20 Hz' if args.realtime else 'lockstep'}"
          + (f", {driver_frames} driver frames through dmonitoringmodeld" if driver_frames else "")
          + (f", checked against {type(reference).__name__}" if reference is not None else "")
          + (f", driver camera checked against {type(driver_check.reference).__name__}" if driver_check is not None else "")
          + (f" (tolerance {tolerance:g})" if tolerance is not None else ""))

def replay_segment(folder: str, args: argparse.Namespace, report: Callable[[str], None] = log.info, written: list[str] | None = None) -> Result:
  """Replay one segment with a modeld of its own (and a dmonitoringmodeld, for its driver camera) in this process's OPENPILOT_PREFIX; writes
  OUT/<segment>/ and returns what happened. `written`: the files are listed in it as each is complete (what an interrupted replay did write)."""
  segment = open_segment(folder)
  for line in segment.warnings: report(f"warning: {line}")
  out = os.path.join(args.out, segment.name)
  head = read_bundle(os.path.join(args.artifacts, "model.bin"))[0]
  metadata = head["extras"]["metadata"]
  warp = artifacts_warp(args.artifacts, segment, model_planes(head))  # fail here, not after modeld waited for a warp that is not there
  dm = driver_monitoring(args, segment, report)
  reference = make_reference(args, warp)
  check = ReferenceCheck(reference, metadata, segment, args) if reference is not None else None
  driver_check = make_driver_check(args, segment, dm)
  tolerance = check_tolerance(args, reference, driver_check, check)
  frames, driver_frames = segment.frames, segment.driver_frames if dm else []
  if not args.no_pictures and args.frames[0] >= len(frames): raise RouteError(f"--frames starts at {args.frames[0]}: {segment.name} has {len(frames)} frames")
  report(intro_line(segment, args, reference, driver_check, tolerance, len(driver_frames)))
  lockstep = Lockstep(segment, dm is not None, args.realtime)
  decoders = [FrameDecoder(segment)] + ([FrameDecoder(segment, driver=True)] if dm else [])
  daemons = start_daemons(args, check is not None, driver_check is not None if dm else None)
  result, calibrations = Result(segment.name, files=[] if written is None else written), {}
  accepted = BusInputs(Episodes(lambda line: None))  # the calibration and camera height modeld takes from the log, for the overlay

  def on_road(state: LogState, cam: CameraFrame, road: np.ndarray, wide: np.ndarray) -> None:
    calibrations[cam.frame_id] = accepted.calibration(state), accepted.camera_height(state)
    if check is not None: check.submit(state, cam, road, wide)

  def on_driver(state: LogState, cam: CameraFrame, buf: np.ndarray) -> None:
    if driver_check is not None: driver_check.submit(state, cam, buf)

  try: lockstep.run(daemons, frames, driver_frames, decoders, on_road, on_driver, report)
  finally:
    for d in decoders: d.close()
    for daemon in daemons: daemon.stop()
    lockstep.close()
  by_frame = lockstep.published.by_frame
  result.sent, result.driver_sent, result.seconds = lockstep.sent, lockstep.driver_sent, lockstep.seconds
  models = by_frame["modelV2"]
  result.published, result.driver_published = len(models), len(by_frame.get(DRIVER_SERVICE, {}))
  result.frame_drop_perc_max = max((m.frameDropPerc for m in models.values()), default=0.0)
  os.makedirs(out, exist_ok=True)
  write_log(log_path := os.path.join(out, LOG_NAME), lockstep.published.raw)
  result.files.append(log_path)
  result.check = checked_report(check, driver_check, by_frame, [f.frame_id for f in driver_frames], tolerance)
  if result.check is not None:
    write_check(check_path := os.path.join(out, CHECK_NAME), result.check)
    result.files.append(check_path)
  if not args.no_pictures: result.files.extend(draw(args, segment, out, metadata, by_frame, calibrations, driver_frames, report))
  return result
