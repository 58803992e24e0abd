"""A model load must not stall its neighbours: a process doing a fixed job at 20 Hz (a stand-in for controlsd) timed tick by tick, alone and
while modeld starts and loads a big bundle from a cold page cache.

  python -m benchmarks.bench_neighbour [--model big|full|tiny] [--reps 3] [--seconds 15] [--start-at 2] [--cold drop|fadvise|none]
                                       [--work numpy_iters,python_iters] [--neighbour-core N] [--modeld-core N] [--json out/bench_neighbour.json]

The neighbour (its own process, this file's `neighbour`) ticks on a fixed 20 Hz schedule: each tick a fixed job (a chain of small numpy
matrix-vector products and a Python loop: about 3 ms on the 2-core dev VM) and a carControl message published over msgq, as controlsd does;
per tick it stamps the schedule, its start and its end (CLOCK_MONOTONIC, the same clock in every process). A run is --seconds of ticks; in a
loaded run this process starts modeld --start-at seconds in (camerad's stand-in serving the camera geometry, so that modeld loads at once),
and the load window is from modeld's start to its "running:" line, split at modeld's first line into the interpreter's start and imports,
and the daemon's start and streamed load (what openpilot's modeld does at start). Runs alternate alone, loaded, alone, loaded (--reps
pairs); before every run the page cache is made cold (--cold drop: sync, then /proc/sys/vm/drop_caches = 1, root only; fadvise:
posix_fadvise(POSIX_FADV_DONTNEED) on the bundle files only, and where dropping is not permitted; what was used is printed). The stand-in is
bench_load's split_current of --model (`big`: 823 MB of weights, the size of openpilot's big model) with the 1928x1208 split warp, built
once into --workdir. --modeld-core pins this process (which starts modeld and serves the camera) and so modeld from its first instruction,
and passes modeld --core; --neighbour-core pins the neighbour (default: every core).

Per run: the neighbour's tick time (start -> end: its job and publish), lateness (start - schedule) and completion (end - schedule), p50 /
p99 / max ms, over the whole run after a 1 s warm-up and over the window (a loaded run's load; its alone partner's same span from the same
offset). The verdict pools the windows: the loaded p99 tick time over the alone p99, against 1.5x (the bound of openpilot issue 39001); the
same ratio of lateness and of completion (what a reader of the neighbour's messages sees) are printed beside it, and the loaded windows' two
phases apart.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, percentiles, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

HZ = 20
BOUND = 1.5  # the loaded window's p99 tick time may be at most this many times the alone one's
WARMUP_S = 1.0  # the neighbour's first second (its caches, the first publish) is left out of the whole-run figures
LOAD_LINE = re.compile(r"in (\d+) ms")  # modeld's "loaded set ... in N ms" line: the loader's own time

def job(m: np.ndarray, x: np.ndarray, numpy_iters: int, python_iters: int) -> float:
  """The neighbour's fixed work per tick: `numpy_iters` normalized matrix-vector products and a Python loop of `python_iters` steps."""
  for _ in range(numpy_iters): x = (y := m @ x) / np.abs(y).max()
  total = 0
  for i in range(python_iters): total += i * i
  return float(x[0]) + total

def neighbour(seconds: float, numpy_iters: int, python_iters: int, cores: list[int]) -> None:
  """The neighbour process, on `cores`: ticks at HZ for `seconds`, each the fixed job and a carControl publish; prints its schedule's
  start, then (at the end) every tick's (schedule, start, end) in monotonic ns, as JSON lines."""
  import msgq

  from benchmarks.car_bus import bus_traffic
  os.sched_setaffinity(0, cores)
  sock, raw = msgq.pub_sock("carControl"), bus_traffic()["carControl"]
  rng = np.random.default_rng(0)
  m, x = (rng.standard_normal((64, 64)) / 8).astype(np.float32), rng.standard_normal(64).astype(np.float32)
  job(m, x, numpy_iters, python_iters)
  period = 1_000_000_000 // HZ
  t0 = time.monotonic_ns() + period
  print(json.dumps({"t0": t0}), flush=True)
  ticks = []
  for k in range(int(seconds * HZ)):
    scheduled = t0 + k * period
    if (wait := scheduled - time.monotonic_ns()) > 0: time.sleep(wait / 1e9)
    start = time.monotonic_ns()
    job(m, x, numpy_iters, python_iters)
    sock.send(raw)
    ticks.append((scheduled, start, time.monotonic_ns()))
  print(json.dumps({"ticks": ticks}), flush=True)

def stats(values_ms: list[float]) -> dict[str, float]:
  """p50, p99 (numpy's linear interpolation), max and count of a series in ms."""
  return percentiles(values_ms, (50, 99)) or {"n": 0}

def tick_stats(ticks: list[tuple[int, int, int]], since_ns: int, until_ns: int) -> dict[str, dict[str, float]]:
  """Tick time (end - start), lateness (start - schedule) and completion (end - schedule) of the ticks scheduled in [since, until)."""
  window = [t for t in ticks if since_ns <= t[0] < until_ns]
  return {"tick_ms": stats([(e - s) / 1e6 for _, s, e in window]), "late_ms": stats([(s - d) / 1e6 for d, s, _ in window]),
          "done_ms": stats([(e - d) / 1e6 for d, _, e in window])}

def ratio_verdict(alone_p99: float, loaded_p99: float, bound: float = BOUND) -> tuple[float, str]:
  """(loaded p99 / alone p99, "met" or "not met") against `bound`."""
  ratio = loaded_p99 / alone_p99 if alone_p99 > 0 else float("inf")
  return ratio, "met" if ratio <= bound else "not met"

def make_cold(mode: str, files: list[str]) -> str:
  """Empty the page cache the way `mode` asks (drop: every clean page, root only; fadvise: the bundle files' pages); what was done."""
  if mode == "drop":
    os.sync()
    try:
      with open("/proc/sys/vm/drop_caches", "w") as f: f.write("1")
      return "drop_caches"
    except OSError: mode = "fadvise"  # not root, or /proc/sys read-only: the bundle files alone
  if mode == "fadvise":
    for path in files:
      fd = os.open(path, os.O_RDONLY)
      try: os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
      finally: os.close(fd)
    return "fadvise"
  return "none"

def run_once(artifacts: str, files: list[str], loaded: bool, args) -> dict:
  """One run of the neighbour for args.seconds, with modeld started args.start_at seconds in when `loaded`."""
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  cold = make_cold(args.cold, files)
  code = f"from benchmarks.bench_neighbour import neighbour; neighbour({args.seconds}, {args.work[0]}, {args.work[1]}, {args.neighbour_cores})"
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
  assert proc.stdout is not None
  try:
    t0 = json.loads(proc.stdout.readline())["t0"]
    spawn = said = running = None
    modeld = None
    if loaded:
      time.sleep(max(0.0, (t0 + int(args.start_at * 1e9) - time.monotonic_ns()) / 1e9))
      spawn = time.monotonic_ns()
      modeld = Modeld(artifacts, ["--core", str(args.modeld_core)] if args.modeld_core is not None else [], echo=False)
      while running is None and proc.poll() is None:
        modeld.check()
        if said is None and modeld.lines: said = time.monotonic_ns()  # its first line: the imports are done, the daemon starts
        if any("running:" in line for line in modeld.lines): running = time.monotonic_ns()
        else: time.sleep(0.005)
    out, _ = proc.communicate(timeout=args.seconds + 60)
  finally:
    if proc.poll() is None: proc.kill()
    if loaded and modeld is not None: modeld.stop()
  ticks = json.loads(out.strip().splitlines()[-1])["ticks"]
  load_ms = next((int(m[1]) for line in (modeld.lines if modeld else []) if "loaded set" in line and (m := LOAD_LINE.search(line))), None)
  return {"loaded": loaded, "cold": cold, "t0": t0, "spawn": spawn, "said": said, "running": running, "ticks": ticks, "loader_ms": load_ms,
          "start_to_running_s": (running - spawn) / 1e9 if running and spawn else None}

def set_windows(runs: list[dict], args) -> None:
  """Each run's window, (first, last) scheduled ns: a loaded run's from modeld's start to its "running:" line (or the run's end); an alone
  run's the same span from the same offset as the loaded run after it."""
  end = lambda r: r["t0"] + int(args.seconds * 1e9)
  for i, r in enumerate(runs):
    partner = r if r["loaded"] else runs[i + 1] if i + 1 < len(runs) else None
    if partner is None: r["window_ns"] = (r["t0"] + int(args.start_at * 1e9), end(r))
    else:
      since = r["spawn"] if r["loaded"] else r["t0"] + int(args.start_at * 1e9)
      r["window_ns"] = (since, since + (partner["running"] or end(partner)) - partner["spawn"])

def summarize(runs: list[dict], args) -> dict:
  """Per run the whole-run (after WARMUP_S) and window statistics; the pooled windows of the alone and the loaded runs, and the loaded /
  alone ratio of each p99 with its verdict."""
  set_windows(runs, args)
  for r in runs:
    r["whole"] = tick_stats(r["ticks"], r["t0"] + int(WARMUP_S * 1e9), r["t0"] + int(args.seconds * 1e9))
    r["window"] = tick_stats(r["ticks"], *r["window_ns"])
  pooled = {name: tick_stats([t for r in runs if r["loaded"] == loaded for t in r["ticks"] if r["window_ns"][0] <= t[0] < r["window_ns"][1]],
                             0, 1 << 62) for name, loaded in (("alone", False), ("loaded", True))}
  # a loaded window in two: the process's start (the interpreter and its imports, up to modeld's first line) and the daemon's start and load
  phases = {"imports": lambda r: (r["spawn"], r["said"] or r["window_ns"][1]), "load": lambda r: (r["said"] or r["window_ns"][1], r["window_ns"][1])}
  for name, bounds in phases.items():
    pooled[f"loaded: {name}"] = tick_stats([t for r in runs if r["loaded"] for t in r["ticks"] if bounds(r)[0] <= t[0] < bounds(r)[1]], 0, 1 << 62)
  ratios = {}
  for k in ("tick_ms", "late_ms", "done_ms"):
    ratio, word = ratio_verdict(pooled["alone"][k].get("p99", 0.0), pooled["loaded"][k].get("p99", 0.0))
    ratios[k] = {"ratio": ratio, "verdict": word}
  return {"pooled": pooled, "ratios": ratios}

NAMES = {"tick_ms": "tick time", "late_ms": "lateness", "done_ms": "completion"}

def report(runs: list[dict], summary: dict, args, model_bytes: int) -> None:
  q = lambda d: f"{d['p50']:.2f} / {d['p99']:.2f} / {d['max']:.2f}" if d.get("n") else "-"
  print(f"neighbour at {HZ} Hz (job {args.work[0]} numpy products + {args.work[1]} Python steps, a carControl publish) alone and while modeld "
        f"starts and loads the {args.model} split_current stand-in ({model_bytes / 1e6:.0f} MB) + 1928x1208 warp; page cache emptied before each "
        f"run by {runs[0]['cold']}; neighbour on cores {args.neighbour_cores}, modeld (and its starter) on "
        f"{'core ' + str(args.modeld_core) if args.modeld_core is not None else 'any core'}; ms, p50 / p99 / max\n")
  start = lambda r: f"{r['start_to_running_s']:.2f}" if r["start_to_running_s"] else ("did not finish" if r["loaded"] else "-")
  print(markdown_table(("run", "cold", "modeld start -> running s", "loader ms", "window ticks", "window tick time", "window lateness", "window completion",
                        "whole-run tick time", "whole-run lateness"),
                       ((f"{i // 2 + 1} {'loaded' if r['loaded'] else 'alone'}", r["cold"], start(r), r["loader_ms"] or "-", r["window"]["tick_ms"]["n"],
                         q(r["window"]["tick_ms"]), q(r["window"]["late_ms"]), q(r["window"]["done_ms"]), q(r["whole"]["tick_ms"]), q(r["whole"]["late_ms"]))
                        for i, r in enumerate(runs))))
  pooled, ratios = summary["pooled"], summary["ratios"]
  print("\npooled windows, tick time: " + "; ".join(f"{name} {q(pooled[name]['tick_ms'])} ({pooled[name]['tick_ms']['n']} ticks)" for name in pooled))
  for k, v in ratios.items():
    print(f"{NAMES[k]} p99 loaded / alone: {pooled['loaded'][k]['p99']:.2f} / {pooled['alone'][k]['p99']:.2f} ms = {v['ratio']:.2f}x"
          + (f" (bound {BOUND}x): {v['verdict']}" if k == "tick_ms" else f" ({v['verdict']} against {BOUND}x)"))

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_neighbour", __doc__)
  parser.add_argument("--model", default="big", choices=("tiny", "full", "big"), help="bench_load's split_current stand-in loaded (big: 823 MB)")
  parser.add_argument("--reps", type=int, default=3, help="pairs of runs: alone, then loaded")
  parser.add_argument("--seconds", type=float, default=15.0, help="the neighbour's ticks per run, in seconds")
  parser.add_argument("--start-at", type=float, default=2.0, help="seconds into a loaded run when modeld starts")
  parser.add_argument("--cold", default="drop", choices=("drop", "fadvise", "none"), help="how the page cache is emptied before each run")
  parser.add_argument("--work", default="200,50000", help="the neighbour's job per tick: numpy products, Python loop steps")
  parser.add_argument("--neighbour-core", type=int, help="pin the neighbour to this core (default: every core)")
  parser.add_argument("--modeld-core", type=int, help="pin modeld to this core from its start (and this process, which starts it and serves the "
                      "camera: the rest of the machine stays the neighbour's), and pass modeld --core, as openpilot pins modeld on a device")
  parser.add_argument("--workdir", default="out/bench_load", help="where bench_load's stand-ins are built (and kept)")
  parser.add_argument("--json")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  try: args.work = tuple(int(x) for x in args.work.split(","))
  except ValueError: parser.error(f"--work: expected two integers, got {args.work!r}")
  log = logger()
  every = sorted(os.sched_getaffinity(0))
  args.neighbour_cores = [args.neighbour_core] if args.neighbour_core is not None else every
  if args.modeld_core is not None: os.sched_setaffinity(0, [args.modeld_core])  # modeld inherits it from its first instruction
  from benchmarks.stand_ins import build_split_current
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
  model, warp = build_split_current(args.workdir, args.model, log)
  prefix, previous = f"bench_neighbour_{uuid.uuid4().hex[:10]}", os.environ.get("OPENPILOT_PREFIX")
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}")
  camerad, runs = FakeCamerad(camerad_frame(1928, 1208)), []
  try:
    for rep in range(args.reps):
      for loaded in (False, True):
        log(f"pair {rep + 1}/{args.reps}: {'loaded' if loaded else 'alone'} ...")
        runs.append(run_once(os.path.dirname(model), [model, warp], loaded, args))
  finally:
    camerad.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
    if previous is None: os.environ.pop("OPENPILOT_PREFIX", None)
    else: os.environ["OPENPILOT_PREFIX"] = previous
  summary = summarize(runs, args)
  report(runs, summary, args, os.path.getsize(model) + os.path.getsize(warp))
  write_json(args.json, {"args": vars(args), "runs": runs, **summary})
  return 0

if __name__ == "__main__":
  sys.exit(main())
