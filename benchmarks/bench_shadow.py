"""A model switch with its warm-up in the shadow, at 20 Hz: what the frames cost before, during and after it, against a control run with
no switch.

  python -m benchmarks.bench_shadow [--model tiny|full] [--generation split_current] [--camera 1928x1208] [--before 100] [--after 100]
                                    [--runs 2] [--json out/bench_shadow.json]

Two sets of one generation's stand-in (the default, and b of another seed) with the camera's split warp; modeld runs with --model-sets
and --timings, camerad's stand-in (FakeCamerad) serves frames at 20 Hz and this process publishes the car's messages before each. After
--before frames b is asked for (ROOT/active): modeld loads it beside the frames, runs it in the shadow of the default until its context is
its own (the generation's: split_current's features history holds 97 frames), then takes over. Each frame falls in a phase by modeld's
own lines: before (the default alone), loading (b loads on the switch thread), warming (b in the shadow: two models a frame), after (b
alone). Per phase: modeld's frame time (its receive to the end of the shadow's run: `shadow` of its --timings stamps), the latency
(VisionIPC send returned -> modelV2 received here), the largest gap between two modelV2 (a frame later than its 50 ms interval shows as a
gap over 1.5 intervals), frames received and dropped. The control run is the same without the request. The warm-up's length in frames
is read from modeld's lines. Runs alternate switch and control, --runs times each.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sys
import tempfile
import time
import uuid

from benchmarks.car_bus import BUS_SERVICES, bus_traffic
from benchmarks.common import logger, markdown_table, percentiles, write_json
from benchmarks.daemon_run import Receiver
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.daemon.status import STAGE_STAMPS

INTERVAL_NS = 50_000_000  # 20 Hz
SHADOW = STAGE_STAMPS.index("shadow")

def build_sets(model: str, generation: str, camera: tuple[int, int], root: str, log) -> tuple[str, str]:
  """The default set (seed 0) and set b (seed 1) of the stand-in, each with the camera's split warp: (default folder, model sets root)."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  default, sets = os.path.join(root, "default"), os.path.join(root, "sets")
  for seed, folder in ((0, default), (1, os.path.join(sets, "b"))):
    os.makedirs(folder)
    log(f"building {generation} {model} (seed {seed}) into {folder} ...")
    files = stand_in_models.write(generation, model, os.path.join(root, f"{generation}_{seed}.onnx"), seed=seed)["files"]
    compile_model(os.path.join(folder, "model.bin"), **files, log=lambda s: None)
    compile_warp(camerad_frame(*camera).spec, "512x256", os.path.join(folder, "warp_split.bin"), split_frames=True)
  return default, sets

def phase_bounds(lines: list[str]) -> dict[str, int | None]:
  """From modeld's lines: the first frame run in the shadow and the first frame on set b (None when it never came)."""
  find = lambda pattern: next((int(m[1]) for line in lines if (m := re.search(pattern, line))), None)
  return {"warming": find(r"frame (\d+): the first of set b in the shadow"), "after": find(r"frame (\d+): the first on set b ")}

def run(default: str, sets: str, camera: tuple[int, int], before: int, after: int, switch: bool, log) -> dict:
  """One modeld at 20 Hz: `before` frames, then (with `switch`) b asked for, then frames until `after` ran on b (or as many as a switch
  run took, for the control): per phase, modeld's frame time, latency, largest gap, received and dropped."""
  from sunnypilot.modeld_v2.daemon.messaging import pub_master
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad, synthetic_frames
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  prefix, work = f"bench_shadow_{uuid.uuid4().hex[:10]}", tempfile.mkdtemp(prefix="bench_shadow_")
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}")
  root = os.path.join(work, "sets")
  shutil.copytree(sets, root)
  timings = os.path.join(work, "timings.json")
  frame = camerad_frame(*camera)
  replay, receiver, traffic, bus = FakeCamerad(frame), Receiver(), bus_traffic(), pub_master(list(BUS_SERVICES))
  source = synthetic_frames(frame)
  modeld = Modeld(default, ["--model-sets", root, "--timings", timings, "--status-every", "0"], echo=False)
  sent, frame_id, limit = {}, 0, before + 400 + after
  try:
    modeld.wait_running(600)
    start = time.monotonic_ns()
    while frame_id < limit:
      receiver.wait(start + frame_id * INTERVAL_NS)
      if switch and frame_id == before:
        with open(os.path.join(root, "active"), "w") as f: f.write("b\n")
      for service, raw in traffic.items(): bus.send(service, raw)
      sent[frame_id] = replay.send(frame_id, *source[frame_id % len(source)], sof=start + frame_id * INTERVAL_NS)
      frame_id += 1
      if switch and (bounds := phase_bounds(modeld.lines))["after"] is not None and frame_id >= bounds["after"] + after: break
    receiver.wait(time.monotonic_ns() + 500_000_000)
  finally:
    modeld.stop()
    replay.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  with open(timings) as f: stamps = {row[0]: row[1:] for row in json.load(f)["frames"]}
  shutil.rmtree(work, ignore_errors=True)
  bounds = phase_bounds(modeld.lines) if switch else {"warming": None, "after": None}
  def phase_of(i: int) -> str:
    if i < before: return "before"
    if bounds["warming"] is None or i < bounds["warming"]: return "loading" if switch else "control"
    return "warming" if bounds["after"] is None or i < bounds["after"] else "after"
  phases: dict[str, list[int]] = {}
  for i in range(20, frame_id): phases.setdefault(phase_of(i), []).append(i)  # the first 20 bind the camera buffers
  out = {"frames": frame_id, "warm_up_frames": (bounds["after"] - bounds["warming"]) if bounds["after"] and bounds["warming"] else None}
  for name, ids in phases.items():
    got = [i for i in ids if i in receiver.arrived]
    arrivals = sorted(receiver.arrived[i] for i in got)
    gaps = [(b - a) / 1e6 for a, b in zip(arrivals, arrivals[1:])]
    out[name] = {"frames": len(ids), "received": len(got), "dropped": len(ids) - len(got),
                 "frame_time_ms": percentiles([(stamps[i][SHADOW] - stamps[i][0]) / 1e6 for i in got if i in stamps]),
                 "latency_ms": percentiles([(receiver.arrived[i] - sent[i]) / 1e6 for i in got]),
                 "max_gap_ms": max(gaps, default=0.0)}
  return out

def main(argv: list[str] | None = None) -> int:
  p = cli_parser("benchmarks.bench_shadow", __doc__)
  p.add_argument("--model", default="tiny", choices=("tiny", "full"))
  p.add_argument("--generation", default="split_current")
  p.add_argument("--camera", default="1928x1208")
  p.add_argument("--before", type=int, default=100)
  p.add_argument("--after", type=int, default=100)
  p.add_argument("--runs", type=int, default=2)
  p.add_argument("--json")
  args = p.parse_args(argv)
  log = logger()
  camera = tuple(int(x) for x in args.camera.split("x"))
  work = tempfile.mkdtemp(prefix="bench_shadow_sets_")
  try:
    default, sets = build_sets(args.model, args.generation, camera, work, log)
    runs = []
    for r in range(args.runs):
      for switch in (True, False):
        log(f"run {r + 1}/{args.runs}: {'switch' if switch else 'control'} ...")
        runs.append({"switch": switch, **run(default, sets, camera, args.before, args.after, switch, log)})
  finally: shutil.rmtree(work, ignore_errors=True)
  print(f"modeld at 20 Hz, {args.generation} {args.model} stand-ins, {args.camera}: set b asked for after {args.before} frames, warmed in the "
        "shadow, then run; control: no request. Per phase: frames, dropped, modeld's frame time (receive -> the shadow's end) p50/p99/max, "
        "latency (send -> modelV2 here) p50/p99, the largest gap between two modelV2\n")
  q = lambda d, k: f"{d[k]:.2f}" if k in d else "-"
  rows = ((f"{i // 2 + 1} {'switch' if r['switch'] else 'control'}", r["warm_up_frames"] or "-", phase, x["frames"], x["dropped"],
           *(q(x["frame_time_ms"], k) for k in ("p50", "p99", "max")), *(q(x["latency_ms"], k) for k in ("p50", "p99")), f"{x['max_gap_ms']:.1f}")
          for i, r in enumerate(runs) for phase in ("before", "loading", "warming", "after", "control") if (x := r.get(phase)) is not None)
  print(markdown_table(("run", "warm-up frames", "phase", "frames", "dropped", "frame time p50", "p99", "max", "latency p50", "p99", "largest gap"), rows))
  write_json(args.json, {"model": args.model, "generation": args.generation, "camera": args.camera, "runs": runs})
  return 0

if __name__ == "__main__":
  sys.exit(main())
