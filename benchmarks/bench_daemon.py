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

measures dmonitoringmodeld the same way: the DM stand-in (bench_dm.build_dm: dmonitoring_model.bin and the dm_warp) per --beams level,
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
import json
import os
import resource
import shutil
import sys
import tempfile
import time
import uuid
from typing import Any

import numpy as np

from benchmarks.bench import build, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.daemon.status import STAGE_STAMPS

WARMUP = 40  # lockstep frames before timing: the bundle's first runs, the camera buffers' first bindings (2 x 18)

def percentiles(values: list[float]) -> dict[str, float]:
  if not values: return {}
  a = np.asarray(values, np.float64)
  return {"p10": float(np.percentile(a, 10)), "p50": float(np.percentile(a, 50)), "p95": float(np.percentile(a, 95)),
          "p99": float(np.percentile(a, 99)), "max": float(a.max()), "n": len(values)}

def cpu_seconds(pid: int) -> float:
  """utime + stime of a process so far (clock ticks of /proc/<pid>/stat)."""
  with open(f"/proc/{pid}/stat") as f: fields = f.read().rsplit(")", 1)[1].split()
  return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

# the daemons --daemon runs and the message whose arrival ends a frame's latency
DAEMONS = {"modeld": "modelV2", "dmonitoringmodeld": "driverStateV2"}

class Receiver:
  """`service` (modelV2, or dmonitoringmodeld's driverStateV2) arrivals: frame id -> monotonic ns when the message was taken off the socket
  (before it is parsed)."""
  def __init__(self, service: str = "modelV2"):
    import msgq
    self.poller, self.service = msgq.Poller(), service
    self.sock = msgq.sub_sock(service, poller=self.poller, conflate=False)
    self.arrived: dict[int, int] = {}

  def wait(self, until_ns: int, frame_id: int | None = None) -> None:
    """Take every modelV2 that arrives until monotonic `until_ns`, or until the one of `frame_id` has arrived."""
    from sunnypilot.modeld_v2.daemon.messaging import log
    while (left := until_ns - time.monotonic_ns()) > 0 and (frame_id is None or frame_id not in self.arrived):
      if not self.poller.poll(max(1, left // 1_000_000)): continue
      while (raw := self.sock.receive(non_blocking=True)) is not None:
        t = time.monotonic_ns()
        with log.Event.from_bytes(raw) as event: self.arrived[getattr(event, self.service).frameId] = t

STAGES = STAGE_STAMPS[1:]  # each named for the stamp that ends it, from modeld's receive on
# the model run is inputs -> readback (copy, run, readback); modelV2 is sent at "send"
INPUTS, READBACK, SENT = STAGE_STAMPS.index("inputs"), STAGE_STAMPS.index("readback"), STAGE_STAMPS.index("send")

def modeld_split(stamps: list[list[int]]) -> dict:
  """From per-frame STAGE_STAMPS (ns): percentiles (ms) of modeld's added latency (receive -> modelV2 sent, minus the model run), the model
  run and each stage."""
  ms = lambda ns: ns / 1e6
  return {"added_in_modeld_ms": percentiles([ms(r[SENT] - r[0] - (r[READBACK] - r[INPUTS])) for r in stamps]),
          "model_run_ms": percentiles([ms(r[READBACK] - r[INPUTS]) for r in stamps]),
          "stages_ms": {name: percentiles([ms(r[i + 1] - r[i]) for r in stamps]) for i, name in enumerate(STAGES)}}

def run_rate(artifacts: str, frame, rate: float, frames: int, log, core: int | None = None, bus: bool = True, daemon: str = "modeld") -> dict:
  """One modeld process (or `daemon`: dmonitoringmodeld, fed the driver stream, a cabin_scene face, after one liveCalibration; pinned to
  `core` if given: --core), `frames` timed frames at `rate` Hz (0: lockstep) after WARMUP lockstep frames; with `bus`, bus_traffic()
  published before each frame."""
  from benchmarks.car_bus import BUS_SERVICES, bus_traffic
  from sunnypilot.modeld_v2.daemon.messaging import pub_master
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad, synthetic_frames
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  prefix = f"bench_daemon_{uuid.uuid4().hex[:10]}"
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}", exist_ok=True)
  dm = daemon == "dmonitoringmodeld"
  if dm:
    from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
    source = [cabin_scene(frame, i) for i in range(40)]
  else: source = synthetic_frames(frame)
  timings = os.path.join(tempfile.mkdtemp(prefix="bench_daemon_"), "timings.json")
  replay = FakeCamerad(frame, driver=dm)
  receiver = Receiver(DAEMONS[daemon])
  traffic, bus_pm = (bus_traffic(), pub_master(list(BUS_SERVICES))) if bus else ({}, None)
  modeld = Modeld(artifacts, ["--timings", timings, *(["--core", str(core)] if core is not None else [])], echo=False, daemon=daemon)
  try:
    modeld.wait_running(300)
    if dm: replay.send_calibration()  # dmonitoringmodeld's calib (FakeCamerad.send publishes it with road frames)
    sent, publish_ns, sof0 = {}, {}, time.monotonic_ns()
    def send(frame_id: int) -> None:
      for service, raw in traffic.items(): bus_pm.send(service, raw)  # before the frame: the car's messages of the last 50 ms
      t = time.monotonic_ns()
      # start-of-frame on camerad's 20 Hz sensor clock whatever the send rate: modeld pairs road and wide frames by it (25 ms)
      if dm: sent[frame_id] = replay.send_driver(frame_id, source[frame_id % len(source)], sof=sof0 + frame_id * 50_000_000)
      else: sent[frame_id] = replay.send(frame_id, *source[frame_id % len(source)], sof=sof0 + frame_id * 50_000_000)
      publish_ns[frame_id] = time.monotonic_ns() - t
    def lockstep(frame_id: int) -> None:
      send(frame_id)
      receiver.wait(time.monotonic_ns() + 2_000_000_000, frame_id)
    for frame_id in range(WARMUP): lockstep(frame_id)
    cpu0, start = cpu_seconds(modeld.proc.pid), time.monotonic_ns()
    timed = range(WARMUP, WARMUP + frames)
    for i, frame_id in enumerate(timed):
      if rate: receiver.wait(start + int(i * 1e9 / rate))
      if rate: send(frame_id)
      else: lockstep(frame_id)
    elapsed_s = (time.monotonic_ns() - start) / 1e9  # the frames' span: the achieved rate
    receiver.wait(time.monotonic_ns() + 500_000_000)  # the last frames' messages
    cpu_s = cpu_seconds(modeld.proc.pid) - cpu0
  finally:
    modeld.stop()  # SIGTERM: modeld writes its timings on the way out
    replay.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  with open(timings) as f: stamps = {row[0]: row[1:] for row in json.load(f)["frames"]}
  shutil.rmtree(os.path.dirname(timings), ignore_errors=True)
  got = [f for f in timed if f in receiver.arrived]
  own = [f for f in got if f in stamps]
  ms = lambda ns: ns / 1e6
  return {"rate_hz": rate, "frames": frames, "received": len(got), "drops": frames - len(got), "wall_s": elapsed_s,
          "achieved_hz": len(got) / elapsed_s if elapsed_s else 0.0, "modeld_cpu_ms_per_frame": 1e3 * cpu_s / max(len(got), 1),
          "latency_ms": percentiles([ms(receiver.arrived[f] - sent[f]) for f in got]),
          "added_ms": percentiles([ms(stamps[f][SENT] - sent[f] - (stamps[f][READBACK] - stamps[f][INPUTS])) for f in own]),
          "delivery_ms": percentiles([ms(stamps[f][0] - sent[f]) for f in own]),
          "bus_ms": percentiles([ms(receiver.arrived[f] - stamps[f][SENT]) for f in own]),
          **modeld_split([stamps[f] for f in own]),
          "fake_camerad_publish_ms": percentiles([ms(publish_ns[f]) for f in timed if f in publish_ns]),
          "modeld_log_tail": modeld.lines[-3:]}

def bundle_layout(model_path: str) -> tuple[dict[str, list[int]], int]:
  """A bundle's output_slices and output width."""
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  extras = read_bundle(model_path)[0]["extras"]
  return extras["metadata"]["output_slices"], extras["output_specs"]["outputs"][0][-1]

def stand_in_layout(generation: str) -> tuple[dict[str, list[int]], int]:
  """A stand-in generation's output_slices as its fused bundle has them, and their width."""
  from sunnypilot.modeld_v2.tools.stand_in_models import output_layout
  slices = output_layout(generation)
  return slices, max(stop for _, stop in slices.values())

class PublishPath:
  """modeld's publish path of one checkout, frame by frame: parse (OutputParser), fill (the driving state advanced and the three
  messages' fields) and serialize (their bytes). This checkout's, or with `modules` another's: its publish_state module (before the
  driving state and the byte seam: PublishState's parser, fill and serialize), or its {name: module} of the same pieces as this one."""
  def __init__(self, slices: dict[str, list[int]], modules: Any = None):
    if hasattr(modules, "PublishState"):  # a checkout from before the output path's seam
      self.old, self.slices = modules.PublishState(log=lambda s: None), slices
      self.info = modules.FrameInfo
      return
    from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
    from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
    from sunnypilot.modeld_v2.model import fill_model_msg
    from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
    from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
    m = modules or {"DrivingState": DrivingState, "MessageBytes": MessageBytes, "fill_model_msg": fill_model_msg, "OutputParser": OutputParser,
                    "ParsedReads": ParsedReads}
    self.old, self.parser, self.state, self.bytes = None, m["OutputParser"](slices), m["DrivingState"](), m["MessageBytes"]()
    self.fills = m["fill_model_msg"]
    # what DrivingState.update reads: the parser's views (a tree from before ParsedReads: the parse's dict itself)
    self.reads = m["ParsedReads"].of(self.parser.parsed) if m.get("ParsedReads") else None
    self.info = self.fills.FrameInfo

  def frame_info(self, i: int) -> Any: return self.info(i, i, i, i, 0.0, 0, 0.001, True, 0.2, 0.3)

  def parse(self, outputs: np.ndarray) -> dict: return self.old.parser(self.slices)(outputs) if self.old else self.parser(outputs)

  def fill(self, outputs: np.ndarray, parsed: dict, frame: Any, car: Any) -> dict:
    if self.old: return self.old.fill(None, outputs, self.slices, frame, car, False, parsed)
    return self.fills.frame_fields(parsed, self.state.update(self.reads or parsed, frame, car, False), frame)

  def serialize(self, values: dict, frame: Any, i: int) -> dict[str, bytes]:
    if self.old: return self.old.serialize(values, frame, log_mono_time=i)
    return {s: self.bytes.to_bytes(s, fields, frame.valid[s], i) for s, fields in values.items()}

def baseline_modules(root: str) -> Any:
  """The publish path's modules of another checkout at `root` (e.g. an earlier commit's tree from git archive), imported beside this
  one's: its sunnypilot modules take the package's name only while it is imported, then this checkout's come back. A tree from before the
  seam gives its publish_state module (at the top or in daemon/), a later one {name: module} as PublishPath takes them."""
  import importlib
  ours = {k: m for k, m in sys.modules.items() if k.split(".")[0] == "sunnypilot"}
  for k in ours: del sys.modules[k]
  sys.path.insert(0, os.path.abspath(root))
  try:
    if os.path.exists(os.path.join(root, "sunnypilot", "modeld_v2", "daemon", "driving_state.py")):
      modules = {name: getattr(importlib.import_module(f"sunnypilot.modeld_v2.{path}"), name) for name, path in
                 (("DrivingState", "daemon.driving_state"), ("MessageBytes", "daemon.message_bytes"), ("OutputParser", "model.parse_model_outputs"))}
      modules["fill_model_msg"] = importlib.import_module("sunnypilot.modeld_v2.model.fill_model_msg")
      if os.path.exists(os.path.join(root, "sunnypilot", "modeld_v2", "model", "parsed_reads.py")):
        modules["ParsedReads"] = importlib.import_module("sunnypilot.modeld_v2.model.parsed_reads").ParsedReads
      where = modules["fill_model_msg"].__file__
    else:
      layered = os.path.isdir(os.path.join(root, "sunnypilot", "modeld_v2", "daemon"))
      at = "sunnypilot.modeld_v2.daemon.publish_state" if layered else "sunnypilot.modeld_v2.publish_state"
      modules = importlib.import_module(at)
      where = modules.__file__
  finally:
    sys.path.remove(os.path.abspath(root))
    for k in [k for k in sys.modules if k.split(".")[0] == "sunnypilot"]: del sys.modules[k]
    sys.modules.update(ours)
  if not os.path.abspath(where).startswith(os.path.abspath(root)): raise ValueError(f"{root} has no sunnypilot/modeld_v2")
  return modules

def publish_split(slices: dict[str, list[int]], width: int, runs: int = 300, baseline: Any = None, idle_s: float = 0.0) -> dict:
  """modeld's parse, fill and serialize of the three messages (PublishPath), in this process, on random outputs of one layout: the split
  modeld's stamps cannot make; and, for comparison, pycapnp writing the same fields. `baseline`: another checkout's modules
  (baseline_modules), whose path runs on the same outputs, before or after this one's by turns, frame by frame ("baseline ..." keys;
  "same bytes": every frame's three messages equal). `idle_s`: a sleep before each path's frame, as modeld sleeps in its receive between
  frames (caches and clocks go cold)."""
  from sunnypilot.modeld_v2.daemon.messaging import new_message, set_fields
  paths = {"": PublishPath(slices)} | ({"baseline ": PublishPath(slices, baseline)} if baseline is not None else {})
  rng, car = np.random.default_rng(0), new_message("carState").carState
  stages = ("parse", "fill", "serialize", "parse+fill+serialize")
  times: dict[str, list[float]] = {f"{who}{k}": [] for who in paths for k in stages} | {"pycapnp to_bytes of the same fields": []}
  same = True
  for i in range(runs + 20):
    outputs, out = rng.standard_normal((1, width)).astype(np.float32), {}
    for who in (list(paths) if i % 2 else list(paths)[::-1]):  # by turns: neither path always runs on caches the other warmed
      path = paths[who]
      frame = path.frame_info(i)
      if idle_s: time.sleep(idle_s)
      t0 = time.perf_counter()
      parsed = path.parse(outputs)
      t1 = time.perf_counter()
      values = path.fill(outputs, parsed, frame, car)
      t2 = time.perf_counter()
      out[who] = path.serialize(values, frame, i)
      t3 = time.perf_counter()
      if i >= 20:
        for k, (a, b) in zip(stages, ((t0, t1), (t1, t2), (t2, t3), (t0, t3)), strict=True): times[f"{who}{k}"].append((b - a) * 1e3)
      if who == "": ours = values
    same = same and len({tuple(o.values()) for o in out.values()}) == 1
    if idle_s: time.sleep(idle_s)
    t4 = time.perf_counter()
    for service, fields in ours.items():
      set_fields(getattr(msg := new_message(service), service), fields)
      msg.to_bytes()
    if i >= 20: times["pycapnp to_bytes of the same fields"].append((time.perf_counter() - t4) * 1e3)
  return {k: percentiles(v) for k, v in times.items()} | ({"same bytes": same} if baseline is not None else {})

def split_line(split: dict) -> str:
  """p50 / p10 / p99 ms of each timed stage, and whether a baseline wrote the same bytes."""
  parts = [f"{k} {v['p50']:.3f} / {v['p10']:.3f} / {v['p99']:.3f}" for k, v in split.items() if isinstance(v, dict)]
  return ", ".join(parts) + (f"; same bytes as the baseline on every frame: {'yes' if split['same bytes'] else 'NO'}" if "same bytes" in split else "")

def idle_note(args: argparse.Namespace) -> str: return f", {args.publish_idle_ms:g} ms asleep before each" if args.publish_idle_ms else ""

def rate_name(rate: float) -> str: return f"{rate:g} Hz" if rate else "lockstep"

def table(runs: list[dict]) -> str:
  q = lambda d, k="p50": "-" if not d else f"{d[k]:.2f}"
  lines = ["| BEAM | parse | rate | frames | drops | achieved Hz | latency p10 | p50 | p95 | p99 | max | added p10 | added p50 | added p99 "
           "| added in modeld p99 | model run p50 | modeld CPU ms/frame | fake_camerad publish p50 |", "|---" * 18 + "|"]
  for r in runs:
    lines.append(f"| {r['beam']} | {r['parse']} | {rate_name(r['rate_hz'])} | {r['frames']} | {r['drops']} | {r['achieved_hz']:.1f} "
                 f"| {q(r['latency_ms'], 'p10')} "
                 f"| {q(r['latency_ms'])} | {q(r['latency_ms'], 'p95')} | {q(r['latency_ms'], 'p99')} | {q(r['latency_ms'], 'max')} "
                 f"| {q(r['added_ms'], 'p10')} | {q(r['added_ms'])} | {q(r['added_ms'], 'p99')} | {q(r['added_in_modeld_ms'], 'p99')} | {q(r['model_run_ms'])} "
                 f"| {r['modeld_cpu_ms_per_frame']:.2f} | {q(r['fake_camerad_publish_ms'])} |")
  lines += ["", "modeld's split per published frame, p50 (p99) ms: VisionIPC delivery, then modeld's stages, then the bus to this process", "",
            "| BEAM | parse | rate | delivery | inputs | copy | run | readback | parse+fill | serialize | send | bus | the other two |",
            "|---" * 13 + "|"]
  for r in runs:
    cells = [r["delivery_ms"], *[v for k, v in r["stages_ms"].items() if k != "others"], r["bus_ms"], r["stages_ms"]["others"]]
    lines.append(f"| {r['beam']} | {r['parse']} | {rate_name(r['rate_hz'])} | " + " | ".join(f"{q(c)} ({q(c, 'p99')})" for c in cells) + " |")
  return "\n".join(lines)

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
  log = lambda s: print(s, file=sys.stderr, flush=True)
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

  from benchmarks.bench_dm import build_dm
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
  from benchmarks.stubbed_loop import run_stubbed
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
  print("| parse | between frames | added p10 | added p50 | added p95 | added p99 | max | inputs p50 (p99) | parse+fill | serialize | send "
        "| the other two |\n" + "|---" * 12 + "|")
  for split in splits.values():
    added, stages = split["added_in_modeld_ms"], split["stages_ms"]
    cells = " | ".join(f"{q(stages[k])} ({q(stages[k], 'p99')})" for k in ("inputs", "parse_fill", "serialize", "send", "others"))
    print(f"| {split['parse']} | {split['wait']} | {q(added, 'p10')} | {q(added)} | {q(added, 'p95')} | {q(added, 'p99')} | {q(added, 'max')} | {cells} |")
  counts = count_calls(args, log) if args.count_calls else {}
  if counts:
    print(f"\nPython calls and CPU time per frame of modeld's loop ({args.generation} layout, back to back, {args.count_frames} frames, median; "
          "the stub camera's own work left out)\n\n| tree | parse | Python calls per frame | CPU ms per frame |\n|---|---|---|---|")
    for (tree, parse), c in counts.items(): print(f"| {tree} | {parse} | {c['calls']:.0f} | {c['cpu_ms']:.3f} |")
  write_json(args.json, {"generation": args.generation, "bus": not args.no_bus, "stub_loop_ms": splits,
                         "per_frame": [{"tree": t, "parse": p, **c} for (t, p), c in counts.items()]})
  return 0

# Run in a fresh interpreter in a tree's root (this one's, or --baseline's: any tree whose benchmarks.stubbed_loop has StubCamera.recv (recv_frames before)
# and run_stubbed): modeld's frame loop stubbed, back to back; per frame, from the stub camera handing a frame over to its next receive,
# the Python calls (sys.setprofile's call and c_call events) in one run and the process's CPU time in another, unprofiled
COUNT_SNIPPET = """
import json, statistics, sys, time
from benchmarks import stubbed_loop
from benchmarks.bench_daemon import stand_in_layout
generation, frames, warmup, bus, kwargs = {args!r}
slices, width = stand_in_layout(generation)
receiving = 'recv' if hasattr(stubbed_loop.StubCamera, 'recv') else 'recv_frames'  # an older tree's name
calls, marks, receive = [0], [], getattr(stubbed_loop.StubCamera, receiving)
def count(frame, event, arg):
  if event in ("call", "c_call"): calls[0] += 1
def recv_frames(self):  # the stub camera's own work (its sleep, the car's messages it sends) is not modeld's
  profiler = sys.getprofile()
  sys.setprofile(None)
  marks.append((time.process_time(), calls[0]))
  try: return receive(self)
  finally:
    marks.append((time.process_time(), calls[0]))
    sys.setprofile(profiler)
setattr(stubbed_loop.StubCamera, receiving, recv_frames)
def per_frame(profile, k):
  marks.clear()
  sys.setprofile(count if profile else None)
  try: stubbed_loop.run_stubbed(slices, width, generation, frames + warmup, 0.0, 0.0, bus, **kwargs)
  finally: sys.setprofile(None)
  return statistics.median(marks[i + 1][k] - marks[i][k] for i in range(1 + 2 * warmup, len(marks) - 1, 2))
print(json.dumps({{"calls": per_frame(True, 1), "cpu_ms": per_frame(False, 0) * 1e3}}))
"""

def count_calls(args: argparse.Namespace, log) -> dict[tuple[str, str], dict]:
  """{(tree, parse): {calls, cpu_ms}} per frame of the stubbed loop, each in a fresh process: this tree for each --parse, and --baseline's
  (a tree from before the in-graph parse: its host parse)."""
  import subprocess
  here, out = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), {}
  runs = [("this", here, parse, {"parse": parse}) for parse in args.parse] + ([("baseline", args.baseline, "host", {})] if args.baseline else [])
  for tree, root, parse, kwargs in runs:
    log(f"counting calls per frame: {tree} tree, parse on the {parse} ...")
    code = COUNT_SNIPPET.format(args=(args.generation, args.count_frames, STUB_WARMUP, not args.no_bus, kwargs))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=os.environ | {"PYTHONPATH": os.path.abspath(root)}, capture_output=True, text=True)
    if proc.returncode: raise SystemExit(f"benchmarks.bench_daemon: error: counting in {root} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out[(tree, parse)] = json.loads(proc.stdout.strip().splitlines()[-1])
  return out

def layouts_table(splits: dict[str, dict]) -> str:
  """One row per layout and path (a baseline's first): p50 (p10) ms of each stage."""
  cell = lambda d: f"{d['p50']:.3f} ({d['p10']:.3f})"
  lines = ["| layout | path | parse | fill | serialize | together | pycapnp to_bytes of the same fields | same bytes as baseline |", "|---" * 8 + "|"]
  for generation, split in splits.items():
    same = {True: "yes", False: "NO"}.get(split.get("same bytes"), "-")
    pycapnp = cell(split["pycapnp to_bytes of the same fields"])
    rows = ([("baseline", "baseline ", "-", "-")] if "same bytes" in split else []) + [("this", "", pycapnp, same)]
    for name, key, pycapnp, equal in rows:
      stages = " | ".join(cell(split[key + k]) for k in ("parse", "fill", "serialize", "parse+fill+serialize"))
      lines.append(f"| {generation} | {name} | {stages} | {pycapnp} | {equal} |")
  return "\n".join(lines)

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
