"""A soak: modeld and dmonitoringmodeld together for many frames, each daemon's memory, file descriptors and shared memory sampled as it
goes, the slope of each after a warm-up, and whether the pycapnp the daemons run leaks with the garbage collector off.

  python -m benchmarks.bench_soak [--model tiny|full] [--frames 72000] [--rate 20] [--sample-every N] [--warmup-fraction 0.2]
                                  [--gc-frames 20000] [--pycapnp DIR] [--json out/bench_soak.json]

The soak: a split_current stand-in (modeld) and the driver-monitoring stand-in (dmonitoringmodeld) of --model in one artifacts folder
(--workdir, reused while it holds the same build), camerad's stand-in (FakeCamerad) in this process serving the road, wide and driver
cameras, the car's messages (car_bus) before each frame, both daemons their own processes as on a device. --frames at --rate Hz (0:
lockstep, each frame once both daemons published the last one; 72,000 frames at 20 Hz is an hour of driving). Every --sample-every frames,
per daemon, from /proc/<pid>: VmRSS, RssAnon (the heap: what a leak of Python objects grows), RssShmem, the bytes of msgq's rings and of
VisionIPC's camera buffers resident (smaps), open file descriptors (fd/), and the shared-memory mappings (distinct /dev/shm and memfd files
in maps, and the bytes they span); and the run's own /dev/shm entries and bytes (msgq_<prefix>: the bus's rings and VisionIPC's sockets).
The slope of each metric is the least-squares line through the samples after the first --warmup-fraction of the frames (the camera buffers'
first bindings, the message templates, allocator arenas growing to their working size), per 1000 frames; the verdict projects it over an
hour (72,000 frames): memory is flat when that stays under 8 MiB, counts when they stay under one. A daemon leaks when RssAnon, its mappings
(count or bytes) or its fds grow; RssShmem also grows, without a leak, while msgq's rings are written around for the first time (a shared
page counts once touched), which its line tells apart. On exit each daemon says how many objects its frame loop left in reference cycles (it
runs with the collector off): that count, and whether anything of the run is left in /dev/shm, close the report.

The pycapnp question (openpilot pins pycapnp 2.1.0: 2.2 leaks through cyclic references; here 2.2 runs with the collector off while frames
run, daemon/process.py config_realtime): --gc-frames frames in fresh processes of this interpreter, with the collector off as the daemons
run and on, of two paths: modeld's own frame loop (ModelD.run, camera and model stubbed: benchmarks/stubbed_loop.py), which reads the car's
messages through pycapnp readers and writes its messages into byte templates, and the pycapnp path openpilot's daemons take (each frame's
three messages built with new_message and set_fields and serialized, the car's messages read with from_bytes and kept, as a SubMaster keeps
them). Per row: objects left in reference cycles per frame (gc.collect() at the end), tracked objects, RSS and RssAnon slopes per 1000
frames after the first half (pycapnp's builder path grows the heap for its first ~10,000 frames, then not at all). --pycapnp DIR runs those
processes with another pycapnp first on the path (pip install --no-deps --target DIR pycapnp==X).
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
from typing import Any

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, write_json
from sunnypilot.modeld_v2.common.cli import checked
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.model.calibration import parse_camera_size

DAEMONS = {"modeld": "modelV2", "dmonitoringmodeld": "driverStateV2"}  # each daemon and the message that says it ran a frame
HOUR_FRAMES = 72_000  # an hour at 20 Hz: what a slope is projected over
METRICS = {"rss": "VmRSS", "anon": "RssAnon", "shmem": "RssShmem", "rings": "msgq rings resident", "rings_mapped": "msgq rings mapped",
           "camera": "camera buffers resident", "shm_mapped": "shm mapped", "fds": "open fds", "shm_maps": "shm mappings"}
MEMORY = ("rss", "anon", "shmem", "rings", "rings_mapped", "camera", "shm_mapped", "run_shm_bytes")
# a metric is flat when its slope projected over HOUR_FRAMES stays under this: 8 MiB of memory (~116 bytes a frame), under one fd or mapping
THRESHOLDS = {**dict.fromkeys(MEMORY, 8 << 20), "fds": 1.0, "shm_maps": 1.0, "run_shm": 1.0}
CYCLES_LINE = re.compile(r"the frame loop left (\d+) objects in reference cycles")

def proc_sample(pid: int) -> dict[str, int]:
  """One process's memory (bytes), open file descriptors, and its shared-memory mappings (/dev/shm and memfd files): how many distinct
  files, and how many bytes of address space they span (RssShmem can grow only within those, as pages are first touched)."""
  with open(f"/proc/{pid}/status") as f: status = {k: v for k, _, v in (line.partition(":") for line in f)}
  kb = lambda key: int(status[key].split()[0]) * 1024
  with open(f"/proc/{pid}/maps") as f: rows = [line.split(maxsplit=5) for line in f]
  shared = [(r[0], r[5].strip()) for r in rows if len(r) > 5 and r[5].startswith(("/dev/shm/", "/memfd:"))]
  mapped = sum(int(b, 16) - int(a, 16) for a, b in (span.split("-") for span, _ in shared))
  return {"rss": kb("VmRSS"), "anon": kb("RssAnon"), "shmem": kb("RssShmem"), **resident_shm(pid), "shm_mapped": mapped,
          "fds": len(os.listdir(f"/proc/{pid}/fd")), "shm_maps": len({path for _, path in shared})}

def resident_shm(pid: int) -> dict[str, int]:
  """Bytes of msgq's rings (/dev/shm/msgq_<prefix>/...) a process maps and has resident, and of VisionIPC's camera buffers
  (/dev/shm/msgq_visionbuf_*) it has resident: a shared page counts once the process touched it, so a ring's count rises over its first lap."""
  out, kind = {"rings": 0, "rings_mapped": 0, "camera": 0}, None
  with open(f"/proc/{pid}/smaps") as f:
    for line in f:
      if line[0] in "0123456789abcdef" and "-" in (span := line.split(maxsplit=1)[0]):
        kind = "camera" if "/dev/shm/msgq_visionbuf" in line else "rings" if "/dev/shm/msgq_" in line else None
        if kind == "rings": out["rings_mapped"] += int(span.split("-")[1], 16) - int(span.split("-")[0], 16)
      elif kind is not None and line.startswith("Rss:"): out[kind] += int(line.split()[1]) * 1024
  return out

def run_shm(prefix: str) -> tuple[int, int]:
  """Entries this run made in /dev/shm, and their bytes: its msgq folder's (the bus's rings and VisionIPC's sockets) and any other naming
  the prefix."""
  folder = f"/dev/shm/msgq_{prefix}"
  paths = [os.path.join(folder, n) for n in (os.listdir(folder) if os.path.isdir(folder) else [])]
  paths += [os.path.join("/dev/shm", n) for n in os.listdir("/dev/shm") if prefix in n and n != f"msgq_{prefix}"]
  return len(paths), sum(os.stat(p).st_size for p in paths if os.path.isfile(p))

def slope(frames: list[int], values: list[float], warmup_fraction: float, total: int) -> float | None:
  """Least-squares slope of `values` against `frames`, per 1000 frames, over the samples at or after `warmup_fraction` of `total` frames;
  None with fewer than two such samples."""
  x, y = zip(*[(f, v) for f, v in zip(frames, values) if f >= warmup_fraction * total], strict=True) if frames else ((), ())
  if len(x) < 2 or len(set(x)) < 2: return None
  xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return float(((xs - xs.mean()) * (ys - ys.mean())).sum() / ((xs - xs.mean()) ** 2).sum() * 1000)

def verdict(per_1000: float | None, threshold: float) -> tuple[float | None, str]:
  """(growth projected over HOUR_FRAMES, "flat" or "grows") of a slope per 1000 frames against a metric's threshold."""
  if per_1000 is None: return None, "too few samples"
  projected = per_1000 * HOUR_FRAMES / 1000
  return projected, "flat" if projected < threshold else "grows"

class Arrivals:
  """Each service's messages as they arrive: {service: {frame id: monotonic ns}}, one poller over all."""
  def __init__(self, services: list[str]):
    import msgq
    self.poller = msgq.Poller()
    self.socks = {s: msgq.sub_sock(s, poller=self.poller, conflate=False) for s in services}
    self.arrived: dict[str, dict[int, int]] = {s: {} for s in services}

  def wait(self, until_ns: int, frame_id: int | None = None) -> None:
    """Take every message until monotonic `until_ns`, or until each service's of `frame_id` has arrived."""
    from sunnypilot.modeld_v2.daemon.messaging import log
    while True:
      for s, sock in self.socks.items():
        while (raw := sock.receive(non_blocking=True)) is not None:
          with log.Event.from_bytes(raw) as event: self.arrived[s][getattr(event, s).frameId] = time.monotonic_ns()
      if frame_id is not None and all(frame_id in got for got in self.arrived.values()): return
      if (left := until_ns - time.monotonic_ns()) <= 0: return
      self.poller.poll(max(1, left // 1_000_000))

def build(workdir: str, model: str, camera: tuple[int, int], log) -> str:
  """Both daemons' bundles of the `model` stand-ins for `camera` in workdir/<model>: modeld's split_current model and split warp,
  dmonitoringmodeld's model and dm_warp (each rebuilt only when its sources or build settings changed)."""
  from sunnypilot.modeld_v2.tools.demo import build_artifacts, build_dm_artifacts
  folder = os.path.join(workdir, model)
  build_artifacts(folder, camera, "split_current", model, {}, log)
  build_dm_artifacts(folder, camera, model, None, log)
  return folder

def soak(artifacts: str, camera: tuple[int, int], frames: int, rate: float, every: int, log) -> dict:
  """Both daemons on `artifacts` for `frames` frames at `rate` Hz (0: lockstep), sampled every `every` frames: the samples, frames each
  daemon published, what each said on exit about reference cycles, and what was left in /dev/shm and running afterwards."""
  from benchmarks.car_bus import BUS_SERVICES, bus_traffic
  from sunnypilot.modeld_v2.daemon.messaging import pub_master
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad, synthetic_frames
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  prefix = f"bench_soak_{uuid.uuid4().hex[:10]}"
  previous = os.environ.get("OPENPILOT_PREFIX")
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}")
  frame = camerad_frame(*camera)
  road, driver = synthetic_frames(frame), [cabin_scene(frame, i) for i in range(40)]
  replay, arrivals = FakeCamerad(frame, driver=True), Arrivals(list(DAEMONS.values()))
  traffic, bus = bus_traffic(), pub_master(list(BUS_SERVICES))
  daemons = {name: Modeld(artifacts, ["--status-every", "0"], echo=False, daemon=name) for name in DAEMONS}
  samples: list[dict[str, Any]] = []
  try:
    for d in daemons.values(): d.wait_running(600)
    replay.send_calibration()
    start = time.monotonic_ns()
    for i in range(frames + 1):
      if i % every == 0 or i == frames:  # after i frames
        arrivals.wait(time.monotonic_ns() + 1_000_000)
        entries, size = run_shm(prefix)
        samples.append({"frame": i, "s": (time.monotonic_ns() - start) / 1e9, "run_shm": entries, "run_shm_bytes": size,
                        **{name: proc_sample(d.proc.pid) for name, d in daemons.items()}})
        if i % (every * 10) == 0: log(f"{i}/{frames} frames, {samples[-1]['s']:.0f} s")
      if i == frames: break
      for d in daemons.values(): d.check()
      if rate: arrivals.wait(start + int(i * 1e9 / rate))
      for service, raw in traffic.items(): bus.send(service, raw)
      sof = start + i * 50_000_000  # camerad's 20 Hz sensor clock whatever the send rate: modeld pairs road and wide by it
      replay.send(i, *road[i % len(road)], sof=sof)
      replay.send_driver(i, driver[i % len(driver)], sof=sof)
      if not rate: arrivals.wait(time.monotonic_ns() + 2_000_000_000, i)
    wall_s = (time.monotonic_ns() - start) / 1e9
    arrivals.wait(time.monotonic_ns() + 500_000_000)
  finally:
    for d in daemons.values(): d.stop()
    replay.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
    if previous is None: os.environ.pop("OPENPILOT_PREFIX", None)
    else: os.environ["OPENPILOT_PREFIX"] = previous
  cycles = {name: next((int(m[1]) for line in d.lines if (m := CYCLES_LINE.search(line))), None) for name, d in daemons.items()}
  return {"frames": frames, "rate_hz": rate, "wall_s": wall_s, "samples": samples, "cycles_left_on_exit": cycles,
          "published": {name: len(arrivals.arrived[service]) for name, service in DAEMONS.items()},
          "exit_codes": {name: d.proc.returncode for name, d in daemons.items()}, "pids": {name: d.proc.pid for name, d in daemons.items()},
          "prefix": prefix, "left_in_dev_shm": left_in_dev_shm(prefix, [os.getpid(), *(d.proc.pid for d in daemons.values())])}

def left_in_dev_shm(prefix: str, pids: list[int]) -> list[str]:
  """What a run left in /dev/shm: entries naming its prefix, and VisionIPC buffers of its processes (msgq_visionbuf_<pid>_<n>)."""
  return sorted(n for n in os.listdir("/dev/shm") if prefix in n or n.startswith(tuple(f"msgq_visionbuf_{pid}_" for pid in pids)))

def slopes(run: dict, warmup_fraction: float) -> dict[str, dict[str, dict]]:
  """{daemon (or "run" for its /dev/shm entries): {metric: slope per 1000 frames, projected hour, verdict}} of a soak."""
  samples, out = run["samples"], dict[str, dict[str, dict]]()
  frames = [s["frame"] for s in samples]
  for who, metrics in [(name, list(METRICS)) for name in DAEMONS] + [("run", ["run_shm", "run_shm_bytes"])]:
    out[who] = {}
    for metric in metrics:
      values = [s[who][metric] if who != "run" else s[metric] for s in samples]
      per_1000 = slope(frames, values, warmup_fraction, run["frames"])
      projected, word = verdict(per_1000, THRESHOLDS[metric])
      out[who][metric] = {"per_1000_frames": per_1000, "projected_hour": projected, "verdict": word,
                          "first": values[0], "last": values[-1]}
  return out

GC_WARMUP_FRACTION = 0.5  # pycapnp's builder path grows the heap by ~4 MiB over its first ~10,000 frames, then not at all (malloc's arenas)
# A row of the pycapnp question, run in a fresh interpreter: {path, collector, frames, every} -> JSON of its samples and cycles left
GC_SNIPPET = "import json, sys; from benchmarks.bench_soak import gc_row; print(json.dumps(gc_row(*json.loads(sys.argv[1]))))"

def self_memory() -> tuple[int, int]:
  with open("/proc/self/status") as f: status = {k: v for k, _, v in (line.partition(":") for line in f)}
  return int(status["VmRSS"].split()[0]) * 1024, int(status["RssAnon"].split()[0]) * 1024

def gc_row(path: str, collector: str, frames: int, every: int) -> dict:
  """In this (fresh) process: `frames` frames of `path` ("loop": modeld's frame loop, stubbed; "pycapnp": openpilot's way through pycapnp)
  with the collector off or on, sampled every `every` frames (RSS, RssAnon, tracked objects); then the objects gc.collect() finds in
  reference cycles, which with the collector off is all the frames left."""
  import gc
  import logging

  import capnp
  samples: list[dict] = []
  def sample(i: int) -> None:
    if i % every == 0: samples.append({"frame": i, "rss": (m := self_memory())[0], "anon": m[1], "objects": len(gc.get_objects())})
  if path == "loop":
    from benchmarks import stubbed_loop
    from benchmarks.publish_path import stand_in_layout
    if collector == "on": gc.disable = lambda: None  # ModelD.run turns it off as modeld runs: for this row it stays on
    said: list[str] = []
    class Said(logging.Handler):
      def emit(self, record: logging.LogRecord) -> None: said.append(record.getMessage())
    logging.getLogger("sunnypilot").addHandler(Said())
    logging.getLogger("sunnypilot").setLevel(logging.INFO)
    class Sampled(stubbed_loop.StubCamera):
      def recv(self) -> Any:  # sampled between two frames, inside the loop
        sample(self.frame_id)
        return super().recv()
    os.environ["OPENPILOT_PREFIX"] = prefix = f"bench_soak_gc_{uuid.uuid4().hex[:10]}"  # a fresh process: nothing to restore
    try:
      daemon = stubbed_loop.StubbedModelD(stubbed_loop.StubModel(*stand_in_layout("split_current"), "split_current"), Sampled(0.0))
      daemon.timings = None  # no benchmark stamps kept per frame: nothing grows here that modeld does not grow
      daemon.run(frames + 1)
    finally: shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
    left = next((int(m[1]) for line in said if (m := CYCLES_LINE.search(line))), None)
  else:
    pycapnp_frames(frames, collector == "on", sample)
    left = gc.collect()
  return {"path": path, "collector": collector, "frames": frames, "pycapnp": capnp.__version__, "samples": samples, "cycles_left": left}

def pycapnp_frames(frames: int, collect: bool, sample) -> None:
  """`frames` frames the way openpilot's modeld goes through pycapnp: the car's messages read (from_bytes, the reader kept until the next
  frame's, as a SubMaster keeps it), the frame's modelV2, drivingModelData and cameraOdometry filled with new_message + set_fields and
  serialized; the collector on or off for the frames."""
  import gc

  from benchmarks.car_bus import bus_traffic
  from benchmarks.publish_path import PublishPath, stand_in_layout
  from sunnypilot.modeld_v2.daemon.messaging import NO_TRAVERSAL_LIMIT, log, new_message, set_fields
  slices, width = stand_in_layout("split_current")
  publish, traffic, kept = PublishPath(slices), bus_traffic(), {}
  outputs = [np.random.default_rng(i).standard_normal((1, width)).astype(np.float32) for i in range(8)]
  gc.collect()
  gc.enable() if collect else gc.disable()
  for i in range(frames + 1):
    sample(i)
    if i == frames: break
    for service, raw in traffic.items():
      with log.Event.from_bytes(raw, traversal_limit_in_words=NO_TRAVERSAL_LIMIT) as event: kept[service] = getattr(event, service)
    out, info = outputs[i % len(outputs)], publish.frame_info(i)
    for service, fields in publish.fill(out, publish.parse(out), info, kept["carState"]).items():
      set_fields(getattr(msg := new_message(service), service), fields)
      msg.to_bytes()
  gc.disable()

def gc_rows(frames: int, pycapnp: str | None, log) -> list[dict]:
  """Each path with the collector off and on, each in a fresh process (`pycapnp`: a folder put first on its path)."""
  here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, [pycapnp, here, os.environ.get("PYTHONPATH")]))}
  rows, every = [], max(frames // 20, 1)
  for path in ("loop", "pycapnp"):
    for collector in ("off", "on"):
      log(f"pycapnp question: {path}, collector {collector}, {frames} frames ...")
      out = subprocess.run([sys.executable, "-c", GC_SNIPPET, json.dumps([path, collector, frames, every])], env=env, cwd=here, capture_output=True, text=True)
      if out.returncode: raise SystemExit(f"bench_soak: the {path} row failed: {out.stderr.strip()[-2000:]}")
      row = json.loads(out.stdout.strip().splitlines()[-1])
      frames_at = [s["frame"] for s in row["samples"]]
      for metric in ("rss", "anon", "objects"):
        row[f"{metric}_per_1000"] = slope(frames_at, [s[metric] for s in row["samples"]], GC_WARMUP_FRACTION, frames)
      rows.append(row)
  return rows

LEAK_METRICS = ("anon", "shm_mapped", "rings_mapped", "fds", "shm_maps")  # what a leak grows; RSS and RssShmem also grow as mapped pages are first touched

def daemon_verdict(metrics: dict[str, dict]) -> str:
  """One daemon's line: whether anything a leak grows grew, and how much of RssShmem's rise is msgq's rings' first lap."""
  grew = [METRICS[m] for m in LEAK_METRICS if metrics[m]["verdict"] != "flat"]
  mib = lambda metric, key="last": f"{(metrics[metric][key] or 0) / (1 << 20):.1f} MiB"
  touched = (f"; RssShmem rises {mib('shmem', 'projected_hour')} an hour by its slope, the msgq rings resident in it {mib('rings', 'projected_hour')}: "
             f"their pages count once written or read, on each ring's first lap ({mib('rings')} of the {mib('rings_mapped')} of rings it maps so far)"
             if metrics["shmem"]["verdict"] != "flat" else "")
  return (f"grows: {', '.join(grew)}" if grew else "no leak: " + ", ".join(METRICS[m] for m in LEAK_METRICS) + " flat") + touched

def soak_report(run: dict, fits: dict, args) -> None:
  mib = lambda b: f"{b / (1 << 20):.2f}"
  print(f"soak: modeld + dmonitoringmodeld, {args.model} stand-ins, {'x'.join(map(str, args.camera))}, {run['frames']} frames at "
        f"{f'{args.rate:g} Hz' if args.rate else 'lockstep'} in {run['wall_s']:.0f} s; published: "
        + ", ".join(f"{k} {v}" for k, v in run["published"].items()) + "\n")
  per_daemon = ("RSS MiB", "anon MiB", "shmem MiB", "rings MiB", "shm mapped MiB", "fds", "shm maps")
  cells = lambda s, d: (mib(s[d]["rss"]), mib(s[d]["anon"]), mib(s[d]["shmem"]), mib(s[d]["rings"]), mib(s[d]["shm_mapped"]), s[d]["fds"], s[d]["shm_maps"])
  print(markdown_table(("frame", "s", *(f"{d} {c}" if i == 0 else c for d in DAEMONS for i, c in enumerate(per_daemon)), "run's /dev/shm entries", "MiB"),
                       ((s["frame"], f"{s['s']:.0f}", *(c for d in DAEMONS for c in cells(s, d)), s["run_shm"], mib(s["run_shm_bytes"]))
                        for s in run["samples"])))
  print(f"\nslopes after the first {args.warmup_fraction:.0%} of the frames (least squares), per 1000 frames; projected over {HOUR_FRAMES} "
        "frames (an hour at 20 Hz); flat: under 8 MiB of memory, under 1 fd, mapping or entry\n")
  def row(who: str, metric: str, f: dict) -> tuple:
    memory = metric in MEMORY
    show = (lambda v: "-" if v is None else f"{v / 1024:.1f} KiB") if memory else (lambda v: "-" if v is None else f"{v:.2f}")
    first, last = (mib(f["first"]) + " MiB", mib(f["last"]) + " MiB") if memory else (str(f["first"]), str(f["last"]))
    return (who, METRICS.get(metric, "entries" if metric == "run_shm" else "bytes"), first, last, show(f["per_1000_frames"]), show(f["projected_hour"]),
            f["verdict"])
  print(markdown_table(("daemon", "metric", "first", "last", "slope per 1000 frames", "projected over an hour", "verdict"),
                       (row(who, metric, f) for who, metrics in fits.items() for metric, f in metrics.items())))
  print()
  for who, metrics in fits.items():
    line = daemon_verdict(metrics) if who in DAEMONS else ", ".join(f"{METRICS.get(m, m)} {f['verdict']}" for m, f in metrics.items())
    print(f"verdict {who}: {line}")
  print("objects the frame loops left in reference cycles (said on exit): " + ", ".join(f"{k} {v}" for k, v in run["cycles_left_on_exit"].items())
        + f"; exit codes {run['exit_codes']}; left in /dev/shm afterwards: {run['left_in_dev_shm'] or 'nothing'}")

def gc_report(rows: list[dict]) -> None:
  print(f"\npycapnp {rows[0]['pycapnp']} with the collector off (as the daemons run) and on, {rows[0]['frames']} frames a row, fresh processes; "
        f"slopes after the first {GC_WARMUP_FRACTION:.0%}, per 1000 frames\n")
  names = {"loop": "modeld's frame loop (stubbed camera, model)", "pycapnp": "openpilot's pycapnp path (new_message, set_fields, from_bytes)"}
  kib = lambda v: "-" if v is None else f"{v / 1024:.1f}"
  print(markdown_table(("path", "collector", "objects left in cycles", "per frame", "tracked objects per 1000 frames", "RSS KiB per 1000 frames",
                        "RssAnon KiB per 1000 frames"),
                       ((names[r["path"]], r["collector"], r["cycles_left"] if r["cycles_left"] is not None else "?",
                         f"{(r['cycles_left'] or 0) / r['frames']:.3f}",
                         f"{r['objects_per_1000'] or 0:.1f}", kib(r["rss_per_1000"]), kib(r["anon_per_1000"])) for r in rows)))

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_soak", __doc__)
  parser.add_argument("--model", default="tiny", choices=("tiny", "full"), help="the stand-ins' size (tiny: a quick run on two CPU cores)")
  parser.add_argument("--camera", default="1928x1208", type=checked(parse_camera_size), help="1928x1208 (comma 3/3X) or 1344x760 (comma 4)")
  parser.add_argument("--frames", type=int, default=HOUR_FRAMES, help="frames of the soak (0: only the pycapnp question)")
  parser.add_argument("--rate", type=float, default=20.0, help="frames per second; 0: lockstep (each frame once both daemons published the last)")
  parser.add_argument("--sample-every", type=int, default=0, help="frames between samples (default: a 40th of --frames, at least 20)")
  parser.add_argument("--warmup-fraction", type=float, default=0.2, help="the first fraction of the frames left out of the slopes")
  parser.add_argument("--gc-frames", type=int, default=20000, help="frames of each row of the pycapnp question (0: none)")
  parser.add_argument("--pycapnp", metavar="DIR", help="run the pycapnp question with the pycapnp installed in DIR (pip install --target DIR)")
  parser.add_argument("--workdir", default="out/bench_soak", help="where the stand-ins are built (and kept)")
  parser.add_argument("--json")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  if args.frames < 0 or args.gc_frames < 0 or not 0 <= args.warmup_fraction < 1 or args.rate < 0: parser.error("negative counts or a warm-up outside [0, 1)")
  camera = args.camera
  log = logger()
  run = fits = None
  if args.frames:
    artifacts = build(args.workdir, args.model, camera, log)
    run = soak(artifacts, camera, args.frames, args.rate, args.sample_every or max(args.frames // 40, 20), log)
    fits = slopes(run, args.warmup_fraction)
  rows = gc_rows(args.gc_frames, args.pycapnp, log) if args.gc_frames else []
  if run is not None and fits is not None: soak_report(run, fits, args)
  if rows: gc_report(rows)
  write_json(args.json, {"model": args.model, "camera": list(args.camera), "warmup_fraction": args.warmup_fraction, "thresholds": THRESHOLDS,
                         "soak": run, "slopes": fits, "pycapnp": rows})
  return 0

if __name__ == "__main__":
  sys.exit(main())
