"""The demo: build the embedded default artifacts (again when their inputs or build settings changed), start a camerad stand-in, modeld and
dmonitoringmodeld, run N frames through each, summarize.

  python -m sunnypilot.modeld_v2.tools.demo [--frames 100] [--camera 1928x1208] [--generation split_09] [--size tiny|full] [--onnx model.onnx]
                                            [--dm-onnx dmonitoring_model.onnx | --no-dm]
  python -m sunnypilot.modeld_v2.tools.demo --route SEGMENT_OR_ROUTE_FOLDER [--onnx model.onnx] [--dm-onnx dmonitoring_model.onnx | --no-dm]

With --route it replays a recorded drive instead of synthetic frames (route_replay, in lockstep, checked against onnxruntime on the same
models): both daemons' artifacts for the route's camera (the driver-monitoring pair when its first segment has a driver camera video,
dcamera.hevc, and not --no-dm), then OUT/demo_replay/<segment>/ with the daemons' log, the overlay MP4, the plots and check.json (its own
folder: route_replay's OUT/replay is left alone).

The default model is a RANDOM-WEIGHT STAND-IN of a driving-model generation (`--generation`, see stand_in_models) with openpilot's inputs
and outputs: the pipeline is real, the predictions are noise. Point it at a real driving model with --onnx (native or supercombo),
--vision/--policy (a split pair) or --vision/--off-policy/--on-policy.

Driver monitoring runs beside it: the artifacts folder also gets dmonitoring_model.bin (a random-weight stand-in of openpilot's
driver-monitoring model, or --dm-onnx) and dm_warp_<camera>.bin (compile_dm_warp), fake_camerad serves a driver stream (a synthetic cabin:
a face that sways, turns and blinks) and dmonitoringmodeld publishes driverStateV2, summarized beside modelV2. --no-dm leaves it out.

A bundle is reused only when it records the same sources (each ONNX's sha256, which compile_modeld writes into it) and build settings
(device, kernel target, tinygrad, IMAGE/FLOAT16/NOLOCALS/JIT_BATCH_SIZE/BEAM) as this run would build; else it is rebuilt, saying why.
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.model_plan import MODEL_FILES, add_model_flags, model_files
from sunnypilot.modeld_v2.model.calibration import parse_camera_size

PROG = "modeld_demo"  # its console command (pyproject.toml): what usage lines and errors name
PNGS = ("demo_latency.png", "demo_preview.png")  # written into --out
REPLAY_DIR = "demo_replay"  # --route's results, in --out: not route_replay's own default folder (out/replay), which a demo must not overwrite
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
  short = lambda v: {k: x[:12] for k, x in v.items()} if isinstance(v, dict) else v[:12] if isinstance(v, str) and len(v) == 64 else v  # sha256s
  return next((f"it records {k} {short(have[k])}, this run builds {short(need[k])}" for k in need if have[k] != need[k]), None)

def build_model(bundle: str, sources: dict[str, str], write_stand_in: Callable[[], None] | None, what: str, log: Callable[[str], None]) -> None:
  """`bundle` compiled from `sources` (compile_model's ONNX keywords) for this device unless the one there records the same sources (by
  content) and settings (why_rebuild); `write_stand_in` writes the stand-in `sources` name (None: they are the user's files). A rebuild
  says why in one line."""
  from sunnypilot.modeld_v2.common.files import file_sha256
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  present = all(os.path.isfile(p) for p in sources.values())  # a stand-in not written yet: nothing built from it can be current
  why = why_rebuild(bundle, {"source_sha256": {k: file_sha256(p) for k, p in sources.items()}}) if present else "its stand-in is not written yet"
  if not why:
    log(f"reusing {bundle}: built from the same {'stand-in' if write_stand_in else 'model files'} with the same settings")
    return
  if os.path.exists(bundle): log(f"rebuilding {bundle}: {why}")
  if write_stand_in: write_stand_in()
  log(f"compiling the {what} ...")
  compile_model(bundle, **cast(dict[str, Any], sources), log=lambda s: log(f"  {s}"))  # its ONNX path keywords, nothing else

def build_warp(path: str, want: dict[str, Any], compile_it: Callable[[], Any], what: str, log: Callable[[str], None]) -> None:
  """The warp at `path` compiled by `compile_it` unless the one there records `want` in its metadata and this run's settings (why_rebuild)."""
  if why := why_rebuild(path, want):
    if os.path.exists(path): log(f"rebuilding {path}: {why}")
    log(f"compiling {what} ...")
    compile_it()
  else: log(f"reusing {path}")

def build_artifacts(folder: str, camera: tuple[int, int], generation: str, size: str, models: dict[str, str], log: Callable[[str], None]) -> str:
  """model.bin (from `models`, compile_model's ONNX keywords, else the generation's stand-in, written beside it) and the camera's
  --split-frames warp in `folder`, each rebuilt only when build_model's and build_warp's rule says so. Returns the warp's path."""
  from sunnypilot.modeld_v2 import compile_warp
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  os.makedirs(folder, exist_ok=True)
  stand_in = os.path.join(folder, f"{generation}_{size}_stand_in.onnx")
  def write_stand_in() -> None:
    log(f"generating the embedded default model ({size} {generation}, random weights) ...")
    stand_in_models.write(generation, size, stand_in)
  build_model(os.path.join(folder, "model.bin"), models or stand_in_models.files(generation, stand_in), None if models else write_stand_in,
              "driving model", log)
  frame = camerad_frame(*camera)
  warp = os.path.join(folder, f"warp_{camera[0]}x{camera[1]}_split.bin")
  build_warp(warp, {"frame": frame.spec, "model_size": [int(x) for x in WARP_TO.split("x")], "split_frames": True},
             lambda: compile_warp.compile_warp(frame.spec, WARP_TO, warp, split_frames=True), f"the camera warp for {camera[0]}x{camera[1]}", log)
  return warp

def build_dm_artifacts(folder: str, camera: tuple[int, int], size: str, dm_onnx: str | None, log: Callable[[str], None]) -> str:
  """dmonitoring_model.bin (from `dm_onnx`, else the driver-monitoring stand-in of `size`, written beside it) and the driver camera's
  dm_warp for `camera` in `folder`, by the same rebuild rule as the driving model's. Returns the ONNX the model is built from."""
  from sunnypilot.modeld_v2 import compile_dm_warp
  from sunnypilot.modeld_v2.daemon.model_sets import DM_MODEL_NAME
  from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  os.makedirs(folder, exist_ok=True)
  stand_in = os.path.join(folder, f"dmonitoring_{size}_stand_in.onnx")
  def write_stand_in() -> None:
    log(f"generating the driver-monitoring stand-in ({size}, random weights) ...")
    stand_in_models.write("dmonitoring", size, stand_in)
  build_model(os.path.join(folder, DM_MODEL_NAME), {"onnx": dm_onnx or stand_in}, None if dm_onnx else write_stand_in, "driver-monitoring model", log)
  frame = camerad_frame(*camera)
  warp = os.path.join(folder, f"dm_warp_{camera[0]}x{camera[1]}.bin")
  build_warp(warp, {"frame": frame.spec, "model_size": list(DM_INPUT_SIZE), "border_fill": compile_dm_warp.BORDER_FILL},
             lambda: compile_dm_warp.compile_dm_warp(frame.spec, warp, log=lambda s: log(f"  {s}")),
             f"the driver camera's warp for {camera[0]}x{camera[1]}", log)
  return dm_onnx or stand_in

def collect(frames: int, timeout: float, camerad: subprocess.Popen, daemons: dict[str, subprocess.Popen]) -> dict[str, list[dict]]:
  """{service: rows} of the first `frames` published frames of each daemon's service (modelV2, with the matching cameraOdometry;
  driverStateV2), until each has them or its daemon exited (what it sent before exiting still read), the camerad stand-in died or `timeout`."""
  from sunnypilot.modeld_v2.daemon.messaging import sub_master
  sm = sub_master(list(daemons) + (["cameraOdometry"] if "modelV2" in daemons else []))
  rows: dict[str, list[dict]] = {service: [] for service in daemons}
  pending, exited, deadline = dict(daemons), set(), time.monotonic() + timeout
  while pending and time.monotonic() < deadline and camerad.poll() is None:
    sm.update(100)
    if "modelV2" in pending and sm.updated["modelV2"]:
      m = sm["modelV2"]
      rows["modelV2"].append({"frameId": m.frameId, "frameIdExtra": m.frameIdExtra, "frameDropPerc": m.frameDropPerc, "ms": m.modelExecutionTime * 1e3,
                              "x_end": m.position.x[-1], "lane_probs": list(m.laneLineProbs), "lead_prob": m.leadsV3[0].prob,
                              "desire_state": int(np.argmax(m.meta.desireState)), "trans": list(sm["cameraOdometry"].trans)})
    if "driverStateV2" in pending and sm.updated["driverStateV2"]:
      d = sm["driverStateV2"]
      driver = d.leftDriverData
      rows["driverStateV2"].append({"frameId": d.frameId, "ms": d.modelExecutionTime * 1e3, "gpu_ms": d.gpuExecutionTime * 1e3,
                                    "valid": sm.valid["driverStateV2"], "face_prob": driver.faceProb, "orientation": list(driver.faceOrientation),
                                    "position": list(driver.facePosition), "wheel_on_right": d.wheelOnRightProb})
    for service, proc in list(pending.items()):
      if len(rows[service]) >= frames: del pending[service]
      elif proc.poll() is not None:  # gone: one more update reads what it sent last
        if service in exited: del pending[service]
        exited.add(service)
  return rows

def latency_series(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
  """(frame ids, ms) over every frame id from the first published to the last, NaN where modeld published nothing: a dropped frame is a
  gap in the line, not a straight segment drawn across it."""
  if not rows: return np.zeros(0, np.int64), np.zeros(0)
  first, last = rows[0]["frameId"], rows[-1]["frameId"]
  ids, ms = np.arange(first, last + 1), np.full(last - first + 1, np.nan)
  for r in rows: ms[r["frameId"] - first] = r["ms"]
  return ids, ms

def plot_latency(rows: list[dict], path: str, model: str, dm_rows: list[dict] | None = None) -> None:
  """modelExecutionTime per frame id (dropped frames left as gaps and marked) and its histogram, titled with the model it ran; with
  `dm_rows`, driverStateV2's beside it (per driver frame id: the driver camera counts its own frames)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.ticker import MaxNLocator
  ids, ms = latency_series(rows)
  dropped = ids[np.isnan(ms)]
  fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [2, 1]})
  a.plot(ids, ms, lw=1, marker=".", ms=3, label="modelV2 modelExecutionTime" if dm_rows else "modelExecutionTime")
  dm_ids, dm_ms = latency_series(dm_rows or [])
  if dm_rows: a.plot(dm_ids, dm_ms, lw=1, marker=".", ms=3, color="tab:green", label="driverStateV2 modelExecutionTime")
  a.axhline(50, color="red", ls="--", lw=1, label="20 Hz budget (50 ms)")
  both = np.concatenate([ms, dm_ms])
  highest = float(np.nanmax(both)) if np.isfinite(both).any() else 50.0
  if len(dropped):
    for i in dropped: a.axvspan(i - 0.5, i + 0.5, color="orange", alpha=0.3, lw=0)
    a.plot(dropped, np.full(len(dropped), highest), "v", color="tab:orange", ms=5, label=f"dropped: no modelV2 ({len(dropped)} frames)")
  top = max(50.0, highest)
  a.set_xlabel("camera frame id"), a.set_ylabel("modelExecutionTime (ms)"), a.set_ylim(0, top * 1.45), a.legend(fontsize=8, loc="upper right", ncol=2)
  title = f"per frame: {len(rows)} modelV2 published of {len(ids)} frame ids"
  a.set_title(title + (f", {len(dm_rows)} driverStateV2 of {len(dm_ids)}" if dm_rows else ""), fontsize=10)
  published = ms[np.isfinite(ms)]
  if dm_rows: b.hist(dm_ms[np.isfinite(dm_ms)], bins=30, color="tab:green", alpha=0.6, label="driverStateV2")
  b.hist(published, bins=30, alpha=0.8 if dm_rows else 1.0, label="modelV2" if dm_rows else None)
  for q, style in ((50, "-"), (95, "--")):
    if len(published): b.axvline(np.percentile(published, q), color="black", ls=style, lw=1,
                                 label=f"{'modelV2 ' if dm_rows else ''}p{q} {np.percentile(published, q):.1f} ms")
  if len(published): b.legend(fontsize=8)
  b.set_xlabel("modelExecutionTime (ms)"), b.set_ylabel("frames"), b.set_title("distribution", fontsize=10)
  a.xaxis.set_major_locator(MaxNLocator(integer=True)), b.yaxis.set_major_locator(MaxNLocator(integer=True))
  fig.suptitle(f"modeld_v2 demo: {model}", fontsize=11)
  fig.tight_layout()
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  with replaced_atomically(path) as (tmp,): fig.savefig(tmp, dpi=100, format="png")
  plt.close(fig)

def route_cameras(path: str) -> tuple[tuple[int, int], bool]:
  """The camera size of a route's first segment and whether it has a driver camera video (ValueError with the route's problem)."""
  from sunnypilot.modeld_v2.replay.route_segment import RouteError, open_segment, segment_folders
  try: segment = open_segment(segment_folders(path)[0])
  except RouteError as e: raise ValueError(str(e)) from None
  return (segment.frame.width, segment.frame.height), segment.driver_video is not None

def replay_route(args: argparse.Namespace, folder: str, models: dict[str, str], dm_onnx: str | None) -> int:
  """route_replay on args.route with the demo's artifacts, into OUT/demo_replay, checked against the ONNX they were built from (the
  stand-ins' when there; `dm_onnx`: the driver-monitoring model's, when dmonitoringmodeld runs)."""
  from sunnypilot.modeld_v2.replay import route_replay
  from sunnypilot.modeld_v2.tools.stand_in_models import model_path
  if not models:
    stand_in = os.path.join(folder, f"{args.generation}_{args.size}_stand_in.onnx")
    models = {k: p for k in MODEL_FILES if os.path.exists(p := model_path(stand_in, k))}
  flags = [f"--{k.replace('_', '-')}={v}" for k, v in (models | ({"dm_onnx": dm_onnx} if dm_onnx else {})).items()]
  return route_replay.main([args.route, "--artifacts", folder, "--out", os.path.join(args.out, REPLAY_DIR), *flags])

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

def dm_summary(rows: list[dict], dm_onnx: str | None, size: str) -> str:
  """driverStateV2's lines of the summary: frames in and out (the driver stream is conflated: a frame that arrives while the model runs
  is replaced by the next), execution times, the last frame's left-hand-drive driver fields."""
  ms, gpu = np.array([r["ms"] for r in rows]), np.array([r["gpu_ms"] for r in rows])
  ids, last = [r["frameId"] for r in rows], rows[-1]
  return f"""dmonitoringmodeld: {f'driver-monitoring model {dm_onnx}' if dm_onnx else f'{size} dmonitoring random-weight stand-in'}, synthetic cabin
  driver frames in (driver camera frame ids {ids[0]}..{ids[-1]}): {ids[-1] - ids[0] + 1}
  frames out (driverStateV2 published): {len(rows)}, {sum(not r['valid'] for r in rows)} with valid=False
  skipped: {ids[-1] - ids[0] + 1 - len(rows)} driver frame ids (conflated: the newest frame runs)
  modelExecutionTime: p50 {np.percentile(ms, 50):.1f} ms, p95 {np.percentile(ms, 95):.1f} ms, max {ms.max():.1f} ms; \
gpuExecutionTime p50 {np.percentile(gpu, 50):.1f} ms
  last frame {last['frameId']}: faceProb {last['face_prob']:.2f}, faceOrientation {np.round(last['orientation'], 2).tolist()}, facePosition \
{np.round(last['position'], 2).tolist()}, wheelOnRightProb {last['wheel_on_right']:.2f} (left-hand-drive driver)
"""

def describe_model(models: dict[str, str], generation: str, size: str) -> str:
  if not models: return f"{size} {generation} random-weight stand-in model"
  return "model " + ", ".join(f"--{k.replace('_', '-')} {p}" for k, p in models.items())

def run_daemons(folder: str, camera_name: str, frames: int, dm: bool) -> tuple[dict[str, list[dict]], dict[str, int]]:
  """modeld (and with `dm`, dmonitoringmodeld) on `folder` with fake_camerad (--driver with `dm`) on a fresh bus, for `frames` frames each:
  ({service: collected rows}, {process: exit code})."""
  from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir
  prefix = f"demo_{uuid.uuid4().hex[:8]}"
  env = os.environ | {"OPENPILOT_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
  os.environ["OPENPILOT_PREFIX"] = prefix
  ensure_prefix_dir()
  py, max_frames = [sys.executable, "-m"], ["--max-frames", str(frames)]
  daemons = {"modelV2": subprocess.Popen(py + ["sunnypilot.modeld_v2.modeld", "--artifacts", folder, *max_frames], env=env)}
  if dm: daemons["driverStateV2"] = subprocess.Popen(py + ["sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", folder, *max_frames], env=env)
  camerad = subprocess.Popen(py + ["sunnypilot.modeld_v2.replay.fake_camerad", "--camera", camera_name, "--start-delay", "0.5"] + ["--driver"] * dm, env=env)
  names = {"modelV2": "modeld", "driverStateV2": "dmonitoringmodeld"}
  try:
    got = collect(frames, timeout=120 + frames * 0.5, camerad=camerad, daemons=daemons)
  finally:
    for p in daemons.values():
      try: p.wait(timeout=10)  # each daemon stops by itself after --max-frames
      except subprocess.TimeoutExpired: pass
    for p in (*daemons.values(), camerad):
      if p.poll() is None: p.send_signal(signal.SIGTERM)
    codes = {names[s]: p.wait(timeout=30) for s, p in daemons.items()} | {"fake_camerad": camerad.wait(timeout=30)}
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  return got, codes

@interruptible(PROG)
def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.compile.onnx_model import ModelError
  from sunnypilot.modeld_v2.tools import stand_in_models
  from sunnypilot.modeld_v2.tools.preview import preview
  parser = cli_parser(PROG, __doc__)
  parser.add_argument("--frames", type=positive_int, default=100)
  parser.add_argument("--camera", default="1928x1208", type=checked(parse_camera_size), help="1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--generation", default="native", choices=stand_in_models.NAMES, help="the embedded stand-in's generation")
  parser.add_argument("--size", default="tiny", choices=("tiny", "full"), help="the embedded stand-in's size")
  add_model_flags(parser, ": a real model instead of the stand-in")
  parser.add_argument("--artifacts", help="where bundles are built and reused (default out/artifacts/<device>_<generation>_<size>)")
  parser.add_argument("--out", default="out", help=f"where the summary PNGs go (with --route: the replay's results, in OUT/{REPLAY_DIR})")
  parser.add_argument("--route", help="replay this recorded segment (or folder of segments) instead: see route_replay (with its driver camera through "
                      "dmonitoringmodeld when it has one)")
  parser.add_argument("--dm-onnx", help="a real driver-monitoring model (openpilot's dmonitoring_model.onnx) instead of its stand-in")
  parser.add_argument("--no-dm", action="store_true", help="run modeld only: no driver camera, no dmonitoringmodeld")
  args = parser.parse_args(argv)
  log = logging.getLogger(__name__).info
  models = model_files(args)
  if args.dm_onnx and args.no_dm: parser.error("--dm-onnx is for the driver-monitoring daemon, which --no-dm leaves out")
  try: check_model_files(models | ({"dm_onnx": args.dm_onnx} if args.dm_onnx else {}))
  except ArtifactError as e: parser.error(str(e))
  try: camera, driver = route_cameras(args.route) if args.route else (args.camera, True)
  except ValueError as e: parser.error(str(e))
  if args.dm_onnx and not driver: parser.error(f"--dm-onnx: {args.route} has no driver camera video (dcamera.hevc) for dmonitoringmodeld to run on")
  dm = driver and not args.no_dm
  camera_name = f"{camera[0]}x{camera[1]}"
  real = bool(models)
  folder = args.artifacts or os.path.join("out", "artifacts", f"{Device.DEFAULT.lower()}_{'custom' if real else f'{args.generation}_{args.size}'}")
  made: list[str] = []
  try:  # until the artifacts are built, a failure (or Ctrl-C) removes every folder this run made
    try: check_outputs(args.out, folder, PNGS, made)
    except ArtifactError as e: parser.error(str(e))
    if not real: log(STAND_IN_BANNER)
    try:
      warp = build_artifacts(folder, camera, args.generation, args.size, models, log)
      dm_onnx = build_dm_artifacts(folder, camera, args.size, args.dm_onnx, log) if dm else None
    except (ModelError, ArtifactError) as e: parser.error(str(e))
  except BaseException:
    remove_folders(made)
    raise
  if args.route: return replay_route(args, folder, models, dm_onnx)
  got, codes = run_daemons(folder, camera_name, args.frames, dm)
  exits = ", ".join(f"{name} exit code {code}" for name, code in codes.items())
  rows, dm_rows = got["modelV2"], got.get("driverStateV2", [])
  if not rows or (dm and not dm_rows):
    log(f"no {'modelV2' if not rows else 'driverStateV2'} messages arrived ({exits})")
    return 1
  ms = np.array([r["ms"] for r in rows])
  ids = [r["frameId"] for r in rows]
  last = rows[-1]
  dm_title = f" + {'driver monitoring ' + args.dm_onnx if args.dm_onnx else 'dmonitoring stand-in'}" if dm else ""
  plot_latency(rows, latency_png := os.path.join(args.out, PNGS[0]), describe_model(models, args.generation, args.size) + dm_title, dm_rows)
  preview(warp, preview_png := os.path.join(args.out, PNGS[1]))
  print(f"""
modeld_v2 demo on {Device.DEFAULT}, {camera_name} cameras, {describe_model(models, args.generation, args.size)}
  frames in (camera frame ids {ids[0]}..{ids[-1]}): {ids[-1] - ids[0] + 1}
  frames out (modelV2 published):   {len(rows)}
  drops: {ids[-1] - ids[0] + 1 - len(rows)} frame ids unpublished, frameDropPerc max {max(r['frameDropPerc'] for r in rows):.2f}%
  modelExecutionTime: p50 {np.percentile(ms, 50):.1f} ms, p95 {np.percentile(ms, 95):.1f} ms, max {ms.max():.1f} ms (budget 50 ms at 20 Hz)
  last frame {last['frameId']}: plan x at 10 s {last['x_end']:.2f} m, lane line probs {np.round(last['lane_probs'], 2).tolist()},
    lead prob {last['lead_prob']:.2f}, desire state {last['desire_state']}, cameraOdometry trans {np.round(last['trans'], 3).tolist()}
{dm_summary(dm_rows, args.dm_onnx, args.size) if dm else ""}  wrote {latency_png} and {preview_png} (what the model sees)
  {exits}""")
  if not real: print(STAND_IN_BANNER)
  return 0 if all(code == 0 for code in codes.values()) and len(rows) == args.frames and (not dm or len(dm_rows) == args.frames) else 1

if __name__ == "__main__":
  sys.exit(main())
