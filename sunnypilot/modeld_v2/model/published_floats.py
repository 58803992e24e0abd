"""The floats the three messages publish from the model's outputs, in their fields' order, and where each comes from in the parse: the
layout of the block the in-graph parse writes (compile/output_parse.py) and modeld copies into the messages' byte templates.

Found by tracing the fill functions (fill_model_msg) on a parse whose buffer holds each value's own index: a field whose value is a view of
the parse's buffer publishes those parsed values; the daemon's fields (host_fields) stay the host's; any other field must be a constant
(the time and distance axes, a lead's probability time) and is checked to be one, on a second trace with other values. So the block
follows the fill functions field by field, with no second list of them. After the published floats, the block's tail holds what the
driving state reads (ParsedReads) and no message publishes: the desired_curvature and action heads, lat_planner_solution's yaw and curvature.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.model.constants import IDX_N
from sunnypilot.modeld_v2.model.drive_helpers import Action
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES, FrameInfo, FrameState, frame_fields, host_fields, meta_layout
from sunnypilot.modeld_v2.model.message_fields import Fields
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads

FLOAT_BLOCK = "message_floats"  # the model bundle's output that holds the block (beside `outputs`, the raw vector)
LAYOUT_VERSION = 2  # what a block's values mean (the parse's rules, the sources' indexing): a bundle of another version parses on the host

@dataclass(frozen=True)
class FloatLayout:
  """`fields`: (service, path, floats) in block order, each service's fields in their fill order; `sources`: per block float its index in
  the parse's buffer (OutputParser.buffer); `published`: floats the messages publish, the tail after them read by the host alone; `reads`:
  per ParsedReads field (start, stop, shape) in the block; `fcw`: the meta head has a known layout (FCW and confidence are published)."""
  fields: tuple[tuple[str, str, int], ...]
  sources: np.ndarray
  published: int
  reads: dict[str, tuple[int, int, tuple[int, ...]]]
  fcw: bool
  unchecked: np.ndarray  # block floats a finite check skips: the lane lines' times, NaN past the plan's end by openpilot's rule

  @property
  def services(self) -> dict[str, tuple[int, int]]:
    """Each service's [start, stop) in the block."""
    spans: dict[str, tuple[int, int]] = {}
    at = 0
    for service, _, n in self.fields:
      start, _ = spans.get(service, (at, at))
      spans[service], at = (start, at + n), at + n
    return spans

  def reads_of(self, block: np.ndarray) -> ParsedReads:
    """The driving state's reads as views of `block` (one per model: the graph rewrites the block in place)."""
    return ParsedReads(**{name: block[start:stop].reshape(shape) for name, (start, stop, shape) in self.reads.items()},
                       **{name: None for name in ParsedReads._fields if name not in self.reads})

  def checked(self) -> np.ndarray:
    """Indices of the block floats a finite check covers (every one but the lane lines' times)."""
    return np.setdiff1d(np.arange(len(self.sources)), self.unchecked)

  def to_json(self) -> dict[str, Any]:
    return {"version": LAYOUT_VERSION, "fields": [list(f) for f in self.fields], "sources": self.sources.tolist(), "published": self.published,
            "reads": {k: [a, b, list(s)] for k, (a, b, s) in self.reads.items()}, "fcw": self.fcw, "unchecked": self.unchecked.tolist()}

def check_recorded(recorded: object, block_shape: Iterable[int] | None) -> None:
  """ValueError unless a bundle's recorded layout (FloatLayout.to_json) is well formed and its FLOAT_BLOCK output (`block_shape`) holds it:
  checked when the bundle is read, so a crafted one cannot make modeld's views of the block run past it."""
  if not isinstance(recorded, dict) or not {"version", "fields", "sources", "published", "reads", "fcw", "unchecked"} <= set(recorded):
    raise ValueError(f"{FLOAT_BLOCK} is not a float block's layout")
  sources, fields = recorded["sources"], recorded["fields"]
  if not isinstance(sources, list) or not all(type(i) is int and i >= 0 for i in sources): raise ValueError(f"{FLOAT_BLOCK} sources are not indices")
  if not isinstance(fields, list) or not all(isinstance(f, list) and len(f) == 3 and type(f[2]) is int and f[2] > 0 for f in fields):
    raise ValueError(f"{FLOAT_BLOCK} fields are not [service, path, floats]")
  if sum(f[2] for f in fields) != recorded["published"] or recorded["published"] > len(sources):
    raise ValueError(f"{FLOAT_BLOCK} fields hold {sum(f[2] for f in fields)} floats, it publishes {recorded['published']} of {len(sources)}")
  if list(block_shape or []) != [len(sources)]: raise ValueError(f"the {FLOAT_BLOCK} output is {block_shape}, its layout has {len(sources)} floats")

def _labels(value: object, buffer: np.ndarray) -> np.ndarray | None:
  """The buffer indices a field's value reads when the buffer holds its own indices, or None for a value that is no view of it."""
  if isinstance(value, np.ndarray) and np.shares_memory(value, buffer): return value.reshape(-1).astype(np.int64)
  return None

def _fields(parser: OutputParser, values: np.ndarray) -> tuple[dict[str, Fields], dict[str, Fields], bool]:
  """The fill functions' fields and the host's, by service, with the parse's buffer set to `values`."""
  parser.buffer[:] = values
  p, fcw = parser.parsed, meta_layout(parser.parsed, None) is not None
  state, frame = FrameState(Action() if "plan" in p else None, False, "green", 0, 0), FrameInfo(1, 1, 1, 1, 0.0, 0, 0.0, True, 0.3, 0.5)
  return frame_fields(p, state, frame), host_fields(state, frame, None, fcw), fcw

def trace(slices: Mapping[str, Sequence[int]]) -> FloatLayout:
  """The float block of a model with these `output_slices`. ValueError when a field depends on the outputs without being a view of the
  parse (a fill function computing a value the in-graph parse does not know)."""
  parser = OutputParser(slices)
  if len(parser.buffer) >= 1 << 24: raise ValueError(f"a parse of {len(parser.buffer)} values: its indices are not exact float32 labels")
  labels = np.arange(len(parser.buffer), dtype=np.float32)
  other, _, _ = _fields(parser, -1.0 - labels)  # a constant reads the same on any outputs
  fields, host, fcw = _fields(parser, labels)  # from here on the buffer holds its indices
  layout, sources = [], []
  for service in SERVICES:
    for path, value in fields[service].items():
      if path in host[service]: continue
      if (index := _labels(value, parser.buffer)) is not None:
        layout.append((service, path, len(index)))
        sources.append(index)
      elif not np.array_equal(np.asarray(value), np.asarray(other[service][path])):
        raise ValueError(f"{service}.{path} depends on the model's outputs but reads no parsed value: the in-graph parse cannot publish it")
  block = np.concatenate(sources) if sources else np.zeros(0, np.int64)
  published, first = len(block), dict[int, int]()
  for i, label in enumerate(block.tolist()): first.setdefault(label, i)
  reads, tail = dict[str, tuple[int, int, tuple[int, ...]]](), list[np.ndarray]()
  for name, value in ParsedReads.of(parser.parsed)._asdict().items():
    if value is None: continue
    index, shape = _labels(value, parser.buffer), tuple(value.shape)
    assert index is not None, f"the read {name} is a view of the parse"
    start = first.get(int(index[0]), -1)
    if start < 0 or not np.array_equal(block[start:start + len(index)], index):  # not published as one run: read from the tail
      start = published + sum(map(len, tail))
      tail.append(index)
    reads[name] = (start, start + len(index), shape)
  sources_all = np.concatenate([block, *tail]) if tail else block
  plan_t = parser.derived.start + np.arange(IDX_N) if "plan_t" in parser.parsed else np.zeros(0, np.int64)
  return FloatLayout(tuple(layout), sources_all, published, reads, fcw, np.flatnonzero(np.isin(sources_all, plan_t)))

def reference_block(parser: OutputParser, layout: FloatLayout, outputs: np.ndarray) -> np.ndarray:
  """The block the in-graph parse writes for the (1, N) `outputs`, by the host parse (`parser`, of the same slices as `layout`), non-finite
  outputs read as 0 as modeld parses them: the reference the graph is held to."""
  parser(np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0))
  return parser.buffer[layout.sources]
