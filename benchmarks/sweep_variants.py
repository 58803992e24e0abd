"""What a benchmark sweep varies, and how one variant of it is built: a named set of tinygrad knobs (environment variables tinygrad reads once,
when it is imported: TC_OPT, ALLOW_TF32, BEAM_UOPS_MAX, ...) and compile options (precision, BEAM width, layer boundaries). Each variant is
built in a fresh process on this machine's device (BEAM times its candidate kernels there) into a folder of its own, with built.json saying
what was built; a later sweep reuses that folder when the same variant of the same model was built there with the same tinygrad.

  python -m benchmarks.sweep_variants --list      # every variant, what it answers, its estimated build time on an H200 (full stand-ins)

tinygrad 0.14.0 keys its BEAM cache (CACHEDB) by kernel, width and device only, not by the knobs that shape the search (TC_OPT,
ALLOW_TF32, BEAM_UOPS_MAX, BEAM_PADTO, ...): variants whose knobs differ get a cache file each (`cache/<knobs>.db` in the sweep's folder), so
no variant replays another's search; variants with the same knobs share theirs (a driving model's warps are searched once for both precisions).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import NamedTuple

from benchmarks.common import logger
from sunnypilot.modeld_v2.common.cli import child_env, interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECORD, ERROR = "built.json", "build_error.txt"  # in a variant's folder: what was built; why a build failed (its traceback)
FRAMES = ("dm", "driving")
# tinygrad's knobs a variant may set; any the caller's environment sets is left out of every build, so only the variant's apply
KNOBS = ("BEAM", "JITBEAM", "TC", "TC_OPT", "TC_SELECT", "ALLOW_TF32", "BEAM_UPCAST_MAX", "BEAM_LOCAL_MAX", "BEAM_UOPS_MAX", "BEAM_PADTO",
         "BEAM_ESTIMATE", "BEAM_MIN_PROGRESS", "BEAM_TIMEOUT_SEC", "IGNORE_BEAM_CACHE", "FLOAT16", "IMAGE", "NOLOCALS", "CACHEDB")

class Variant(NamedTuple):
  """One build of a frame's model (and warps): `precision`, `beam` width, tinygrad `env` knobs at compile time, `fuse_layers` (no realize
  point per layer). `runtime`: tinygrad Context values while the bundle is loaded (JIT_BATCH_SIZE: how the replay batches its CUDA graphs),
  with `builds_as` naming the variant whose bundles it loads (it builds nothing). `est_s`: seconds its build takes on an H200 with the full
  stand-in, for --budget-s (a guess until measured: built.json records the real one)."""
  name: str
  precision: str
  beam: int = 0
  env: dict[str, str] = {}
  fuse_layers: bool = False
  runtime: dict[str, int] = {}
  builds_as: str | None = None
  est_s: float = 30.0
  about: str = ""

  @property
  def tf32(self) -> bool:
    """Whether its float32 kernels may round their operands to TF32 (10-bit mantissa, float16's unit roundoff) on tensor cores."""
    return self.precision == "float32" and self.env.get("ALLOW_TF32", "0") not in ("", "0")

  def spec(self) -> dict:
    return {"precision": self.precision, "beam": self.beam, "env": dict(sorted(self.env.items())), "fuse_layers": self.fuse_layers}

def _variants(*vs: Variant) -> dict[str, Variant]: return {v.name: v for v in vs}

TC2, TF32 = {"TC_OPT": "2"}, {"ALLOW_TF32": "1"}
WIDE = {"BEAM_UOPS_MAX": "10000", "BEAM_PADTO": "1", "BEAM_ESTIMATE": "0"}
# the driver-monitoring frame: the dm_warp fused with the DM stand-in (8 conv layers over the 1440x960 Y plane, 35 GFLOP)
DM_VARIANTS = _variants(
  Variant("f32", "float32", about="hand-coded opts, float32: no tensor cores (TC_OPT=0 tries them only on one-reduce-axis kernels)"),
  Variant("f32_b2", "float32", 2, est_s=150, about="BEAM=2, float32 (the measured baseline): CUDA cores only, ALLOW_TF32=0 keeps TC actions out"),
  Variant("f32_b4", "float32", 4, est_s=300, about="BEAM=4, float32: a wider search over the same actions"),
  Variant("tf32_tc", "float32", 0, TF32 | TC2, est_s=30, about="hand-coded TF32 tensor cores on every conv (TC_OPT=2 pads 360/180/90 wide maps)"),
  Variant("tf32_b2", "float32", 2, TF32, est_s=170, about="BEAM=2 with TF32 tensor-core actions (torch's convs are TF32 by default)"),
  Variant("f16", "float16", about="hand-coded opts, float16: no tensor cores (three reduce axes per conv, TC_OPT=0)"),
  Variant("f16_tc", "float16", 0, TC2, est_s=30, about="hand-coded fp16 tensor cores on every conv (mma m16n8k16, f32 accumulate; TC_OPT=2 pads)"),
  Variant("f16_b2", "float16", 2, est_s=170, about="BEAM=2, float16: TC actions with padding are in BEAM's set (search.py: TC_OPT 2)"),
  Variant("f16_b4", "float16", 4, est_s=340, about="BEAM=4, float16: TC survives the first round more often at width 4"),
  Variant("f16_b2_wide", "float16", 2, WIDE, est_s=230, about="BEAM=2, float16, bigger TC tiles allowed (BEAM_UOPS_MAX 10000), PADTO actions, "
          "full-size timing (BEAM_ESTIMATE=0)"),
)
DM_DEFAULT = ("f16_tc", "f16_b2", "tf32_tc", "tf32_b2", "f32_b2")
# the driving frame: the split warp of both road cameras fused with the native stand-in (launch-bound: ~30 small kernels)
DRIVING_VARIANTS = _variants(
  Variant("f32", "float32", about="hand-coded opts, float32"),
  Variant("f32_b2", "float32", 2, est_s=180, about="BEAM=2, float32 (the measured baseline)"),
  Variant("f32_b2_1graph", "float32", 2, runtime={"JIT_BATCH_SIZE": 0}, builds_as="f32_b2", est_s=0,
          about="f32_b2's bundles replayed as one CUDA graph (JIT_BATCH_SIZE=0: 0.14.0 batches 32, then 64, ...)"),
  Variant("f32_b2_fused", "float32", 2, fuse_layers=True, est_s=150, about="BEAM=2, float32, no layer boundaries: 18 kernels instead of 27, the "
          "last conv recomputed in the pool and the GRU's products nested"),
  Variant("f32_b4", "float32", 4, est_s=360, about="BEAM=4, float32"),
  Variant("f16", "float16", about="hand-coded opts, float16"),
  Variant("f16_b2", "float16", 2, est_s=180, about="BEAM=2, float16 (the warps' searches shared with f32_b2)"),
  Variant("f16_b2_1graph", "float16", 2, runtime={"JIT_BATCH_SIZE": 0}, builds_as="f16_b2", est_s=0, about="f16_b2 as one CUDA graph"),
  Variant("f16_b4", "float16", 4, est_s=360, about="BEAM=4, float16"),
)
DRIVING_DEFAULT = ("f32_b2", "f32_b2_1graph", "f16_b2", "f16_b2_1graph")
VARIANTS = {"dm": DM_VARIANTS, "driving": DRIVING_VARIANTS}

def resolve(frame: str, names: str) -> list[Variant]:
  """The variants named (comma separated, "all"), each one known for the frame; a runtime-only variant brings the variant it loads."""
  known = VARIANTS[frame]
  picked = list(known) if names == "all" else [n for n in names.split(",") if n]
  if bad := [n for n in picked if n not in known]: raise ValueError(f"unknown {frame} variants {bad}: choose from {', '.join(known)} (or all)")
  out = [known[n] for n in picked]
  for v in list(out):
    if v.builds_as and known[v.builds_as] not in out: out.insert(out.index(v), known[v.builds_as])
  return out

def listing(frame: str) -> str:
  return "\n".join(f"  {v.name:14s} {v.precision:8s} BEAM={v.beam} {' '.join(f'{k}={x}' for k, x in v.env.items()) or '-':44s} ~{v.est_s:.0f} s  {v.about}"
                   for v in VARIANTS[frame].values())

def knobs_key(env: dict[str, str]) -> str:
  """The cache file's name for a set of knobs: the same knobs share a BEAM cache, other knobs never read it."""
  return ",".join(f"{k}={v}" for k, v in sorted(env.items())) or "default"

# *** the budget ***

class Budget:
  """Seconds left of a sweep's --budget-s (None: no limit), and the steps dropped because their estimate does not fit, one line each."""
  def __init__(self, seconds: float | None, log: Callable[[str], None]):
    self.end, self.log, self.dropped = (time.monotonic() + seconds if seconds else None), log, []

  def left(self) -> float: return float("inf") if self.end is None else self.end - time.monotonic()

  def fits(self, what: str, est_s: float, reserve_s: float = 0.0) -> bool:
    """Whether `what` (about est_s seconds) fits with reserve_s kept for what must follow; if not, say so and record it."""
    if est_s + reserve_s <= self.left(): return True
    self.dropped.append(what)
    self.log(f"dropping {what}: about {est_s:.0f} s{f' (+{reserve_s:.0f} s kept for the steps after it)' if reserve_s else ''} does not fit the "
             f"{max(0.0, self.left()):.0f} s left of --budget-s")
    return False

# *** building a variant in a fresh process ***

def record_key(frame: str, v: Variant, sources: dict[str, str], cameras: list[tuple[int, int]]) -> dict:
  """What a build depends on: the variant's spec, the sources' contents, the cameras, this tinygrad and device."""
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.files import file_sha256
  from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
  return {"frame": frame, "variant": v.spec(), "sources": {k: file_sha256(p) for k, p in sorted(sources.items())},
          "cameras": [list(c) for c in cameras], "tinygrad": str(imported_tinygrad()), "device": Device.DEFAULT}

def reusable(frame: str, v: Variant, sources: dict[str, str], cameras: list[tuple[int, int]], workdir: str) -> dict | None:
  """The record of a build of this very variant, sources, cameras, tinygrad and device in workdir/<name>, or None."""
  try:
    with open(os.path.join(workdir, v.name, RECORD)) as f: record = json.load(f)
  except (OSError, ValueError): return None
  return record if record.get("key") == record_key(frame, v, sources, cameras) else None

def build_variant(frame: str, v: Variant, sources: dict[str, str], cameras: list[tuple[int, int]], workdir: str, log: Callable[[str], None],
                  timeout_s: float | None = None) -> dict:
  """Build variant `v` of the frame in a fresh process (its knobs in the environment) into workdir/<name>: its record (built.json), or
  {"error": one line} when the build failed, was stopped past timeout_s, or wrote no record."""
  out, key = os.path.join(workdir, v.name), record_key(frame, v, sources, cameras)
  os.makedirs(out, exist_ok=True)
  for stale in (ERROR, RECORD):  # an earlier build's record or error must not pass for this one's
    if os.path.exists(os.path.join(out, stale)): os.remove(os.path.join(out, stale))
  path = os.path.join(out, RECORD)
  cache = os.path.join(os.path.abspath(workdir), "cache", f"{knobs_key(v.env)}.db")
  os.makedirs(os.path.dirname(cache), exist_ok=True)
  env = {k: x for k, x in os.environ.items() if k not in KNOBS} | v.env | {"CACHEDB": cache}
  env["PYTHONPATH"] = os.pathsep.join(filter(None, (ROOT, env.get("PYTHONPATH"))))
  cmd = [sys.executable, "-m", "benchmarks.sweep_variants", "--frame", frame, "--variant", v.name, "--spec", json.dumps(v.spec()), "--out", out,
         "--cameras", ",".join(f"{w}x{h}" for w, h in cameras), *(f"--{k.replace('_', '-')}={p}" for k, p in sources.items())]
  log(f"{v.name}: building ({v.precision}, BEAM={v.beam}{''.join(f', {k}={x}' for k, x in v.env.items())}{', fused layers' if v.fuse_layers else ''}) "
      f"in a fresh process{f', at most {timeout_s:.0f} s' if timeout_s is not None else ''} ...")
  t0, last = time.monotonic(), ["no error recorded"]
  # its own group: a kill reaches BEAM's workers too; its stderr passed on as it comes, the last line kept for the one-line error
  proc = subprocess.Popen(cmd, env=child_env(env), cwd=ROOT, start_new_session=True, stderr=subprocess.PIPE, text=True, errors="replace")
  def forward() -> None:
    for line in proc.stderr:
      sys.stderr.write(line)
      if line.strip(): last[0] = line.strip()
  reader = threading.Thread(target=forward, daemon=True)
  reader.start()
  try: rc = proc.wait(timeout=timeout_s)
  except subprocess.TimeoutExpired:
    stop(proc)
    return {"error": f"{v.name}: the build ran past {timeout_s:.0f} s and was stopped"}
  except BaseException:  # Ctrl-C, SIGTERM: the build goes with the sweep
    stop(proc)
    raise
  reader.join(timeout=5)
  if rc != 0: return {"error": f"{v.name}: the build failed (exit {rc}): {last[0]}"}
  try:
    with open(path) as f: record = json.load(f)
  except (OSError, ValueError) as e: return {"error": f"{v.name}: the build wrote no record: {e}"}
  record |= {"key": key, "build_s": time.monotonic() - t0}
  with open(path, "w") as f: json.dump(record, f, indent=2)
  log(f"{v.name}: built in {record['build_s']:.0f} s: {record['kernels']} model kernels, {record['tensor_core_kernels']} programs with tensor cores")
  return record

def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
  """End a build and every process of its group: SIGTERM first (multiprocessing's resource tracker ignores it and, once the pool's owner is
  gone, unlinks the pool's named semaphores in /dev/shm: a SIGKILL to the group would leave them), SIGKILL to what is left after grace_s."""
  try: os.killpg(proc.pid, signal.SIGTERM)
  except ProcessLookupError: return
  try: proc.wait(timeout=grace_s)
  except subprocess.TimeoutExpired:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()

def tensor_core_kernels(path: str) -> int:
  """How many of a bundle's programs issue tensor-core instructions (kernel_profile.arithmetic on each binary)."""
  from sunnypilot.modeld_v2.format.bundle import read_parts
  from sunnypilot.modeld_v2.tools.kernel_profile import arithmetic
  parts = read_parts(path)[0]
  return sum(arithmetic(p, bytes(blob[p.lib[0]:p.lib[1]])).tensor_cores is not None for part, blob in parts.values() for p in part.programs)

def build_here(frame: str, v: Variant, sources: dict[str, str], cameras: list[tuple[int, int]], out: str, log: Callable[[str], None]) -> dict:
  """The child's work: the frame's model bundle in the variant's precision and its warps for each camera, all with its BEAM; the record."""
  from sunnypilot.modeld_v2 import compile_dm_warp
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  model = os.path.join(out, DRIVER_MONITORING.model_name if frame == "dm" else "model.bin")
  summary = compile_model(model, **sources, log=log, beam=v.beam, fuse_layers=v.fuse_layers, precision=v.precision)
  warps = {}
  for w, h in cameras:
    spec, name = camerad_frame(w, h).spec, f"{w}x{h}"
    if frame == "dm": warps[name] = compile_dm_warp.compile_dm_warp(spec, os.path.join(out, f"dm_warp_{name}.bin"), beam=v.beam, log=log)["output"]
    else: warps[name] = compile_warp(spec, "512x256", os.path.join(out, f"warp_{name}_split.bin"), True, beam=v.beam, log=log)["output"]
  return {"variant": v.name, "model": model, "warps": warps, "kernels": summary["kernels"], "compile_s": summary["compile_s"],
          "tensor_core_kernels": tensor_core_kernels(model), "env": {k: os.environ.get(k) for k in KNOBS if k in os.environ}}

@interruptible("sweep_variants")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.sweep_variants", __doc__)
  parser.add_argument("--list", action="store_true", help="list every frame's variants")
  parser.add_argument("--frame", choices=FRAMES, help="build: which frame's variant")
  parser.add_argument("--variant", help="build: the variant's name")
  parser.add_argument("--spec", help="build: the variant's compile options as JSON (precision, beam, fuse_layers; its knobs are in the environment)")
  parser.add_argument("--out", help="build: the variant's folder")
  parser.add_argument("--cameras", default="1928x1208", help="build: camera sizes for the warps, comma separated")
  for key in ("onnx", "vision", "policy"): parser.add_argument(f"--{key}", help="build: the model's ONNX (compile_model's keyword)")
  args = parser.parse_args(argv)
  if args.list:
    for frame in FRAMES: print(f"{frame}:\n{listing(frame)}")
    return 0
  if not (args.frame and args.variant and args.spec and args.out and (args.onnx or args.vision)):
    parser.error("a build takes --frame, --variant, --spec, --out and the model's ONNX (--list shows the variants)")
  spec = json.loads(args.spec)
  variant = Variant(args.variant, spec["precision"], spec["beam"], spec["env"], spec["fuse_layers"])
  sources = {k: p for k in ("onnx", "vision", "policy") if (p := getattr(args, k))}
  cameras = [tuple(int(x) for x in c.split("x")) for c in args.cameras.split(",")]
  log = logger(f"  {args.variant}: ")
  try: record = build_here(args.frame, variant, sources, cameras, args.out, log)
  except Exception as e:  # one line here and to the sweep; the traceback kept beside the variant's bundles
    import traceback
    with open(os.path.join(args.out, ERROR), "w") as f: f.write(traceback.format_exc() + f"{type(e).__name__}: {e}\n")
    log(f"failed: {type(e).__name__}: {e} (traceback in {os.path.join(args.out, ERROR)})")
    return 2
  with open(os.path.join(args.out, RECORD), "w") as f: json.dump(record, f, indent=2)
  return 0

if __name__ == "__main__":
  sys.exit(main())
