"""modeld's parse of a model's outputs against openpilot's formulas, written out here (not imported from the package), on hand-written
output vectors: each head's activation, both layouts of plan and lead, float16 overflow, one parse plan per layout bit for bit.

References: openpilot selfdrive/modeld/{constants,parse_model_outputs,fill_model_msg,modeld}.py, controls/lib/{drive_helpers,desire_helper}.py,
sunnypilot modeld_v2/fill_model_msg.py (get_curvature_from_output, temporal pose without sim_pose).
"""
import numpy as np
import pytest

from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser, parse_outputs
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES, output_layout

from openpilot_reference import T, openpilot_plan_t_idxs, sig, varied_plan_x
from output_vectors import Publisher, close, heads, pack, plan_mean, publish, softmax, todays_heads

def test_heads_use_openpilots_activations():
  rng = np.random.default_rng(1)
  raws = heads(rng)
  lead = rng.standard_normal((2, 51)).astype(np.float32)
  lead[:, 48:] = [[0.0, 3.0, -1.0], [1.0, 0.5, 2.0]]  # selection 0 -> hypothesis 1, selection 1 -> 0, selection 2 -> 1
  raws["lead"] = lead.reshape(-1)
  p = parse_outputs(*pack(raws))
  close(p["plan"], plan_mean())
  close(p["plan_std"], np.exp(raws["plan"].reshape(5, 991)[3, 495:990]).reshape(33, 15))
  for sel, hyp in enumerate((1, 0, 1)):
    close(p["lead"][sel], lead[hyp, :24].reshape(6, 4))
    close(p["lead_std"][sel], np.exp(lead[hyp, 24:48]).reshape(6, 4))
  close(p["lane_lines_prob"], sig(raws["lane_lines_prob"]))  # sigmoid of all 8 logits, not a softmax over pairs
  close(p["lead_prob"], sig(raws["lead_prob"]))
  close(p["meta"], sig(raws["meta"]))
  close(p["desire_state"], softmax(raws["desire_state"]))
  close(p["desire_pred"], np.stack([softmax(row) for row in raws["desire_pred"].reshape(4, 8)]))
  close(p["lane_lines"], raws["lane_lines"][:264].reshape(4, 33, 2))
  close(p["lane_lines_std"], np.exp(raws["lane_lines"][264:]).reshape(4, 33, 2))
  close(p["pose"], raws["pose"][:6])
  close(p["pose_std"], np.exp(raws["pose"][6:]))

def test_todays_single_hypothesis_heads():
  """openpilot's is_mhp: a head of exactly 2 x its shape has no hypotheses; every head parsed by openpilot's formulas written here."""
  rng = np.random.default_rng(21)
  raws = todays_heads(rng)
  p = parse_outputs(*pack(raws))
  close(p["plan"], raws["plan"][:495].reshape(33, 15))
  close(p["plan_std"], np.exp(raws["plan"][495:]).reshape(33, 15))
  close(p["lead"], raws["lead"][:72].reshape(3, 6, 4))  # LEAD_MHP_SELECTION x LEAD_TRAJ_LEN x LEAD_WIDTH
  close(p["lead_std"], np.exp(raws["lead"][72:]).reshape(3, 6, 4))
  close(p["lead_prob"], sig(raws["lead_prob"]))
  close(p["lane_lines"], raws["lane_lines"][:264].reshape(4, 33, 2))
  close(p["lane_lines_std"], np.exp(raws["lane_lines"][264:]).reshape(4, 33, 2))
  close(p["road_edges_std"], np.exp(raws["road_edges"][132:]).reshape(2, 33, 2))
  close(p["lane_lines_prob"], sig(raws["lane_lines_prob"]))
  close(p["meta"], sig(raws["meta"]))
  close(p["desire_state"], softmax(raws["desire_state"]))
  close(p["desire_pred"], np.stack([softmax(row) for row in raws["desire_pred"].reshape(4, 8)]))
  for name in ("pose", "road_transform"): close(p[name], raws[name][:6]), close(p[f"{name}_std"], np.exp(raws[name][6:]))
  close(p["wide_from_device_euler_std"], np.exp(raws["wide_from_device_euler"][3:]))
  msgs, values = publish(Publisher(), raws)
  v = values["modelV2"]
  for i in range(3):  # each lead is one selection of the (3, 6, 4) head
    lead, std = raws["lead"][:72].reshape(3, 6, 4)[i], np.exp(raws["lead"][72:]).reshape(3, 6, 4)[i]
    close(v[f"leadsV3.{i}.x"], lead[:, 0]), close(v[f"leadsV3.{i}.aStd"], std[:, 3])
    assert v[f"leadsV3.{i}.prob"] == pytest.approx(sig(raws["lead_prob"][i]))
  close(v["position.x"], plan_mean()[:, 0]), close(list(msgs["modelV2"].modelV2.position.xStd), np.exp(raws["plan"][495:]).reshape(33, 15)[:, 0])

def test_safe_exp_clips_float16_overflow():
  """openpilot's safe_exp: exponents above 11 are clipped (float16 logits of real models overflow a plain exp)."""
  raws = todays_heads(np.random.default_rng(22))
  raws["plan"][495:] = 60.0
  raws["meta"][:] = -200.0
  raws["desire_state"][:] = [300.0, -300.0, 0, 0, 0, 0, 0, 0]
  with np.errstate(over="raise"): p = parse_outputs(*pack(raws))
  close(p["plan_std"], np.full((33, 15), np.exp(11.0)), rtol=1e-6)
  close(p["meta"], np.full(55, 1 / (1 + np.exp(11.0))), rtol=1e-5)
  close(p["desire_state"], [1.0, 0, 0, 0, 0, 0, 0, 0], atol=1e-7)

layout = output_layout  # every generation's fused output_slices, the fixture of the parse and template tests

def per_head_parse(vec: np.ndarray, slices: dict[str, list[int]]) -> dict[str, np.ndarray]:
  """openpilot's parse_model_outputs.py one head at a time, in float32 (parse_mdn, sigmoid, softmax with exponents clipped at 11)."""
  def exp(x): return np.exp(np.minimum(x, 11.0))
  def softmax(x, axis=-1):
    e = exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)
  raw, out = {name: vec[a:b] for name, (a, b) in slices.items()}, {}
  mdn = {"plan": ((33, 15), 5, 1), "planplus": ((33, 15), 1, 0), "lane_lines": ((4, 33, 2), 1, 0), "road_edges": ((2, 33, 2), 1, 0),
         "pose": ((6,), 1, 0), "road_transform": ((6,), 1, 0), "sim_pose": ((6,), 1, 0), "wide_from_device_euler": ((3,), 1, 0),
         "lead": ((6, 4), 2, 3), "desired_curvature": ((1,), 1, 0), "lat_planner_solution": ((33, 4), 1, 0)}
  for name, (shape, hyps, sels) in mdn.items():
    if name not in raw: continue
    if name in ("plan", "lead") and raw[name].size == 2 * int(np.prod(shape)) * max(sels, 1): shape, hyps, sels = (shape if sels == 1 else (sels, *shape)), 1, 0
    rows = raw[name].reshape(hyps, -1)
    n = (rows.shape[1] - sels) // 2
    mean, std = rows[:, :n], exp(rows[:, n:2 * n])
    if hyps == 1: out[name], out[f"{name}_std"] = mean.reshape(shape), std.reshape(shape)
    else:
      picks = [int(np.argsort(softmax(rows[:, 2 * n + k], axis=0))[-1]) for k in range(sels)]
      shape = shape if sels == 1 else (sels, *shape)
      out[name], out[f"{name}_std"] = mean[picks].reshape(shape), std[picks].reshape(shape)
  if "planplus" in out: out["plan"] = out["plan"] + out["planplus"]
  out |= {name: 1.0 / (1.0 + exp(-raw[name])) for name in ("lead_prob", "lane_lines_prob", "meta") if name in raw}
  out |= {name: softmax(raw[name].reshape(shape)) for name, shape in (("desire_state", (8,)), ("desire_pred", (4, 8))) if name in raw}
  if "plan" in out:  # what openpilot's fill_model_msg.py computes from the plan: the lane lines' times, the path's polynomials
    out["plan_t"] = np.array(openpilot_plan_t_idxs(out["plan"][:, 0]), np.float32)
    out["path"] = np.polynomial.polynomial.polyfit(T, out["plan"][:, :3].astype(np.float64), 4).astype(np.float32)
  return out | {k: raw[k] for k in ("hidden_state", "action") if k in raw}  # openpilot leaves the heads it does not activate as they are

@pytest.mark.parametrize("generation", NAMES)
def test_one_parse_plan_per_layout_gives_the_per_head_parse_bit_for_bit(generation):
  """OutputParser (one safe_exp over every std, one sigmoid over every binary head) equals a per-head parse exactly, ties in the
  hypothesis logits included (openpilot picks the last of them)."""
  slices, rng = layout(generation), np.random.default_rng(len(generation))
  parser = OutputParser(slices)
  for i in range(20):
    vec = (rng.standard_normal(max(b for _, b in slices.values())) * (1 + 10 * (i % 3))).astype(np.float32)
    if i % 4 == 0 and "plan" in slices and slices["plan"][1] - slices["plan"][0] > 990: vec[slices["plan"][0] + 990::991][:5] = 1.5  # tied logits
    got, want = parser(vec[None]), per_head_parse(vec, slices)
    assert got.keys() == want.keys()
    for name in want:
      if name == "path": np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=f"{generation} {name}")  # polyfit's own solve
      else: np.testing.assert_array_equal(got[name], want[name], err_msg=f"{generation} {name}")

def test_planplus_is_added_to_the_plan_and_lat_planner_solution_is_parsed():
  """sunnypilot's split runner: plan = plan + planplus (means); lat_planner_solution a single (33, 4) mean/std pair."""
  rng = np.random.default_rng(23)
  raws = todays_heads(rng) | {"planplus": rng.standard_normal(990).astype(np.float32), "lat_planner_solution": rng.standard_normal(264)}
  p = parse_outputs(*pack(raws))
  close(p["plan"], raws["plan"][:495].reshape(33, 15) + raws["planplus"][:495].reshape(33, 15))
  close(p["plan_std"], np.exp(raws["plan"][495:]).reshape(33, 15)), close(p["planplus_std"], np.exp(raws["planplus"][495:]).reshape(33, 15))
  close(p["lat_planner_solution"], raws["lat_planner_solution"][:132].reshape(33, 4))

def test_output_slices_take_both_layouts_of_plan_and_lead():
  """A bundle's output_slices are checked at load: plan and lead as 5 and 2 hypotheses (0.9.x) or as one mean/std pair (today's 990 and 144
  floats, openpilot's is_mhp), nothing between."""
  from sunnypilot.modeld_v2.model.parse_model_outputs import check_head_sizes
  for plan, lead in ((5 * (2 * 33 * 15 + 1), 2 * (2 * 6 * 4 + 3)), (2 * 33 * 15, 2 * 3 * 6 * 4)):
    check_head_sizes({"plan": [0, plan], "lead": [plan, plan + lead]})
  for name, size in (("plan", 991), ("plan", 989), ("lead", 143), ("lead", 145)):
    with pytest.raises(ValueError, match=f"{name} has {size} values"): check_head_sizes({name: [0, size]})

def test_lane_line_times_equal_openpilots_loop_bit_for_bit():
  """plan_t_idxs (Python floats, the search carried on) writes what openpilot's loop writes, as float32, on plans that go back and
  forth, stand still (coincident points: NaN), end short of the distances, or land on a distance or just beside it."""
  from sunnypilot.modeld_v2.model.parse_model_outputs import plan_t_idxs
  rng = np.random.default_rng(21)
  for i in range(600):
    plan_x = varied_plan_x(rng, i)
    np.testing.assert_array_equal(plan_t_idxs(plan_x), np.array(openpilot_plan_t_idxs(plan_x), np.float32), err_msg=f"plan {i}")
