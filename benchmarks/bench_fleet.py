"""A fleet of synthetic segments replayed by route_replay with --jobs N (local processes) and with --ray (Ray tasks on a local instance,
each reserving cores / N CPUs so that N run at once), interleaved (A B A B ...) so that a machine shared with other work drifts into both
alike; medians.

  python -m benchmarks.bench_fleet --segments 8 --frames 200 --jobs 2 --pairs 2 --json out/bench_fleet.json

Each run is the whole command, as a user runs it, split by the times in its fleet.json (each replay process's start and end, and each Ray
task's): start = until the first replay (or task) starts (the interpreter, Ray's start); end = after the last ends (Ray's stop, the report);
per segment = what a slot spends on a segment beyond its replay: the wait between one replay (task) ending and the next starting on the
freed slot, plus, on Ray, the task's own time around its replay (the shipped artifacts written on the node, the output read). These hardly
move when other work on the machine slows every replay alike; the totals do. The model is the native random-weight stand-in,
built with the demo's artifacts (out/artifacts/<device>_native_<size>) when missing; the check is onnxruntime on its ONNX (--no-check:
none).
"""
from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import check_outputs, logger, markdown_table, write_json

def breakdown(report: dict, began: float, finished: float, slots: int) -> dict[str, float]:
  """A run's seconds: in total, before the first replay, after the last, the mean replay, and a slot's overhead per segment."""
  segments = report["per_segment"]
  ray = segments[0]["task_started"] is not None
  starts = sorted(s["task_started" if ray else "started"] for s in segments)
  ends = sorted(s["task_ended" if ray else "ended"] for s in segments)
  waits = [starts[slots + k] - ends[k] for k in range(len(segments) - slots)]  # the k-th end frees the slot the (slots + k)-th start takes
  around = [(s["started"] - s["task_started"]) + (s["task_ended"] - s["ended"]) for s in segments] if ray else []
  return {"total": finished - began, "start": starts[0] - began, "end": finished - ends[-1], "replay": statistics.mean(s["wall_s"] for s in segments),
          "per_segment": (sum(waits) + sum(around)) / len(segments)}

def timed_run(command: list[str], out: str, env: dict[str, str], slots: int, failed: list[str]) -> dict[str, float]:
  """The run's breakdown; a run in which a segment failed (a stalled replay on a loaded machine) is said, kept in `failed`, and run again,
  once."""
  for _ in range(2):
    shutil.rmtree(out, ignore_errors=True)
    began = time.time()
    run = subprocess.run(command + ["--out", out], capture_output=True, text=True, env=env)
    finished = time.time()
    print(run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:], file=sys.stderr)
    if run.returncode == 0:
      with open(os.path.join(out, "fleet.json")) as f: return breakdown(json.load(f), began, finished, slots)
    failed.append(run.stdout.strip().splitlines()[-1] if run.stdout.strip() else f"exit {run.returncode}")
  raise SystemExit(f"route_replay failed twice ({run.returncode}):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")

def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device

  from sunnypilot.modeld_v2.common.cli import checked, positive_int
  from sunnypilot.modeld_v2.common.cli import parser as cli_parser
  from sunnypilot.modeld_v2.model.calibration import parse_camera_size
  from sunnypilot.modeld_v2.replay.synthetic_route import write_segment
  from sunnypilot.modeld_v2.tools.demo import build_artifacts
  parser = cli_parser("benchmarks.bench_fleet", __doc__)
  parser.add_argument("--segments", type=positive_int, default=8, help="synthetic segments in the fleet (default 8)")
  parser.add_argument("--frames", type=positive_int, default=200, help="frames per segment (default 200: 10 s of driving)")
  parser.add_argument("--camera", type=checked(parse_camera_size), default="1344x760", help="a comma camera's frame size (default 1344x760)")
  parser.add_argument("--jobs", type=positive_int, default=2, help="replays at once: --jobs N, and on Ray cores / N CPUs per replay (default 2)")
  parser.add_argument("--pairs", type=positive_int, default=2, help="(--jobs run, --ray run) pairs, interleaved (default 2)")
  parser.add_argument("--model", default="tiny", choices=("tiny", "full"))
  parser.add_argument("--no-check", action="store_true", help="replay without the onnxruntime check")
  parser.add_argument("--json", help="also write the numbers here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  log = logger()
  artifacts = os.path.join("out", "artifacts", f"{Device.DEFAULT.lower()}_native_{args.model}")
  build_artifacts(artifacts, args.camera, "native", args.model, {}, log)
  onnx = os.path.join(artifacts, f"native_{args.model}_stand_in.onnx")
  env = os.environ | {"RAY_USAGE_STATS_ENABLED": "0"}
  with tempfile.TemporaryDirectory() as tmp:
    drive = os.path.join(tmp, "realdata")
    log(f"writing {args.segments} segments of {args.frames} frames, {args.camera[0]}x{args.camera[1]} ...")
    write_segment(first := os.path.join(drive, "2026-01-01--00-00-00--0"), args.camera, args.frames, distinct=20)
    for k in range(1, args.segments): shutil.copytree(first, os.path.join(drive, f"2026-01-01--00-00-00--{k}"))
    base = [sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", drive, "--artifacts", artifacts, "--no-pictures"]
    base += [] if args.no_check else ["--onnx", onnx]
    cpus = os.cpu_count() / args.jobs  # the local instance has every core: each replay reserves this many, so N run at once
    runs: dict[str, list[dict[str, float]]] = {"jobs": [], "ray": []}
    failed: list[str] = []
    for pair in range(args.pairs):
      for name, command in (("jobs", base + ["--jobs", str(args.jobs)]), ("ray", base + ["--replay-cpus", f"{cpus:g}", "--ray"])):
        log(f"pair {pair + 1}/{args.pairs}: {name} ...")
        runs[name].append(timed_run(command, os.path.join(tmp, f"out_{name}"), env, args.jobs, failed))
  median = {name: {k: statistics.median(r[k] for r in rows) for k in rows[0]} for name, rows in runs.items()}
  print(f"fleet replay, {Device.DEFAULT}, {args.segments} segments x {args.frames} frames {args.camera[0]}x{args.camera[1]}, native {args.model} "
        f"stand-in, {'no check' if args.no_check else 'onnxruntime check'}, {args.jobs} at a time, {args.pairs} interleaved pairs (medians)\n")
  runs_of = lambda name, k: ", ".join(f"{r[k]:.{1 if k == 'total' else 2}f}" for r in runs[name])
  rows = []
  for name, label in (("jobs", f"--jobs {args.jobs}"), ("ray", "--ray (local instance)")):
    m = median[name]
    rows.append((label, f"{m['total']:.1f} ({runs_of(name, 'total')})", f"{args.segments * args.frames / m['total']:.1f}", f"{m['start']:.2f}",
                 f"{m['end']:.2f}", f"{m['replay']:.2f}", f"{m['per_segment']:.2f} ({runs_of(name, 'per_segment')})"))
  print(markdown_table(("executor", "total s (runs)", "frames/s", "start s", "end s", "replay s", "overhead per segment s (runs)"), rows))
  jobs, ray = median["jobs"], median["ray"]
  print(f"\n--ray / --jobs: {ray['total'] / jobs['total']:.3f}; Ray adds {ray['start'] + ray['end'] - jobs['start'] - jobs['end']:.2f} s to start and "
        f"stop, and {ray['per_segment'] - jobs['per_segment']:.2f} s of a slot per segment")
  if failed: print(f"runs repeated after a failed segment: {len(failed)}: " + "; ".join(failed))
  write_json(args.json, {"device": Device.DEFAULT, "segments": args.segments, "frames": args.frames, "camera": f"{args.camera[0]}x{args.camera[1]}",
                         "model": args.model, "check": not args.no_check, "jobs": args.jobs, "runs_s": runs, "medians_s": median, "runs_repeated": failed,
                         "ratio": ray["total"] / jobs["total"], "ray_overhead_per_segment_s": ray["per_segment"] - jobs["per_segment"]})
  return 0

if __name__ == "__main__":
  sys.exit(main())
