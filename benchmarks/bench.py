"""modeld benchmark: this runtime side by side with the legacy pickled TinyJits (and peers), on this machine's device.

  python -m benchmarks.bench --model tiny --camera 1344x760,1928x1208 --frames 1000 --json out/bench.json --plot out/bench.png

Per camera size, in one process and interleaved frame by frame (each frame starting at the next path), it times copy_frames + run + readback for
  fused split   the fused warp+model part, camera buffers read in place (bound by pointer; on CUDA registered with the driver),
                camerad's 18 buffers per stream rotating
  fused split, one buffer pair  the same, one camera buffer pair every frame (what binding per slot costs over no rotation)
  fused split upload  the same part, each frame uploaded instead
  fused packed  the fused part, both frames copied into the packed host buffer and uploaded
  unfused       the warp bundle, then the model bundle (frames and inputs written into their tensors)
  legacy        unpickled TinyJits for warp and model, frames copied each step (old modeld)
peers on the same ONNX and frames (onnxruntime's CPU EP with a numpy warp; PyTorch eager and CUDA-graph replay on a GPU),
and the kernel-only floor (the fused split part's calls on its last bindings with no Python per input: Replay.run_bound). Host
overhead = total - floor; for the fused split path the time is also split into copy_frames, run and output_array. Load times are
measured in fresh processes. Camera buffers are 18 page-aligned shared mappings per stream cycling like camerad's; their contents are
synthetic road scenes. `--beam N` builds the model and warps with searched kernels (the legacy baseline stays unsearched).
`--precision float16` builds the model in half (compile/precision.py; the warps have no precision: uint8 in and out) and runs the peers in
half too: the same float16 ONNX (weights, activations and inputs half, as torch's model.half()), onnxruntime on it where its CPU EP runs
it (else on the float32 ONNX, labelled "float32 only"). Every path's outputs are checked against the fused split path's on every frame:
within 1e-3 in float32; in float16 within twice compile/precision.float16_bound of the models (both sides round), relative above 1.
"""
from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, percentiles, write_json
from benchmarks.frame_inputs import BUFFERS_PER_STREAM, set_inputs, synthetic_buffers
from benchmarks.kernel_floor import device_floor_ms
from benchmarks.peers import TORCH_PEERS, OrtPeer, PeerAdapter, make_peers, output_difference
from benchmarks.stand_ins import build
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM, PACKED_FRAMES, WARP_TRANSFORM
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

class Unfused:
  """The warp bundle, then the model bundle: frames and host inputs written into their tensors each step."""
  def __init__(self, model_path: str, warp_path: str):
    from tinygrad import Tensor

    from sunnypilot.modeld_v2.format.bundle import next_name, state_names
    from sunnypilot.modeld_v2.runtime.loader import load_bundle
    self.warp, self.model = load_bundle(warp_path), load_bundle(model_path)
    zeros = lambda spec: Tensor(np.zeros(spec.shape, spec.dtype)).realize()
    self.frames = zeros(self.warp.input_specs[PACKED_FRAMES])
    self.tfm = zeros(self.warp.input_specs[WARP_TRANSFORM])
    states = state_names(self.model.input_specs, self.model.output_specs)
    self.tensors = {n: zeros(s) for n, s in self.model.input_specs.items() if n != "new_img"}
    state_of = {next_name(s): s for s in states}  # a state's next value is written into the state's own tensor
    self.outputs = {n: self.tensors[state_of[n]] if n in state_of else zeros(s) for n, s in self.model.output_specs.items()}
    self.numpy_inputs = {HOST_TRANSFORM: np.zeros((2, 3, 3), np.float32)} | {n: np.zeros(s.shape, np.float32) for n, s in self.model.input_specs.items()
                                                                       if n not in states and n != "new_img"}

  def copy_frames(self, bufs: dict) -> None:
    from sunnypilot.modeld_v2.runtime.kernel_replay import write_tensor
    write_tensor(self.frames, np.stack([np.frombuffer(bufs[k].data, np.uint8, count=self.frames.shape[1]) for k in CAMERA_BUFFERS]))

  def run(self):
    from sunnypilot.modeld_v2.runtime.kernel_replay import write_tensor
    write_tensor(self.tfm, self.numpy_inputs[HOST_TRANSFORM])
    for n, v in self.numpy_inputs.items():
      if n != HOST_TRANSFORM: write_tensor(self.tensors[n], v)
    new_img = self.warp.run(input_frame=self.frames, M_inv=self.tfm)
    self.model.run(new_img=new_img, **self.tensors, output_buffers=self.outputs)

  def output_array(self) -> np.ndarray: return self.outputs["outputs"].numpy()

def reads_in_place(adapter) -> bool | None:
  """Whether this frame's warp inputs are the camera buffers' own memory (mapped once, bound by pointer), checked on the adapter's frame feed;
  None for paths without one (they copy by construction)."""
  return adapter.frame_feed.reads_in_place if hasattr(adapter, "frame_feed") else None

def bench_frames(built: dict, size: tuple[int, int], frames: int, legacy_pickles: tuple | None, log, peers: bool, torch_modes: list[str]) -> dict:
  from tinygrad import Device

  from benchmarks.legacy import LegacyModelAdapter
  from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, sensor_for_size, warp_matrices
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  warps, dev = built["warps"][size], Device.DEFAULT
  bufs = synthetic_buffers(warps["frame"])
  m_inv = warp_matrices(SENSOR_CAMERAS[sensor_for_size(*size)])
  adapters = {"fused split": ModelRunner(built["model"], warps[True]),
              "fused split, one buffer pair": ModelRunner(built["model"], warps[True]),
              "fused split upload": ModelRunner(built["model"], warps[True], map_camera_buffers=False),
              "fused packed": ModelRunner(built["model"], warps[False]),
              "unfused": Unfused(built["model"], warps[False])} | ({"legacy": LegacyModelAdapter(*legacy_pickles)} if legacy_pickles else {})
  models = built["peers"]
  if peers: adapters |= make_peers(models["torch"], warps["frame"], torch_modes, log, ort_peer=OrtPeer(models["ort"], warps["frame"]),
                                   ort_label=models["ort_label"])
  from tinygrad.helpers import GlobalCounters
  device_bytes = GlobalCounters.mem_used
  times: dict[str, list[float]] = {p: [] for p in adapters}
  kernels: dict[str, list[float]] = {"fused split": [], "fused split, one buffer pair": []}  # CPU: each call's own kernel time
  stages: dict[str, list[float]] = {"copy_frames": [], "run": [], "output_array": []}  # the fused split path's time, split
  max_diff: dict[str, float] = dict.fromkeys(adapters, 0.0)  # vs the fused split path on the same frame and inputs, over every frame
  in_place: dict[str, bool | None] = {}
  log(f"{size[0]}x{size[1]}: {frames} frames per path, interleaved ...")
  for step in range(frames + 20):
    order = list(adapters.items())  # each step starts at another path: whatever follows a peer (a CUDA context switch, cold caches) is shared
    outputs: dict[str, np.ndarray] = {}
    for path, adapter in order[step % len(order):] + order[:step % len(order)]:
      set_inputs(adapter, step, m_inv)
      t0 = time.perf_counter()
      adapter.copy_frames(bufs[0 if path == "fused split, one buffer pair" else step % BUFFERS_PER_STREAM])
      try:
        t1 = time.perf_counter()
        adapter.run()
        t2 = time.perf_counter()
        out = adapter.output_array()
      except Exception as e:
        if not isinstance(adapter, PeerAdapter): raise
        log(f"dropping the {path} peer: {type(e).__name__}: {e}")  # a peer must not sink the run
        del adapters[path], times[path]
        continue
      t3 = time.perf_counter()
      outputs[path] = np.array(out)  # a copy: the output array is the adapter's own buffer, rewritten by its next run
      in_place[path] = reads_in_place(adapter)
      if step < 20: continue
      times[path].append((t3 - t0) * 1e3)
      if path in kernels: kernels[path].append(adapter.replay.replay_s * 1e3)
      if path == "fused split":
        for stage, (a, b) in zip(stages, ((t0, t1), (t1, t2), (t2, t3))): stages[stage].append((b - a) * 1e3)
    for path, out in outputs.items(): max_diff[path] = max(max_diff[path], output_difference(out, outputs["fused split"], models["relative"]))
  alone = {name: run_alone(adapters["fused split"], bufs, m_inv, pick, frames) for name, pick in
           (("18 rotating buffers", lambda i: i % BUFFERS_PER_STREAM), ("one buffer pair", lambda i: 0))}
  split_run = adapters["fused split"].replay
  if split_run.outputs_in_place: floors, floor_how = kernels["fused split"], "the fused split part's kernel calls, timed inside each call"
  else: floors, floor_how = device_floor_ms(adapters["fused split"]), "the fused split part's graph run back to back with wait=True"
  floor = float(np.percentile(floors, 50))
  rows = {}
  for path in adapters:
    t = np.array(times[path])
    # the fused split paths on CPU: overhead per call against its own kernel time; others: against the fused split's median floor (same kernels)
    overhead = t - np.array(kernels[path]) if path in kernels and split_run.outputs_in_place else t - floor
    ours = not isinstance(adapters[path], PeerAdapter)  # a peer runs other kernels: the floor says nothing about its overhead
    row = percentiles(t, max_and_n=False)
    rows[path] = row | {"x_floor": row["p50"] / floor,
                        "host_overhead_ms": float(np.percentile(overhead, 50)) if ours else None, "camera_frames_in_place": in_place.get(path),
                        "bindings_made": adapters[path].replay.bindings_made if path.startswith("fused") else None,
                        "max_abs_diff_vs_fused_split": max_diff[path],
                        "within_tolerance": max_diff[path] <= models["tolerance"] or path == "fused split, one buffer pair"}
  for adapter in adapters.values():
    if hasattr(adapter, "close"): adapter.close()  # unregister the camera buffers and pinned memory before they are freed
  return {"camera": f"{size[0]}x{size[1]}", "device": dev, "frames": frames, "floor_ms": floor, "floor": floor_how, "paths": rows, "times": times,
          "precision": built["precision"], "tolerance": models["tolerance"], "relative": models["relative"],
          "fused_split_stages_ms": {k: percentiles(v, (10, 50), max_and_n=False) for k, v in stages.items()},
          "fused_split_alone_ms": alone,
          "tinygrad_device_bytes": device_bytes, "torch_cuda_peak_bytes": _torch_peak()}

def run_alone(adapter, bufs: list, m_inv: np.ndarray, pick, frames: int) -> dict[str, float]:
  """The fused split path with nothing else between its frames (as modeld runs it): p50 of each stage and of the whole frame, in ms."""
  stages: dict[str, list[float]] = {"copy_frames": [], "run": [], "output_array": [], "frame": []}
  for step in range(frames + 20):
    set_inputs(adapter, step, m_inv)
    t0 = time.perf_counter()
    adapter.copy_frames(bufs[pick(step)])
    t1 = time.perf_counter()
    adapter.run()
    t2 = time.perf_counter()
    adapter.output_array()
    t3 = time.perf_counter()
    if step >= 20:
      for stage, (a, b) in zip(stages, ((t0, t1), (t1, t2), (t2, t3), (t0, t3))): stages[stage].append((b - a) * 1e3)
  return {stage: float(np.percentile(v, 50)) for stage, v in stages.items()}

def _torch_peak() -> int | None:
  try:
    import torch
  except ImportError: return None
  return int(torch.cuda.max_memory_allocated()) if torch.cuda.is_available() else None

LOAD_SCRIPT = """
import json, sys, time
from tinygrad import Device
Device[Device.DEFAULT]
kind, model, warp = sys.argv[1:4]
from sunnypilot.modeld_v2.runtime.loader import load_fused
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
imported_tinygrad()
t = time.perf_counter()
if kind == "legacy":
  from benchmarks.legacy import LegacyModelAdapter
  with open(model, "rb") as f: pickles = f.read()
  with open(warp, "rb") as f: warp_pickle = f.read()
  spec = json.loads(sys.argv[4])
  LegacyModelAdapter(warp_pickle, pickles, spec)
else:
  load_fused(model, warp)
print(json.dumps({"ms": (time.perf_counter() - t) * 1e3}))
"""

def bench_load(built: dict, size: tuple[int, int], legacy_pickles: tuple, workdir: str, runs: int) -> dict:
  warps = built["warps"][size]
  legacy_model, legacy_warp = os.path.join(workdir, "legacy_model.pkl"), os.path.join(workdir, "legacy_warp.pkl")
  with open(legacy_model, "wb") as f: f.write(legacy_pickles[1])
  with open(legacy_warp, "wb") as f: f.write(legacy_pickles[0])
  spec = json.dumps(legacy_pickles[2], default=list)
  def fresh(kind: str, *paths: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD_SCRIPT, kind, *paths, spec], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]
  med = lambda kind, *p: statistics.median(fresh(kind, *p) for _ in range(runs))
  return {"bundle (read + fuse)": med("bundle", built["model"], warps[True]),
          "unpickle legacy TinyJits": med("legacy", legacy_model, legacy_warp), "recompile from ONNX": built["compile_s"] * 1e3}

def table(results: list[dict], loads: dict) -> str:
  lines = []
  for r in results:
    rows = [(path, *(f"{row[k]:.2f}" for k in ("p10", "p50", "p95", "p99")), f"{row['x_floor']:.2f}x",
             "-" if row["host_overhead_ms"] is None else f"{row['host_overhead_ms']:.3f}",
             {True: "yes", False: "no (copied)", None: "no (copied)"}[row["camera_frames_in_place"]],
             "-" if row["bindings_made"] is None else row["bindings_made"], f"{row['max_abs_diff_vs_fused_split']:.2g}") for path, row in r["paths"].items()]
    lines += [f"\n{r['camera']} on {r['device']}, {r['frames']} frames, {r['precision']}; kernel-only floor {r['floor_ms']:.2f} ms ({r['floor']})", "",
              markdown_table(("path", "p10 ms", "p50 ms", "p95 ms", "p99 ms", "p50 / floor", "host overhead ms (median of total - floor)",
                              "camera frames read in place", "bindings made", "max abs diff vs fused split (every frame)"), rows)]
    past = [p for p, row in r["paths"].items() if not row["within_tolerance"]]
    lines.append(f"\noutputs vs fused split: tolerance {r['tolerance']:.2g}{' relative above 1' if r['relative'] else ''}: "
                 + (f"PAST IT: {', '.join(past)}" if past else "every path within it"))
    stages = r["fused_split_stages_ms"]
    lines.append("\nfused split per frame: " + ", ".join(f"{k} {v['p50'] * 1e3:.0f} us (p10 {v['p10'] * 1e3:.0f})" for k, v in stages.items()) +
                 " (output_array includes waiting for the device)")
    for name, a in r["fused_split_alone_ms"].items():
      lines.append(f"fused split alone, {name}: p50 {a['frame']:.3f} ms = {a['frame'] / r['floor_ms']:.2f}x the floor, host overhead "
                   f"{a['frame'] - r['floor_ms']:.3f} ms (copy_frames {a['copy_frames'] * 1e3:.0f} us, run {a['run'] * 1e3:.0f} us, "
                   f"output_array {a['output_array'] * 1e3:.0f} us)")
    rotating, fixed = r["paths"]["fused split"], r["paths"]["fused split, one buffer pair"]
    lines.append(f"18 rotating camera buffers vs one fixed pair: p50 {rotating['p50']:.3f} vs {fixed['p50']:.3f} ms "
                 f"({100 * (rotating['p50'] / fixed['p50'] - 1):+.1f}%), host overhead {rotating['host_overhead_ms']:.3f} vs "
                 f"{fixed['host_overhead_ms']:.3f} ms (the one-pair path sees other frames: its diff column is not a check)")
    legacy, split = r["paths"].get("legacy", {}).get("host_overhead_ms", 0), r["paths"]["fused split"]["host_overhead_ms"]
    lines.append(f"fused split host overhead = {100 * split / legacy:.1f}% of legacy's" if legacy > 0 else "")
  if loads:
    header = ("load (fresh process)", *loads[next(iter(loads))])
    lines += ["", markdown_table(header, ((camera, *(f"{v:.1f} ms" for v in row.values())) for camera, row in loads.items()))]
  return "\n".join(lines)

def plot(results: list[dict], path: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
  for ax, r in zip(axes[0], results):
    paths = list(r["times"])
    ax.boxplot([r["times"][p] for p in paths], tick_labels=[p.replace(" ", "\n").replace("(", "\n(") for p in paths], showfliers=False)
    ax.axhline(r["floor_ms"], color="gray", linestyle="--", label="kernel-only floor")
    ax.set_title(f"{r['camera']} on {r['device']}: copy_frames + run + readback")
    ax.set_ylabel("ms per frame")
    ax.legend()
  fig.tight_layout()
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  with replaced_atomically(path) as (tmp,): fig.savefig(tmp, dpi=100, format="png")

def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device

  from benchmarks.legacy import capture_legacy
  from sunnypilot.modeld_v2.tools import stand_in_models
  parser = cli_parser("benchmarks.bench", __doc__)
  parser.add_argument("--model", default="tiny", help="tiny, full (random-weight stand-ins) or a path to an ONNX")
  parser.add_argument("--generation", default="native", choices=stand_in_models.NAMES, help="stand-in generation for tiny/full")
  parser.add_argument("--camera", default="1344x760,1928x1208", help="camera sizes, comma separated")
  parser.add_argument("--frames", type=int, default=1000, help="timed frames per path and camera size")
  parser.add_argument("--load-runs", type=int, default=3, help="fresh processes per load measurement (0: skip loads)")
  parser.add_argument("--workdir", default="out/bench_work")
  parser.add_argument("--no-peers", action="store_true", help="skip onnxruntime and PyTorch")
  parser.add_argument("--torch-modes", default="eager,graph,compile", help=f"PyTorch peers on a GPU, comma separated: {', '.join(TORCH_PEERS)}")
  parser.add_argument("--beam", type=int, default=0, help="build the model and warp bundles with BEAM-searched kernels (0: no search)")
  parser.add_argument("--precision", choices=("float32", "float16"), default="float32", help="build the model in this precision and run the peers "
                      "in it (float16: torch and onnxruntime on the float16 ONNX the bundle computes)")
  parser.add_argument("--json")
  parser.add_argument("--plot", help="PNG of the latency distributions")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json, args.plot)
  log = logger()
  cameras = [tuple(int(x) for x in c.split("x")) for c in args.camera.split(",")]
  torch_modes = [m for m in args.torch_modes.split(",") if m]
  if bad := [m for m in torch_modes if m not in TORCH_PEERS]: parser.error(f"unknown --torch-modes {bad}: choose from {', '.join(TORCH_PEERS)}")
  built = build(args.model, args.generation, cameras, args.workdir, log, args.beam, precision=args.precision)
  results, loads = [], {}
  for size in cameras:
    frame = built["warps"][size]["frame"]
    try: legacy = capture_legacy(built["files"], frame.spec)
    except Exception as e:  # the old way never ran every generation: the table goes on without it
      log(f"no legacy baseline for {args.generation}: {type(e).__name__}: {e}")
      legacy = None
    results.append(bench_frames(built, size, args.frames, legacy, log, not args.no_peers, torch_modes))
    if args.load_runs and legacy: loads[f"{size[0]}x{size[1]}"] = bench_load(built, size, legacy, args.workdir, args.load_runs)
  print(f"model {args.model} ({args.generation}{', random-weight stand-in' if args.model in ('tiny', 'full') else ''}), {built['kernels']} model kernels, "
        f"BEAM={args.beam}, {args.precision}, "
        f"device {Device.DEFAULT}, peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
  print(table(results, loads))
  if args.plot: plot(results, args.plot)
  write_json(args.json, {"model": args.model, "generation": args.generation, "beam": args.beam, "precision": args.precision, "device": Device.DEFAULT,
                         "loads": loads,
                         "results": [{k: v for k, v in r.items() if k != "times"} for r in results],
                         "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
  return 0

if __name__ == "__main__":
  sys.exit(main())
