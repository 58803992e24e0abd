"""A sweep's run, for any frame (benchmarks/bench_dm_sweep.py, bench_driving_sweep.py): its variants built (sweep_variants), then per
camera size and precision every path timed in one process: each tinygrad variant's fused frame and the torch peers of that precision, on
the same frames, interleaved frame by frame (each frame starting at the next path), then each path alone; every path's outputs checked
against one reference path on every interleaved frame. Results are written as they come: the cheap peers' table first, then again with
torch.compile, whose build is the slowest step.

torch's float32 convolutions round their operands to TF32 (10-bit mantissa) by default on Ampere and later (torch.backends.cudnn.allow_tf32
is True; Inductor's conv templates follow it): a float32 peer says which it is, and a `-strict` mode builds and runs it with TF32 off.
Tolerances: two float32 paths within 1e-3; a float16 path, or one that rounds to TF32 (a peer with TF32 on, a variant with ALLOW_TF32=1),
within twice compile/precision.float16_bound of the model, relative above 1 (TF32 has float16's unit roundoff).
"""
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, percentiles, write_json
from benchmarks.kernel_floor import device_floor_ms
from benchmarks.peers import FLOAT32_TOLERANCE, TORCH_PEERS, output_difference
from benchmarks.sweep_variants import Budget, Variant, build_variant, reusable

WARMUP = 10
TORCH_BUILD_S = {"eager": 10.0, "graph": 15.0}  # seconds to build a peer on an H200; torch.compile's is the frame's (FrameKind.compile_s)

class FrameKind(NamedTuple):
  """What a sweep needs to know of one frame: its variants and stand-in sources, how to load a variant's fused frame and a torch peer, its
  camera buffers, inputs and warp transform, and its goal against torch.compile (`goal`: the ratio torch.compile / tinygrad at p50 to reach,
  `goal_on`: "interleaved" or "alone")."""
  name: str
  variants: dict[str, Variant]
  sources: Callable[[str, str], dict[str, str]]  # (model: tiny|full|path, workdir) -> compile_model keywords
  load: Callable[[dict, tuple[int, int]], Any]  # (a build's record, camera size) -> the fused frame's adapter
  torch_peer: Callable[..., Any]  # (the peers' ONNX files, camera frame, mode, wrap) -> PeerAdapter(wrap(make the torch peer), ...)
  buffers: Callable[[Any], list[dict]]  # camera frame -> camerad's rotating buffers
  set_inputs: Callable[[Any, int, np.ndarray], None]
  transform: Callable[[tuple[int, int]], np.ndarray]  # camera size -> M_inv
  compile_s: float  # torch.compile max-autotune's build on an H200 (the budget's reckoning)
  goal: float
  goal_on: str

@dataclass
class TimedPath:
  """One path of a precision group: a tinygrad variant's fused frame or a torch peer. `half_rounding`: its arithmetic rounds to a 10-bit
  mantissa (float16, or TF32) so it is checked with float16's tolerance."""
  label: str
  adapter: Any
  precision: str
  half_rounding: bool
  tinygrad: bool
  info: dict = field(default_factory=dict)

# *** torch's TF32 switch ***

def torch_uses_tf32(torch: Any) -> bool:
  """Whether torch's float32 convolutions may run as TF32 now (read before any peer changes it)."""
  import warnings
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    return bool(torch.backends.cudnn.allow_tf32)

@contextlib.contextmanager
def torch_tf32(torch: Any, allow: bool) -> Iterator[None]:
  """TF32 on or off for torch's convolutions and matrix products within the block, put back after. Through the allow_tf32 flags only, the
  API torch_uses_tf32 reads and Inductor reads when it compiles (torch >= 2.9 maps them onto fp32_precision, and refuses a mix of the two)."""
  import warnings
  switches = ((torch.backends.cudnn, "allow_tf32"), (torch.backends.cuda.matmul, "allow_tf32"))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    old = [getattr(obj, name) for obj, name in switches]
    for obj, name in switches: setattr(obj, name, allow)
  try: yield
  finally:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      for (obj, name), value in zip(switches, old): setattr(obj, name, value)

class StrictFloat32:
  """A float32 torch peer built and run with TF32 off: strict float32 convolutions (cuDNN's, Triton's) and matrix products."""
  def __init__(self, torch: Any, make: Callable[[], Any]):
    self.torch = torch
    with torch_tf32(torch, False): self.inner = make()
    self.peer = self.inner.peer  # what PeerAdapter reads the host inputs from

  def step(self, *frames_and_host: Any) -> np.ndarray:
    with torch_tf32(self.torch, False): return self.inner.step(*frames_and_host)

  def reset(self) -> None: self.inner.reset()

def torch_peers(kind: FrameKind, files: dict[str, str], frame: Any, precision: str, modes: list[str], budget: Budget,
                log: Callable[[str], None]) -> list[TimedPath]:
  """The torch peers of `modes` (eager, graph, compile; `-strict`: float32 with TF32 off), each one that fits the budget; a peer that cannot
  be built is left out with one line. torch must see a GPU (torch_here)."""
  import torch
  tf32 = torch_uses_tf32(torch)
  peers = []
  for mode in modes:
    base, strict = mode.removesuffix("-strict"), mode.endswith("-strict")
    if strict and precision != "float32": continue  # float16 has no TF32 to turn off
    label = f"{TORCH_PEERS[base]}, {precision}" + (", TF32 off" if strict else ", TF32 convs (torch's default)" if precision == "float32" and tf32 else "")
    if not budget.fits(f"the {label} peer", kind.compile_s if base == "compile" else TORCH_BUILD_S[base]): continue
    log(f"building the {label} peer ...")
    t = time.perf_counter()
    wrap = (lambda make: StrictFloat32(torch, make)) if strict else (lambda make: make())
    try: adapter = kind.torch_peer(files, frame, base, wrap)
    except Exception as e:  # a peer must not sink the run
      log(f"skipping the {label} peer: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
      continue
    log(f"  ready in {time.perf_counter() - t:.1f} s")
    peers.append(TimedPath(label, adapter, precision, precision == "float16" or (tf32 and not strict), False,
                           {"mode": mode, "tf32": precision == "float32" and tf32 and not strict, "build_s": time.perf_counter() - t}))
  return peers

# *** timing ***

QUANTILES = (10, 50, 90, 99)  # a sweep's percentiles of a path's frame times

def time_interleaved(paths: list[TimedPath], bufs: list[dict], kind: FrameKind, m_inv: np.ndarray, frames: int, tolerance: Callable,
                     log: Callable[[str], None]) -> dict[str, dict]:
  """Every path on the same frames from zeroed states, frame by frame, each frame starting at the next path; each path's outputs against
  paths[0]'s (the reference; the next path becomes it if it fails) on every frame. A path that raises is dropped with one line."""
  for p in paths: p.adapter.reset_states()  # every path from zeroed states: an earlier group's frames must not linger in a recurrent model
  times: dict[str, list[float]] = {p.label: [] for p in paths}
  diffs = dict.fromkeys(times, 0.0)
  live = list(paths)
  for step in range(frames + WARMUP):
    outputs, start = {}, step % max(1, len(live))
    for p in live[start:] + live[:start]:
      kind.set_inputs(p.adapter, step, m_inv)
      t0 = time.perf_counter()
      try:
        p.adapter.copy_frames(bufs[step % len(bufs)])
        p.adapter.run()
        outputs[p.label] = np.array(p.adapter.output_array())  # a copy: the adapter's own buffer is rewritten by its next run
      except Exception as e:
        log(f"dropping {p.label}: {type(e).__name__}: {str(e)[:200]}")
        live.remove(p)
        continue
      if step >= WARMUP: times[p.label].append((time.perf_counter() - t0) * 1e3)
    if not live: break
    ref = live[0]
    for p in live: diffs[p.label] = max(diffs[p.label], output_difference(outputs[p.label], outputs[ref.label], tolerance(p, ref)[1]))
  ref = live[0] if live else None
  return {p.label: {"interleaved": percentiles(times[p.label], QUANTILES, max_and_n=False), "max_diff_vs_reference": diffs[p.label],
                    "reference": ref.label if ref else None, "tolerance": tolerance(p, ref)[0] if ref else None,
                    "relative": tolerance(p, ref)[1] if ref else None,
                    "within_tolerance": ref is not None and diffs[p.label] <= tolerance(p, ref)[0]} for p in live}

def time_alone(p: TimedPath, bufs: list[dict], kind: FrameKind, m_inv: np.ndarray, frames: int) -> dict[str, float]:
  """One path with nothing else between its frames (as a daemon runs it): percentiles of copy_frames + run + readback, in ms."""
  t = []
  for step in range(frames + WARMUP):
    kind.set_inputs(p.adapter, step, m_inv)
    t0 = time.perf_counter()
    p.adapter.copy_frames(bufs[step % len(bufs)])
    p.adapter.run()
    p.adapter.output_array()
    if step >= WARMUP: t.append((time.perf_counter() - t0) * 1e3)
  return percentiles(t, QUANTILES, max_and_n=False)

def time_group(paths: list[TimedPath], bufs: list[dict], kind: FrameKind, m_inv: np.ndarray, frames: int, tolerance: Callable,
               log: Callable[[str], None]) -> dict[str, dict]:
  """Interleaved, then each path alone, then each tinygrad path's kernel-only floor (its calls back to back, no Python per input)."""
  rows = time_interleaved(paths, bufs, kind, m_inv, frames, tolerance, log)
  for p in paths:
    if p.label not in rows: continue
    try:
      rows[p.label]["alone"] = time_alone(p, bufs, kind, m_inv, frames)
      if p.tinygrad: rows[p.label]["floor_ms"] = float(np.median(device_floor_ms(p.adapter, rounds=max(20, frames))))
    except Exception as e:
      log(f"{p.label} alone: {type(e).__name__}: {str(e)[:200]}")
    rows[p.label] |= {"precision": p.precision, "tinygrad": p.tinygrad, **p.info}
  return rows

# *** the sweep ***

def reference_first(paths: list[TimedPath]) -> list[TimedPath]:
  """The reference leads: torch's CUDA graph in strict float32 (float16: its float16 graph), else a tinygrad path that does not round to a
  10-bit mantissa, else the first path."""
  def rank(p: TimedPath) -> int:
    if not p.tinygrad and p.info.get("mode") in ("graph-strict", "graph") and not p.info.get("tf32"): return 0
    return 1 if p.tinygrad and not p.half_rounding else 2
  return sorted(paths, key=rank)

def goals(kind: FrameKind, rows: dict[str, dict]) -> list[dict]:
  """Per torch.compile peer: the fastest tinygrad path within tolerance, and torch.compile's p50 over its p50 (on kind.goal_on)."""
  ours = [(r[kind.goal_on]["p50"], label) for label, r in rows.items() if r["tinygrad"] and r["within_tolerance"] and r.get(kind.goal_on)]
  out = []
  for label, r in rows.items():
    if r["tinygrad"] or not str(r.get("mode", "")).startswith("compile") or not r.get(kind.goal_on) or not ours: continue
    best, name = min(ours)
    ratio = r[kind.goal_on]["p50"] / best
    out.append({"torch_compile": label, "best": name, "ratio": ratio, "goal": kind.goal, "met": ratio >= kind.goal, "on": kind.goal_on})
  return out

def table(group: dict) -> str:
  """One camera size and precision: every path's build, timings and check, then the goal against each torch.compile peer."""
  f = lambda r, key: f"{r[key]['p50']:.3f}" if r.get(key) else "-"
  rows = []
  for label, r in group["paths"].items():
    kernels = f"{r['kernels']} ({r['tensor_core_kernels']})" if r.get("kernels") is not None else "-"
    floor = f"{r['floor_ms']:.3f}" if r.get("floor_ms") is not None else "-"
    tol = f"{r['tolerance']:.2g}{' rel' if r['relative'] else ''}" if r.get("tolerance") is not None else "-"
    rows.append((label, f"{r.get('build_s', 0):.0f}", kernels, f(r, "interleaved"), f(r, "alone"), floor, f"{r['max_diff_vs_reference']:.2g}", tol,
                 "yes" if r["within_tolerance"] else "NO"))
  lines = [f"\n{group['camera']}, {group['precision']}, {group['frames']} frames on {group['device']} (reference: {group['reference']})", "",
           markdown_table(("path", "build s", "kernels (tensor cores)", "p50 interleaved ms", "p50 alone ms", "kernel-only floor ms", "max diff vs reference",
                           "tolerance", "ok"), rows)]
  for g in group["goals"]:
    lines.append(f"{g['torch_compile']} / {g['best']} at p50 {g['on']}: {g['ratio']:.2f}x (goal >= {g['goal']:g}x: {'met' if g['met'] else 'NOT met'})")
  if not group["goals"]: lines.append("no torch.compile peer in this table: no goal reckoned")
  return "\n".join(lines)

def build_all(kind: FrameKind, variants: list[Variant], sources: dict[str, str], cameras: list[tuple[int, int]], workdir: str, budget: Budget,
              table_s: float, rebuild: bool, log: Callable[[str], None]) -> tuple[dict[str, dict], dict[str, str]]:
  """Each variant built (or its earlier build reused) in order, while its estimate fits the budget with the time kept for the tables it
  and the variants built before it need (table_s per precision: its peers and its timing); (records by name, one line per variant that
  failed or was dropped)."""
  records, missing = {}, {}
  for v in variants:
    reserve_s = table_s * len({variants_by_name(variants)[n].precision for n in records} | {v.precision})
    if v.builds_as: continue  # loads another variant's bundles
    if not rebuild and (record := reusable(kind.name, v, sources, cameras, workdir)) is not None:
      log(f"{v.name}: reusing its build in {os.path.join(workdir, v.name)} ({record['build_s']:.0f} s when built)")
      records[v.name] = record | {"reused": True}
      continue
    if not budget.fits(f"variant {v.name}", v.est_s, reserve_s):
      missing[v.name] = "dropped: its build does not fit --budget-s"
      continue
    timeout = None if budget.end is None else max(1.0, budget.left() - reserve_s)
    record = build_variant(kind.name, v, sources, cameras, workdir, log, timeout)
    if "error" in record:
      log(record["error"])
      missing[v.name] = record["error"]
    else: records[v.name] = record
  return records, missing

def variants_by_name(variants: list[Variant]) -> dict[str, Variant]: return {v.name: v for v in variants}

def run_sweep(kind: FrameKind, variants: list[Variant], model: str, cameras: list[tuple[int, int]], frames: int, torch_modes: list[str],
              budget: Budget, workdir: str, json_path: str | None, rebuild: bool, log: Callable[[str], None]) -> dict:
  """Build, then time per camera size and precision (variants in the order given); the results, written to json_path as they come."""
  from tinygrad import Context, Device

  from benchmarks.peers import peer_models
  from sunnypilot.modeld_v2.compile.precision import float16_bound
  from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  os.makedirs(workdir, exist_ok=True)
  sources = kind.sources(model, workdir)
  precisions = list(dict.fromkeys(v.precision for v in variants))
  if torch_modes and not torch_here(log): torch_modes = []
  # per precision: its peers' builds and about 20 s of timing per camera size
  table_s = len(cameras) * (20.0 + sum(kind.compile_s if m.startswith("compile") else TORCH_BUILD_S[m.removesuffix("-strict")] for m in torch_modes))
  records, missing = build_all(kind, variants, sources, cameras, workdir, budget, table_s, rebuild, log)
  out = {"frame": kind.name, "model": model, "device": Device.DEFAULT, "tinygrad": str(imported_tinygrad()), "frames": frames, "torch": torch_version(),
         "variants": {v.name: v.spec() | {"runtime": v.runtime, "builds_as": v.builds_as, "about": v.about} |
                      ({"build": {k: records[v.builds_as or v.name].get(k) for k in ("build_s", "compile_s", "kernels", "tensor_core_kernels", "reused")}}
                       if (v.builds_as or v.name) in records else {"missing": missing.get(v.builds_as or v.name, "not built")}) for v in variants},
         "results": [], "dropped": budget.dropped}
  write = lambda: write_json(json_path, out)
  write()
  half_tol = 2 * float16_bound(sources)
  tolerance = lambda p, ref: (half_tol, True) if p.half_rounding or ref.half_rounding or p.precision == "float16" else (FLOAT32_TOLERANCE, False)
  for size in cameras:
    frame = camerad_frame(*size)
    bufs, m_inv = kind.buffers(frame), kind.transform(size)
    for precision in precisions:
      paths = []
      for v in (v for v in variants if v.precision == precision and (v.builds_as or v.name) in records):
        record = records[v.builds_as or v.name]
        try:
          with Context(**v.runtime): adapter = kind.load(record, size)
        except Exception as e:
          log(f"{v.name}: cannot load its bundles: {type(e).__name__}: {str(e)[:200]}")
          continue
        paths.append(TimedPath(f"tinygrad {v.name}", adapter, precision, precision == "float16" or v.tf32, True,
                               {"variant": v.name, "build_s": record["build_s"], "kernels": record["kernels"],
                                "tensor_core_kernels": record["tensor_core_kernels"], "beam": v.beam, "env": v.env, "runtime": v.runtime}))
      if not paths:
        log(f"{size[0]}x{size[1]} {precision}: no variant of this precision was built: nothing to time")
        continue
      files = peer_models(sources, precision, workdir, log)["torch"]
      group = {"camera": f"{size[0]}x{size[1]}", "precision": precision, "frames": frames, "device": Device.DEFAULT, "half_tolerance": half_tol}
      stages = [[m for m in torch_modes if not m.startswith("compile")], [m for m in torch_modes if m.startswith("compile")]]
      for i, modes in enumerate(stages):
        if i and not modes: break
        paths += torch_peers(kind, files, frame, precision, modes, budget, log) if modes else []
        ordered = reference_first(paths)
        log(f"{group['camera']} {precision}: {len(ordered)} paths, {frames} frames interleaved, then each alone ...")
        rows = time_group(ordered, bufs, kind, m_inv, frames, tolerance, log)
        group |= {"paths": rows, "reference": next(iter(rows), None), "goals": goals(kind, rows), "complete": i == 1 or not stages[1]}
        out["results"] = [r for r in out["results"] if (r["camera"], r["precision"]) != (group["camera"], precision)] + [dict(group)]
        write()
        print(table(group) + ("" if group["complete"] else "\n(torch.compile's peer is built next: this table comes again with it)"), flush=True)
      for p in paths:
        if hasattr(p.adapter, "close"): p.adapter.close()  # unregister the camera buffers before they are freed
  out["dropped"] = budget.dropped
  write()
  return out

def torch_here(log: Callable[[str], None]) -> bool:
  """Whether torch is installed and sees a CUDA device (the peers run there); if not, one line saying which."""
  try:
    import torch
  except ImportError:
    log("torch is not installed here: no torch peers")
    return False
  if not torch.cuda.is_available(): log("torch sees no CUDA device here: no torch peers")
  return bool(torch.cuda.is_available())

def torch_version() -> dict | None:
  try:
    import torch
  except ImportError: return None
  return {"version": torch.__version__, "cuda": torch.cuda.is_available(), "tf32_convs_by_default": torch_uses_tf32(torch)}

def summary(out: dict) -> str:
  """The variants: built (seconds, kernels, tensor cores), reused, failed or dropped; then every goal, one line each."""
  lines = [f"\n{out['frame']} frame sweep, model {out['model']}, {out['device']}, {out['tinygrad']}, torch {(out['torch'] or {}).get('version', 'absent')}"]
  for name, v in out["variants"].items():
    b = v.get("build")
    what = (f"built in {b['build_s']:.0f} s{' (reused)' if b.get('reused') else ''}, {b['kernels']} kernels, {b['tensor_core_kernels']} with tensor cores"
            if b else v["missing"])
    lines.append(f"  {name:14s} {v['precision']:8s} BEAM={v['beam']} {' '.join(f'{k}={x}' for k, x in v['env'].items()) or '-':40s} {what}")
  for r in out["results"]:
    for g in r["goals"]:
      lines.append(f"{r['camera']} {r['precision']}: {g['torch_compile']} / {g['best']} = {g['ratio']:.2f}x {g['on']} (goal {g['goal']:g}x: "
                   f"{'met' if g['met'] else 'NOT met'})")
  if out["dropped"]: lines.append(f"dropped for --budget-s: {', '.join(out['dropped'])}")
  return "\n".join(lines)

# *** the command line both sweeps share ***

def sweep_main(kind: FrameKind, prog: str, doc: str, default_variants: tuple[str, ...], argv: list[str] | None) -> int:
  from benchmarks.sweep_variants import listing, resolve
  from sunnypilot.modeld_v2.common.cli import interrupts_handled
  from sunnypilot.modeld_v2.common.cli import parser as cli_parser
  from sunnypilot.modeld_v2.model.calibration import sensor_for_size
  parser = cli_parser(prog, doc)
  parser.add_argument("--variants", default=",".join(default_variants), help="variants to build and time, comma separated, or all (--list: each)")
  parser.add_argument("--list", action="store_true", help="list the variants: knobs, what each answers, estimated H200 build time")
  parser.add_argument("--model", default="full", help="tiny, full (the random-weight stand-in's backbones) or a path to an ONNX")
  parser.add_argument("--camera", default="1928x1208", help="camera sizes, comma separated (1928x1208: comma 3/3X, 1344x760: comma 4)")
  parser.add_argument("--frames", type=int, default=60, help="timed frames per path, interleaved and alone")
  parser.add_argument("--torch-modes", default="graph,compile", help=f"torch peers: {', '.join(TORCH_PEERS)}, each also as MODE-strict (float32 with "
                      "TF32 off); none: no peers")
  parser.add_argument("--budget-s", type=float, help="seconds this run may take: a build or peer whose estimate does not fit is dropped with a "
                      "line, and a build is stopped when it runs into the time kept for timing")
  parser.add_argument("--workdir", default=f"out/{kind.name}_sweep", help="variants' folders (reused when built with the same knobs), stand-ins, caches")
  parser.add_argument("--rebuild", action="store_true", help="build every variant again, even where its folder holds this very build")
  parser.add_argument("--json", help="write the results here (rewritten as each table is done)")
  args = parser.parse_args(argv)
  if args.list:
    print(listing(kind.name))
    return 0
  check_outputs(parser, args.json)
  try: variants = resolve(kind.name, args.variants)
  except ValueError as e: parser.error(str(e))
  try: cameras = [tuple(int(x) for x in c.split("x")) for c in args.camera.split(",")]
  except ValueError: parser.error(f"--camera wants WxH sizes, comma separated, got {args.camera!r}")
  for size in cameras:
    try: sensor_for_size(*size)
    except ValueError as e: parser.error(f"--camera {size[0]}x{size[1]}: {e}")
  modes = [m for m in args.torch_modes.split(",") if m and m != "none"]
  if bad := [m for m in modes if m.removesuffix("-strict") not in TORCH_PEERS]:
    parser.error(f"unknown --torch-modes {bad}: choose from {', '.join(TORCH_PEERS)} (each also MODE-strict)")
  if args.frames < 1: parser.error("--frames must be positive")
  if args.budget_s is not None and args.budget_s <= 0: parser.error("--budget-s must be positive")
  if args.model not in ("tiny", "full") and not os.path.isfile(args.model): parser.error(f"--model {args.model}: not tiny, full or an ONNX file")
  log = logger(f"{prog}: ")
  try:
    with interrupts_handled():  # SIGTERM (a `timeout` around the sweep) too: a build running stops with its BEAM workers (its process group)
      out = run_sweep(kind, variants, args.model, cameras, args.frames, modes, Budget(args.budget_s, log), args.workdir, args.json, args.rebuild, log)
  except KeyboardInterrupt:
    log(f"interrupted: the tables done so far are in {args.json or 'the output above'}")
    return 130
  print(summary(out))
  return 0
