"""modeld's published fields against openpilot's formulas, written out here (not imported from the package), on hand-written output vectors.

References: openpilot selfdrive/modeld/{constants,parse_model_outputs,fill_model_msg,modeld}.py, controls/lib/{drive_helpers,desire_helper}.py,
sunnypilot modeld_v2/fill_model_msg.py (get_curvature_from_output, temporal pose without sim_pose).
"""
from types import SimpleNamespace

import numpy as np
import pytest

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon import messaging
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.messaging import new_message
from sunnypilot.modeld_v2.model.desire_helper import DesireHelper
from sunnypilot.modeld_v2.model.drive_helpers import action_times
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES, FrameInfo, frame_fields
from sunnypilot.modeld_v2.model.generations import GENERATIONS, Rules
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser, parse_outputs
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES, output_layout

from openpilot_reference import T, X, car, openpilot_plan_t_idxs, sig, varied_plan_x

# openpilot's constants, written out
DT = 0.05
OFF, PRE, STARTING, FINISHING = 0, 1, 2, 3  # LaneChangeState
NONE, LEFT, RIGHT = 0, 1, 2  # LaneChangeDirection
LANE_CHANGE_LEFT, LANE_CHANGE_RIGHT = 3, 4  # Desire

def softmax(x):
  e = np.exp(np.asarray(x, np.float64) - np.max(x))
  return e / e.sum()
def logit(p): return np.log(np.asarray(p, np.float64) / (1 - np.asarray(p, np.float64))).astype(np.float32)
def close(a, b, rtol=1e-5, atol=1e-6): np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)

def plan_mean(v0=20.0, a0=0.5, yaw_rate=0.02, yaw_accel=0.001) -> np.ndarray:
  """(33, 15): position, velocity, acceleration, orientation, orientation rate at T; a car speeding up while turning left."""
  m = np.zeros((33, 15), np.float32)
  m[:, 0], m[:, 3], m[:, 6] = v0 * T + 0.5 * a0 * T ** 2, v0 + a0 * T, a0
  m[:, 1] = 0.1 * T ** 2
  m[:, 11], m[:, 14] = yaw_rate * T + 0.5 * yaw_accel * T ** 2, yaw_rate + yaw_accel * T
  return m

def heads(rng, plan=None, winner=3, meta_p=None) -> dict[str, np.ndarray]:
  """Raw heads of a current model: the plan's hypothesis `winner` carries `plan` (the largest selection logit), the others noise."""
  plan_raw = rng.standard_normal((5, 991)).astype(np.float32)
  plan_raw[winner, :495] = (plan_mean() if plan is None else plan).reshape(-1)
  plan_raw[:, 990] = [0.1, -0.3, 0.2, 0.0, -1.0]
  plan_raw[winner, 990] = 2.0
  meta = logit(np.full(55, 0.001) if meta_p is None else meta_p)
  return {"pose": rng.standard_normal(12), "wide_from_device_euler": rng.standard_normal(6), "road_transform": rng.standard_normal(12),
          "plan": plan_raw.reshape(-1), "lane_lines": rng.standard_normal(528), "lane_lines_prob": rng.standard_normal(8) * 3,
          "road_edges": rng.standard_normal(264), "lead": rng.standard_normal(102), "lead_prob": rng.standard_normal(3),
          "desire_state": np.array([4.0, 0, 0, 0, 0, 0, 0, 0]), "meta": meta, "desire_pred": rng.standard_normal(32)}

def pack(raws: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, list[int]]]:
  vec, slices, start = [], {}, 0
  for name, raw in raws.items():
    slices[name] = [start, start + raw.size]
    start += raw.size
    vec.append(np.asarray(raw, np.float32).reshape(-1))
  return np.concatenate(vec)[None], slices

def frame(frame_id=1, lat_t=0.275, long_t=0.675, calib=True, dropped=0) -> FrameInfo:
  return FrameInfo(frame_id=frame_id, frame_id_extra=frame_id, timestamp_eof=10**9 + frame_id, road_frame_id=frame_id + 2,
                   frame_drop_perc=1.5, dropped_frames=dropped, model_execution_time=0.02, live_calib_seen=calib, lat_action_t=lat_t, long_action_t=long_t)

class Publisher:
  """modeld's output path on one frame of raw heads: parse, the driving state advanced, the fields filled and written through pycapnp;
  the fields a model leaves default said once each on `log`, as modeld says them."""
  def __init__(self, log=lambda line: None, rules: Rules = GENERATIONS["split_09"]):
    self.state, self.lines = DrivingState(rules), Episodes(log)

  def __call__(self, raws: dict[str, np.ndarray], info: FrameInfo | None = None, car_state=None, lat_active=True):
    info, vec, slices = info or frame(), *pack(raws)
    parsed, missing = OutputParser(slices)(vec), {}
    values = frame_fields(parsed, self.state.update(ParsedReads.of(parsed), info, car_state or car(), lat_active), info, missing=missing)
    msgs = {}
    for service, fields in values.items():
      msgs[service] = new_message(service, valid=info.valid[service])
      for path in messaging.set_fields(getattr(msgs[service], service), fields):
        self.lines.once(f"{service}.{path} is not published: this cereal schema has no such field")
    for path, reason in missing.items(): self.lines.once(f"{path} stays default: {reason}")
    return msgs, values

def publish(publisher: Publisher, raws: dict[str, np.ndarray], info: FrameInfo | None = None, car_state=None, lat_active=True):
  return publisher(raws, info, car_state, lat_active)

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

def todays_heads(rng) -> dict[str, np.ndarray]:
  """Raw heads of openpilot's current models: a single-hypothesis plan (990 = one mean/std pair of 33x15) and lead (144 = one pair of
  3x6x4), in the vision/policy split's order."""
  plan = np.concatenate([plan_mean().reshape(-1), rng.standard_normal(495).astype(np.float32) - 2])
  return {"pose": rng.standard_normal(12), "wide_from_device_euler": rng.standard_normal(6), "road_transform": rng.standard_normal(12),
          "lane_lines": rng.standard_normal(528), "lane_lines_prob": rng.standard_normal(8) * 3, "road_edges": rng.standard_normal(264),
          "desire_pred": rng.standard_normal(32), "meta": logit(np.full(55, 0.01)), "lead": rng.standard_normal(144), "lead_prob": rng.standard_normal(3),
          "plan": plan, "desire_state": rng.standard_normal(8)}

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

def test_model_v2_fields_follow_fill_model_msg():
  rng = np.random.default_rng(2)
  raws = heads(rng)
  msgs, values = publish(Publisher(), raws)
  v, m = values["modelV2"], msgs["modelV2"].modelV2
  plan, plan_std = plan_mean(), np.exp(raws["plan"].reshape(5, 991)[3, 495:990]).reshape(33, 15)
  close(v["position.x"], plan[:, 0])
  close(v["position.zStd"], plan_std[:, 2])
  close(v["orientationRate.z"], plan[:, 14])
  assert "velocity.xStd" not in v and list(m.velocity.xStd) == [], "only the position carries stds"
  close(v["position.t"], T)
  lanes, lanes_std = raws["lane_lines"][:264].reshape(4, 33, 2), np.exp(raws["lane_lines"][264:]).reshape(4, 33, 2)
  close(v["laneLines.2.y"], lanes[2, :, 0])
  close(v["laneLines.2.z"], lanes[2, :, 1])
  close(v["laneLines.0.x"], X)
  close(v["laneLineStds"], lanes_std[:, 0, 0])
  close(v["laneLineProbs"], sig(raws["lane_lines_prob"])[[1, 3, 5, 7]])
  close(list(m.laneLineProbs), sig(raws["lane_lines_prob"])[[1, 3, 5, 7]])
  edges_std = np.exp(raws["road_edges"][132:]).reshape(2, 33, 2)
  close(v["roadEdges.1.y"], raws["road_edges"][:132].reshape(2, 33, 2)[1, :, 0])
  close(v["roadEdgeStds"], edges_std[:, 0, 0])
  lead = raws["lead"].reshape(2, 51)
  for i in range(3):
    hyp = int(np.argmax(lead[:, 48 + i]))
    assert v[f"leadsV3.{i}.t"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0] and v[f"leadsV3.{i}.probTime"] == [0.0, 2.0, 4.0][i]
    close(v[f"leadsV3.{i}.v"], lead[hyp, :24].reshape(6, 4)[:, 2])
    close(v[f"leadsV3.{i}.aStd"], np.exp(lead[hyp, 24:48]).reshape(6, 4)[:, 3])
    close(v[f"leadsV3.{i}.prob"], sig(raws["lead_prob"][i]))
  close(v["meta.desireState"], softmax(raws["desire_state"]))
  close(v["meta.desirePrediction"], np.concatenate([softmax(r) for r in raws["desire_pred"].reshape(4, 8)]))
  assert (m.frameId, m.frameIdExtra, m.frameAge, m.timestampEof) == (1, 1, 2, 10**9 + 1)
  assert m.frameDropPerc == pytest.approx(1.5) and m.modelExecutionTime == pytest.approx(0.02)

def test_meta_interleaves_disengage_arrays_by_time_step():
  p = np.arange(1, 56) / 100  # probability j/100 at meta index j-1: each field shows which indices it read
  values = publish(Publisher(), heads(np.random.default_rng(3), meta_p=p))[1]["modelV2"]
  d = {k.split(".")[-1]: np.round(np.array(v) * 100 - 1).astype(int).tolist() for k, v in values.items() if k.startswith("meta.disengagePredictions.")
       and k != "meta.disengagePredictions.t"}
  assert d == {"gasDisengageProbs": [1, 7, 13, 19, 25], "brakeDisengageProbs": [2, 8, 14, 20, 26], "steerOverrideProbs": [3, 9, 15, 21, 27],
               "brake3MetersPerSecondSquaredProbs": [4, 10, 16, 22, 28], "brake4MetersPerSecondSquaredProbs": [5, 11, 17, 23, 29],
               "brake5MetersPerSecondSquaredProbs": [6, 12, 18, 24, 30], "gasPressProbs": [31, 35, 39, 43, 47, 51],
               "brakePressProbs": [32, 36, 40, 44, 48, 52]}
  assert list(values["meta.disengagePredictions.t"]) == [2.0, 4.0, 6.0, 8.0, 10.0]
  assert values["meta.engagedProb"] == pytest.approx(0.01, rel=1e-5)

@pytest.mark.parametrize("n, gas_press, brake_press", [(53, [7, 15, 23, 31, 39], [8, 16, 24, 32, 40]), (48, [7, 14, 21, 28, 35], None)])
def test_meta_layouts_of_older_generations(n, gas_press, brake_press):
  lines: list[str] = []
  raws = heads(np.random.default_rng(4), meta_p=np.arange(1, n + 1) / 100)
  msgs, values = publish(Publisher(log=lines.append), raws)
  v = values["modelV2"]
  stride = 8 if n == 53 else 7
  assert np.round(np.array(v["meta.disengagePredictions.steerOverrideProbs"]) * 100 - 1).astype(int).tolist() == [3 + stride * k for k in range(5)]
  assert np.round(np.array(v["meta.disengagePredictions.gasPressProbs"]) * 100 - 1).astype(int).tolist() == gas_press
  if brake_press is None:
    assert "meta.disengagePredictions.brakePressProbs" not in v and list(msgs["modelV2"].modelV2.meta.disengagePredictions.brakePressProbs) == []
    assert sum("modelV2.meta.disengagePredictions.brakePressProbs stays default" in line for line in lines) == 1
  else:
    assert np.round(np.array(v["meta.disengagePredictions.brakePressProbs"]) * 100 - 1).astype(int).tolist() == brake_press

def test_hard_brake_needs_the_fcw_history():
  p5 = [0.2, 0.2, 0.2, 0.2, 0.2, 0.1, 0.1, 0.2, 0.2, 0.2, 0.04, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]
  p3 = [0.8] * 13 + [0.6, 0.8, 0.8, 0.8]
  state, got, expected = Publisher(), [], []
  hist5, hist3 = [0.0] * 5, [0.0] * 2
  for i, (a, b) in enumerate(zip(p5, p3, strict=True)):
    meta = np.full(55, 0.01)
    meta[6], meta[4] = a, b  # the first time step of the 5 m/s2 and 3 m/s2 hard-brake arrays
    got.append(publish(state, heads(np.random.default_rng(i), meta_p=meta), frame(i + 1))[1]["modelV2"]["meta.hardBrakePredicted"])
    hist5, hist3 = hist5[1:] + [a], hist3[1:] + [b]
    expected.append(all(h > t for h, t in zip(hist5, [0.05, 0.05, 0.15, 0.15, 0.15], strict=True)) and all(h > 0.7 for h in hist3))
  assert got == expected
  assert not got[3] and got[4] and not got[6] and got[9] and not got[11] and not got[14] and got[15], "thresholds apply per history position, oldest first"

def test_confidence_goes_yellow_then_red_on_rising_disengage_probabilities():
  state, got, expected, buf = Publisher(), [], [], np.zeros(25)
  for frame_id in range(0, 400, 5):  # 2 s updates come from frame ids divisible by 40, not from the clock
    level = 0.0005 * (1.02 ** frame_id)  # rising risk
    gas, brake, steer = (np.minimum(level * k * np.arange(1, 6), 0.9) for k in (1, 2, 3))
    meta = np.full(55, 0.001)
    meta[1:31:6], meta[2:31:6], meta[3:31:6] = gas, brake, steer
    got.append(publish(state, heads(np.random.default_rng(frame_id), meta_p=meta), frame(frame_id))[1]["modelV2"]["confidence"])
    if frame_id % 40 == 0:
      g, b, s = sig(logit(gas)), sig(logit(brake)), sig(logit(steer))
      any_p = 1 - (1 - b) * (1 - g) * (1 - s)
      buf = np.concatenate([buf[5:], [any_p[0], *((any_p[k] - any_p[k - 1]) / (1 - any_p[k - 1]) for k in range(1, 5))]])
    score = sum(buf[i * 5 + 4 - i] for i in range(5)) / 5
    expected.append("green" if score < 0.01165 else "yellow" if score < 0.06157 else "red")
    assert state.state.confidence.score == pytest.approx(score, rel=1e-4)
  assert got == expected
  assert got[0] == "green" and "yellow" in got and got[-1] == "red" and got.index("yellow") < got.index("red")

def test_lane_line_and_road_edge_times_come_from_the_plan():
  plan = plan_mean(v0=8.0, a0=0.4)  # reaches 8*10 + 0.2*100 = 100 m at 10 s: the far X_IDXS lie beyond it
  v = publish(Publisher(), heads(np.random.default_rng(5), plan=plan))[1]["modelV2"]
  x_end = plan[-1, 0]
  beyond = int(np.argmax(X > x_end))
  expected = [np.interp(x, plan[:, 0], T) for x in X[:beyond]] + [10.0] + [np.nan] * (32 - beyond)
  for line in (*(f"laneLines.{i}" for i in range(4)), "roadEdges.0", "roadEdges.1"):
    np.testing.assert_allclose(v[f"{line}.t"], expected, rtol=1e-5, atol=1e-6)
  assert 0 < beyond < 32 and v["laneLines.0.t"][0] == 0.0

def test_action_from_plan_with_smoothing_and_stop():
  state, prev_accel = Publisher(), 0.0
  lat_t, long_t = action_times(0.2, 0.1)
  assert (lat_t, long_t) == pytest.approx((0.2 + 0.075, 0.1 + 0.3 + 0.075)), "action_t = [lat + 1.5 DT, long + 0.3 + 1.5 DT]"
  for i, (v_ego, a0) in enumerate(((15.0, 0.5), (15.0, -1.0))):
    plan = plan_mean(v0=15.0, a0=a0)
    v = publish(state, heads(np.random.default_rng(6), plan=plan), frame(i + 1, lat_t, long_t), car(v_ego=v_ego))[1]["modelV2"]
    psi = np.interp(lat_t, T, plan[:, 11])
    curvature = 2 * psi / (v_ego * lat_t) - plan[0, 14] / v_ego  # LAT_SMOOTH_SECONDS = 0: no smoothing
    v_t = np.interp(long_t, T, plan[:, 3])
    accel = 2 * (v_t - plan[0, 3]) / long_t - plan[0, 6]
    alpha = 1 - np.exp(-DT / 0.3)  # LONG_SMOOTH_SECONDS = 0.3
    prev_accel = alpha * accel + (1 - alpha) * prev_accel
    assert v["action.desiredCurvature"] == pytest.approx(curvature, rel=1e-5)
    assert v["action.desiredAcceleration"] == pytest.approx(prev_accel, rel=1e-5)
    assert v["action.shouldStop"] is False
  stopping = plan_mean(v0=0.04, a0=-0.01)
  v = publish(state, heads(np.random.default_rng(7), plan=stopping), frame(3, lat_t, long_t), car(v_ego=0.2))[1]["modelV2"]
  assert v["action.shouldStop"] is True, "speed at long_action_t and 1 s later both below 0.05 m/s"
  starting = plan_mean(v0=0.0, a0=0.06)  # 0.03 m/s at long_action_t, 0.09 m/s a second later
  v = publish(state, heads(np.random.default_rng(7), plan=starting), frame(4, lat_t, long_t), car(v_ego=0.2))[1]["modelV2"]
  assert np.interp(long_t, T, starting[:, 3]) < 0.05 < np.interp(long_t + 1, T, starting[:, 3]) and v["action.shouldStop"] is False
  assert v["action.desiredCurvature"] == pytest.approx(curvature, rel=1e-5), "below 0.3 m/s the curvature holds"

def test_desired_curvature_head_wins_over_the_plan_and_low_speed_clamps_the_plan():
  raws = heads(np.random.default_rng(8))
  raws["desired_curvature"] = np.array([0.0123, -2.0], np.float32)
  v = publish(Publisher(), raws, car_state=car(v_ego=20.0))[1]
  assert v["modelV2"]["action.desiredCurvature"] == pytest.approx(0.0123, rel=1e-6) == v["drivingModelData"]["action.desiredCurvature"]
  plan = plan_mean()
  v = publish(Publisher(), heads(np.random.default_rng(8)), frame(1, 0.5, 0.9), car(v_ego=0.5))[1]["modelV2"]
  psi = np.interp(0.5, T, plan[:, 11])
  assert v["action.desiredCurvature"] == pytest.approx(2 * psi / 0.5 - plan[0, 14], rel=1e-5), "speed clipped to MIN_SPEED 1 m/s"

def test_temporal_pose_from_plan_or_sim_pose():
  raws = heads(np.random.default_rng(9))
  plan_std = np.exp(raws["plan"].reshape(5, 991)[3, 495:990]).reshape(33, 15)
  pose = publish(Publisher(), raws)[1]["modelV2"]
  close(pose["temporalPose.trans"], plan_mean()[0, 3:6])
  close(pose["temporalPose.rot"], plan_mean()[0, 12:15])
  close(pose["temporalPose.transStd"], plan_std[0, 3:6])
  close(pose["temporalPose.rotStd"], plan_std[0, 12:15])
  raws["sim_pose"] = np.arange(12, dtype=np.float32) / 10
  pose = publish(Publisher(), raws)[1]["modelV2"]
  close(pose["temporalPose.trans"], [0.0, 0.1, 0.2])
  close(pose["temporalPose.rotStd"], np.exp([0.9, 1.0, 1.1]))

def test_driving_model_data_and_camera_odometry():
  raws = heads(np.random.default_rng(10))
  msgs, values = publish(Publisher(), raws, frame(7, calib=True, dropped=0))
  d, o = values["drivingModelData"], values["cameraOdometry"]
  position = plan_mean()[:, 0:3].astype(np.float64)
  vander = np.stack([T ** k for k in range(5)], axis=1)  # lowest power first, degree 4
  coeffs = np.linalg.lstsq(vander, position, rcond=None)[0]
  for i, axis in enumerate("xyz"):
    close(d[f"path.{axis}Coefficients"], coeffs[:, i], rtol=1e-4, atol=1e-5)
  close(list(msgs["drivingModelData"].drivingModelData.path.yCoefficients), coeffs[:, 1], rtol=1e-4, atol=1e-5)
  lanes = raws["lane_lines"][:264].reshape(4, 33, 2)
  assert d["laneLineMeta.leftY"] == pytest.approx(lanes[1, 0, 0]) and d["laneLineMeta.rightY"] == pytest.approx(lanes[2, 0, 0])
  probs = sig(raws["lane_lines_prob"])
  assert d["laneLineMeta.leftProb"] == pytest.approx(probs[3]) and d["laneLineMeta.rightProb"] == pytest.approx(probs[5])
  assert (d["frameId"], d["frameIdExtra"]) == (7, 7) and d["meta.laneChangeState"] == OFF
  close(o["trans"], raws["pose"][:3])
  close(o["rotStd"], np.exp(raws["pose"][9:]))
  close(o["wideFromDeviceEuler"], raws["wide_from_device_euler"][:3])
  close(o["roadTransformTransStd"], np.exp(raws["road_transform"][6:9]))
  assert (o["frameId"], o["timestampEof"]) == (7, 10**9 + 7)
  assert all(msgs[s].valid for s in SERVICES)

def test_valid_flags():
  msgs, _ = publish(Publisher(), heads(np.random.default_rng(11)), frame(calib=False))
  assert not any(msgs[s].valid for s in SERVICES), "nothing is valid before a calibration"
  msgs, _ = publish(Publisher(), heads(np.random.default_rng(11)), frame(dropped=2))
  assert msgs["modelV2"].valid and msgs["drivingModelData"].valid and not msgs["cameraOdometry"].valid

def test_missing_heads_leave_defaults_and_are_logged_once():
  lines: list[str] = []
  state = Publisher(log=lines.append)
  raws = {k: v for k, v in heads(np.random.default_rng(12)).items() if k not in ("lane_lines", "lead", "meta", "pose", "desire_state")}
  for i in range(3): msgs, values = publish(state, raws, frame(i + 1), car(left=True))
  m = msgs["modelV2"].modelV2
  assert len(m.laneLines) == 0 and len(m.leadsV3) == 0 and m.meta.engagedProb == 0 and not m.meta.hardBrakePredicted
  assert list(msgs["cameraOdometry"].cameraOdometry.trans) == [] and len(m.roadEdges) == 2 and len(m.position.x) == 33
  for field in ("modelV2.laneLines", "modelV2.laneLineStds", "modelV2.leadsV3", "modelV2.meta.engagedProb", "modelV2.confidence",
                "modelV2.meta.desireState", "drivingModelData.laneLineMeta.leftY", "cameraOdometry.trans"):
    assert sum(line.startswith(f"{field} stays default") for line in lines) == 1, (field, lines)
  assert not any("roadEdges" in line or "position" in line for line in lines)
  assert "meta.laneChangeState" in values["modelV2"], "lane-change state is published without a desire_state head"

def test_schema_gaps_are_logged_once_and_values_still_returned():
  lines: list[str] = []
  state = Publisher(log=lines.append)
  for i in range(2): msgs, values = publish(state, heads(np.random.default_rng(13)), frame(i + 1))
  assert "action.desiredAcceleration" in values["modelV2"] and "action.shouldStop" in values["modelV2"]
  has_accel = "desiredAcceleration" in msgs["modelV2"].modelV2.action.schema.fieldnames
  missing = [line for line in lines if line.startswith("modelV2.action.desiredAcceleration is not published")]
  assert len(missing) == (0 if has_accel else 1)

def test_set_fields_skips_what_the_schema_lacks():
  msg = new_message("modelV2")
  skipped = messaging.set_fields(msg.modelV2, {"frameId": 3, "noSuchField": 1, "meta.noSuch": 2, "laneLines.1.x": [1.0], "laneLines.1.bogus": 1,
                                               "position.x": [2.0], "position.nope": [1], "nowhere.3.x": 1})
  assert msg.modelV2.frameId == 3 and len(msg.modelV2.laneLines) == 2 and list(msg.modelV2.laneLines[1].x) == [1.0] and list(msg.modelV2.position.x) == [2.0]
  assert skipped == ["noSuchField", "meta.noSuch", "laneLines.1.bogus", "position.nope", "nowhere.3.x"]

def test_lateral_delay_from_the_lateral_delay_topic_when_the_schema_has_one(monkeypatch):
  """The topic is the schema's (lateralDelay today, liveDelay before: daemon/topics); the bundled schema has none."""
  import dataclasses

  from sunnypilot.modeld_v2.daemon.topics import TOPICS
  live = {"lateralDelay": SimpleNamespace(lateralDelay=0.31)}
  sm = type("SM", (), {"seen": {"lateralDelay": True}, "__getitem__": lambda self, k: live[k]})()
  monkeypatch.setattr(messaging, "TOPICS", dataclasses.replace(TOPICS, lateral_delay="lateralDelay"))
  assert messaging.lateral_delay(sm, 0.2) == pytest.approx(0.31)
  sm.seen = {"lateralDelay": False}
  assert messaging.lateral_delay(sm, 0.2) == 0.2, "no estimate before the first message"
  monkeypatch.setattr(messaging, "TOPICS", dataclasses.replace(TOPICS, lateral_delay=None))
  sm.seen = {"lateralDelay": True}
  assert messaging.lateral_delay(sm, 0.2) == 0.2, "a schema without the topic"

def desire_state_raw(lane_change_prob_high: bool) -> np.ndarray:
  return np.array([0.0, 0, 0, 5.0, 0, 0, 0, 0]) if lane_change_prob_high else np.array([10.0, 0, 0, 0, 0, 0, 0, 0])

def test_lane_change_through_every_state():
  """A left lane change: blinker (pre), a blocked blindspot, torque (starting), the model finishing the change, lane lines fading back."""
  state, rng = Publisher(), np.random.default_rng(14)
  script = ([car()] * 2 + [car(left=True)] * 2 + [car(left=True, pressed=True, torque=1.0, left_bsm=True)]
            + [car(left=True, pressed=True, torque=1.0)] + [car(left=True)] * 14 + [car()] * 25)
  got, pulses = [], []
  for i, cs in enumerate(script):
    pulses.append(state.state.desire_input())
    raws = heads(rng)
    raws["desire_state"] = desire_state_raw(i < 18)  # the model sees the change happening until frame 18
    msgs, values = publish(state, raws, frame(i + 1), cs)
    m = msgs["modelV2"].modelV2.meta
    got.append((values["modelV2"]["meta.laneChangeState"], values["modelV2"]["meta.laneChangeDirection"], int(state.state.desire_helper.desire)))
    assert (m.laneChangeState.raw, m.laneChangeDirection.raw) == got[-1][:2]
    assert msgs["drivingModelData"].drivingModelData.meta.laneChangeState.raw == got[-1][0]
  # by hand from desire_helper.py: blinker -> pre (direction set on the next frame); torque towards it, blindspot clear -> starting;
  # starting fades the lane lines by 0.1 a frame and waits for prob < 0.02 with lines < 0.01; finishing fades them in by 0.05 a frame
  expected = ([(OFF, NONE, 0)] * 2 + [(PRE, NONE, 0)] + [(PRE, LEFT, 0)] * 2 + [(STARTING, LEFT, LANE_CHANGE_LEFT)] * 13
              + [(FINISHING, LEFT, LANE_CHANGE_LEFT)] * 20 + [(OFF, NONE, 0)] * 7)
  assert got == expected
  hot = [i for i, p in enumerate(pulses) if p.any()]
  assert hot == [6] and pulses[6].tolist() == [0, 0, 0, 1, 0, 0, 0, 0], "one pulse, on the frame after the change started"

def test_desire_pulse_as_openpilot_computes_it():
  """Any sequence of DesireHelper desires (changes, repeats, back to none, out of range) against openpilot's input, written out from
  selfdrive/modeld/modeld.py (@6c6be47b): the one-hot vector of the desire, index 0 zeroed, where(now - previous > 0.99, now, 0)."""
  state, rng, prev = Publisher(), np.random.default_rng(5), np.zeros(8, np.float32)
  for desire in [0, 3, 3, 3, 0, 3, 4, 3, 3, 6, 0, 0, 5, 5, 9, 5, *rng.integers(0, 9, 200).tolist()]:
    state.state.desire_helper.desire = desire
    vec = np.zeros(8, np.float32)
    if 0 <= desire < 8: vec[desire] = 1
    vec[0] = 0
    expected = np.where(vec - prev > 0.99, vec, 0)
    prev = vec
    assert state.state.desire_input().tolist() == expected.tolist(), desire

def test_desire_helper_guards():
  dh = DesireHelper()
  dh.update(car(v_ego=8.9, left=True), True, 0.0)
  assert dh.lane_change_state == OFF, "a blinker below 20 mph does nothing"
  dh.update(car(v_ego=9.0, left=True), True, 0.0)
  assert dh.lane_change_state == OFF, "only a fresh blinker starts a lane change"
  dh.update(car(v_ego=9.0), True, 0.0)
  dh.update(car(v_ego=9.0, right=True), True, 0.0)
  assert dh.lane_change_state == PRE
  dh.update(car(v_ego=9.0, right=True, pressed=True, torque=1.0), True, 0.0)
  assert (dh.lane_change_state, dh.lane_change_direction) == (PRE, RIGHT), "torque away from the blinker does not start it"
  dh.update(car(v_ego=9.0, right=True, pressed=True, torque=-1.0, right_bsm=True), True, 0.0)
  assert dh.lane_change_state == PRE
  cs = new_message("carState").carState  # a cereal carState works as well as plain values
  cs.vEgo, cs.rightBlinker, cs.steeringPressed, cs.steeringTorque = 9.0, True, True, -1.0
  assert dh.update(cs, True, 0.5) == LANE_CHANGE_RIGHT and dh.lane_change_state == STARTING
  frames, timer = 0, 0.05
  while timer <= 10.0: timer, frames = timer + DT, frames + 1  # LANE_CHANGE_TIME_MAX: off once the timer passed 10 s
  for _ in range(frames): dh.update(cs, True, 0.5)
  assert dh.lane_change_state == STARTING
  dh.update(cs, True, 0.5)
  assert (dh.lane_change_state, dh.desire) == (OFF, 0)
  for lateral_active, expected in ((False, OFF), (True, PRE)):
    dh = DesireHelper()
    dh.update(car(v_ego=20.0, left=True), lateral_active, 0.0)
    assert dh.lane_change_state == expected, "no lane change without lateral control"

def test_generation_rules_decide_curvature_source_and_hold():
  """sunnypilot modeld.py: mlsim generations take the plan's curvature over a desired_curvature head; the low-speed hold only from
  generation 10 (post FOF) on; the 0.9.x supercombo publishes the head's value as it is."""
  from sunnypilot.modeld_v2.model.generations import GENERATIONS
  raws = heads(np.random.default_rng(24)) | {"desired_curvature": np.array([0.0123, -2.0], np.float32)}
  slow = raws | {"desired_curvature": np.array([-0.004, -2.0], np.float32)}
  plan, lat_t = plan_mean(), 0.275
  from_plan = 2 * np.interp(lat_t, T, plan[:, 11]) / (20.0 * lat_t) - plan[0, 14] / 20.0
  for generation, fast, held in (("split_current", from_plan, from_plan), ("split_09", 0.0123, 0.0123), ("supercombo_20hz", 0.0123, -0.004)):
    state = Publisher(rules=GENERATIONS[generation])
    assert publish(state, raws, frame(1), car(v_ego=20.0))[1]["modelV2"]["action.desiredCurvature"] == pytest.approx(fast, rel=1e-5), generation
    got = publish(state, slow, frame(2), car(v_ego=0.2))[1]["modelV2"]["action.desiredCurvature"]
    assert got == pytest.approx(held, rel=1e-5), f"{generation} below 0.3 m/s"

def test_lat_planner_state_is_fed_back_from_the_solution():
  """sunnypilot modeld.py @002f69b0: lat_planner_state's yaw and curvature are the solution's, interpolated one frame (DT_MDL) ahead."""
  rng = np.random.default_rng(25)
  state = Publisher()
  raws = heads(rng) | {"lat_planner_solution": rng.standard_normal(264).astype(np.float32)}
  publish(state, raws)
  solution = raws["lat_planner_solution"][:132].reshape(33, 4)
  close(state.state.lat_planner_state, [0, 0, np.interp(DT, T, solution[:, 2]), np.interp(DT, T, solution[:, 3])])

def test_camera_offset_shears_the_camera_pixel():
  """sunnypilot camera_offset_helper.py: a camera pixel (u, v) moves to (u + offset / height * (v - cy), v)."""
  from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, apply_camera_offset, get_warp_matrix
  road = SENSOR_CAMERAS["os04c10"][0]
  m_inv = get_warp_matrix((0.01, 0.02, -0.01), road.intrinsics)
  shifted = apply_camera_offset(m_inv, road.intrinsics, 1.4, 0.3)
  for x, y in ((10, 20), (256, 128), (500, 250)):
    u, v, w = m_inv @ [x, y, 1]
    u2, v2, w2 = shifted @ [x, y, 1]
    close([u2 / w2, v2 / w2], [u / w + 0.3 / 1.4 * (v / w - road.height / 2), v / w], rtol=1e-9)

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

def test_fcw_history_compares_as_openpilots_float32_arrays():
  """HardBrake (Python floats of float32 values) against openpilot's float32 arrays, np.append and array compares, with probabilities on the float32
  thresholds and one step beside them."""
  from sunnypilot.modeld_v2.model.fill_model_msg import HardBrake
  t5, t3 = np.array([0.05, 0.05, 0.15, 0.15, 0.15], np.float32), np.array([0.7, 0.7], np.float32)
  edges = [v for t in (0.05, 0.15, 0.7) for v in (t, np.float32(t), *(np.nextafter(np.float32(t), d, dtype=np.float32) for d in (0, 1)))]
  rng, hard_brake, h5, h3 = np.random.default_rng(3), HardBrake(), np.zeros(5, np.float32), np.zeros(2, np.float32)
  for _ in range(3000):
    b5, b3 = (edges[rng.integers(len(edges))] if rng.random() < 0.8 else rng.random() for _ in range(2))
    h5, h3 = np.append(h5[1:], np.float32(b5)), np.append(h3[1:], np.float32(b3))
    assert hard_brake.update(np.float32(b5).item(), np.float32(b3).item()) == bool((h5 > t5).all() and (h3 > t3).all())  # as meta.item gives them
