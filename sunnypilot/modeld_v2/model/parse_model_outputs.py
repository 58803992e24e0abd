"""The model's raw output vector -> named arrays, with openpilot's activation for each head.

Mirrors openpilot selfdrive/modeld/parse_model_outputs.py (commaai/openpilot @75a8e5d1) and sunnypilot modeld_v2/parse_model_outputs_split.py
(sunnypilot/sunnypilot @a7fda632: every head optional; `is_mhp`: plan and lead have hypotheses unless the head is exactly one mean/std
pair of its shape, as today's models' 990-float plan and 144-float lead are; `safe_exp` clips exponents at 11, as float16 logits overflow).
sunnypilot's TinygradSplitRunner (sunnypilot/models/runners/tinygrad/tinygrad_runner.py @06b23b5a) adds a `planplus` head's mean to the
plan's. A head the model lacks is simply absent from the result. Arrays carry no batch axis; standard deviations are under `<name>_std`.
With a plan, the parse also derives what openpilot's fill_model_msg.py computes from it (commaai/openpilot @028c5eb9): `plan_t`, the time
the plan reaches each lane-line distance, and `path`, the plan's position as degree-4 polynomials: everything published that is computed
from the outputs alone, which the in-graph parse (compile/output_parse.py) computes from the same plan.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

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
  POLY_PATH_DEGREE,
  POSE_WIDTH,
  T_IDXS,
  WIDE_FROM_DEVICE_WIDTH,
  X_IDXS,
  Plan,
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
# read as they are: the features fed back, and the action head today's openpilot takes its action from (modeld.py @084747c
# get_action_from_model: [lateral acceleration, acceleration], unparsed)
RAW_HEADS = ("hidden_state", "action")

# *** what the parse derives from the plan: the lane lines' times and the path's polynomials ***

# numpy compares a float32 plan point with a Python float in float32; X_IDXS (3 k^2 / 16 m) are exact in float32, so a float64 compare agrees
assert all(float(np.float32(x)) == x for x in X_IDXS), "X_IDXS must be float32 values for plan_t_idxs' compares"

def plan_t_idxs(plan_x: np.ndarray) -> np.ndarray:
  """The time at which the plan reaches each X_IDXS distance, linear between plan points: 0 at the first; 10 s for the first distance
  beyond the plan's end and NaN after it; NaN where two plan points coincide. On Python floats (numpy scalars cost ~10x per step);
  openpilot restarts its search at the first plan point for every distance, this carries it on: the distances grow, so it stops at the
  same point."""
  px, t, ti = plan_x.tolist(), [0.0] + [float("nan")] * (IDX_N - 1), 0
  for xi in range(1, IDX_N):
    while ti < IDX_N - 1 and px[ti + 1] < X_IDXS[xi]: ti += 1  # the last plan point short of this distance
    if ti == IDX_N - 1:
      t[xi] = T_IDXS[-1]
      break
    x0, x1 = px[ti], px[ti + 1]
    p = (X_IDXS[xi] - x0) / (x1 - x0) if abs(x1 - x0) > 1e-9 else float("nan")
    t[xi] = p * T_IDXS[ti + 1] + (1 - p) * T_IDXS[ti]
  return np.array(t, np.float32)  # the message's float32: the byte template concatenates it with the other float32 arrays, no cast

def _poly_fit_matrix() -> np.ndarray:
  """numpy.polynomial's polyfit on the fixed T_IDXS as one matrix: the least-squares solve of its column-scaled Vandermonde matrix (the
  pseudo-inverse with polyfit's rcond), then its scaling undone, so a fit is one product instead of an SVD per frame."""
  vander = np.polynomial.polynomial.polyvander(np.asarray(T_IDXS, np.float64), POLY_PATH_DEGREE)
  scale = np.sqrt(np.square(vander).sum(0))
  return np.linalg.pinv(vander / scale, rcond=len(T_IDXS) * np.finfo(np.float64).eps) / scale[:, None]

POLY_FIT = _poly_fit_matrix()
# plan positions below this in magnitude give path coefficients float32 can hold (each is a weighted sum of positions)
POLY_PATH_LIMIT = float(np.finfo(np.float32).max / np.abs(POLY_FIT).sum(axis=1).max())

def poly_path(position: np.ndarray) -> np.ndarray:
  """The plan's (33, 3) position as degree-4 polynomials of time, lowest power first (numpy.polynomial's polyfit, as openpilot): (5, 3)."""
  return POLY_FIT @ np.asarray(position, np.float64)

# *** the heads ***

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
  return {"lead_prob": (LEAD_MHP_SELECTION,), "lane_lines_prob": (2 * NUM_LANE_LINES,), "action": (2,)}.get(name)

def check_head_sizes(slices: Mapping[str, Sequence[int]]) -> None:
  """Raise ValueError unless each known head of `slices` ({name: [start, stop]}, its structure checked) is as long as parse_outputs
  reads it: a bundle's output_slices, checked before the first frame instead of failing in the middle of a run."""
  for name, (start, stop) in slices.items():
    if (sizes := head_sizes(name)) is not None and stop - start not in sizes:
      raise ValueError(f"{name} has {stop - start} values, openpilot's layouts have {' or '.join(map(str, sizes))}")

class Hypotheses(NamedTuple):
  """A mixture-density head whose hypothesis each selection takes is picked per call: where its means and stds go in the parser's buffer
  ((selections, n) values each), the indices of its selection logits in the output vector (hypotheses, selections), and of each
  hypothesis' means (hypotheses, n): hypothesis h's row starts `stride` values after hypothesis h - 1's."""
  means: slice
  stds: slice
  logits: np.ndarray
  rows: np.ndarray
  stride: int

class OutputParser:
  """parse_outputs for one `output_slices` layout, planned once. A mixture-density head holds per hypothesis the means, then log-stds,
  then `selections` logits; with several hypotheses, selection k takes the hypothesis whose logit k has the largest softmax weight (the
  result is (selections, *shape), or `shape` for one selection).

  Every call writes one float32 buffer, laid out as [every head's means | every std | every binary head | every categorical head |
  hidden_state and action as they are | what is derived from the plan: `plan_t` (the time the plan reaches each lane-line distance) and
  `path` (its position as polynomials)], with one gather from the output vector (its hypotheses' rows picked first), then the activations in place, one exp over
  all three activated parts: elementwise, so each value is what a per-head call gives. The result is the same dict of the same views of
  that buffer on every call: the next call overwrites them (copy what must outlive the frame). The in-graph parse
  (compile/output_parse.py) computes the same buffer from the same plan (`gather`, `hypotheses`, the regions)."""
  def __init__(self, slices: Mapping[str, Sequence[int]]):
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
    raw_heads = [name for name in RAW_HEADS if name in self.raw]
    derived = categorical_end + sum(self.raw[name][1] - self.raw[name][0] for name in raw_heads)
    self.buffer = np.zeros(derived + (IDX_N + 3 * (POLY_PATH_DEGREE + 1) if "plan" in self.raw else 0), np.float32)
    self.gather = np.zeros(derived, np.int64)  # buffer[i] = vec[gather[i]] before the activations; hypotheses' rows set per call
    self.stds, self.binary, self.categorical = slice(means, stds), slice(stds, binary_end), slice(binary_end, categorical_end)
    self.derived = slice(derived, len(self.buffer))  # plan_t and path: computed from the plan, not read from the outputs
    self.values = self.buffer[:derived]  # what is read from the outputs (a finite check covers these: plan_t may be NaN by openpilot's rule)
    self.parsed: dict[str, np.ndarray] = {}
    self.spans: dict[str, slice] = {}  # where each parsed array lies in the buffer
    self.hypotheses: list[Hypotheses] = []
    at = 0
    for (name, start, _shape, hypotheses, selections, n), size in zip(heads, sizes, strict=True):
      mean, std = slice(at, at + size), slice(means + at, means + at + size)
      self.spans[name], self.spans[f"{name}_std"] = mean, std
      if hypotheses == 1: self.gather[mean], self.gather[std] = np.arange(start, start + n), np.arange(start + n, start + 2 * n)
      else:  # each hypothesis' row: its means, then as many log-stds, then the selection logits
        rows = start + (2 * n + selections) * np.arange(hypotheses)[:, None]
        self.hypotheses.append(Hypotheses(mean, std, rows + 2 * n + np.arange(selections), rows + np.arange(n), 2 * n + selections))
      at += size
    # per picked head, the views of gather its call writes: its means as (selections, n) and its stds
    self.picked = [(self.gather[h.means].reshape(-1, h.rows.shape[1]), self.gather[h.stds], h) for h in self.hypotheses]
    at = stds
    for name in (*binary, *categorical, *raw_heads):
      start, stop = self.raw[name]
      self.gather[at:at + stop - start] = np.arange(start, stop)
      self.spans[name] = slice(at, at + stop - start)
      at += stop - start
    if "plan" in self.raw: self.spans["plan_t"], self.spans["path"] = slice(derived, derived + IDX_N), slice(derived + IDX_N, len(self.buffer))
    shapes = {name: shape for name, _, shape, *_ in heads} | CATEGORICAL_HEADS | {"path": (POLY_PATH_DEGREE + 1, 3)}
    for name, span in self.spans.items(): self.parsed[name] = self.buffer[span].reshape(shapes.get(name.removesuffix("_std"), (-1,)))
    self.plan_plus = "plan" in self.parsed and "planplus" in self.parsed

  def __call__(self, outputs: np.ndarray) -> dict[str, np.ndarray]:
    """The model's (1, N) output vector -> named arrays after openpilot's activations (views of `buffer`, refilled by the next call)."""
    vec = np.asarray(outputs, np.float32).reshape(-1)
    for means, stds, h in self.picked:
      # openpilot sorts the softmax weights and takes the first of the descending order: the last of the largest, as a stable sort has it
      weights = softmax(vec[h.logits], axis=0)
      np.take(h.rows, len(weights) - 1 - weights[::-1].argmax(axis=0), axis=0, out=means, mode="clip")  # in range: clip skips a buffered copy
      np.add(means.reshape(-1), h.rows.shape[1], out=stds)
    buf = self.buffer
    np.take(vec, self.gather, out=buf[:len(self.gather)], mode="clip")  # planned in range; "raise" with out= copies through a buffer
    # one safe_exp over every std, every binary logit negated (sigmoid) and every categorical logit less its row's largest (softmax: the
    # rows are DESIRE_LEN wide and independent); then each finished in place: elementwise, so each value is the per-head one
    binary, rows, act = buf[self.binary], buf[self.categorical].reshape(-1, DESIRE_LEN), buf[self.stds.start:self.categorical.stop]
    if len(binary): np.negative(binary, out=binary)
    if len(rows): np.subtract(rows, rows.max(axis=-1, keepdims=True), out=rows)
    np.exp(np.minimum(act, EXP_CLIP, out=act), out=act)
    if len(binary): np.divide(1.0, np.add(binary, 1.0, out=binary), out=binary)
    if len(rows): np.divide(rows, rows.sum(axis=-1, keepdims=True), out=rows)
    if self.plan_plus: np.add(self.parsed["plan"], self.parsed["planplus"], out=self.parsed["plan"])
    if "plan_t" in self.parsed:
      position = self.parsed["plan"][:, Plan.POSITION]
      self.parsed["plan_t"][:] = plan_t_idxs(position[:, 0])
      self.parsed["path"][:] = poly_path(position)  # float64, stored as the message's float32
    return self.parsed

def parse_outputs(outputs: np.ndarray, slices: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
  """The model's (1, N) output vector and its `output_slices` ({name: (start, stop)}) -> named arrays after openpilot's activations.
  A daemon parsing every frame keeps an OutputParser of its layout instead."""
  return OutputParser(slices)(outputs)
