"""Driving-model benchmark: compile time, bundle size, kernels and per-step time of every generation's stand-in (tiny and full) on this device.

  python -m benchmarks.bench_modeld [--sizes tiny,full] [--generations native,split_09,...] [--variants default,fuse-layers,beam2]
                                    [--steps 50] [--json out/bench_modeld.json]

Variants: `default` (a realize point per Conv/MatMul/Gemm, no search, the output parse in the graph), `fuse-layers` (tinygrad left to fuse
across layers: the compiler's behaviour before layer boundaries), `beamN` (default, each kernel searched with BEAM=N; compile time includes
the search, or a hit in tinygrad's search cache), `host-parse` (without the output parse in the graph: modeld parses on the host); `+`
joins them (`beam2+host-parse`). A generation's variants are stepped in turns, one step each, so they share the machine's state: `default`
against `host-parse` is the cost of the parse in the graph. With `--camera WxH` each step is a frame as modeld runs it: the model fused
with a --split-frames warp for that camera (compiled with the variant's BEAM), camera frames bound, the graph run, every output read back.
"""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from tinygrad import Device, Tensor

from benchmarks.common import check_outputs, markdown_table, percentiles, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.format.bundle import next_name, state_names
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools import stand_in_models

def stepper(path: str):
  """A step of the loaded bundle with states written in place, as modeld runs it: a function returning its time in ms."""
  model = load_bundle(path)
  rng = np.random.default_rng(0)
  tensor = lambda shape, dtype: Tensor(rng.integers(0, 256, shape).astype(dtype) if np.dtype(dtype) == np.uint8 else np.zeros(shape, dtype)).realize()
  inputs = {k: tensor(s, d) for k, (s, d, _) in model.input_specs.items()}
  states = {next_name(k): k for k in state_names(model.input_specs, model.output_specs)}
  outs = {k: inputs[states[k]] if k in states else tensor(s, d) for k, (s, d, _) in model.output_specs.items()}
  def step() -> float:
    t = time.perf_counter()
    model.run(**inputs, output_buffers=outs)
    Device[Device.DEFAULT].synchronize()
    return (time.perf_counter() - t) * 1e3
  return step

def frame_stepper(path: str, warp: str, frame) -> Callable[[], float]:
  """A frame of the bundle fused with `warp`, as modeld runs it (ModelRunner: copy_frames, run, every output read back): a function
  returning its time in ms."""
  from benchmarks.frame_inputs import synthetic_buffers
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  adapter, bufs = ModelRunner(path, warp), synthetic_buffers(frame, 1)[0]
  def step() -> float:
    t = time.perf_counter()
    adapter.copy_frames(bufs)
    adapter.run()
    for name in adapter.readbacks: adapter.output_array(name)
    return (time.perf_counter() - t) * 1e3
  return step

def step_ms(paths: list[str], steps: int, warps: list[str] | None = None, frame=None) -> list[list[float]]:
  """Per-step times of each bundle (fused with its warp when `warps` are given), stepped in turns (each round starting at the next one)
  after 5 warm-up rounds."""
  steppers = [stepper(p) for p in paths] if warps is None else [frame_stepper(p, w, frame) for p, w in zip(paths, warps, strict=True)]
  times: list[list[float]] = [[] for _ in paths]
  for i in range(steps + 5):
    for k in range(len(paths)):
      j = (i + k) % len(paths)
      ms = steppers[j]()
      if i >= 5: times[j].append(ms)
  return times

def variant_options(name: str) -> dict:
  options = {}
  for part in name.split("+"):
    if part == "default": continue
    elif part == "fuse-layers": options["fuse_layers"] = True
    elif part == "host-parse": options["host_parse"] = True
    elif part.startswith("beam") and part[4:].isdigit(): options["beam"] = int(part[4:])
    else: raise SystemExit(f"bench_modeld: unknown variant {name!r} (default, fuse-layers, host-parse, beamN, joined by +)")
  return options

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_modeld", __doc__)
  parser.add_argument("--sizes", default="tiny,full")
  parser.add_argument("--generations", default=",".join(stand_in_models.NAMES), help="stand-in generations, comma separated")
  parser.add_argument("--variants", default="default",
                      help="compile variants per generation, comma separated: default, fuse-layers, host-parse, beamN, joined by +")
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--camera", metavar="WxH", help="step each bundle as a frame: fused with a --split-frames warp for this camera size")
  parser.add_argument("--json")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  frame, rows = None, []
  if args.camera:
    from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
    try: frame = camerad_frame(*(int(v) for v in args.camera.split("x")))
    except ValueError as e: parser.error(f"--camera {args.camera}: {e}")
  with tempfile.TemporaryDirectory() as tmp:
    warps: dict[int, str] = {}  # BEAM -> the warp compiled with it
    for size in args.sizes.split(","):
      for generation in args.generations.split(","):
        stand_in, built = stand_in_models.write(generation, size, os.path.join(tmp, f"{generation}.onnx")), {}
        for variant in args.variants.split(","):
          print(f"compiling {generation} {size} ({variant}) ...", file=sys.stderr, flush=True)
          out = os.path.join(tmp, f"{generation}_{variant}.bin")
          built[variant] = out, compile_model(out, **stand_in["files"], log=lambda s: None, **variant_options(variant))
        paths, beams = [out for out, _ in built.values()], [variant_options(v).get("beam", 0) for v in built]
        if frame is not None:
          from sunnypilot.modeld_v2.compile_warp import compile_warp
          for beam in (b for b in beams if b not in warps):
            print(f"compiling the warp for {args.camera} (BEAM={beam}) ...", file=sys.stderr, flush=True)
            warps[beam] = compile_warp(frame.spec, "512x256", os.path.join(tmp, f"warp_beam{beam}.bin"), True, beam=beam)["output"]
        timed = step_ms(paths, args.steps, [warps[b] for b in beams] if frame is not None else None, frame)
        for (variant, (out, summary)), times in zip(built.items(), timed, strict=True):
          rows.append({"generation": generation, "variant": variant, "size": size, "device": Device.DEFAULT, "gflops": stand_in["flops"] / 1e9,
                       "mparams": stand_in["params"] / 1e6, "frame_skip": load_bundle(out).metadata["frame_skip"], "compile_s": summary["compile_s"],
                       "kernels": summary["kernels"], "bundle_mb": summary["bytes"] / 1e6, "camera": args.camera, "step_ms_median": statistics.median(times),
                       **{f"step_ms_{k}": v for k, v in percentiles(times, (10, 95), max_and_n=False).items()}})
  if args.camera: print(f"each step a frame: the model fused with the --split-frames warp for {args.camera}, frames bound, every output read back")
  print(markdown_table(("generation (random-weight stand-in)", "variant", "size", "device", "GFLOPs/step", "M params", "frame_skip", "compile s", "kernels",
                        "bundle MB", "step ms (median)", "p10", "p95"),
                       ((r["generation"], r["variant"], r["size"], r["device"], f"{r['gflops']:.3f}", f"{r['mparams']:.2f}", r["frame_skip"] or "-",
                         f"{r['compile_s']:.1f}", r["kernels"], f"{r['bundle_mb']:.1f}", f"{r['step_ms_median']:.2f}", f"{r['step_ms_p10']:.2f}",
                         f"{r['step_ms_p95']:.2f}") for r in rows)))
  write_json(args.json, rows)
  return 0

if __name__ == "__main__":
  sys.exit(main())
