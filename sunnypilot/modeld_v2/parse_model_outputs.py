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

from sunnypilot.modeld_v2.constants import (
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

def sigmoid(x: np.ndarray) -> np.ndarray: return 1.0 / (1.0 + safe_exp(-x))

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

def check_output_slices(slices: object, n: int) -> None:
  """Raise ValueError unless `slices` is {name: [start, stop]} of integers with 0 <= start < stop <= n, each known head as long as
  parse_outputs reads it: a bundle's output_slices, checked before the first frame instead of failing in the middle of a run."""
  if not isinstance(slices, dict): raise ValueError(f"expected {{name: [start, stop]}}, got {type(slices).__name__}")
  for name, span in slices.items():
    if not (isinstance(span, list | tuple) and len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in span)):
      raise ValueError(f"{name!r:.40} is {span!r:.40}, not [start, stop]")
    if not 0 <= span[0] < span[1] <= n: raise ValueError(f"{name!r:.40} [{span[0]}, {span[1]}] falls outside the {n} outputs")
    if (sizes := head_sizes(name)) is not None and span[1] - span[0] not in sizes:
      raise ValueError(f"{name} has {span[1] - span[0]} values, openpilot's layouts have {' or '.join(map(str, sizes))}")

class OutputParser:
  """parse_outputs for one `output_slices` layout, planned once. A mixture-density head holds per hypothesis the means, then log-stds,
  then `selections` logits; with several hypotheses, selection k takes the hypothesis whose logit k has the largest softmax weight (the
  result is (selections, *shape), or `shape` for one selection). Every std of every such head goes through one safe_exp and every binary
  head through one sigmoid: both are elementwise, so each value is what a per-head call gives."""
  def __init__(self, slices: dict[str, Sequence[int]]):
    self.raw = {name: (int(start), int(stop)) for name, (start, stop) in slices.items()}
    self.mdn, std_idx, offset = [], [], 0  # mdn: (name, start, stop, shape, hypotheses, selections, values per half, its std offset)
    for name in MDN_HEADS:
      if name not in self.raw: continue
      start, stop = self.raw[name]
      shape, hypotheses, selections = mdn_layout(name, stop - start)
      n = ((stop - start) // hypotheses - selections) // 2
      self.mdn.append((name, start, stop, shape, hypotheses, selections, n, offset))
      std_idx += [start + h * (stop - start) // hypotheses + n + i for h in range(hypotheses) for i in range(n)]
      offset += hypotheses * n
    self.std_idx = np.asarray(std_idx, np.int64)
    self.binary = [(name, *self.raw[name]) for name in BINARY_HEADS if name in self.raw]
    self.binary_idx = np.asarray([i for _, start, stop in self.binary for i in range(start, stop)], np.int64)
    # every categorical head's rows are DESIRE_LEN wide and independent: one softmax over all of them, then each head's rows
    self.categorical = [(name, shape, int(np.prod(shape)) // DESIRE_LEN) for name, shape in CATEGORICAL_HEADS.items() if name in self.raw]
    self.categorical_idx = np.asarray([i for name, *_ in self.categorical for i in range(*self.raw[name])], np.int64)

  def __call__(self, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """The model's (1, N) output vector -> named arrays after openpilot's activations."""
    vec = np.asarray(outputs, np.float32).reshape(-1)
    stds, out = safe_exp(vec[self.std_idx]), {}
    for name, start, stop, shape, hypotheses, selections, n, offset in self.mdn:
      if hypotheses == 1:  # the means, then the stds: one view each
        out[name], out[f"{name}_std"] = vec[start:start + n].reshape(shape), stds[offset:offset + n].reshape(shape)
        continue
      rows, std = vec[start:stop].reshape(hypotheses, -1), stds[offset:offset + hypotheses * n].reshape(hypotheses, n)
      # openpilot sorts the softmax weights and takes the first of the descending order: the last of an ascending argsort
      picks = softmax(rows[:, 2 * n:2 * n + selections], axis=0).argsort(axis=0)[-1]
      out_shape = shape if selections == 1 else (selections, *shape)
      out[name], out[f"{name}_std"] = rows[picks, :n].reshape(out_shape), std[picks].reshape(out_shape)
    if "plan" in out and "planplus" in out: out["plan"] = out["plan"] + out["planplus"]
    if self.binary:
      probs, at = sigmoid(vec[self.binary_idx]), 0
      for name, start, stop in self.binary: out[name], at = probs[at:at + stop - start], at + stop - start
    if self.categorical:
      rows, at = softmax(vec[self.categorical_idx].reshape(-1, DESIRE_LEN)), 0
      for name, shape, count in self.categorical: out[name], at = rows[at:at + count].reshape(shape), at + count
    if "hidden_state" in self.raw: out["hidden_state"] = vec[slice(*self.raw["hidden_state"])]
    return out

def parse_outputs(outputs: np.ndarray, slices: dict[str, Sequence[int]]) -> dict[str, np.ndarray]:
  """The model's (1, N) output vector and its `output_slices` ({name: (start, stop)}) -> named arrays after openpilot's activations.
  A daemon parsing every frame keeps an OutputParser of its layout instead."""
  return OutputParser(slices)(outputs)
