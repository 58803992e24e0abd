"""modeld end to end, as a user sees it: camera frames in over VisionIPC, modelV2 out on the bus, modeld in its own process (or
dmonitoringmodeld: --daemon dmonitoringmodeld, below).

  python -m benchmarks.bench_daemon [--model full] [--generation native] [--camera 1928x1208] [--beams 0,2] [--rates 20,100,0]
                                    [--parse graph,host] [--frames 2000] [--json out/bench_daemon.json]

Per bundle (one per --beams level and --parse: the output parse in the model's graph, the default, or on the host: compile_modeld
--host-parse) and rate (Hz; 0 = lockstep, each frame sent once the last one's modelV2 arrived: as fast as modeld goes), this process
serves camerad's 18 rotating buffers per camera with fake_camerad.FakeCamerad (which also publishes the camera states and, once a second,
liveCalibration), publishes carState, carControl and driverMonitoringState before each frame as a car's bus would (not with --no-bus), and
subscribes to modelV2; modeld runs as a separate process with --timings. Latency is from the frame's last VisionIPC send returning
(FakeCamerad.send) to modelV2 received here; a frame with no modelV2 is a drop. modeld's CPU time per frame comes from /proc over the
timed frames. modeld's own stamps split each published frame: VisionIPC delivery (send returned -> modeld's receive returned), inputs,
copy, run, readback, parse+fill, serialize and send of modelV2, then the other two messages (made and sent after modelV2). modeld's added
latency = (VisionIPC send returned -> modelV2 sent) - the model run (copy + run + readback); "added in modeld" starts at modeld's receive.
--modeld-core pins modeld to a core (modeld --core, as openpilot's modeld on a device); --publish-idle-ms sleeps before each in-process
publish, as modeld idles between frames. fake_camerad's own publish cost (copying both frames into VisionIPC, the camera states) is
reported apart. A last line times modeld's parse, fill and serialize (byte templates) in this process on the bundle's output layout (the
parse/fill split modeld's stamps cannot make), and the pycapnp path the templates replaced. Times on a shared machine are noisy: read
medians and p10.

  python -m benchmarks.bench_daemon --stub-loop [--generation native] [--parse host,graph] [--publish-runs 300] [--publish-idle-ms 50]
                                    [--stub-spin-ms 2] [--no-bus] [--count-calls [--count-frames 200] [--baseline DIR]] [--json out/stub.json]

runs modeld's own frame loop in this process with the camera and the model stubbed (benchmarks/stubbed_loop.py): back to back, then
--publish-idle-ms (default 50, modeld's idle at 20 Hz) between frames asleep, then the same with its last --stub-spin-ms spinning instead
of asleep (0: no such row), each with the output parse on the host and in the graph (the stub model then hands back its float block too);
its stamps give the added latency and its split with no camera copies, no model run and no other process: the same code hot and on a core
that slept. --count-calls adds modeld's Python calls and CPU time per frame back to back (sys.setprofile's call and c_call events; the
stub camera's own work left out), each in a fresh process, and those of --baseline's tree (a tree from before the in-graph parse). It
takes only these options.

  python -m benchmarks.bench_daemon --daemon dmonitoringmodeld [--model full] [--camera 1928x1208] [--beams 0,2] [--rates 20,100,0]
                                    [--frames 2000] [--json out/bench_daemon_dm.json]

measures dmonitoringmodeld the same way: the DM stand-in (stand_ins.build_dm: dmonitoring_model.bin and the dm_warp) per --beams level,
camerad's 18 driver buffers (a cabin_scene face) served by FakeCamerad's driver stream after one liveCalibration, latency from the
driver frame's VisionIPC send returning to driverStateV2 received here, and its --timings stamps split the same way (its only message
is driverStateV2: "the other two" is empty).

  python -m benchmarks.bench_daemon --publish-layouts [--baseline DIR] [--publish-runs 300] [--json out/publish.json]

times only that in-process split, on every stand-in generation's output layout (no bundle built, no daemon); with --baseline, another
commit's tree (mkdir DIR; git archive REV | tar -x -C DIR) runs its parse, fill and serialize beside this checkout's, by turns on the
same outputs, and every frame's bytes are compared.
"""
from __future__ import annotations

import argparse
import os
import resource
import sys

from benchmarks.common import logger, markdown_table, write_json
from benchmarks.daemon_run import DAEMONS, modeld_split, run_rate
from benchmarks.loop_calls import count_calls
from benchmarks.publish_path import baseline_modules, bundle_layout, layouts_table, publish_split, split_line, stand_in_layout
from benchmarks.stand_ins import build, build_dm
from benchmarks.stubbed_loop import run_stubbed
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

def idle_note(args: argparse.Namespace) -> str: return f", {args.publish_idle_ms:g} ms asleep before each" if args.publish_idle_ms else ""

def rate_name(rate: float) -> str: return f"{rate:g} Hz" if rate else "lockstep"

def table(runs: list[dict]) -> str:
  q = lambda d, k="p50": "-" if not d else f"{d[k]:.2f}"
  rows = ((r["beam"], r["parse"], rate_name(r["rate_hz"]), r["frames"], r["drops"], f"{r['achieved_hz']:.1f}",
           *(q(r["latency_ms"], k) for k in ("p10", "p50", "p95", "p99", "max")), *(q(r["added_ms"], k) for k in ("p10", "p50", "p99")),
           q(r["added_in_modeld_ms"], "p99"), q(r["model_run_ms"]), f"{r['modeld_cpu_ms_per_frame']:.2f}", q(r["fake_camerad_publish_ms"])) for r in runs)
  split = lambda r: [r["delivery_ms"], *[v for k, v in r["stages_ms"].items() if k != "others"], r["bus_ms"], r["stages_ms"]["others"]]
  splits = ((r["beam"], r["parse"], rate_name(r["rate_hz"]), *(f"{q(c)} ({q(c, 'p99')})" for c in split(r))) for r in runs)
  return "\n".join([markdown_table(("BEAM", "parse", "rate", "frames", "drops", "achieved Hz", "latency p10", "p50", "p95", "p99", "max", "added p10",
                                    "added p50", "added p99", "added in modeld p99", "model run p50", "modeld CPU ms/frame", "fake_camerad publish p50"),
                                   rows), "",
                    "modeld's split per published frame, p50 (p99) ms: VisionIPC delivery, then modeld's stages, then the bus to this process", "",
                    markdown_table(("BEAM", "parse", "rate", "delivery", "inputs", "copy", "run", "readback", "parse+fill", "serialize", "send", "bus",
                                    "the other two"), splits)])

def checked_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], list[float], tuple[int, ...]]:
  """(beams, rates, camera size) from the arguments, every combination checked (parser.error on a bad one); --publish-idle-ms defaulted."""
  try:
    beams, rates = [int(b) for b in args.beams.split(",")], [float(r) for r in args.rates.split(",")]
    size = tuple(int(x) for x in args.camera.split("x"))
  except ValueError as e: parser.error(f"--beams, --rates and --camera must be numbers: {e}")
  if args.frames < 1 or any(r < 0 for r in rates) or any(b < 0 for b in beams): parser.error("--frames must be positive, --rates and --beams not negative")
  if args.baseline and not (args.publish_layouts or args.count_calls): parser.error("--baseline needs --publish-layouts or --count-calls")
  if args.count_calls and not args.stub_loop: parser.error("--count-calls counts in the stubbed loop: give --stub-loop")
  args.parse = (args.parse if args.parse is not None else "host,graph" if args.stub_loop else "graph").split(",")
  if not args.parse or not set(args.parse) <= {"host", "graph"}: parser.error(f"--parse takes host and graph, comma separated, got {','.join(args.parse)!r}")
  if args.publish_runs < 1: parser.error("--publish-runs must be positive")
  if args.daemon == "dmonitoringmodeld" and (args.stub_loop or args.publish_layouts or args.publish_only or args.parse != ["graph"]):
    parser.error("--daemon dmonitoringmodeld runs the daemon end to end only (its parse is on the host): no --stub-loop, --publish-layouts, "
                 "--publish-only or --parse")
  if args.publish_idle_ms is None: args.publish_idle_ms = 50.0 if args.stub_loop else 0.0
  if not 0 <= args.publish_idle_ms <= 1000: parser.error("--publish-idle-ms must be within 0 to 1000")
  if args.stub_loop and args.publish_layouts: parser.error("--stub-loop and --publish-layouts are separate runs: give one")
  if args.stub_loop and not 0 < args.publish_idle_ms: parser.error("--stub-loop compares back to back with a sleep: --publish-idle-ms must be above 0")
  if args.stub_loop and not 0 <= args.stub_spin_ms <= args.publish_idle_ms: parser.error("--stub-spin-ms must be within 0 and --publish-idle-ms")
  return beams, rates, size

def arg_parser() -> argparse.ArgumentParser:
  from sunnypilot.modeld_v2.daemon.process import core_arg
  from sunnypilot.modeld_v2.tools import stand_in_models
  parser = cli_parser("benchmarks.bench_daemon", __doc__)
  parser.add_argument("--daemon", default="modeld", choices=tuple(DAEMONS), help="the daemon measured: modeld (camera frames in, modelV2 out) or "
                      "dmonitoringmodeld (the driver camera in, driverStateV2 out; the DM stand-in of --model, built with compile_dm_warp's warp)")
  parser.add_argument("--model", default="tiny", choices=("tiny", "full"), help="random-weight stand-in size")
  parser.add_argument("--generation", default="native", choices=stand_in_models.NAMES)
  parser.add_argument("--camera", default="1928x1208")
  parser.add_argument("--beams", default="0", help="bundles to run, by BEAM level, comma separated")
  parser.add_argument("--rates", default="20,100,0", help="frame rates in Hz, comma separated; 0 = lockstep (as fast as modeld goes)")
  parser.add_argument("--frames", type=int, default=2000, help="timed frames per bundle and rate")
  parser.add_argument("--workdir", default="out/bench_daemon")
  parser.add_argument("--publish-only", action="store_true", help="only the in-process parse/fill/serialize table (no daemon runs)")
  parser.add_argument("--publish-layouts", action="store_true",
                      help="only the in-process parse/fill/serialize split, on every stand-in generation's output layout (no bundle built, no daemon runs)")
  parser.add_argument("--stub-loop", action="store_true", help="only modeld's frame loop in this process with the camera and model stubbed, back "
                      "to back, after --publish-idle-ms (default 50) asleep, and with its last --stub-spin-ms spinning (no bundle built, no daemon runs)")
  parser.add_argument("--stub-spin-ms", type=float, default=2.0, help="with --stub-loop: a row whose wait spins its last this many ms (0: none)")
  parser.add_argument("--parse", help="where the output parse runs, comma separated: graph (in the model's graph: the default bundle) and host "
                      "(compile_modeld --host-parse, as bundles before it); default graph, with --stub-loop host,graph")
  parser.add_argument("--count-calls", action="store_true", help="with --stub-loop: also Python calls and CPU ms per frame of the loop, back to "
                      "back, each --parse in a fresh process (and --baseline's tree: a tree from before the in-graph parse)")
  parser.add_argument("--count-frames", type=int, default=200, help="frames per --count-calls run")
  parser.add_argument("--baseline", metavar="DIR", help="another commit's tree (mkdir DIR; git archive REV | tar -x -C DIR): with --publish-layouts "
                      "its publish path runs beside this one's, by turns on the same outputs; with --count-calls its loop is counted too")
  parser.add_argument("--publish-runs", type=int, default=300, help="timed frames of the in-process split, per layout")
  parser.add_argument("--publish-idle-ms", type=float, help="sleep this long before each in-process frame (50: modeld's idle at 20 Hz; default 0, "
                      "with --stub-loop 50)")
  parser.add_argument("--no-bus", action="store_true", help="publish only the camera states, not a car's carState, carControl and "
                      "driverMonitoringState before each frame")
  parser.add_argument("--modeld-core", type=core_arg, help="pin modeld to this CPU core (modeld --core)")
  parser.add_argument("--json")
  return parser

def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device
  parser = arg_parser()
  args = parser.parse_args(argv)
  beams, rates, size = checked_args(parser, args)
  log = logger()
  if args.publish_layouts: return publish_layouts(args, log)
  if args.stub_loop: return stub_loop(args, log)
  if args.daemon == "dmonitoringmodeld": return dm_runs(args, beams, rates, size, log)
  runs, split = [], {}
  for beam in beams:
    artifacts = {parse: os.path.join(args.workdir, f"beam{beam}" + ("_host_parse" if parse == "host" else "")) for parse in args.parse}
    built = {parse: build(args.model, args.generation, [size], folder, log, beam, host_parse=parse == "host") for parse, folder in artifacts.items()}
    split[beam] = publish_split(*bundle_layout(next(iter(built.values()))["model"]), args.publish_runs, idle_s=args.publish_idle_ms / 1e3)
    for rate in rates if not args.publish_only else ():
      for parse, folder in artifacts.items():  # by turns within each rate
        log(f"BEAM={beam}, parse on the {parse}: {args.frames} frames, {rate_name(rate)} ...")
        runs.append(run_rate(folder, built[parse]["warps"][size]["frame"], rate, args.frames, log, args.modeld_core, not args.no_bus)
                    | {"beam": beam, "parse": parse})
        write_json(args.json, {"model": args.model, "generation": args.generation, "camera": args.camera, "runs": runs, "partial": True})  # row by row
  print(f"modeld end to end: {args.model} {args.generation} (random-weight stand-in), {args.camera}, device {Device.DEFAULT}, "
        f"latencies in ms, {args.frames} timed frames per row")
  if runs: print(table(runs))
  for beam, s in split.items():
    print(f"\nBEAM={beam} bundle's layout, in this process{idle_note(args)} (p50 / p10 / p99 ms): " + split_line(s))
  write_json(args.json, {"model": args.model, "generation": args.generation, "camera": args.camera, "device": Device.DEFAULT, "runs": runs,
                         "publish_split_ms": split, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
  return 0

def dm_runs(args: argparse.Namespace, beams: list[int], rates: list[float], size: tuple[int, ...], log) -> int:
  """--daemon dmonitoringmodeld: the DM stand-in (--model) and its dm_warp per --beams level, dmonitoringmodeld at each rate, measured as
  modeld is (its --timings give the same stamps; driverStateV2 is its one message, parsed on the host)."""
  from tinygrad import Device

  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  runs, frame = [], camerad_frame(*size)
  for beam in beams:
    folder = os.path.join(args.workdir, f"dmonitoring_beam{beam}")
    build_dm(args.model, [size], folder, log, beam)
    for rate in rates:
      log(f"dmonitoringmodeld, BEAM={beam}: {args.frames} frames, {rate_name(rate)} ...")
      runs.append(run_rate(folder, frame, rate, args.frames, log, args.modeld_core, not args.no_bus, "dmonitoringmodeld") | {"beam": beam, "parse": "host"})
      write_json(args.json, {"daemon": args.daemon, "model": args.model, "camera": args.camera, "runs": runs, "partial": True})  # row by row
  print(f"dmonitoringmodeld end to end: {args.model} driver-monitoring stand-in (random weights), {args.camera} driver camera, device "
        f"{Device.DEFAULT}, latencies in ms (to driverStateV2 received), {args.frames} timed frames per row; 'modeld' columns are dmonitoringmodeld's")
  print(table(runs))
  write_json(args.json, {"daemon": args.daemon, "model": args.model, "camera": args.camera, "device": Device.DEFAULT, "runs": runs,
                         "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
  return 0

STUB_WARMUP = 20  # frames of the stubbed loop left out of its figures: the templates' and the parser's first frames

def stub_loop(args: argparse.Namespace, log) -> int:
  """--stub-loop: the stubbed frame loop on a stand-in layout, back to back, with a sleep between frames, and with the sleep's end spun,
  for each --parse; with --count-calls, its Python calls and CPU time per frame (this tree's and a --baseline tree's)."""
  idle, spin = args.publish_idle_ms, args.stub_spin_ms
  slices, width = stand_in_layout(args.generation)
  waits = {"back to back": (0.0, 0.0), f"{idle:g} ms asleep": (idle, 0.0)}
  if spin: waits[f"{idle - spin:g} ms asleep, {spin:g} ms spinning"] = (idle, spin)
  splits = {}
  for name, (idle_ms, spin_ms) in waits.items():
    for parse in args.parse:  # by turns within each wait: the modes share the machine's state
      log(f"stubbed loop, {args.generation} layout, parse on the {parse}, {name} between frames: {args.publish_runs} frames ...")
      rows = run_stubbed(slices, width, args.generation, args.publish_runs + STUB_WARMUP, idle_ms / 1e3, spin_ms / 1e3, not args.no_bus, parse)
      splits[f"{parse}: {name}"] = {"parse": parse, "wait": name, "frames": len(rows) - STUB_WARMUP, **modeld_split([row[1:] for row in rows[STUB_WARMUP:]])}
  q = lambda d, k="p50": f"{d[k]:.3f}"
  print(f"modeld's frame loop in this process, camera and model stubbed, {args.generation} layout, {'no ' if args.no_bus else ''}car messages "
        f"on the bus, {args.publish_runs} frames per row, ms (with the parse in the graph, parse+fill is the driving state and the host's fields, "
        "serialize the block's copy into the templates)")
  print(markdown_table(("parse", "between frames", "added p10", "added p50", "added p95", "added p99", "max", "inputs p50 (p99)", "parse+fill",
                        "serialize", "send", "the other two"),
                       ((split["parse"], split["wait"], *(q(split["added_in_modeld_ms"], k) for k in ("p10", "p50", "p95", "p99", "max")),
                         *(f"{q(split['stages_ms'][k])} ({q(split['stages_ms'][k], 'p99')})" for k in ("inputs", "parse_fill", "serialize", "send", "others")))
                        for split in splits.values())))
  counts = count_calls(args.generation, args.count_frames, STUB_WARMUP, not args.no_bus, args.parse, args.baseline, log) if args.count_calls else {}
  if counts:
    print(f"\nPython calls and CPU time per frame of modeld's loop ({args.generation} layout, back to back, {args.count_frames} frames, median; "
          "the stub camera's own work left out)\n")
    print(markdown_table(("tree", "parse", "Python calls per frame", "CPU ms per frame"),
                         ((tree, parse, f"{c['calls']:.0f}", f"{c['cpu_ms']:.3f}") for (tree, parse), c in counts.items())))
  write_json(args.json, {"generation": args.generation, "bus": not args.no_bus, "stub_loop_ms": splits,
                         "per_frame": [{"tree": t, "parse": p, **c} for (t, p), c in counts.items()]})
  return 0

def publish_layouts(args: argparse.Namespace, log) -> int:
  """--publish-layouts: the in-process split on every stand-in generation's layout, beside a baseline checkout's when one is given."""
  from sunnypilot.modeld_v2.tools.stand_in_models import NAMES
  try: baseline = baseline_modules(args.baseline) if args.baseline else None
  except (ImportError, ValueError) as e:
    print(f"error: --baseline {args.baseline}: {e}", file=sys.stderr)
    return 2
  splits = {}
  for generation in NAMES:
    log(f"{generation}: {args.publish_runs} frames ...")
    splits[generation] = publish_split(*stand_in_layout(generation), args.publish_runs, baseline, args.publish_idle_ms / 1e3)
  print(f"modeld's publish path in this process, per stand-in layout, {args.publish_runs} frames{idle_note(args)}, p50 (p10) ms"
        + (f"; baseline {args.baseline} by turns on the same outputs" if baseline else ""))
  print(layouts_table(splits))
  write_json(args.json, {"publish_split_ms": splits, "baseline": args.baseline})
  return 0

if __name__ == "__main__":
  sys.exit(main())
