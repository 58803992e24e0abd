"""The model's raw output vector -> named arrays, with openpilot's activation for each head.

Mirrors openpilot selfdrive/modeld/parse_model_outputs.py (commaai/openpilot @75a8e5d1) and sunnypilot modeld_v2/parse_model_outputs_split.py
(sunnypilot/sunnypilot @a7fda632: every head optional; `is_mhp`: plan and lead have hypotheses unless the head is exactly one mean/std
pair of its shape, as today's models' 990-float plan and 144-float lead are; `safe_exp` clips exponents at 11, as float16 logits overflow).
sunnypilot's TinygradSplitRunner (sunnypilot/models/runners/tinygrad/tinygrad_runner.py @06b23b5a) adds a `planplus` head's mean to the
plan's. A head the model lacks is simply absent from the result. Arrays carry no batch axis; standard deviations are under `<name>_std`.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from sunnypilot.modeld_v2.model.constants import (
  DESIRE_LEN,
  DESIRE_PRED_LEN,
  DESIRED_CURV_WIDTH,
  IDX_N,
  LANE_LINES_WIDTH,
  LAT_PLANNER_SOLUTION_WIDTH,
  LEAD_MHP_N,
  LEAD_MHP_SELECTION,
  LEAD_TRAJ_LEN,
  LEAD_WIDTH,
  NUM_LANE_LINES,
  NUM_ROAD_EDGES,
  PLAN_MHP_N,
  PLAN_MHP_SELECTION,
  PLAN_WIDTH,
  POSE_WIDTH,
  WIDE_FROM_DEVICE_WIDTH,
)

EXP_CLIP = 11.0  # exp(11) ~ 6e4, the largest float16 finite value's order: a larger exponent overflows half-precision models

def safe_exp(x: np.ndarray) -> np.ndarray: return np.exp(np.minimum(x, EXP_CLIP))

def sigmoid(x: np.ndarray) -> np.ndarray: return 1.0 / (1.0 + safe_exp(-x))  # openpilot's, its exponent clipped as safe_exp's

def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:  # the array methods: np.max / np.sum add ~3 us of dispatch each
  e = safe_exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)

# name -> (shape of one selection, hypotheses, selections) for the mixture-density heads; a MHP_HEADS head of exactly one mean/std pair of
# its selections is read without hypotheses (openpilot's is_mhp)
MDN_HEADS = {
  "plan": ((IDX_N, PLAN_WIDTH), PLAN_MHP_N, PLAN_MHP_SELECTION),
  "planplus": ((IDX_N, PLAN_WIDTH), 1, 0),
  "lane_lines": ((NUM_LANE_LINES, IDX_N, LANE_LINES_WIDTH), 1, 0),
  "road_edges": ((NUM_ROAD_EDGES, IDX_N, LANE_LINES_WIDTH), 1, 0),
  "pose": ((POSE_WIDTH,), 1, 0),
  "road_transform": ((POSE_WIDTH,), 1, 0),
  "sim_pose": ((POSE_WIDTH,), 1, 0),
  "wide_from_device_euler": ((WIDE_FROM_DEVICE_WIDTH,), 1, 0),
  "lead": ((LEAD_TRAJ_LEN, LEAD_WIDTH), LEAD_MHP_N, LEAD_MHP_SELECTION),
  "desired_curvature": ((DESIRED_CURV_WIDTH,), 1, 0),
  "lat_planner_solution": ((IDX_N, LAT_PLANNER_SOLUTION_WIDTH), 1, 0),
}
MHP_HEADS = ("plan", "lead")
BINARY_HEADS = ("lead_prob", "lane_lines_prob", "meta")  # independent probabilities: sigmoid of every logit
CATEGORICAL_HEADS = {"desire_state": (DESIRE_LEN,), "desire_pred": (DESIRE_PRED_LEN, DESIRE_LEN)}  # softmax over the last axis, DESIRE_LEN wide

def mdn_layout(name: str, size: int) -> tuple[tuple[int, ...], int, int]:
  """(shape, hypotheses, selections) a mixture-density head of `size` raw values is read with: a MHP_HEADS head of exactly one mean/std
  pair of its selections has no hypotheses (openpilot's is_mhp: today's plan 990 and lead 144), any other size is the hypotheses layout."""
  shape, hypotheses, selections = MDN_HEADS[name]
  if name in MHP_HEADS and size == 2 * int(np.prod(shape)) * max(selections, 1): return ((selections, *shape) if selections > 1 else shape), 1, 0
  return shape, hypotheses, selections

def head_sizes(name: str) -> tuple[int, ...] | None:
  """The raw lengths parse_outputs and the message filling can read for a head; None where any length is read (meta: one of its
  layouts, or skipped; hidden_state: passed through, its width is the compiled features queue's) or the head is not one modeld reads."""
  if name in MDN_HEADS:
    shape, hypotheses, selections = MDN_HEADS[name]
    sizes = (hypotheses * (2 * int(np.prod(shape)) + selections),)
    return sizes + (2 * int(np.prod(shape)) * max(selections, 1),) if name in MHP_HEADS else sizes
  if name in CATEGORICAL_HEADS: return (int(np.prod(CATEGORICAL_HEADS[name])),)
  return {"lead_prob": (LEAD_MHP_SELECTION,), "lane_lines_prob": (2 * NUM_LANE_LINES,)}.get(name)

def check_head_sizes(slices: dict[str, Sequence[int]]) -> None:
  """Raise ValueError unless each known head of `slices` ({name: [start, stop]}, its structure checked) is as long as parse_outputs
  reads it: a bundle's output_slices, checked before the first frame instead of failing in the middle of a run."""
  for name, (start, stop) in slices.items():
    if (sizes := head_sizes(name)) is not None and stop - start not in sizes:
      raise ValueError(f"{name} has {stop - start} values, openpilot's layouts have {' or '.join(map(str, sizes))}")

class OutputParser:
  """parse_outputs for one `output_slices` layout, planned once. A mixture-density head holds per hypothesis the means, then log-stds,
  then `selections` logits; with several hypotheses, selection k takes the hypothesis whose logit k has the largest softmax weight (the
  result is (selections, *shape), or `shape` for one selection).

  Every call writes one float32 buffer, laid out as [every head's means | every std | every binary head | every categorical head |
  hidden_state], with one gather from the output vector (its hypotheses' rows picked first), then the activations in place, one exp
  over all three activated parts: elementwise, so each value is what a per-head call gives. The result is the same dict of the same
  views of that buffer on every call: the next call overwrites them (copy what must outlive the frame)."""
  def __init__(self, slices: dict[str, Sequence[int]]):
    self.raw = {name: (int(start), int(stop)) for name, (start, stop) in slices.items()}
    heads = []  # (name, start, shape of the result, hypotheses, selections, values per half)
    for name in MDN_HEADS:
      if name not in self.raw: continue
      start, stop = self.raw[name]
      shape, hypotheses, selections = mdn_layout(name, stop - start)
      n = ((stop - start) // hypotheses - selections) // 2
      heads.append((name, start, shape if selections <= 1 else (selections, *shape), hypotheses, selections, n))
    binary = [name for name in BINARY_HEADS if name in self.raw]
    categorical = [name for name in CATEGORICAL_HEADS if name in self.raw]
    sizes = [int(np.prod(shape)) for _, _, shape, *_ in heads]
    means, stds = sum(sizes), 2 * sum(sizes)
    binary_end = stds + sum(self.raw[name][1] - self.raw[name][0] for name in binary)
    categorical_end = binary_end + sum(self.raw[name][1] - self.raw[name][0] for name in categorical)
    hidden = self.raw.get("hidden_state", (0, 0))
    self.buffer = np.zeros(categorical_end + hidden[1] - hidden[0], np.float32)
    self.gather = np.zeros(len(self.buffer), np.int64)  # buffer[i] = vec[gather[i]] before the activations; hypotheses' rows set per call
    self.stds, self.binary, self.categorical = slice(means, stds), slice(stds, binary_end), slice(binary_end, categorical_end)
    self.parsed: dict[str, np.ndarray] = {}
    # per head whose hypotheses are picked per call: (its means' part of gather as (selections, n), its stds' part, the (hypotheses,
    # selections) indices of the logits, the (hypotheses, n) indices of each hypothesis' means, n)
    self.picked: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]] = []
    at = 0
    for (name, start, shape, hypotheses, selections, n), size in zip(heads, sizes, strict=True):
      mean, std = slice(at, at + size), slice(means + at, means + at + size)
      self.parsed[name], self.parsed[f"{name}_std"] = self.buffer[mean].reshape(shape), self.buffer[std].reshape(shape)
      if hypotheses == 1: self.gather[mean], self.gather[std] = np.arange(start, start + n), np.arange(start + n, start + 2 * n)
      else:  # each hypothesis' row: its means, then as many log-stds, then the selection logits
        rows = start + (2 * n + selections) * np.arange(hypotheses)[:, None]
        self.picked.append((self.gather[mean].reshape(selections, n), self.gather[std], rows + 2 * n + np.arange(selections), rows + np.arange(n), n))
      at += size
    at = stds
    for name in (*binary, *categorical, *(["hidden_state"] if "hidden_state" in self.raw else [])):
      start, stop = self.raw[name]
      self.gather[at:at + stop - start] = np.arange(start, stop)
      self.parsed[name] = self.buffer[at:at + stop - start].reshape(CATEGORICAL_HEADS.get(name, (stop - start,)))
      at += stop - start
    self.plan_plus = "plan" in self.parsed and "planplus" in self.parsed

  def __call__(self, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """The model's (1, N) output vector -> named arrays after openpilot's activations (views of `buffer`, refilled by the next call)."""
    vec = np.asarray(outputs, np.float32).reshape(-1)
    for means, stds, logits, rows, n in self.picked:
      # openpilot sorts the softmax weights and takes the first of the descending order: the last of the largest, as a stable sort has it
      weights = softmax(vec[logits], axis=0)
      np.take(rows, len(weights) - 1 - weights[::-1].argmax(axis=0), axis=0, out=means, mode="clip")  # in range: clip skips a buffered copy
      np.add(means.reshape(-1), n, out=stds)
    buf = self.buffer
    np.take(vec, self.gather, out=buf, mode="clip")  # planned in range; "raise" with out= copies through a buffer
    # one safe_exp over every std, every binary logit negated (sigmoid) and every categorical logit less its row's largest (softmax: the
    # rows are DESIRE_LEN wide and independent); then each finished in place: elementwise, so each value is the per-head one
    binary, rows, act = buf[self.binary], buf[self.categorical].reshape(-1, DESIRE_LEN), buf[self.stds.start:self.categorical.stop]
    if len(binary): np.negative(binary, out=binary)
    if len(rows): np.subtract(rows, rows.max(axis=-1, keepdims=True), out=rows)
    np.exp(np.minimum(act, EXP_CLIP, out=act), out=act)
    if len(binary): np.divide(1.0, np.add(binary, 1.0, out=binary), out=binary)
    if len(rows): np.divide(rows, rows.sum(axis=-1, keepdims=True), out=rows)
    if self.plan_plus: np.add(self.parsed["plan"], self.parsed["planplus"], out=self.parsed["plan"])
    return self.parsed

def parse_outputs(outputs: np.ndarray, slices: dict[str, Sequence[int]]) -> dict[str, np.ndarray]:
  """The model's (1, N) output vector and its `output_slices` ({name: (start, stop)}) -> named arrays after openpilot's activations.
  A daemon parsing every frame keeps an OutputParser of its layout instead."""
  return OutputParser(slices)(outputs)
