"""float16 against float32 over a route: how far a half-precision bundle moves each published field from onnxruntime on the float32 ONNX.

  python -m benchmarks.bench_precision SEGMENT [--generation split_current | --onnx M.onnx | --vision V.onnx --policy P.onnx ...]
      [--frames 200] [--workdir out/bench_precision] [--json out/precision.json]

Builds the model (a tiny stand-in of --generation, or the given ONNX files) as a float32 and a float16 bundle and a warp for the segment's
camera, then runs every frame of the segment (SEGMENT: a folder with fcamera.hevc, ecamera.hevc and an rlog; replay.synthetic_route makes
one) through both bundles and onnxruntime, each fed what modeld is fed on the log's state (route_replay's ReferenceCheck: FrameInputs,
its own DrivingState, openpilot's parse and fill through pycapnp). Per output head and per published field of modelV2, drivingModelData and
cameraOdometry it prints the largest absolute and relative (over max(1, |reference|)) difference of each bundle from onnxruntime, with the
frame where it peaks, and compile/precision.float16_bound of the models: the float32 bundle's column is the floor (its kernels' sum
orders), the float16 one's what half precision moves. Table on stdout, all of it as JSON with --json.
"""
from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

PRECISIONS = ("float32", "float16")
NOT_COMPARED = ("modelExecutionTime", "rawPredictions", "locationMonoTimeDEPRECATED", "frameAge", "timestampEof")

def build(files: dict[str, str], frame, workdir: str, log) -> dict[str, str]:
  """The model bundle per precision and the warp for `frame`'s camera."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  out = {}
  for precision in PRECISIONS:
    log(f"compiling the {precision} bundle ...")
    out[precision] = compile_model(os.path.join(workdir, f"model_{precision}.bin"), **files, log=lambda s: None, precision=precision)["output"]
  out["warp"] = compile_warp(frame.spec, "512x256", os.path.join(workdir, "warp.bin"), split_frames=True, log=lambda s: None)["output"]
  return out

def compare(files: dict[str, str], bundles: dict[str, str], segment_path: str, frames: int, log) -> dict:
  """Every frame of the segment through each bundle and onnxruntime; per head and field, each bundle's largest differences."""
  from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  from sunnypilot.modeld_v2.replay.log_state import LogState
  from sunnypilot.modeld_v2.replay.onnx_reference import OnnxReference
  from sunnypilot.modeld_v2.replay.reference_check import BundleReference, ReferenceCheck, difference
  from sunnypilot.modeld_v2.replay.route_segment import EventFeed, FrameDecoder, open_segment
  segment = open_segment(segment_path)
  args = SimpleNamespace(rhd=False, camera_offset=0.0, lat_delay=TYPICAL_CAR.lateral, long_delay=TYPICAL_CAR.longitudinal)
  metadata = read_bundle(bundles["float32"])[0]["extras"]["metadata"]
  checks = {"onnxruntime": ReferenceCheck(OnnxReference(files), metadata, segment, args)}
  checks |= {p: ReferenceCheck(BundleReference(bundles[p], bundles["warp"]), metadata, segment, args) for p in PRECISIONS}
  worst = {p: {} for p in PRECISIONS}
  def note(p: str, key: str, absolute: float, relative: float, frame_id: int) -> None:
    w = worst[p].setdefault(key, {"abs": 0.0, "rel": 0.0, "frame": frame_id})
    if relative > w["rel"] or (relative == w["rel"] and absolute > w["abs"]): w.update(abs=max(w["abs"], absolute), rel=relative, frame=frame_id)
    w["abs"] = max(w["abs"], absolute)
  state, feed, decoder, n = LogState(), EventFeed(segment.events), FrameDecoder(segment), 0
  try:
    for cam, (road, wide) in zip(segment.frames[:frames], decoder):
      for event in feed.until(cam.log_time):
        if event.service in state.seen: state.update(event.service, event.data)
      for check in checks.values(): check.step(state.snapshot(), cam, road, wide)
      ref_out, ref_msgs = checks["onnxruntime"].pending.pop(cam.frame_id)
      for p in PRECISIONS:
        out, msgs = checks[p].pending.pop(cam.frame_id)
        for head, (a, b) in ((h, s) for h, s in metadata["output_slices"].items() if "/" not in h):  # a model's own copy of a head: the same floats
          note(p, f"head {head}", float(np.abs(out[a:b] - ref_out[a:b]).max()), difference(out[a:b].tolist(), ref_out[a:b].tolist(), True), cam.frame_id)
        for service, fields in ref_msgs.items():
          for path, value in fields.items():
            if path.split(".")[0] in NOT_COMPARED or path == "frameId": continue
            got = msgs[service].get(path)
            note(p, f"{service}.{path}", difference(got, value), difference(got, value, True), cam.frame_id)
      state.next_frame()
      n += 1
      if n % 50 == 0: log(f"{n} frames")
  finally:
    decoder.close()
    for check in checks.values(): check.finish()
  return {"segment": segment.name, "frames": n, "rows": worst}

def table(result: dict, bound: float) -> str:
  f32, f16 = result["rows"]["float32"], result["rows"]["float16"]
  rows = ((key, f"{f32[key]['abs']:.3g}", f"{f32[key]['rel']:.3g}", f"{b['abs']:.3g}", f"{b['rel']:.3g}", b["frame"]) for key, b in f16.items())
  return "\n".join([f"{result['segment']}: {result['frames']} frames; float16_bound of the models {bound:.3g} (of the outputs' scale)", "",
                    markdown_table(("head / published field", "float32 bundle max abs", "max rel", "float16 bundle max abs", "max rel", "frame"), rows)])

def main(argv: list[str] | None = None) -> int:
  from sunnypilot.modeld_v2.compile.model_plan import add_model_flags, model_files
  from sunnypilot.modeld_v2.compile.precision import float16_bound
  from sunnypilot.modeld_v2.replay.route_segment import RouteError, open_segment
  from sunnypilot.modeld_v2.tools import stand_in_models
  parser = cli_parser("benchmarks.bench_precision", __doc__)
  parser.add_argument("segment", help="a segment folder (fcamera.hevc, ecamera.hevc, rlog)")
  add_model_flags(parser, ": the model to build (default: a tiny stand-in of --generation)")
  parser.add_argument("--generation", default="split_current", choices=stand_in_models.NAMES, help="the stand-in's generation")
  parser.add_argument("--frames", type=int, default=200, help="at most this many frames of the segment")
  parser.add_argument("--workdir", default=os.path.join("out", "bench_precision"))
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  if args.frames < 1: parser.error("--frames must be positive")
  log = logger()
  try: segment = open_segment(args.segment)
  except RouteError as e: parser.exit(2, f"{parser.prog}: error: {e}\n")
  os.makedirs(args.workdir, exist_ok=True)
  files = model_files(args) or stand_in_models.write(args.generation, "tiny", os.path.join(args.workdir, f"{args.generation}.onnx"))["files"]
  bundles = build(files, segment.frame, args.workdir, log)
  result = compare(files, bundles, args.segment, args.frames, log)
  bound = float16_bound(files)
  print(table(result, bound))
  write_json(args.json, result | {"files": files, "float16_bound": bound})
  return 0

if __name__ == "__main__":
  sys.exit(main())
