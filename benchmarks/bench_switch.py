"""Switching model sets while modeld runs at 20 Hz: frames published before, during and after each switch, the longest gap between two
published frames, and the frame latency while a set loads beside the frames against the steady state.

  python -m benchmarks.bench_switch [--model tiny] [--runs 2] [--switches 4] [--between 6] [--json out/bench_switch.json]
  DEV=CUDA python -m benchmarks.bench_switch --model full                       # on a GPU machine

Two sets of today's openpilot layout (split_current stand-ins of --model size, other seeds: other weights) and a 1928x1208 split warp,
built into --workdir: the default (--artifacts) and `b` installed in a model sets folder. The camerad stand-in runs in this process and
sends a frame every 50 ms on its own clock; modeld runs in a subprocess with --model-sets; every modelV2 is taken off the bus here with
its arrival time and the model identity it carries (modelV2.locationMonoTimeDEPRECATED). After 5 s, every --between seconds the flag file
asks for the other set. Per switch: `before` is the 2 s before the request, `during` from the request until the first frame on the new
set (modeld's poll, read, verify, load and warm-up beside the frames), `after` the 2 s from it. Latency: arrival minus the camerad send.
Each round is a run with switches and a control run without (the same schedule, no request written; its `during` windows as long as the
switches' median), in alternating order: on a shared machine what the switch adds is the difference between the two.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, percentiles, write_json
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

FRAME_NS, WARM_S, WINDOW_S = 50_000_000, 5.0, 2.0

class Arrivals:
  """Every modelV2: frame id -> (monotonic ns when taken off the socket, the model identity it carries)."""
  def __init__(self):
    import msgq
    self.poller = msgq.Poller()
    self.sock = msgq.sub_sock("modelV2", poller=self.poller, conflate=False)
    self.got: dict[int, tuple[int, int]] = {}

  def until(self, deadline_ns: int) -> None:
    from sunnypilot.modeld_v2.daemon.messaging import log
    while (left := deadline_ns - time.monotonic_ns()) > 0:
      if not self.poller.poll(max(1, left // 1_000_000)): continue
      while (raw := self.sock.receive(non_blocking=True)) is not None:
        t = time.monotonic_ns()
        with log.Event.from_bytes(raw) as event: self.got[event.modelV2.frameId] = (t, event.modelV2.locationMonoTimeDEPRECATED)

def build(workdir: str, size: str, log) -> tuple[str, str]:
  """(default set folder, model sets root holding set b), built when missing."""
  from tinygrad import Device

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.daemon.model_sets import folder_roles
  from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  base = os.path.join(workdir, f"{Device.DEFAULT.lower()}_{size}")
  default, root = os.path.join(base, "default"), os.path.join(base, "sets")
  for folder, seed in ((default, 0), (os.path.join(root, "b"), 1)):
    os.makedirs(folder, exist_ok=True)
    if not os.path.exists(model := os.path.join(folder, "model.bin")):
      log(f"building a {size} split_current stand-in (seed {seed}) in {folder} ...")
      files = stand_in_models.write("split_current", size, os.path.join(folder, "stand_in.onnx"), seed=seed)["files"]
      compile_model(model, **files, log=lambda s: None)
      for path in files.values(): os.remove(path)
    if not os.path.exists(warp := os.path.join(folder, "warp.bin")):
      compile_warp(camerad_frame(1928, 1208).spec, "512x256", warp, split_frames=True, log=lambda s: None)
  b = os.path.join(root, "b")
  write_manifest(os.path.join(b, MANIFEST_NAME), "b", [entry_of(os.path.join(b, f), r) for f, r in folder_roles(b).items()])
  return default, root

def model_id(folder: str) -> int:
  from sunnypilot.modeld_v2.format.bundle import content_digest
  return int(content_digest(os.path.join(folder, "model.bin"))[:16], 16)

def run(default: str, root: str, switches: int, between_s: float, log, control: bool = False) -> dict:
  """One modeld, frames sent every 50 ms, `switches` requests `between_s` apart (b, default, b, ...; with `control` none is written);
  per frame its send and arrival times and the model identity it carries, and per request its time and the set asked for."""
  from sunnypilot.modeld_v2.daemon.model_sets import ACTIVE_FILE, DEFAULT_SET
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad, synthetic_frames
  from sunnypilot.modeld_v2.replay.model_daemons import Modeld
  prefix = f"bench_switch_{uuid.uuid4().hex[:10]}"
  os.environ["OPENPILOT_PREFIX"] = prefix
  os.makedirs(f"/dev/shm/msgq_{prefix}", exist_ok=True)
  active = os.path.join(root, ACTIVE_FILE)
  for stale in (active, os.path.join(root, "last_ran")):
    if os.path.exists(stale): os.remove(stale)
  frame = camerad_frame(1928, 1208)
  source, replay, arrivals = synthetic_frames(frame), FakeCamerad(frame), Arrivals()
  modeld = Modeld(default, ["--model-sets", root], echo=False)
  sent, requests = {}, []
  try:
    modeld.wait_running(600)
    start = time.monotonic_ns()
    total = int((WARM_S + switches * between_s + WINDOW_S + 1) * 1e9 // FRAME_NS)
    for frame_id in range(total):
      arrivals.until(start + frame_id * FRAME_NS)
      modeld.check()
      t = (WARM_S + len(requests) * between_s) * 1e9
      if len(requests) < switches and time.monotonic_ns() - start >= t:
        name = "b" if len(requests) % 2 == 0 else DEFAULT_SET
        if not control:
          with open(active + ".tmp", "w") as f: f.write(name + "\n")
          os.replace(active + ".tmp", active)
        requests.append((time.monotonic_ns(), name))
        log(f"{'control, no switch' if control else 'switch'} {len(requests)}/{switches}: {'would ask' if control else 'asked'} for set {name}")
      sent[frame_id] = replay.send(frame_id, *source[frame_id % len(source)], sof=start + frame_id * FRAME_NS)
    arrivals.until(time.monotonic_ns() + 1_000_000_000)
  finally:
    modeld.stop()
    replay.close()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  return {"sent": sent, "got": arrivals.got, "requests": requests, "log": modeld.lines}

def window(sent: dict, got: dict, lo: int, hi: int) -> dict:
  """Frames sent in monotonic [lo, hi): how many were published, the longest gap between two published ones (in 50 ms frame intervals,
  from the first sent to the last), the latency percentiles (ms)."""
  ids = sorted(f for f, t in sent.items() if lo <= t < hi)
  arrived = [got[f][0] for f in ids if f in got]
  edges = [sent[ids[0]], *arrived, sent[ids[-1]] + FRAME_NS] if ids else []
  gaps = np.diff(sorted(edges)) / FRAME_NS if len(edges) > 1 else np.zeros(1)
  return {"sent": len(ids), "published": len(arrived), "longest_gap_frames": float(gaps.max()),
          "latency_ms": percentiles([(got[f][0] - sent[f]) / 1e6 for f in ids if f in got])}

def analyse(r: dict, ids: dict[str, int], load_s: float | None = None) -> list[dict]:
  """Per switch: the frames before, during (the request to the first frame on the new set) and after it. A control run (`load_s`): its
  `during` windows last `load_s`."""
  sent, got, out = r["sent"], r["got"], []
  for t_req, name in r["requests"]:
    if load_s is not None: first = next((f for f in sorted(sent) if sent[f] >= t_req + load_s * 1e9), None)
    else: first = next((f for f in sorted(got) if sent[f] >= t_req and got[f][1] == ids[name]), None)
    if first is None:
      out.append({"set": name, "switched": False})
      continue
    t_new = sent[first]
    out.append({"set": name, "switched": True, "load_s": (got[first][0] - t_req) / 1e9 if first in got else load_s, "first_frame": first,
                "before": window(sent, got, t_req - int(WINDOW_S * 1e9), t_req), "during": window(sent, got, t_req, t_new),
                "after": window(sent, got, t_new, t_new + int(WINDOW_S * 1e9))})
  return out

def summary(runs: list[dict], switches: list[dict]) -> dict:
  ok = [s for s in switches if s["switched"]]
  med = lambda key, part: statistics.median(s[part][key] for s in ok) if ok else float("nan")
  p99 = lambda part: statistics.median(s[part]["latency_ms"].get("p99", float("nan")) for s in ok) if ok else float("nan")
  wholes = [window(r["sent"], r["got"], min(r["sent"].values()), max(r["sent"].values()) + 1) for r in runs]
  return {"switches": len(switches), "switched": len(ok), "frames_sent": sum(len(r["sent"]) for r in runs),
          "frames_published": sum(len(r["got"]) for r in runs), "never_published": [sorted(set(r["sent"]) - set(r["got"])) for r in runs],
          "whole_run": {"longest_gap_frames": max(w["longest_gap_frames"] for w in wholes),
                        "latency_p99_ms": statistics.median(w["latency_ms"].get("p99", float("nan")) for w in wholes)},
          "median": {part: {"published": med("published", part), "sent": med("sent", part), "longest_gap_frames": med("longest_gap_frames", part),
                            "latency_p99_ms": p99(part)} for part in ("before", "during", "after")},
          "load_s": statistics.median(s["load_s"] for s in ok) if ok else float("nan")}

def table(kinds: dict[str, dict], model: str, device: str, rounds: int) -> str:
  rows = []
  for kind, s in kinds.items():
    for part, label in (("before", "2 s before the request"), ("during", f"request -> first frame on the new set ({s['load_s']:.2f} s)"),
                        ("after", "2 s after the change")):
      m = s["median"][part]
      rows.append((kind, label, f"{m['published']:.0f} / {m['sent']:.0f}", f"{m['longest_gap_frames']:.2f}", f"{m['latency_p99_ms']:.1f}"))
    w = s["whole_run"]
    rows.append((kind, f"whole runs ({s['switched']} of {s['switches']} switched)", f"{s['frames_published']} / {s['frames_sent']}",
                 f"{w['longest_gap_frames']:.2f} (longest)", f"{w['latency_p99_ms']:.1f}"))
  return "\n".join([f"model switch at 20 Hz, {model} split_current stand-ins, 1928x1208 on {device}, {rounds} rounds (a run with switches and a "
                    "control run without, alternating); medians over the switches", "",
                    markdown_table(("run", "window", "frames published / sent", "longest gap between published frames (frame intervals)", "latency p99 ms"),
                                   rows)])

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_switch", __doc__)
  parser.add_argument("--model", default="tiny", choices=("tiny", "full", "big"), help="stand-in size")
  parser.add_argument("--runs", type=int, default=2, help="rounds: each a run with switches and a control run without")
  parser.add_argument("--switches", type=int, default=4, help="switches in a run (b, default, b, ...)")
  parser.add_argument("--between", type=float, default=6.0, help="seconds between two switch requests")
  parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "bench_switch"), help="where the sets are built (and kept)")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  from tinygrad import Device
  log = logger()
  default, root = build(args.workdir, args.model, log)
  ids = {"default": model_id(default), "b": model_id(os.path.join(root, "b"))}
  runs: dict[str, list[dict]] = {"switch": [], "control": []}
  for i in range(args.runs):
    for kind in ("switch", "control") if i % 2 == 0 else ("control", "switch"):
      runs[kind].append(run(default, root, args.switches, args.between, log, control=kind == "control"))
  switches = [s for r in runs["switch"] for s in analyse(r, ids)]
  load_s = statistics.median(s["load_s"] for s in switches if s["switched"]) if any(s["switched"] for s in switches) else 1.0
  controls = [s for r in runs["control"] for s in analyse(r, ids, load_s)]
  kinds = {"switch": summary(runs["switch"], switches), "control": summary(runs["control"], controls)}
  print(table(kinds, args.model, Device.DEFAULT, args.runs))
  write_json(args.json, {"device": Device.DEFAULT, "model": args.model, "summary": kinds, "switches": switches, "controls": controls,
                         "modeld_log": [[line for line in r["log"] if "set" in line or "status" in line] for r in runs["switch"]]})
  return 0

if __name__ == "__main__":
  sys.exit(main())
