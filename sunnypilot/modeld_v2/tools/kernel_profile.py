"""Per-kernel profile of a bundle on this device, against the device's roofline: what `inspect_bundle profile` prints.

Each call of the part is run alone on random inputs and timed (kernels by the device, copies by the host). FLOPs and bytes are the
estimates tinygrad made when it compiled each kernel (recorded in the bundle): `ops`, and `mem`, the bytes a kernel touches, each once.
A kernel's roofline lower bound is max(FLOPs / peak FLOP/s, bytes / peak bandwidth); the part's is their sum (its kernels run one after
another). The peaks are given by the caller, who states where they come from: two numbers, or a device's preset (PEAKS) whose FLOP rate is
picked per kernel by its arithmetic (`arithmetic`: half or single precision buffers, tensor-core instructions in its binary).
"""
from __future__ import annotations

import os
import statistics
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from sunnypilot.modeld_v2.compile.compile_job import random_value
from sunnypilot.modeld_v2.format.bundle import next_name, state_names
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM

if TYPE_CHECKING:
  from tinygrad import Tensor

  from sunnypilot.modeld_v2.format.bundle import TensorSpec
  from sunnypilot.modeld_v2.runtime.kernel_replay import Replay

def random_inputs(specs: dict[str, TensorSpec], device: str, seed: int = 0) -> dict[str, Tensor]:
  """Realized tensors of random values for a bundle's input specs, drawn as the compilers draw capture inputs: never time on zeros."""
  from tinygrad import Tensor
  rng = np.random.default_rng(seed)
  return {k: Tensor(random_value(rng, s.shape, s.dtype), device=device).realize() for k, s in specs.items()}

# *** peaks per kind of arithmetic ***

class Peaks(NamedTuple):
  """A device's datasheet peaks (FLOP/s per kind of arithmetic, dense; memory B/s) and where they come from."""
  name: str
  fp32: float  # single precision on the vector units (no tensor cores)
  tf32_tc: float  # TF32 on the tensor cores
  fp16_tc: float  # FP16/BF16 on the tensor cores: the roofline of any half-precision arithmetic there
  bytes: float
  source: str

PEAKS = {"h200": Peaks("h200", 67e12, 989e12 / 2, 1979e12 / 2, 4.8e12,
                       "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: FP32 67 TFLOPS; TF32 Tensor Core 989 and FP16/BF16 Tensor Core "
                       "1,979 TFLOPS with sparsity (dense: half, 494.5 and 989.5); GPU memory bandwidth 4.8 TB/s")}

class Arithmetic(NamedTuple):
  """What a kernel computes in: "fp16" when any of its buffers is half or bfloat16, else "fp32"; `tensor_cores`: the MMA kind its binary
  issues ("fp16", "tf32"), None when it issues none."""
  dtype: str
  tensor_cores: str | None

  def label(self) -> str: return f"{self.dtype}{f' TC {self.tensor_cores}' if self.tensor_cores else ''}"

  def peak(self, peaks: Peaks) -> float:
    """The FLOP rate this arithmetic can reach on the device: half precision is bounded by the tensor cores whether the kernel uses them or
    not; single precision by the vector units, or by TF32 tensor cores where the kernel rounds to TF32 itself (tinygrad's ALLOW_TF32)."""
    if self.dtype == "fp16": return peaks.fp16_tc
    return peaks.tf32_tc if self.tensor_cores == "tf32" else peaks.fp32

HALF_DTYPES = ("dtypes.half", "dtypes.bfloat16")

def arithmetic(program: Any, binary: bytes) -> Arithmetic:
  """A part's program (format.part.Program) and its binary: CUDA binaries are PTX text, where tinygrad's tensor-core kernels issue
  `mma.sync` (m16n8k16 .f16 or m16n8k8 .tf32); other binaries are read as using none."""
  dtype = "fp16" if any(p.dtype in HALF_DTYPES for p in program.signature) else "fp32"
  tc = None
  if b"mma.sync" in binary: tc = "tf32" if b".tf32" in binary else "fp16" if b".f16" in binary or b".bf16" in binary else "other"
  return Arithmetic(dtype, tc)

def bound_calls(model_path: str, warp_path: str | None = None) -> tuple[Replay, str]:
  """A bundle's replay after one call on random inputs: the model alone, or with the warp fused in front (camera frames uploaded). And what
  was loaded, in words."""
  from tinygrad import Device, Tensor
  if warp_path is None:
    from sunnypilot.modeld_v2.runtime.loader import load_bundle
    model = load_bundle(model_path)
    specs = model.input_specs
    inputs = random_inputs(specs, Device.DEFAULT)
    states = {next_name(name): name for name in state_names(inputs, model.output_specs)}
    outs = {k: inputs[states[k]] if k in states else Tensor(np.zeros(s.shape, s.dtype)).realize() for k, s in model.output_specs.items()}
    model.run(**inputs, **({"output_buffers": outs} if "output_buffers" in model.run.kwargs else {}))
    return model.run, "the model bundle alone"
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  adapter = ModelRunner(model_path, warp_path, map_camera_buffers=False)
  rng = np.random.default_rng(0)
  for v in adapter.numpy_inputs.values(): v[...] = rng.uniform(-1, 1, v.shape)
  adapter.numpy_inputs[HOST_TRANSFORM][:] = np.eye(3, dtype=np.float32) * [[2], [2], [1]]  # a valid transform: a 2x downscale
  # the road cameras' pair, or the driver camera alone for a driver-monitoring pair
  frames = rng.integers(0, 256, (len(adapter.camera_buffers), adapter.warp_frame_size), dtype=np.uint8)
  adapter.copy_frames(dict(zip(adapter.camera_buffers, frames, strict=True)))
  adapter.run()
  adapter.output_array()
  return adapter.replay, "the warp fused in front of the model (frames uploaded)"

def profile(replay: Replay, rounds: int = 20, peak_flops: float | None = None, peak_bytes: float | None = None, peaks: Peaks | None = None) -> dict:
  """Per call: name, launch sizes, arithmetic, FLOPs, bytes, median time, achieved FLOP/s and B/s, share of the calls' summed time, roofline
  bound; and the whole part's measured floor (its calls launched back to back as the replay runs them). `peaks`: a preset whose FLOP rate is
  picked per kernel by its arithmetic (instead of `peak_flops` and `peak_bytes`)."""
  from tinygrad import Device
  programs, rows = replay.part.programs, []
  if peaks is not None: peak_bytes = peaks.bytes
  for r in replay.time_calls(rounds):
    p = programs[r["program"]] if r["program"] is not None else None
    est = (p.estimates if p else None) or {}
    ops, mem = (est.get("ops"), est.get("mem")) if p else (0, r["copy_bytes"])  # a copy: bytes only
    math = arithmetic(p, bytes(replay.blob[p.lib[0]:p.lib[1]])) if p else None
    flops = math.peak(peaks) if peaks is not None and math is not None else peak_flops
    bound = None
    if peak_bytes and ops is not None and mem is not None and (flops or not ops): bound = max(ops / flops if ops and flops else 0.0, mem / peak_bytes)
    rows.append({"call": r["call"], "name": p.name if p else "copy", "global_size": list(p.global_size) if p else None,
                 "local_size": list(p.local_size) if p and p.local_size is not None else None, "ops": ops, "bytes": mem, "s": r["s"],
                 "arithmetic": math.label() if math else None, "tensor_cores": math.tensor_cores if math else None, "peak_flops": flops,
                 "flops_per_s": ops / r["s"] if ops is not None and r["s"] > 0 else None,
                 "bytes_per_s": mem / r["s"] if mem is not None and r["s"] > 0 else None, "bound_s": bound})
  total = sum(r["s"] for r in rows)
  for r in rows: r["share"] = r["s"] / total if total else 0.0
  floors = []
  for _ in range(max(rounds, 20)):
    Device[replay.device].synchronize()
    floors.append(replay.run_bound(wait=True))
  bounds = [r["bound_s"] for r in rows]
  return {"device": replay.device, "calls": rows, "sum_s": total, "floor_s": statistics.median(floors),
          "bound_s": sum(bounds) if bounds and all(b is not None for b in bounds) else None,
          "ops": sum(r["ops"] or 0 for r in rows), "bytes": sum(r["bytes"] or 0 for r in rows), "peak_flops": peak_flops, "peak_bytes": peak_bytes,
          "peaks": peaks._asdict() if peaks is not None else None, "by_arithmetic": by_arithmetic(rows)}

def by_arithmetic(rows: list[dict]) -> dict[str, dict]:
  """Per kind of arithmetic (and copies): calls, FLOPs, bytes, seconds timed alone, roofline seconds."""
  out: dict[str, dict] = {}
  for r in rows:
    kind = out.setdefault(r.get("arithmetic") or "copy", {"calls": 0, "ops": 0, "bytes": 0, "s": 0.0, "bound_s": 0.0})
    kind["calls"] += 1
    kind["ops"] += r["ops"] or 0
    kind["bytes"] += r["bytes"] or 0
    kind["s"] += r["s"]
    kind["bound_s"] += r["bound_s"] or 0.0
  return out

def table(result: dict, top: int = 0) -> str:
  """The per-call table, the totals, and where the floor stands against the roofline (the kernels furthest from their bound named)."""
  f = lambda v, scale, fmt: "-" if v is None else format(v / scale, fmt)
  lines = ["| call | kernel | global | local | math | MFLOP | MB | us | GFLOP/s | GB/s | share | roofline us | x bound |", "|---" * 13 + "|"]
  rows = sorted(result["calls"], key=lambda r: -r["s"])[:top or None]
  for r in rows:
    ratio = f"{r['s'] / r['bound_s']:.1f}x" if r["bound_s"] else "-"
    size = lambda v: str(tuple(v)) if v else "-"
    lines.append(f"| {r['call']} | {r['name'][:40]} | {size(r['global_size'])} | {size(r['local_size'])} | {r.get('arithmetic') or '-'} "
                 f"| {f(r['ops'], 1e6, '.2f')} | {f(r['bytes'], 1e6, '.3f')} | {r['s'] * 1e6:.1f} | {f(r['flops_per_s'], 1e9, '.0f')} "
                 f"| {f(r['bytes_per_s'], 1e9, '.0f')} | {100 * r['share']:.1f}% | {f(r['bound_s'], 1e-6, '.2f')} | {ratio} |")
  lines.append(f"\n{len(result['calls'])} calls on {result['device']}: {result['ops'] / 1e9:.3f} GFLOP, {result['bytes'] / 1e6:.1f} MB; kernels timed alone "
               f"sum to {result['sum_s'] * 1e3:.3f} ms; the part's floor (calls back to back, as the replay runs them) {result['floor_s'] * 1e3:.3f} ms")
  if result["bound_s"]:
    peaks = result.get("peaks")
    flops = peaks["fp32"] if peaks else result["peak_flops"]
    warning = peaks_warning(result["device"], flops, result["peak_bytes"])
    at = (f"the {peaks['name']} peaks ({peaks['fp32'] / 1e12:g} TFLOP/s fp32, {peaks['tf32_tc'] / 1e12:g} TF32 tensor cores, {peaks['fp16_tc'] / 1e12:g} "
          f"fp16 tensor cores, by each kernel's arithmetic; {peaks['bytes'] / 1e12:g} TB/s)" if peaks else
          f"{result['peak_flops'] / 1e12:g} TFLOP/s and {result['peak_bytes'] / 1e12:g} TB/s")
    lines.append(f"roofline lower bound {result['bound_s'] * 1e3:.4f} ms at {at}: "
                 f"floor = {result['floor_s'] / result['bound_s']:.1f}x the bound" + (" (against another machine's peaks: see the NOTE)" if warning else ""))
    if peaks: lines.append(f"peaks: {peaks['source']}")
    for kind, k in (result.get("by_arithmetic") or {}).items():
      lines.append(f"  {kind}: {k['calls']} calls, {k['ops'] / 1e9:.3f} GFLOP, {k['bytes'] / 1e6:.1f} MB, {k['s'] * 1e3:.3f} ms timed alone, "
                   f"bound {k['bound_s'] * 1e3:.4f} ms")
    if warning: lines.append(warning)
    gaps = sorted(result["calls"], key=lambda r: -(r["s"] - (r["bound_s"] or 0)))[:5]
    lines.append("furthest from their bound (time - bound): " + ", ".join(f"call {r['call']} {r['name'][:32]} {(r['s'] - (r['bound_s'] or 0)) * 1e6:.0f} us"
                                                                           for r in gaps))
  else: lines.append("no roofline: give --peaks (a device's datasheet preset) or --peak-tflops and --peak-tbs (and say where they come from), or a bundle "
                     "whose kernels carry estimates. "
                     + how_to_pick_peaks(result["device"]))
  return "\n".join(lines)

# *** peaks that fit the device ***

CPU_BYTES_CEILING = 1.2e12  # B/s: above any CPU socket's memory (12-channel DDR5 ~0.5 TB/s, HBM Xeon Max ~1 TB/s); a GPU's HBM is 2-8 TB/s

def cpu_flops_ceiling() -> tuple[float, str]:
  """The most FP32 FLOP/s this CPU could reach, from /proc/cpuinfo: threads x clock x FLOPs per cycle of its widest FMA (two AVX-512 FMA
  units: 64, AVX2 + FMA: 32, else 16), and how it was reckoned. A ceiling, not a measurement: hyperthreads share their core's units."""
  threads, mhz, flags = os.cpu_count() or 1, 0.0, set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        if key.strip() == "cpu MHz": mhz = max(mhz, float(value or 0))
        elif key.strip() in ("flags", "Features"): flags |= set(value.split())
  except (OSError, ValueError): pass
  try:  # the highest clock, not the one now: an idle core's is throttled
    with open("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq") as f: mhz = max(mhz, int(f.read()) / 1e3)
  except (OSError, ValueError): pass
  ghz = mhz / 1e3 or 3.0
  per_cycle, isa = (64, "AVX-512 FMA") if "avx512f" in flags else (32, "AVX2 FMA") if {"avx2", "fma"} <= flags else (16, "SIMD")
  return threads * ghz * 1e9 * per_cycle, f"{threads} threads x {ghz:.2f} GHz{'' if mhz else ' (assumed)'} x {per_cycle} FP32 FLOP/cycle ({isa})"

def how_to_pick_peaks(device: str) -> str:
  """One line on where this device's peaks come from (a CPU's reckoned here, a GPU's from its datasheet)."""
  if device.split(":")[0] != "CPU":
    return (f"For {device}: its datasheet's FP32 (or FP16 for a FLOAT16 build) TFLOP/s and memory TB/s, e.g. an H200 SXM: --peak-tflops 67 --peak-tbs 4.8, "
            f"or a preset that picks each kernel's: {', '.join(f'--peaks {n}' for n in PEAKS)}")
  flops, how = cpu_flops_ceiling()
  return (f"For this CPU: --peak-tflops {flops / 1e12:.2g} at most ({how}) and --peak-tbs from its memory, channels x MT/s x 8 bytes "
          "(dual-channel DDR4-3200: 0.051, 8-channel DDR5-4800: 0.31), or a STREAM run's")

def peaks_warning(device: str, peak_flops: float | None, peak_bytes: float | None) -> str | None:
  """A line when the peaks given cannot be this device's: on a CPU, FLOP/s above its ceiling (cpu_flops_ceiling) or bandwidth above any
  CPU socket's (a GPU's peaks, such as the README's H200 numbers). The ratios against such a bound say nothing about the kernels."""
  if device.split(":")[0] != "CPU" or not peak_flops or not peak_bytes: return None
  ceiling, _ = cpu_flops_ceiling()
  if peak_flops <= 2 * ceiling and peak_bytes <= CPU_BYTES_CEILING: return None
  return (f"NOTE: {peak_flops / 1e12:g} TFLOP/s and {peak_bytes / 1e12:g} TB/s look like a GPU's peaks, beyond what this CPU reaches: the bound and "
          f"the 'x bound' ratios above measure against the wrong machine. {how_to_pick_peaks(device)}")
