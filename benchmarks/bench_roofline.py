"""Roofline of fused frames side by side: each frame's calls timed alone against its roofline bound (tools/kernel_profile.py, what
`inspect_bundle profile` prints), then one table of the frames: FLOPs, bytes, floor, bound, floor / bound, where the time is.

  DEV=CUDA python -m benchmarks.bench_roofline dm=out/dm_sweep/f16_b2 driving=out/driving_sweep/f32_b2 --peaks h200 --json out/roofline.json
  python -m benchmarks.bench_roofline dm=out/dm/dmonitoring_model.bin:out/dm/dm_warp_1928x1208.bin --peak-tflops 0.3 --peak-tbs 0.05 --top 5

Each frame is LABEL=FOLDER (a sweep variant's folder: its built.json names the model and its warps; the first warp is fused in front) or
LABEL=MODEL.bin:WARP.bin. --peaks h200 takes the H200 datasheet's rates, each kernel's FLOP rate picked by its arithmetic (fp32 on the
vector units, fp16 or TF32 on the tensor cores: kernel_profile.Arithmetic). A frame that cannot be profiled is one line; the others go on.
"""
from __future__ import annotations

import json
import os
import sys

from benchmarks.common import check_outputs, logger, markdown_table, write_json
from sunnypilot.modeld_v2.common.cli import finite_float, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

def bundles(spec: str) -> tuple[str, str, str]:
  """LABEL=FOLDER or LABEL=MODEL.bin:WARP.bin -> (label, model, warp)."""
  label, sep, where = spec.partition("=")
  if not sep or not label or not where: raise ValueError(f"{spec!r} is not LABEL=FOLDER or LABEL=MODEL.bin:WARP.bin")
  if os.path.isdir(where):
    try:
      with open(os.path.join(where, "built.json")) as f: record = json.load(f)
    except (OSError, ValueError) as e: raise ValueError(f"{where}: no sweep build record here ({e})") from None
    return label, record["model"], next(iter(record["warps"].values()))
  model, sep, warp = where.partition(":")
  if not sep: raise ValueError(f"{where}: not a folder (a sweep variant's), and not MODEL.bin:WARP.bin")
  return label, model, warp

def side_by_side(results: dict[str, dict]) -> str:
  rows = []
  for label, r in results.items():
    tc = sum(1 for c in r["calls"] if c.get("tensor_cores"))
    bound = f"{r['bound_s'] * 1e3:.4f}" if r["bound_s"] else "-"
    ratio = f"{r['floor_s'] / r['bound_s']:.1f}x" if r["bound_s"] else "-"
    kinds = ", ".join(f"{k} {v['s'] * 1e3:.3f} ms" for k, v in r["by_arithmetic"].items())
    gaps = sorted(r["calls"], key=lambda c: -(c["s"] - (c["bound_s"] or 0)))[:3]
    far = ", ".join(f"{c['name'][:28]} {(c['s'] - (c['bound_s'] or 0)) * 1e6:.0f} us" for c in gaps)
    rows.append((label, len(r["calls"]), tc, f"{r['ops'] / 1e9:.3f}", f"{r['bytes'] / 1e6:.1f}", f"{r['sum_s'] * 1e3:.3f}", f"{r['floor_s'] * 1e3:.3f}",
                 bound, ratio, kinds, far))
  return "\n" + markdown_table(("frame", "calls", "with tensor cores", "GFLOP", "MB", "kernels alone, summed", "floor ms", "roofline bound ms",
                                 "floor / bound", "time per arithmetic (alone)", "furthest from their bound"), rows)

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_roofline", __doc__)
  parser.add_argument("frames", nargs="+", help="LABEL=FOLDER (a sweep variant's) or LABEL=MODEL.bin:WARP.bin")
  parser.add_argument("--rounds", type=positive_int, default=20, help="timed runs per call (median)")
  peak = finite_float(0, 1e6, low_open=True)
  parser.add_argument("--peak-tflops", type=peak, help="the device's peak FLOP rate, TFLOP/s (say where it comes from)")
  parser.add_argument("--peak-tbs", type=peak, help="the device's peak memory bandwidth, TB/s")
  parser.add_argument("--peaks", help="a device's datasheet preset instead (h200)")
  parser.add_argument("--top", type=positive_int, default=12, help="print the N slowest calls of each frame")
  parser.add_argument("--json", help="write every frame's profile here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  from sunnypilot.modeld_v2.tools.kernel_profile import PEAKS, bound_calls, profile, table
  if args.peaks and args.peaks not in PEAKS: parser.error(f"--peaks: one of {', '.join(PEAKS)}")
  if args.peaks and (args.peak_tflops or args.peak_tbs): parser.error("--peaks sets the peaks: give it or --peak-tflops/--peak-tbs, not both")
  if bad := [s for s in args.frames if not all(s.partition("=")[::2]) or "=" not in s]: parser.error(f"{bad}: not LABEL=FOLDER or LABEL=MODEL.bin:WARP.bin")
  log = logger("benchmarks.bench_roofline: ")
  results = {}
  for spec in args.frames:
    label = spec.partition("=")[0]
    try:
      label, model, warp = bundles(spec)
      log(f"{label}: profiling {model} with {warp} fused in front, {args.rounds} runs per call ...")
      replay, what = bound_calls(model, warp)
      result = profile(replay, args.rounds, args.peak_tflops and args.peak_tflops * 1e12, args.peak_tbs and args.peak_tbs * 1e12,
                       PEAKS[args.peaks] if args.peaks else None)
    except Exception as e:  # a frame that cannot be profiled must not sink the others
      log(f"{label}: cannot profile: {type(e).__name__}: {str(e)[:200]}")
      continue
    results[label] = result | {"model": model, "warp": warp, "what": what}
    print(f"\n{label}: {model} + {warp}\n{table(result, args.top)}", flush=True)
  if results: print(side_by_side(results))
  write_json(args.json, results)
  return 0 if results else 2

if __name__ == "__main__":
  sys.exit(main())
