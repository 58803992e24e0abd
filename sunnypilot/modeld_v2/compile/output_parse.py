"""openpilot's output parse as tinygrad operations appended to the model's graph: the model's output vector -> the float block of the three
messages (model/published_floats.py), so modeld publishes a copy instead of parsing in Python.

The host's parse (model/parse_model_outputs.py OutputParser), computed from the same plan of indices: non-finite outputs read as 0 (modeld
parses such a frame zeroed, and publishes it invalid); per mixture-density head the hypothesis of the largest selection logit (the largest
softmax weight), the last of equal ones; means as they are (the plan's plus a planplus head's); stds safe_exp(x) = exp(min(x, 11)); binary
heads 1 / (1 + safe_exp(-x)); categorical rows' softmax as 1 / sum_k exp(x_k - x), the host's exp(x - max) / sum_k exp(x_k - max) without
the max (its clip at 11 is never reached); from the plan, the lane lines' times (plan_t_idxs) and the path's polynomials (the fixed
least-squares product, in float64 where the device has it). exp is written out with its argument reduced by a two-part ln 2 (Cody and
Waite): tinygrad's exp2(x / ln 2) rounds that product and costs up to 1e-6 relative at the exponents a softmax meets.

Three elementwise kernels (a kernel computes every branch of a concatenation for every element, so what reads many outputs is apart): the
plan's positions (its picked hypothesis), the values derived from them (plan_t, the path), then the block, each float from one output
(its picked hypothesis' row), its softmax row, or one derived value.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.dtype import DType

from sunnypilot.modeld_v2.model.constants import DESIRE_LEN, IDX_N, T_IDXS, X_IDXS, Plan
from sunnypilot.modeld_v2.model.parse_model_outputs import CATEGORICAL_HEADS, EXP_CLIP, POLY_FIT, OutputParser
from sunnypilot.modeld_v2.model.published_floats import FloatLayout

LN2_HI, LN2_LO = 0.693145751953125, 1.4286068203094173e-06  # ln 2 in two parts; n * LN2_HI is exact for |n| < 2^11
EXP_MIN = -87.0  # below this exp is under float32's smallest normal number: 0 here (the host's subnormals differ by less than 1.2e-38)
TAYLOR = [1 / math.factorial(k) for k in range(8)]  # exp(r) for |r| <= ln(2) / 2: the degree-7 term's error is under 6e-9 of it
MEAN, STD, BINARY, SOFTMAX, DERIVED = range(5)  # how a block float is computed

def safe_exp(x: Tensor, clip: float = EXP_CLIP) -> Tensor:
  """openpilot's safe_exp, exp(min(x, clip)), within 3e-7 relative (1.1e-7 for |x| < 20): x = n ln 2 + r, exp(r) by its Taylor series, 2^n
  from its bits; `clip` at most 88 (2^n must stay a float32)."""
  x = x.minimum(clip)
  n = (x * (1 / math.log(2)) + 0.5).floor()
  r = (x - n * LN2_HI) - n * LN2_LO
  poly: Tensor | float = TAYLOR[-1]
  for c in reversed(TAYLOR[:-1]): poly = poly * r + c
  scale = ((n.maximum(EXP_MIN / math.log(2) - 1).cast(dtypes.int32) + 127) * (1 << 23)).bitcast(dtypes.float32)
  return (x < EXP_MIN).where(0.0, poly * scale)

def finite(x: Tensor) -> Tensor: return x.isfinite().where(x, 0.0)

def last_argmax(logits: list[Tensor]) -> Tensor:
  """Per element, the index of the largest of `logits`, the last of equal ones (openpilot's descending sort of the softmax weights,
  stable): elementwise over the few hypotheses."""
  assert len(logits) > 1, "one hypothesis has nothing to pick"
  best = logits[0]
  pick: Tensor | int = 0
  for h, logit in enumerate(logits[1:], start=1):
    pick, best = (logit >= best).where(h, pick), best.maximum(logit)
  assert isinstance(pick, Tensor)
  return pick

def plan_t(px: Tensor) -> Tensor:
  """plan_t_idxs, elementwise: per lane-line distance X_IDXS[i] the time the plan reaches it, linear between the first plan point k whose
  successor reaches it and that successor; 10 s for the first distance beyond the plan, NaN after it and where two plan points coincide.
  As t[k] + p (t[k+1] - t[k]) with t[k] = 10 k^2 / 32^2, which for p in (0, 1] or k = 0 (the only cases) rounds no worse than openpilot's
  p t[k+1] + (1 - p) t[k]."""
  x, before = Tensor(np.array(X_IDXS, np.float32)), Tensor(np.array([-math.inf, *X_IDXS[:-1]], np.float32))
  points = [px[j:j + 1] for j in range(IDX_N)]
  k: Tensor | int = IDX_N - 1  # no plan point reaches the distance
  x0: Tensor | float = 0.0
  x1: Tensor | float = 0.0
  for j in reversed(range(1, IDX_N)):  # the first successor that reaches it wins
    reaches = points[j] >= x
    k, x0, x1 = reaches.where(j - 1, k), reaches.where(points[j - 1], x0), reaches.where(points[j], x1)
  assert isinstance(k, Tensor) and isinstance(x0, Tensor) and isinstance(x1, Tensor), "a plan of more than one point"
  # differences of halves: exactly the halved differences, which for plan points near float32's limit stay finite, as openpilot's in float64
  step, span = T_IDXS[-1] / (IDX_N - 1) ** 2, x1 * 0.5 - x0 * 0.5
  inside = (span.abs() > 0.5e-9).where(k * k * step + (x * 0.5 - x0 * 0.5) / span * ((2 * k + 1) * step), math.nan)
  farthest = points[1]
  for p in points[2:]: farthest = farthest.maximum(p)
  beyond = (farthest < x).where((farthest < before).where(math.nan, T_IDXS[-1]), inside)  # 10 s at the first distance beyond, NaN after
  return beyond[1:].pad(((1, 0),))  # 0 at the first distance

def poly_path(position: Tensor, wide: DType | None = None) -> Tensor:
  """The plan's (33, 3) position as degree-4 polynomials of time (the host's POLY_FIT product, unrolled), in `wide`: by default float64
  where the device has it (not QCOM), as float32 rounds a near-zero coefficient's sum of large terms far from the host's float64."""
  if wide is None: wide = dtypes.float64 if dtypes.float64 in Device[str(position.device)].renderer.supported_dtypes() else dtypes.float32
  weights, position = Tensor(POLY_FIT.astype(wide.fmt)), position.cast(wide)
  total = weights[:, 0:1] * position[0:1]
  for k in range(1, IDX_N): total = total + weights[:, k:k + 1] * position[k:k + 1]
  return total.cast(dtypes.float32)

class _Sources:
  """Where each block float comes from, as per-float index arrays (the graph's constants)."""
  def __init__(self, parser: OutputParser, sources: np.ndarray):
    self.parser, n = parser, len(sources)
    self.kind, self.index, self.stride, self.logit, self.row, self.derived = (np.zeros(n, np.int32) for _ in range(6))
    self.hypotheses, self.plus = np.ones(n, np.int32), np.full(n, -1, np.int32)
    rows = {}  # a categorical value's row start in the outputs
    for name in (name for name in CATEGORICAL_HEADS if name in parser.raw):
      span, start = parser.spans[name], parser.raw[name][0]
      rows.update({span.start + i: start + i // DESIRE_LEN * DESIRE_LEN for i in range(span.stop - span.start)})
    plan, plus = parser.spans.get("plan"), parser.spans.get("planplus") if parser.plan_plus else None
    for i, s in enumerate(sources.tolist()):
      if s >= parser.derived.start: self.kind[i], self.derived[i] = DERIVED, s - parser.derived.start
      elif parser.categorical.start <= s < parser.categorical.stop: self.kind[i], self.index[i], self.row[i] = SOFTMAX, parser.gather[s], rows[s]
      else:
        self.kind[i] = STD if parser.stds.start <= s < parser.stds.stop else BINARY if parser.binary.start <= s < parser.binary.stop else MEAN
        self.index[i] = parser.gather[s]
        for h in parser.hypotheses:
          for part, shift in ((h.means, 0), (h.stds, h.rows.shape[1])):
            if part.start <= s < part.stop:  # hypothesis 0's row; the picked one is `stride` on per hypothesis
              selection, col = divmod(s - part.start, h.rows.shape[1])
              self.index[i], self.stride[i], self.hypotheses[i], self.logit[i] = h.rows[0, col] + shift, h.stride, len(h.rows), h.logits[0, selection]
        if plus is not None and plan is not None and plan.start <= s < plan.stop: self.plus[i] = parser.gather[plus.start + s - plan.start]
    self.max_hypotheses = max([len(h.rows) for h in parser.hypotheses], default=1)

  def derive(self, vec: Tensor) -> Tensor:
    """plan_t and the path, from the plan's positions (its picked hypothesis, plus planplus), realized first: each derived value reads
    them all, and a picked hypothesis per read would multiply the kernel's code (and tinygrad's time to generate it) by the points."""
    parser = self.parser
    span = parser.spans["plan"]
    hyp = next((h for h in parser.hypotheses if h.means == span), None)
    first = int(parser.gather[span.start]) if hyp is None else int(hyp.rows[0, 0])
    rows = lambda start: vec[start:start + span.stop - span.start].reshape(IDX_N, -1)[:, Plan.POSITION]
    position = rows(first)
    if hyp is not None:
      pick = last_argmax([finite(vec[int(hyp.logits[h, 0])]) for h in range(len(hyp.rows))])  # as the block picks: non-finite reads as 0
      for h in range(1, len(hyp.rows)): position = (pick == h).where(rows(first + h * hyp.stride), position)
    position = finite(position)
    if parser.plan_plus: position = position + finite(rows(int(parser.gather[parser.spans["planplus"].start])))
    position = position.contiguous()
    return Tensor.cat(plan_t(position[:, 0]), poly_path(position).reshape(-1)).contiguous()

  def block(self, vec: Tensor) -> Tensor:
    """Each float from its output (its picked hypothesis' row, computed here per float), its softmax row, or a derived value."""
    const, last = Tensor, int(vec.numel()) - 1
    kind, index = const(self.kind), const(self.index)
    raw = vec[index]
    if self.max_hypotheses > 1:  # the picked hypothesis' row, at fixed indices per hypothesis (a computed index costs a kernel of its own)
      logits = [(const(self.hypotheses) > h).where(finite(vec[const(np.minimum(self.logit + h * self.stride, last))]), -math.inf)
                for h in range(self.max_hypotheses)]
      pick = last_argmax(logits)
      for h in range(1, self.max_hypotheses): raw = (pick == h).where(vec[const(np.minimum(self.index + h * self.stride, last))], raw)
    raw = finite(raw)
    if (self.plus >= 0).any(): raw = raw + (const(self.plus) >= 0).where(finite(vec[const(self.plus.clip(0))]), 0.0)
    e = safe_exp((kind == BINARY).where(-raw, raw))
    value = (kind == MEAN).where(raw, (kind == STD).where(e, (e + 1).reciprocal()))
    if (self.kind == SOFTMAX).any():  # 1 / sum_k exp(x_k - x), clipped where the value is under 1e-38 anyway
      row = [finite(vec[const(np.minimum(self.row + k, last))]) for k in range(DESIRE_LEN)]
      total = sum(safe_exp(x - raw, clip=88.0) for x in row)
      assert isinstance(total, Tensor)
      value = (kind == SOFTMAX).where(total.reciprocal(), value)
    if (self.kind == DERIVED).any(): value = (kind == DERIVED).where(self.derive(vec)[const(self.derived)], value)
    return value

def message_floats(outputs: Tensor, slices: Mapping[str, Sequence[int]], layout: FloatLayout) -> Tensor:
  """The float block of `layout` (published_floats.trace of these `slices`) from the model's (1, N) float32 outputs."""
  return _Sources(OutputParser(slices), layout.sources).block(outputs.reshape(-1))
