"""Warp benchmark: time per (road, wide) frame pair, kernel count and bundle size, for camerad's frame sizes, packed and --split-frames.

  python -m benchmarks.bench_warp [--runs 200] [--beams 0,2] [--cameras 1928x1208,1344x760] [--json out/bench_warp.json]
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import numpy as np
from tinygrad import Device, Tensor

from benchmarks.common import check_outputs, markdown_table, percentiles, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.loader import load_bundle

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_warp", __doc__)
  parser.add_argument("--runs", type=int, default=200, help="timed warps per case (median reported)")
  parser.add_argument("--beams", default="0", help="BEAM levels to build with, comma separated (0: no search), e.g. 0,2")
  parser.add_argument("--cameras", default="1928x1208,1344x760")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for size, split, beam in ((tuple(int(x) for x in c.split("x")), split, int(b)) for c in args.cameras.split(",") for split in (False, True)
                              for b in args.beams.split(",")):
      frame = camerad_frame(*size)
      path = os.path.join(tmp, "warp.bin")
      t0 = time.perf_counter()
      summary = compile_warp(frame.spec, "512x256", path, split_frames=split, beam=beam, log=lambda s: None)
      compile_s = time.perf_counter() - t0
      run = load_bundle(path).run
      rng = np.random.default_rng(0)
      bufs = rng.integers(0, 256, (2, frame.size), dtype=np.uint8)
      m_inv = Tensor(np.stack([np.eye(3, dtype=np.float32)] * 2)).realize()
      inputs = {"frame": Tensor(bufs[0]).realize(), "big_frame": Tensor(bufs[1]).realize()} if split else {"input_frame": Tensor(bufs).realize()}
      times = []
      for i in range(args.runs + 10):
        t = time.perf_counter()
        run(**inputs, M_inv=m_inv)
        Device[Device.DEFAULT].synchronize()
        if i >= 10: times.append((time.perf_counter() - t) * 1e3)
      rows.append({"frame": f"{size[0]}x{size[1]}", "layout": "split" if split else "packed", "beam": beam, "device": Device.DEFAULT,
                   "compile_s": compile_s, "kernels": summary["kernels"], "bundle_bytes": summary["bytes"], "ms_median": statistics.median(times),
                   **{f"ms_{k}": v for k, v in percentiles(times, (10, 95), max_and_n=False).items()}})
      print(f"{rows[-1]['frame']} {rows[-1]['layout']} BEAM={beam}: {rows[-1]['ms_median']:.3f} ms", file=sys.stderr)
  print(markdown_table(("frame", "layout", "BEAM", "device", "compile s", "kernels", "bundle bytes", "ms per pair (median)", "p10", "p95"),
                       ((r["frame"], r["layout"], r["beam"], r["device"], f"{r['compile_s']:.1f}", r["kernels"], r["bundle_bytes"], f"{r['ms_median']:.3f}",
                         f"{r['ms_p10']:.3f}", f"{r['ms_p95']:.3f}") for r in rows)))
  write_json(args.json, rows)
  return 0

if __name__ == "__main__":
  sys.exit(main())
