"""Replay a recorded drive: modeld on a segment's videos and logs (and dmonitoringmodeld on its driver camera), their outputs written as a
log, checked frame by frame against onnxruntime or a second bundle, and drawn over the road.

  python -m sunnypilot.modeld_v2.replay.route_replay SEGMENT [SEGMENT ...] --artifacts DIR [--out out/replay]
      [--onnx driving.onnx | --vision v.onnx --policy p.onnx | --vision v.onnx --off-policy off.onnx --on-policy on.onnx | --against other/model.bin]
      [--dm-onnx dmonitoring_model.onnx] [--tolerance T] [--realtime] [--frames a:b] [--jobs N | --ray [ADDRESS]] [--camera-offset M]

A SEGMENT is a folder with fcamera.hevc, ecamera.hevc and rlog or qlog (plain, .bz2 or .zst), as a device keeps them in
/data/media/0/realdata/<route>--<n> and comma connect downloads them; a folder of such segments replays each. The tool is a camerad and
a log publisher: frames go out over VisionIPC in camerad's padded NV12 layout, the log's liveCalibration, carState, carControl,
deviceState, driverMonitoringState and liveDelay (where the schema has it) on msgq in log-time order, and modeld runs unchanged.
When the segment has dcamera.hevc (its frames named by the log's driverEncodeIdx or driverCameraState) and the artifacts hold
dmonitoring_model.bin and a dm_warp for the camera, its frames go out on the driver stream in log-time order among the road frames and
dmonitoringmodeld runs beside modeld; driverStateV2 joins the log, and --dm-onnx checks it against onnxruntime on the DM ONNX (the
frame warped in numpy as compile_dm_warp warps it, calib from liveCalibration, openpilot's parse and fill on its raw outputs).

Lockstep (default): the next frame goes out when its daemon has published this one, so nothing drops and a run is deterministic; a road
frame not answered in a second goes out again (the replay stalled between its road and wide buffers: see lockstep). --realtime sends at
20 Hz and reports the frames modeld dropped. Per segment, OUT/<segment>/ gets modeld_rlog.zst (what modeld published, readable with
openpilot_logging's LogReader), overlay.mp4 (plan path, lane lines, road edges and leads over the road camera),
plots.png (desired curvature, acceleration, lead distance and confidence over time; with the driver camera, the driver's face position and
orientation and the probabilities) and, with a reference, check.json (driverStateV2's heads as driverStateV2:<head>; which daemons it
checked, and which ran unchecked and why: the summary says so too).

Several segments (--jobs N local processes, or --ray: Ray tasks on this machine or a cluster, see fleet_replay) also write OUT/fleet.json
and OUT/fleet.png, one report for all (fleet_report); exit 1 when a segment is past its tolerance, 2 when one could not be replayed.
"""
from __future__ import annotations

import argparse
import os
import sys

from sunnypilot.modeld_v2.common.cli import checked, end_with_parent, finite_float, on_interrupt, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
from sunnypilot.modeld_v2.common.logs import setup
from sunnypilot.modeld_v2.compile.model_plan import add_model_flags, model_files
from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts
from sunnypilot.modeld_v2.daemon.bus_inputs import CAMERA_OFFSET_MAX, parse_camera_offset, parse_delay
from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR
from sunnypilot.modeld_v2.replay.fleet_replay import RAY_ADDRESS, replay_fleet
from sunnypilot.modeld_v2.replay.fleet_report import error_record, result_record, write_record
from sunnypilot.modeld_v2.replay.model_daemons import ModeldKilled
from sunnypilot.modeld_v2.replay.ray_fleet import drive
from sunnypilot.modeld_v2.replay.replay_process import NAMESPACE_ENV, new_namespace, remove_namespace_files
from sunnypilot.modeld_v2.replay.route_segment import RouteError, segment_folders
from sunnypilot.modeld_v2.replay.segment_replay import replay_segment
from sunnypilot.modeld_v2.replay.segment_report import summarize

def parse_range(spec: str) -> tuple[int, int | None]:
  """`"a:b"` (either side may be empty) -> (a, b)."""
  parts = spec.split(":")
  if len(parts) != 2 or not all(p.strip().isdigit() or not p.strip() for p in parts): raise ValueError(f"--frames wants a:b (e.g. 0:200 or 600:), got {spec!r}")
  a, b = (int(p) if p.strip() else None for p in parts)
  if b is not None and b <= (a or 0): raise ValueError(f"--frames {spec}: the range is empty")
  return a or 0, b

def parser() -> argparse.ArgumentParser:
  p = cli_parser("route_replay", __doc__)
  p.add_argument("segments", nargs="+", help="segment folders (fcamera.hevc, ecamera.hevc, rlog or qlog), or folders of segments")
  p.add_argument("--artifacts", required=True, help="modeld's artifacts folder: model.bin and a warp for the route's camera")
  p.add_argument("--out", default=os.path.join("out", "replay"), help="where OUT/<segment>/ goes (default out/replay)")
  add_model_flags(p, ": check against onnxruntime on these ONNX files")
  p.add_argument("--dm-onnx", metavar="ONNX", help="check dmonitoringmodeld's driverStateV2 on the segment's dcamera.hevc against onnxruntime on "
                 "this driver-monitoring ONNX (the artifacts then need dmonitoring_model.bin and a dm_warp for the camera)")
  p.add_argument("--against", help="check against a second bundle (e.g. unsearched vs searched, CPU vs CUDA), run with the artifacts' warp")
  p.add_argument("--tolerance", type=finite_float(0, 1e6), help="largest absolute difference allowed per output and published field (default: 1e-3 for float32 "
                 "references, 1e-2 for float16 references and float16 bundles, whose differences count relative to the value above 1)")
  p.add_argument("--realtime", action="store_true", help="send at 20 Hz instead of lockstep and report drops (no reference check)")
  p.add_argument("--frames", default=":", help="the frames drawn in overlay.mp4 and plots.png, a:b (default: all)")
  p.add_argument("--no-pictures", action="store_true", help="skip overlay.mp4 and plots.png")
  p.add_argument("--jobs", type=positive_int, default=1, help="segments replayed at once, each in its own process with its own modeld and msgq prefix")
  p.add_argument("--ray", nargs="?", const="local", type=checked(ray_address), metavar="ADDRESS", help="each segment a Ray task: on a local Ray "
                 "instance started for the run, or on the cluster at ADDRESS (auto: the one `ray start` joined this machine to; or the head's HOST:PORT); "
                 "needs the fleet extra")
  p.add_argument("--replay-cpus", type=finite_float(0, 4096, low_open=True), default=1.0, metavar="N", help="with --ray: the CPUs a replay reserves "
                 "(default 1), so a node runs at most its CPUs / N at once")
  p.add_argument("--result", metavar="FILE", help="write this segment's record (status, reason, frames, seconds, the check) as JSON here: how --jobs and --ray "
                 "collect their fleet report")
  p.add_argument("--driver", metavar="RUN", help="with --ray: be the Ray driver of the fleet run RUN, writing each segment's record where the fleet reads "
                 "them (route_replay --ray runs its driver in a process of its own: Ray ends that process when its node is lost, not the report)")
  p.add_argument("--rhd", action="store_true", help="passed to modeld (else driverMonitoringState.isRHD decides)")
  p.add_argument("--lat-delay", type=checked(parse_delay), default=TYPICAL_CAR.lateral, help="passed to modeld: the lateral delay in seconds until liveDelay "
                 f"says (default {TYPICAL_CAR.lateral:g}, modeld's: a typical car's steerActuatorDelay + 0.2)")
  p.add_argument("--long-delay", type=checked(parse_delay), default=TYPICAL_CAR.longitudinal, help="passed to modeld: the longitudinal actuator delay in "
                 f"seconds (default {TYPICAL_CAR.longitudinal:g}, modeld's)")
  p.add_argument("--camera-offset", type=checked(parse_camera_offset), default=0.0, help="passed to modeld: sunnypilot's "
                 f"CameraOffset in metres, at most {CAMERA_OFFSET_MAX:g} either way (default 0); the reference check applies it as modeld does")
  return p

def ray_address(text: str) -> str:
  if not RAY_ADDRESS.match(text): raise ValueError(f"expected a Ray address (auto, HOST:PORT or ray://HOST:PORT), got {text!r} (segments go before --ray)")
  return text

def fail(p: argparse.ArgumentParser, problem: str) -> None: p.exit(2, f"route_replay: error: {problem}\n")

def check_args(p: argparse.ArgumentParser, args) -> None:
  """Bad flags and paths in one line, exit 2, before any work."""
  try: args.frames = parse_range(args.frames)
  except ValueError as e: fail(p, str(e))
  models = list(model_files(args))
  if models and args.against: fail(p, "give one reference: ONNX file(s) or --against, not both")
  if (models or args.against or args.dm_onnx) and args.realtime: fail(p, "--realtime drops frames by design: the reference check runs in lockstep only")
  if args.ray and args.jobs > 1: fail(p, "give --jobs (local processes) or --ray (Ray tasks), not both")
  if args.driver is not None and (not args.ray or args.result is not None): fail(p, "--driver drives a --ray fleet: give --ray and no --result")
  for path in [getattr(args, k) for k in models] + [args.against] * bool(args.against) + [args.dm_onnx] * bool(args.dm_onnx):
    if not os.path.isfile(path): fail(p, f"{path}: no such file")
  try:
    check_artifacts(args.artifacts)
    if args.result: check_output_path(args.result)
  except ArtifactError as e: fail(p, str(e))

def main(argv: list[str] | None = None) -> int:
  argv = sys.argv[1:] if argv is None else argv
  p = parser()
  args = p.parse_args(argv)
  setup("route_replay")
  end_with_parent()
  check_args(p, args)
  try: folders = [f for s in args.segments for f in segment_folders(s)]
  except RouteError as e: fail(p, str(e))
  flags = [a for a in argv if a not in args.segments]
  if args.driver is not None:
    at = flags.index("--driver")  # the flags its tasks' replays get: all but this one
    try: return drive(folders, flags[:at] + flags[at + 2:], args, args.driver)
    except RouteError as e: fail(p, str(e))
  if args.result is None and (len(folders) > 1 or args.ray):
    try: return replay_fleet(folders, flags, args)
    except RouteError as e: fail(p, str(e))
  if args.result is not None and len(folders) > 1: fail(p, "--result is one segment's record: give one segment")
  prefix = os.environ.get(NAMESPACE_ENV) or new_namespace()  # a fleet names its replays' namespaces: it ends them, whatever ends this process
  os.environ["OPENPILOT_PREFIX"] = os.environ[NAMESPACE_ENV] = prefix  # the daemons carry the name too
  on_interrupt()  # stop modeld and remove the namespace on SIGTERM too
  written: list[str] = []
  try: result = replay_segment(folders[0], args, written=written)
  except RouteError as e:
    if args.result: write_record(args.result, error_record(os.path.basename(os.path.normpath(folders[0])), str(e), lost=isinstance(e, ModeldKilled)))
    fail(p, str(e))
  except KeyboardInterrupt:
    done = f"wrote {', '.join(written)}" if written else "nothing written"
    p.exit(130, f"route_replay: interrupted: {done} for {os.path.basename(os.path.normpath(folders[0]))}\n")
  finally: remove_namespace_files(prefix)
  if args.result: write_record(args.result, result_record(result))
  print(summarize(result), flush=True)
  return 1 if result.check is not None and not result.check["passed"] else 0

if __name__ == "__main__":
  sys.exit(main())
