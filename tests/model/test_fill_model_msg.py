"""modeld's published fields against openpilot's formulas, written out here (not imported from the package), on hand-written output
vectors: modelV2 (plan, lane lines, leads, meta, FCW, confidence, action, temporal pose), drivingModelData, cameraOdometry, the valid
flags, and what a model or the schema lacks.

References: openpilot selfdrive/modeld/{constants,parse_model_outputs,fill_model_msg,modeld}.py, controls/lib/{drive_helpers,desire_helper}.py,
sunnypilot modeld_v2/fill_model_msg.py (get_curvature_from_output, temporal pose without sim_pose).
"""
import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon import messaging
from sunnypilot.modeld_v2.daemon.messaging import new_message
from sunnypilot.modeld_v2.model.drive_helpers import action_times
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES

from openpilot_reference import T, X, car, sig
from output_vectors import DT, OFF, Publisher, close, frame, heads, logit, plan_mean, publish, softmax

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
