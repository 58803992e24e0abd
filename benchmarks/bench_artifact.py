"""Benchmark plain artifacts against pickled TinyJits: load, first call, and per-call host overhead on the same kernels; and where the time
of a fused load goes (the question a disk cache of fused parts would answer).

  python -m benchmarks.bench_artifact [--calls 3000] [--loads 5] [--fused-load full] [--json out/bench_artifact.json]

The fused load runs in fresh processes, interleaved: the loader's way (read the model and the warp bundles, fuse in memory, build the
replay) against reading one bundle that already holds the fused part (what any disk cache of fused parts would read at the least, with
no check of the source files) and building the same replay.
"""
from __future__ import annotations

import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
from tinygrad import Device, Tensor, dtypes

from benchmarks.common import check_outputs, markdown_table, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.format.bundle import write_bundle
from sunnypilot.modeld_v2.format.part import Part
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay

def small_kernels(n: int = 13):
  """13 inputs, 13 tiny kernels: the shape of modeld's per-frame host work (desire, traffic convention, states, ...), kernels near free."""
  rng = np.random.default_rng(0)
  fn = lambda **xs: tuple((x * 2 + 1).contiguous() for _, x in sorted(xs.items()))
  return fn, lambda: {f"x{i:02d}": Tensor(rng.standard_normal(16).astype(np.float32)).realize() for i in range(n)}

def conv_net():
  rng = np.random.default_rng(0)
  w1 = Tensor(rng.standard_normal((16, 12, 3, 3)).astype(np.float32) * 0.1).realize()
  w2 = Tensor(rng.standard_normal((16, 16, 3, 3)).astype(np.float32) * 0.1).realize()
  fn = lambda img: (img.cast(dtypes.float32) / 255).conv2d(w1, stride=2).relu().conv2d(w2, stride=2).relu().mean(axis=(2, 3))
  return fn, lambda: {"img": Tensor(rng.integers(0, 256, (1, 12, 64, 128), dtype=np.uint8)).realize()}

CASES = {"13 inputs x 13 tiny kernels": small_kernels, "uint8 conv net": conv_net}

LOAD = """
import json, pickle, sys, time
from tinygrad import Device, Tensor
import numpy as np
Device[Device.DEFAULT]
kind, path, names = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
inputs = {name: Tensor(np.zeros(shape, dtype)).realize() for name, (shape, dtype) in names.items()}
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
imported_tinygrad()  # both sides start with their code imported and the imported tinygrad identified
t0 = time.perf_counter()
if kind == "bundle":
  run = Replay(*read_parts(path)[0]["run"])
else:
  with open(path, "rb") as f: run = pickle.load(f)
t1 = time.perf_counter()
run(**inputs)
Device[Device.DEFAULT].synchronize()
print(json.dumps({"load_ms": (t1 - t0) * 1e3, "first_call_ms": (time.perf_counter() - t1) * 1e3}))
"""

def fresh_load(kind: str, path: str, specs: dict) -> dict:
  out = subprocess.run([sys.executable, "-c", LOAD, kind, path, json.dumps(specs)], capture_output=True, text=True, check=True)
  return json.loads(out.stdout.strip().splitlines()[-1])

def per_call_us(fn, inputs: dict, calls: int) -> float:
  """Median microseconds per call over batches of 100 calls."""
  for _ in range(20): fn(**inputs)
  samples = []
  for _ in range(max(1, calls // 100)):
    t = time.perf_counter()
    for _ in range(100): fn(**inputs)
    Device[Device.DEFAULT].synchronize()
    samples.append((time.perf_counter() - t) / 100 * 1e6)
  return statistics.median(samples)

def bench_case(name: str, make_case, calls: int, loads: int, tmp: str) -> dict:
  fn, make = make_case()
  jit, part, inputs = capture(fn, make, prune=False)
  bundle, pickled = os.path.join(tmp, "bundle.bin"), os.path.join(tmp, "jit.pkl")
  write_bundle(bundle, {"run": part}, {})
  with open(pickled, "wb") as f: pickle.dump(jit, f)
  specs = {k: (list(v.shape), np.dtype(v.dtype.fmt).str) for k, v in inputs.items()}
  loads_b = [fresh_load("bundle", bundle, specs) for _ in range(loads)]
  loads_p = [fresh_load("pickle", pickled, specs) for _ in range(loads)]
  plain, inputs = Replay(*part), make()
  plain(**inputs)
  floor = lambda **_: plain.run_bound(wait=False)  # the same kernel calls on the bound inputs, no Python per input: the floor
  # interleaved, three rounds each, so drift on a shared machine hits both sides alike
  rounds = [(per_call_us(jit, inputs, calls), per_call_us(plain, inputs, calls), per_call_us(floor, inputs, calls)) for _ in range(3)]
  tinyjit_us, plain_us, floor_us = (statistics.median(r[i] for r in rounds) for i in range(3))
  med = lambda rows, key: statistics.median(r[key] for r in rows)
  record = Part.from_json(*part)
  return {"case": name, "device": Device.DEFAULT, "kernels": len(record.calls), "inputs": len(record.inputs),
          "bundle_bytes": os.path.getsize(bundle), "pickle_bytes": os.path.getsize(pickled),
          "load_ms": {"bundle": med(loads_b, "load_ms"), "pickle": med(loads_p, "load_ms")},
          "first_call_ms": {"bundle": med(loads_b, "first_call_ms"), "pickle": med(loads_p, "first_call_ms")},
          "per_call_us": {"tinyjit": tinyjit_us, "bundle": plain_us, "kernel_floor": floor_us},
          "host_overhead_us": {"tinyjit": tinyjit_us - floor_us, "bundle": plain_us - floor_us}}

FUSED_LOAD = """
import json, sys, time
from tinygrad import Device
Device[Device.DEFAULT]
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
from sunnypilot.modeld_v2.runtime.frame_fusion import fuse
from sunnypilot.modeld_v2.runtime.loader import load_device, loaded
imported_tinygrad()
kind, model, warp, fused = sys.argv[1:5]
dev = load_device()
t = [time.perf_counter()]
if kind == "fuse":
  bundles = read_parts(model, dev), read_parts(warp, dev)
  t.append(time.perf_counter())
  parts, extras = fuse(*bundles, "warp.bin")
else:
  parts, extras = read_parts(fused, dev)
  t.append(time.perf_counter())
t.append(time.perf_counter())
loaded(parts, extras, dev)
t.append(time.perf_counter())
print(json.dumps({k: (b - a) * 1e3 for k, a, b in zip(("read", "fuse", "replay"), t, t[1:])} | {"total": (t[-1] - t[0]) * 1e3}))
"""
FUSED_LOAD_KINDS = {"fuse": "model + warp bundles, fused in memory (load_fused)", "cached": "one bundle holding the fused part (a cache hit at best)"}

def bench_fused_load(size: str, loads: int, tmp: str) -> dict:
  """Median stage times of a fused load (native stand-in of `size`, 1928x1208 split warp) in fresh processes, the two kinds interleaved."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.format.bundle import read_parts
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.runtime.frame_fusion import fuse
  from sunnypilot.modeld_v2.tools import stand_in_models
  model, warp, fused = (os.path.join(tmp, f) for f in ("model.bin", "warp.bin", "fused.bin"))
  compile_model(model, **stand_in_models.write("native", size, os.path.join(tmp, "native.onnx"))["files"], log=lambda s: None)
  compile_warp(camerad_frame(1928, 1208).spec, "512x256", warp, split_frames=True, log=lambda s: None)
  write_bundle(fused, *fuse(read_parts(model), read_parts(warp), "warp.bin"))
  runs: dict[str, list[dict]] = {kind: [] for kind in FUSED_LOAD_KINDS}
  for i in range(loads):
    for kind in list(runs)[i % 2:] + list(runs)[:i % 2]:  # each round starts with the other kind
      out = subprocess.run([sys.executable, "-c", FUSED_LOAD, kind, model, warp, fused], capture_output=True, text=True, check=True)
      runs[kind].append(json.loads(out.stdout.strip().splitlines()[-1]))
  return {"model": f"native {size}", "device": Device.DEFAULT, "loads": loads,
          "bytes": {"model": os.path.getsize(model), "warp": os.path.getsize(warp), "fused": os.path.getsize(fused)},
          "ms": {kind: {stage: statistics.median(r[stage] for r in rows) for stage in rows[0]} for kind, rows in runs.items()}}

def fused_load_table(r: dict) -> str:
  rows = ((FUSED_LOAD_KINDS[kind], *(f"{ms[k]:.2f}" for k in ("read", "fuse", "replay", "total"))) for kind, ms in r["ms"].items())
  return "\n".join([f"fused load, {r['model']} stand-in ({r['bytes']['model'] / 1e6:.1f} MB) + 1928x1208 split warp on {r['device']}, fresh "
                    f"processes, median of {r['loads']} (interleaved)", "",
                    markdown_table(("load", "read ms", "fuse ms", "build replay ms", "total ms"), rows)])

def ratio(legacy: float, ours: float) -> str:
  return f"{legacy / ours:.0f}x" if ours >= 0.5 else f">{legacy / 0.5:.0f}x (ours within timing noise of the floor)"

def table(rows: list[dict]) -> str:
  cells = []
  for r in rows:
    ov = r["host_overhead_us"]
    cells.append((r["case"], r["kernels"], f"{r['load_ms']['bundle']:.2f} / {r['load_ms']['pickle']:.2f}",
                  f"{r['first_call_ms']['bundle']:.2f} / {r['first_call_ms']['pickle']:.2f}",
                  f"{r['per_call_us']['tinyjit']:.1f} / {r['per_call_us']['bundle']:.1f} / {r['per_call_us']['kernel_floor']:.1f}",
                  f"{ov['tinyjit']:.1f} / {ov['bundle']:.1f}", ratio(ov["tinyjit"], ov["bundle"])))
  return markdown_table(("case", "kernels", "load ms (bundle / pickle)", "first call ms (bundle / pickle)", "per call us (TinyJit / bundle / floor)",
                         "host overhead us (TinyJit / bundle)", "overhead ratio"), cells)

def main(argv: list[str] | None = None) -> None:
  parser = cli_parser("benchmarks.bench_artifact", __doc__)
  parser.add_argument("--calls", type=int, default=3000, help="calls per timing round (median of batches of 100)")
  parser.add_argument("--loads", type=int, default=5, help="fresh processes per load measurement")
  parser.add_argument("--fused-load", default="full", choices=("tiny", "full", "none"), help="stand-in model size for the fused load (none: skip)")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  rows, fused = [], None
  with tempfile.TemporaryDirectory() as tmp:
    for name, make_case in CASES.items():
      print(f"benchmarking {name} on {Device.DEFAULT} ...", file=sys.stderr, flush=True)
      rows.append(bench_case(name, make_case, args.calls, args.loads, tmp))
    if args.fused_load != "none":
      print(f"benchmarking a fused load ({args.fused_load} stand-in) on {Device.DEFAULT} ...", file=sys.stderr, flush=True)
      fused = bench_fused_load(args.fused_load, args.loads, tmp)
  print(table(rows))
  if fused: print("\n" + fused_load_table(fused))
  write_json(args.json, {"cases": rows, "fused_load": fused})

if __name__ == "__main__":
  main()
