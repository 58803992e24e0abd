"""The output parse in the model's graph (compile/output_parse.py) against the host's numpy parse (model/parse_model_outputs.py, itself held
to openpilot's formulas in tests/model): every float of the block within 1e-6 relative, on every generation's stand-in bundle over many
frames, and on crafted layouts (planplus, lat_planner_solution, sim_pose, desired_curvature) and outputs (NaN, inf, values near float32's
limits, tied hypotheses, plans that go back and forth); the parse's exp over its whole range; the path in float32 for devices without
float64."""
import numpy as np
import pytest
from tinygrad import Tensor, TinyJit, dtypes

from sunnypilot.modeld_v2.compile.output_parse import message_floats, plan_t, poly_path, safe_exp
from sunnypilot.modeld_v2.model.constants import IDX_N
from sunnypilot.modeld_v2.model.parse_model_outputs import POLY_FIT, OutputParser, plan_t_idxs
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, reference_block, trace
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES, output_layout

from conftest import realized
from openpilot_reference import GATE, varied_plan_x

RTOL, ATOL = 1e-6, 1e-37  # relative; below 1e-37 (float32's subnormals, where exp underflows) values may differ by that much
FRAMES = 40

def assert_block(got: np.ndarray, want: np.ndarray, what: str) -> None:
  np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, equal_nan=True, err_msg=what)

@pytest.mark.parametrize("generation", NAMES)
def test_every_generations_bundle_writes_the_host_parse(stand_in_bundles, generation):
  """The compiled stand-in, frame after frame with its states fed back: the block it returns beside `outputs` is the host's parse of
  those outputs, and its metadata records the layout this build traces."""
  _, summary = stand_in_bundles(generation)
  model = load_bundle(summary["output"])
  slices = model.metadata["output_slices"]
  layout, parser = trace(slices), OutputParser(slices)
  assert model.metadata[FLOAT_BLOCK] == layout.to_json() and model.output_specs[FLOAT_BLOCK].shape == (len(layout.sources),)
  specs, rng = model.input_specs, np.random.default_rng(5)
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  for frame in range(FRAMES):
    inputs = {n: rng.integers(0, 256, s.shape, dtype=np.uint8) if s.dtype == "|u1" else rng.standard_normal(s.shape).astype(np.float32) * 3
              for n, s in specs.items() if n not in states} | {k: v for k, v in GATE.items() if k in specs}
    model.run(**{n: realized(v) for n, v in inputs.items()}, **states, output_buffers=outs)
    assert_block(outs[FLOAT_BLOCK].numpy(), reference_block(parser, layout, outs["outputs"].numpy()), f"{generation} frame {frame}")

def crafted_slices(generation: str) -> dict[str, list[int]]:
  """A stand-in layout with the heads no stand-in has appended: planplus, lat_planner_solution, sim_pose, desired_curvature."""
  slices, at = dict(output_layout(generation)), max(b for _, b in output_layout(generation).values())
  for name, size in (("planplus", 990), ("lat_planner_solution", 264), ("sim_pose", 12), ("desired_curvature", 2)):
    if name not in slices: slices[name], at = [at, at + size], at + size
  return slices

def crafted_outputs(rng, parser: OutputParser, width: int, frame: int) -> np.ndarray:
  """Outputs of many kinds, by frame: noise of growing scale, a plan that goes forward or back and forth (the lane lines' times), tied
  hypothesis logits, non-finite values (among them a selection logit), values near float32's limits."""
  vec = (rng.standard_normal(width) * (1, 5, 30)[frame % 3]).astype(np.float32)
  x = varied_plan_x(rng, frame)
  rows = [h.rows for h in parser.hypotheses if h.means == parser.spans["plan"]]
  for first in (rows[0][:, 0] if rows else [parser.gather[parser.spans["plan"].start]]): vec[first:first + 15 * IDX_N:15] = x
  if frame % 5 == 1:
    for h in parser.hypotheses: vec[h.logits] = 1.5  # every hypothesis tied: the last one is picked
  if frame % 7 == 2: vec[rng.integers(0, width, width // 20)] = rng.choice([np.nan, np.inf, -np.inf], width // 20)
  if frame % 7 == 4:  # a non-finite selection logit reads as 0, the largest here: its hypothesis is picked, for the plan's path too
    for h in parser.hypotheses:
      vec[h.logits] = -1.0 - np.arange(len(h.logits))[:, None]  # hypothesis 0 the most likely, unless one is NaN (by frame: 0, 1, 2)
      vec[h.logits[frame // 7 % len(h.logits)]] = np.nan
  if frame % 11 == 3:
    with np.errstate(over="ignore"): vec = np.clip(vec * np.float32(1e37), -3e38, 3e38).astype(np.float32)
  return vec[None]

@pytest.mark.parametrize("generation", ["native", "split_current", "supercombo_20hz"])
def test_crafted_layouts_and_outputs(generation):
  slices = crafted_slices(generation)
  layout, parser, width = trace(slices), OutputParser(slices), max(b for _, b in slices.values())
  assert {"desired_curvature", "lat_planner"} <= set(layout.reads), "read from the block's tail"
  jit, rng = TinyJit(lambda outputs: message_floats(outputs, slices, layout).realize()), np.random.default_rng(9)
  for frame in range(24):
    vec = crafted_outputs(rng, parser, width, frame)
    with np.errstate(all="ignore"): want = reference_block(parser, layout, vec)  # near float32's limits the host's sums overflow too
    assert_block(jit(realized(vec)).numpy(), want, f"{generation} frame {frame}")

def test_safe_exp_within_a_few_roundings():
  """exp(min(x, 11)) over float32's whole exponent range, and with the clip of 88 the softmax uses: within 3.5e-7 relative of float64's exp
  (numpy's float32 exp, the host's, is within 2e-7: together under the block's 1e-6); 0 under e^-87 (the host's subnormals are below
  1.2e-38)."""
  x = np.concatenate([np.linspace(-87, 89, 400_001, dtype=np.float32), np.float32([-1e30, -100, -87.5, 11.5, 1e30])])
  for clip in (11.0, 88.0):
    got, want = safe_exp(Tensor(x), clip).numpy().astype(np.float64), np.exp(np.minimum(x.astype(np.float64), clip))
    normal = want > 1.2e-38
    assert (np.abs(got - want)[normal] / want[normal]).max() <= 3.5e-7, clip
    assert (got[~normal] == 0).all() and np.isfinite(got).all(), clip

def test_plan_t_and_path_on_varied_plans():
  """plan_t against plan_t_idxs (openpilot's loop), NaN where it is NaN, on plans that go back and forth, stand still, end short; the
  path in float64 (CPU, CUDA) within 1e-6 relative of POLY_FIT's product, and in float32 (QCOM: no float64) within 1e-6 of the size of
  its terms: a coefficient near 0 is a sum of large terms there."""
  rng = np.random.default_rng(3)
  t = TinyJit(lambda px: plan_t(px).realize())
  for i in range(200):
    px = varied_plan_x(rng, i)
    assert_block(t(realized(px)).numpy(), plan_t_idxs(px), f"plan {i}")
  path = {wide: TinyJit(lambda pos, wide=wide: poly_path(pos, wide).realize()) for wide in (dtypes.float64, dtypes.float32)}
  for i in range(50):
    pos = np.stack([varied_plan_x(rng, i), rng.standard_normal(33) * 3, rng.standard_normal(33)], axis=1).astype(np.float32)
    want, scale = POLY_FIT @ pos.astype(np.float64), np.abs(POLY_FIT) @ np.abs(pos.astype(np.float64))
    assert_block(path[dtypes.float64](realized(pos)).numpy(), want.astype(np.float32), f"plan {i} float64")
    assert (np.abs(path[dtypes.float32](realized(pos)).numpy() - want) <= 1e-6 * scale).all(), f"plan {i} float32"
