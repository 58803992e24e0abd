"""Warp benchmark: time per (road, wide) frame pair, kernel count and bundle size, for camerad's frame sizes, packed and --split-frames.

  python -m benchmarks.bench_warp [--runs 200] [--json out/bench_warp.json]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from tinygrad import Device, Tensor

from benchmarks.bench import write_json
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.loader import load_model
from sunnypilot.modeld_v2.warp import camerad_frame

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--runs", type=int, default=200, help="timed warps per case (median reported)")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for size in ((1928, 1208), (1344, 760)):
      frame = camerad_frame(*size)
      for split in (False, True):
        path = os.path.join(tmp, "warp.bin")
        summary = compile_warp(frame.spec, "512x256", path, split_frames=split)
        run = load_model(path)["run"]
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
        rows.append({"frame": f"{size[0]}x{size[1]}", "layout": "split" if split else "packed", "device": Device.DEFAULT,
                     "kernels": summary["kernels"], "bundle_bytes": summary["bytes"], "ms_median": statistics.median(times),
                     "ms_p95": float(np.percentile(times, 95))})
        print(f"{rows[-1]['frame']} {rows[-1]['layout']}: {rows[-1]['ms_median']:.2f} ms", file=sys.stderr)
  print("| frame | layout | device | kernels | bundle bytes | ms per pair (median) | p95 |\n|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['frame']} | {r['layout']} | {r['device']} | {r['kernels']} | {r['bundle_bytes']} | {r['ms_median']:.2f} | {r['ms_p95']:.2f} |")
  write_json(args.json, rows)
  return 0

if __name__ == "__main__":
  sys.exit(main())
