"""modeld's publish path timed in this process, frame by frame on random outputs of one layout: the parse, fill and serialize of its three
messages (the split modeld's own stamps cannot make), beside pycapnp writing the same fields, and beside another checkout's path
(--baseline: an earlier commit's tree, imported beside this one) with every frame's bytes compared."""
from __future__ import annotations

import os
import sys
import time
from typing import Any

import numpy as np

from benchmarks.common import markdown_table, percentiles

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

def layouts_table(splits: dict[str, dict]) -> str:
  """One row per layout and path (a baseline's first): p50 (p10) ms of each stage."""
  cell = lambda d: f"{d['p50']:.3f} ({d['p10']:.3f})"
  rows = []
  for generation, split in splits.items():
    same = {True: "yes", False: "NO"}.get(split.get("same bytes"), "-")
    pycapnp = cell(split["pycapnp to_bytes of the same fields"])
    for name, key, pycapnp_cell, equal in ([("baseline", "baseline ", "-", "-")] if "same bytes" in split else []) + [("this", "", pycapnp, same)]:
      rows.append((generation, name, *(cell(split[key + k]) for k in ("parse", "fill", "serialize", "parse+fill+serialize")), pycapnp_cell, equal))
  return markdown_table(("layout", "path", "parse", "fill", "serialize", "together", "pycapnp to_bytes of the same fields", "same bytes as baseline"), rows)
