"""Route replay throughput on this machine: a synthetic segment (synthetic_route), replayed in lockstep by route_replay, without and
with the onnxruntime reference check, and the frame decoder alone.

  python -m benchmarks.bench_route --camera 1928x1208 --frames 200 --model tiny --json out/bench_route.json

Lockstep frames/s counts from the first frame sent to modelV2 of the last (modeld's start and the pictures are not in it); the decoder
row is FrameDecoder alone (HEVC -> camerad NV12, road and wide), which runs ahead of modeld in a thread during a replay. The model is
the native random-weight stand-in, built with the demo's artifacts (out/artifacts/<device>_native_<size>) when missing.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

from benchmarks.common import check_outputs, logger, markdown_table, write_json

def replay_fps(segment: str, artifacts: str, out: str, flags: list[str]) -> float:
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", segment, "--artifacts", artifacts, "--out", out, "--no-pictures",
                        *flags], capture_output=True, text=True)
  if run.returncode != 0 or not (m := re.search(r"([\d.]+) frames/s", run.stdout)): raise SystemExit(f"route_replay failed:\n{run.stdout}\n{run.stderr}")
  print(run.stdout.splitlines()[0], file=sys.stderr)
  return float(m[1])

def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.cli import checked, positive_int
  from sunnypilot.modeld_v2.common.cli import parser as cli_parser
  from sunnypilot.modeld_v2.model.calibration import parse_camera_size
  from sunnypilot.modeld_v2.replay.route_segment import FrameDecoder, open_segment
  from sunnypilot.modeld_v2.replay.synthetic_route import write_segment
  from sunnypilot.modeld_v2.tools.demo import build_artifacts
  parser = cli_parser("benchmarks.bench_route", __doc__)
  parser.add_argument("--camera", type=checked(parse_camera_size), default="1928x1208", help="a comma camera's frame size (default 1928x1208)")
  parser.add_argument("--frames", type=positive_int, default=200, help="frames in the synthetic segment (default 200)")
  parser.add_argument("--model", default="tiny", choices=("tiny", "full"))
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  camera = args.camera
  log = logger()
  artifacts = os.path.join("out", "artifacts", f"{Device.DEFAULT.lower()}_native_{args.model}")
  build_artifacts(artifacts, camera, "native", args.model, {}, log)
  onnx = os.path.join(artifacts, f"native_{args.model}_stand_in.onnx")
  with tempfile.TemporaryDirectory() as tmp:
    segment = os.path.join(tmp, "2026-01-01--00-00-00--0")
    log(f"writing a {args.frames}-frame {camera[0]}x{camera[1]} segment ...")
    write_segment(segment, camera, args.frames, distinct=20)
    t = time.perf_counter()
    decoded = sum(1 for _ in FrameDecoder(open_segment(segment)))
    rows = {"decoder alone (road + wide, HEVC -> NV12)": decoded / (time.perf_counter() - t)}
    log("replaying in lockstep ...")
    rows["lockstep replay"] = replay_fps(segment, artifacts, os.path.join(tmp, "out"), [])
    if os.path.exists(onnx):
      log("replaying in lockstep with the onnxruntime check ...")
      rows["lockstep replay + onnxruntime check"] = replay_fps(segment, artifacts, os.path.join(tmp, "out"), ["--onnx", onnx])
  print(f"route replay, {Device.DEFAULT}, {camera[0]}x{camera[1]}, native {args.model} stand-in, {args.frames} frames\n")
  print(markdown_table(("path", "frames/s"), ((name, f"{fps:.1f}") for name, fps in rows.items())))
  write_json(args.json, {"device": Device.DEFAULT, "camera": f"{camera[0]}x{camera[1]}", "model": args.model, "frames": args.frames, "frames_per_s": rows})
  return 0

if __name__ == "__main__":
  sys.exit(main())
