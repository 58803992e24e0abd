"""What modeld feeds the model from the bus and its own state, against openpilot's and sunnypilot's code written out here: the desire
pulse and the lane change (DesireHelper), lat_planner_state from the solution, the camera offset's shear, the lateral delay's topic.

References: openpilot selfdrive/modeld/{constants,parse_model_outputs,fill_model_msg,modeld}.py, controls/lib/{drive_helpers,desire_helper}.py,
sunnypilot modeld_v2/fill_model_msg.py (get_curvature_from_output, temporal pose without sim_pose).
"""
from types import SimpleNamespace

import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon import messaging
from sunnypilot.modeld_v2.daemon.messaging import new_message
from sunnypilot.modeld_v2.model.desire_helper import DesireHelper

from openpilot_reference import T, car
from output_vectors import DT, FINISHING, LANE_CHANGE_LEFT, LANE_CHANGE_RIGHT, LEFT, NONE, OFF, PRE, RIGHT, STARTING, Publisher, close, frame, heads, publish

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
