"""The demo: build the embedded default artifacts (again when their inputs or build settings changed), start a camerad stand-in and modeld,
run N frames, summarize.

  python -m sunnypilot.modeld_v2.tools.demo [--frames 100] [--camera 1928x1208] [--generation split_09] [--size tiny|full] [--onnx model.onnx]
  python -m sunnypilot.modeld_v2.tools.demo --route SEGMENT_OR_ROUTE_FOLDER [--onnx model.onnx]

With --route it replays a recorded drive instead of synthetic frames (route_replay, in lockstep, checked against onnxruntime on the same
model): artifacts for the route's camera, then OUT/replay/<segment>/ with modeld's log, the overlay MP4, the plots and check.json.

The default model is a RANDOM-WEIGHT STAND-IN of a driving-model generation (`--generation`, see stand_in_models) with openpilot's inputs
and outputs: the pipeline is real, the predictions are noise. Point it at a real driving model with --onnx (native or supercombo),
--vision/--policy (a split pair) or --vision/--off-policy/--on-policy.

A bundle is reused only when it records the same sources (each ONNX's sha256, which compile_modeld writes into it) and build settings
(device, kernel target, tinygrad, IMAGE/FLOAT16/NOLOCALS/JIT_BATCH_SIZE/BEAM) as this run would build; else it is rebuilt, saying why.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.model_plan import MODEL_FILES, add_model_flags, model_files
from sunnypilot.modeld_v2.model.calibration import parse_camera_size

PNGS = ("demo_latency.png", "demo_preview.png")  # written into --out
STAND_IN_BANNER = ("NOTE: the model is a random-weight stand-in (openpilot's I/O, seeded random weights): outputs are noise.\n"
                   "      Use a real model with --onnx driving.onnx (or --vision vision.onnx --policy policy.onnx, or --vision, --off-policy and --on-policy).")

WARP_TO = "512x256"

def why_rebuild(path: str, want: dict[str, Any]) -> str | None:
  """Why the bundle at `path` is not what this run would build, in words, or None to reuse it. What it was built from is what its header
  records: its provenance (device, kernel target, tinygrad and format versions, build flags) against this process's, and `want`, fields
  its metadata must hold (a model's sources' sha256, a warp's frame, size and layout)."""
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.format.bundle import provenance, read_bundle
  if not os.path.exists(path): return "not built yet"
  try: head = read_bundle(path)[0]  # whole: a damaged bundle is rebuilt here, not refused by modeld later
  except ArtifactError as e: return f"it is unreadable ({e})"
  built, here, meta = head["provenance"], provenance(Device.DEFAULT), head["extras"].get("metadata", {})
  have = {f"build.{k}": built.get(k) for k in here if k != "flags"} | {f"build.flags.{k}": built.get("flags", {}).get(k) for k in here["flags"]}
  need = {f"build.{k}": v for k, v in here.items() if k != "flags"} | {f"build.flags.{k}": v for k, v in here["flags"].items()} | want
  have |= {k: meta.get(k) for k in want}
  short = lambda v: {k: x[:12] for k, x in v.items()} if isinstance(v, dict) else v  # sha256s by role, shortened
  return next((f"it records {k} {short(have[k])}, this run builds {short(need[k])}" for k in need if have[k] != need[k]), None)

def build_artifacts(folder: str, camera: tuple[int, int], generation: str, size: str, models: dict[str, str], log) -> str:
  """model.bin (from `models`, compile_model's ONNX keywords, else the generation's stand-in, written beside it) and the camera's
  --split-frames warp in `folder`, each built for this device unless the one there records the same sources (by content) and settings
  (why_rebuild). A rebuild says why in one line."""
  from sunnypilot.modeld_v2.common.files import file_sha256
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  os.makedirs(folder, exist_ok=True)
  model = os.path.join(folder, "model.bin")
  sources = models or stand_in_models.files(generation, os.path.join(folder, f"{generation}_{size}_stand_in.onnx"))
  present = all(os.path.isfile(p) for p in sources.values())  # a stand-in not written yet: nothing built from it can be current
  why = why_rebuild(model, {"source_sha256": {k: file_sha256(p) for k, p in sources.items()}}) if present else "its stand-in is not written yet"
  if why:
    if os.path.exists(model): log(f"rebuilding {model}: {why}")
    if not models:
      log(f"generating the embedded default model ({size} {generation}, random weights) ...")
      stand_in_models.write(generation, size, os.path.join(folder, f"{generation}_{size}_stand_in.onnx"))
    log("compiling the driving model ...")
    compile_model(model, **sources, log=lambda s: log(f"  {s}"))
  else: log(f"reusing {model}: built from the same {'model files' if models else 'stand-in'} with the same settings")
  frame = camerad_frame(*camera)
  warp = os.path.join(folder, f"warp_{camera[0]}x{camera[1]}_split.bin")
  if why := why_rebuild(warp, {"frame": frame.spec, "model_size": [int(x) for x in WARP_TO.split("x")], "split_frames": True}):
    if os.path.exists(warp): log(f"rebuilding {warp}: {why}")
    log(f"compiling the camera warp for {camera[0]}x{camera[1]} ...")
    compile_warp(frame.spec, WARP_TO, warp, split_frames=True)
  else: log(f"reusing {warp}")
  return warp

def collect(frames: int, timeout: float, procs: list[subprocess.Popen]) -> list[dict]:
  """modelV2 (+ matching cameraOdometry/drivingModelData) fields of the first `frames` published frames."""
  from sunnypilot.modeld_v2.daemon.messaging import sub_master
  sm = sub_master(["modelV2", "cameraOdometry", "drivingModelData"])
  out, deadline = [], time.monotonic() + timeout
  while len(out) < frames and time.monotonic() < deadline and all(p.poll() is None for p in procs):
    sm.update(100)
    if sm.updated["modelV2"]:
      m = sm["modelV2"]
      out.append({"frameId": m.frameId, "frameIdExtra": m.frameIdExtra, "frameDropPerc": m.frameDropPerc, "ms": m.modelExecutionTime * 1e3,
                  "x_end": m.position.x[-1], "lane_probs": list(m.laneLineProbs), "lead_prob": m.leadsV3[0].prob,
                  "desire_state": int(np.argmax(m.meta.desireState)), "trans": list(sm["cameraOdometry"].trans)})
  return out

def latency_series(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(frame ids, ms) over every frame id from the first published to the last, NaN where modeld published nothing: a dropped frame is a
  gap in the line, not a straight segment drawn across it."""
  if not rows: return np.zeros(0, np.int64), np.zeros(0)
  first, last = rows[0]["frameId"], rows[-1]["frameId"]
  ids, ms = np.arange(first, last + 1), np.full(last - first + 1, np.nan)
  for r in rows: ms[r["frameId"] - first] = r["ms"]
  return ids, ms

def plot_latency(rows: list[dict], path: str, model: str) -> None:
  """modelExecutionTime per frame id (dropped frames left as gaps and marked) and its histogram, titled with the model it ran."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator
  ids, ms = latency_series(rows)
  dropped = ids[np.isnan(ms)]
  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
  a.plot(ids, ms, lw=1, marker=".", ms=3, label="modelExecutionTime")
  a.axhline(50, color="red", ls="--", lw=1, label="20 Hz budget (50 ms)")
  highest = float(np.nanmax(ms)) if np.isfinite(ms).any() else 50.0
  if len(dropped):
    for i in dropped: a.axvspan(i - 0.5, i + 0.5, color="orange", alpha=0.3, lw=0)
    a.plot(dropped, np.full(len(dropped), highest), "v", color="tab:orange", ms=5, label=f"dropped: no modelV2 ({len(dropped)} frames)")
  top = max(50.0, highest)
  a.set_xlabel("camera frame id"), a.set_ylabel("modelExecutionTime (ms)"), a.set_ylim(0, top * 1.45), a.legend(fontsize=8, loc="upper right", ncol=3)
  a.set_title(f"per frame: {len(rows)} published of {len(ids)} frame ids", fontsize=10)
  published = ms[np.isfinite(ms)]
  b.hist(published, bins=30)
  for q, style in ((50, "-"), (95, "--")):
    if len(published): b.axvline(np.percentile(published, q), color="black", ls=style, lw=1, label=f"p{q} {np.percentile(published, q):.1f} ms")
  if len(published): b.legend(fontsize=8)
  b.set_xlabel("modelExecutionTime (ms)"), b.set_ylabel("frames"), b.set_title("distribution", fontsize=10)
  a.xaxis.set_major_locator(MaxNLocator(integer=True)), b.yaxis.set_major_locator(MaxNLocator(integer=True))
  fig.suptitle(f"modeld_v2 demo: {model}", fontsize=11)
  fig.tight_layout()
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  with replaced_atomically(path) as (tmp,): fig.savefig(tmp, dpi=100, format="png")
  plt.close(fig)

def route_camera(path: str) -> tuple[int, int]:
  """The camera size of a route's first segment (ValueError with the route's problem)."""
  from sunnypilot.modeld_v2.replay.route_segment import RouteError, open_segment, segment_folders
  try: frame = open_segment(segment_folders(path)[0]).frame
  except RouteError as e: raise ValueError(str(e)) from None
  return frame.width, frame.height

def replay_route(args, folder: str, models: dict[str, str]) -> int:
  """route_replay on args.route with the demo's artifacts, checked against the ONNX they were built from (the stand-in's when there)."""
  from sunnypilot.modeld_v2.replay import route_replay
  from sunnypilot.modeld_v2.tools.stand_in_models import model_path
  if not models:
    stand_in = os.path.join(folder, f"{args.generation}_{args.size}_stand_in.onnx")
    models = {k: p for k in MODEL_FILES if os.path.exists(p := model_path(stand_in, k))}
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in models.items()]
  return route_replay.main([args.route, "--artifacts", folder, "--out", os.path.join(args.out, "replay"), *flags])

def make_folders(*folders: str) -> list[str]:
  """Make each folder and its missing parents; returns the ones made, outermost first, for `remove_folders` when the run fails."""
  made = []
  for folder in folders:
    missing, up = [], os.path.abspath(folder)
    while not os.path.exists(up):
      missing.append(up)
      up = os.path.dirname(up)
    os.makedirs(folder, exist_ok=True)
    made += [m for m in reversed(missing) if m not in made]
  return made

def remove_folders(made: list[str]) -> None:
  """Remove the folders this run made (innermost first) and what it wrote into them: a failed run leaves nothing behind."""
  for folder in reversed(made): shutil.rmtree(folder, ignore_errors=True)

def check_model_files(models: dict[str, str]) -> None:
  """Before any work: each model file given is a readable regular file (ArtifactError naming its flag)."""
  from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular
  for key, path in models.items():
    try:
      with open_regular(path) as f: f.read(1)
    except (ArtifactError, OSError) as e: raise ArtifactError(f"--{key.replace('_', '-')} {e}") from None

def check_outputs(out: str, artifacts: str, pngs: tuple[str, ...], made: list[str]) -> None:
  """Before any compiling: `out` and `artifacts` are folders (or can be made: those made are appended to `made`), and each summary PNG in
  `out` can be written there."""
  from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
  for flag, folder in (("--out", out), ("--artifacts", artifacts)):
    if os.path.exists(folder) and not os.path.isdir(folder): raise ArtifactError(f"{flag} {folder} is not a folder")
    try: made += make_folders(folder)
    except OSError as e: raise ArtifactError(f"{flag} {folder}: cannot make the folder: {e.strerror or e}") from None
  for png in pngs: check_output_path(os.path.join(out, png))

def describe_model(models: dict[str, str], generation: str, size: str) -> str:
  if not models: return f"{size} {generation} random-weight stand-in model"
  return "model " + ", ".join(f"--{k.replace('_', '-')} {p}" for k, p in models.items())

@interruptible("demo")
def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.compile.onnx_model import ModelError
  from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir
  from sunnypilot.modeld_v2.tools import stand_in_models
  from sunnypilot.modeld_v2.tools.preview import preview
  parser = cli_parser("demo", __doc__)
  parser.add_argument("--frames", type=positive_int, default=100)
  parser.add_argument("--camera", default="1928x1208", type=checked(parse_camera_size), help="1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--generation", default="native", choices=stand_in_models.NAMES, help="the embedded stand-in's generation")
  parser.add_argument("--size", default="tiny", choices=("tiny", "full"), help="the embedded stand-in's size")
  add_model_flags(parser, ": a real model instead of the stand-in")
  parser.add_argument("--artifacts", help="where bundles are built and reused (default out/artifacts/<device>_<generation>_<size>)")
  parser.add_argument("--out", default="out", help="where the summary PNGs go")
  parser.add_argument("--route", help="replay this recorded segment (or folder of segments) instead: see route_replay")
  args = parser.parse_args(argv)
  log = logging.getLogger(__name__).info
  models = model_files(args)
  try: check_model_files(models)
  except ArtifactError as e: parser.exit(2, f"demo: error: {e}\n")
  try: camera = args.camera if not args.route else route_camera(args.route)
  except ValueError as e: parser.error(str(e))
  camera_name = f"{camera[0]}x{camera[1]}"
  real = bool(models)
  folder = args.artifacts or os.path.join("out", "artifacts", f"{Device.DEFAULT.lower()}_{'custom' if real else f'{args.generation}_{args.size}'}")
  made: list[str] = []
  try:  # until the artifacts are built, a failure (or Ctrl-C) removes every folder this run made
    try: check_outputs(args.out, folder, PNGS, made)
    except ArtifactError as e: parser.exit(2, f"demo: error: {e}\n")
    if not real: log(STAND_IN_BANNER)
    try: warp = build_artifacts(folder, camera, args.generation, args.size, models, log)
    except (ModelError, ArtifactError) as e: parser.exit(2, f"demo: error: {e}\n")
  except BaseException:
    remove_folders(made)
    raise
  if args.route: return replay_route(args, folder, models)
  prefix = f"demo_{uuid.uuid4().hex[:8]}"
  env = os.environ | {"OPENPILOT_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
  os.environ["OPENPILOT_PREFIX"] = prefix
  ensure_prefix_dir()
  py = [sys.executable, "-m"]
  procs = [subprocess.Popen(py + ["sunnypilot.modeld_v2.modeld", "--artifacts", folder, "--max-frames", str(args.frames)], env=env),
           subprocess.Popen(py + ["sunnypilot.modeld_v2.replay.fake_camerad", "--camera", camera_name, "--start-delay", "0.5"], env=env)]
  try:
    rows = collect(args.frames, timeout=120 + args.frames * 0.5, procs=procs)
  finally:
    try: procs[0].wait(timeout=10)  # modeld stops by itself after --max-frames
    except subprocess.TimeoutExpired: pass
    for p in procs:
      if p.poll() is None: p.send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=30) for p in procs]
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  if not rows:
    log(f"no modelV2 messages arrived (modeld exit {codes[0]}, fake_camerad exit {codes[1]})")
    return 1
  ms = np.array([r["ms"] for r in rows])
  ids = [r["frameId"] for r in rows]
  last = rows[-1]
  plot_latency(rows, latency_png := os.path.join(args.out, PNGS[0]), describe_model(models, args.generation, args.size))
  preview(warp, preview_png := os.path.join(args.out, PNGS[1]))
  print(f"""
modeld_v2 demo on {Device.DEFAULT}, {camera_name} cameras, {describe_model(models, args.generation, args.size)}
  frames in (camera frame ids {ids[0]}..{ids[-1]}): {ids[-1] - ids[0] + 1}
  frames out (modelV2 published):   {len(rows)}
  drops: {ids[-1] - ids[0] + 1 - len(rows)} frame ids unpublished, frameDropPerc max {max(r['frameDropPerc'] for r in rows):.2f}%
  modelExecutionTime: p50 {np.percentile(ms, 50):.1f} ms, p95 {np.percentile(ms, 95):.1f} ms, max {ms.max():.1f} ms (budget 50 ms at 20 Hz)
  last frame {last['frameId']}: plan x at 10 s {last['x_end']:.2f} m, lane line probs {np.round(last['lane_probs'], 2).tolist()},
    lead prob {last['lead_prob']:.2f}, desire state {last['desire_state']}, cameraOdometry trans {np.round(last['trans'], 3).tolist()}
  wrote {latency_png} and {preview_png} (what the model sees)
  modeld exit code {codes[0]}, fake_camerad exit code {codes[1]}""")
  if not real: print(STAND_IN_BANNER)
  return 0 if codes[0] == 0 and len(rows) == args.frames else 1

if __name__ == "__main__":
  sys.exit(main())
