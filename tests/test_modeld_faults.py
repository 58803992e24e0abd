"""modeld against bad input on the bus: broken numbers, broken messages, broken timestamps. Each test reproduces a failure seen before the fix."""
from types import SimpleNamespace

import numpy as np
import pytest
import test_modeld
from test_modeld import Daemon, reference

from sunnypilot.modeld_v2.bus_inputs import DEFAULT_RPY, BusInputs, Episodes

artifacts, split_09 = test_modeld.artifacts, test_modeld.split_09  # the daemon tests' fixtures, by name

def finite_and_valid(daemon: Daemon, frame_id: int) -> bool:
  msgs = daemon.messages[frame_id]
  return all(valid for _, valid in msgs.values()) and bool(np.isfinite(np.frombuffer(daemon.raw(frame_id), np.float32)).all())

def test_nan_speed_once_is_replaced_by_the_last_good(split_09, openpilot_prefix):
  """One carState with vEgo = NaN used to turn every output of a split_09 model NaN, valid, until a restart."""
  daemon = Daemon(split_09)
  for frame_id in range(40): daemon.send(frame_id, float("nan") if frame_id == 25 else 20.0), daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(finite_and_valid(daemon, i) for i in range(21, 40)), "finite and valid throughout (calibration from frame 20 on)"
  assert [daemon.raw(i) for i in range(40)] == reference(split_09, list(range(40))), "the NaN frame ran on the last good speed, 20 m/s"
  assert sum("carState.vEgo = nan refused" in line for line in daemon.lines) == 1, daemon.lines

# the carState check switched off: a NaN speed reaches the model, and only the output check stands between it and the bus
UNCHECKED_SPEED = ("-c", "import sys; from sunnypilot.modeld_v2 import bus_inputs, modeld; "
                   "bus_inputs.BusInputs.car_state = lambda self, sm: bus_inputs.CarInputs(float(sm['carState'].vEgo)); sys.exit(modeld.main())")

def test_non_finite_outputs_are_published_invalid_and_reset_the_states(split_09, openpilot_prefix):
  daemon = Daemon(split_09, command=UNCHECKED_SPEED)
  for frame_id in range(40): daemon.send(frame_id, float("nan") if frame_id == 25 else 20.0), daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(not valid for _, valid in daemon.messages[25].values()), "the NaN run is published with valid=False on every service"
  assert all(finite_and_valid(daemon, i) for i in range(26, 40)), "the next frame is finite and valid again"
  assert [daemon.raw(i) for i in range(26, 40)] == reference(split_09, list(range(26, 40))), "from zeroed states, as a fresh start"
  assert sum("non-finite model outputs" in line for line in daemon.lines) == 1, daemon.lines

class SM(SimpleNamespace):
  """A SubMaster stand-in holding real cereal readers."""
  def __getitem__(self, service): return self.data[service]

def sm_with(**messages) -> SM:
  """{service: {field: value}} -> an SM that has seen each message."""
  from sunnypilot.modeld_v2.messaging import new_message
  data = {}
  for service, fields in messages.items():
    msg = new_message(service)
    for name, value in fields.items(): setattr(getattr(msg, service), name, value)
    data[service] = getattr(msg.as_reader(), service)
  return SM(seen=dict.fromkeys(data, True), data=data)

@pytest.mark.parametrize("rpy", [[float("nan"), 0, 0], [0, float("inf"), 0], [0, 1e30, 0], [0, 0.5, 0], [0.0, 0.01]])
def test_calibration_out_of_range_is_refused(rpy):
  lines = []
  bus = BusInputs(Episodes(lines.append))
  assert bus.calibration(sm_with(liveCalibration={"rpyCalib": [0.01, 0.02, 0.03]})) == pytest.approx((0.01, 0.02, 0.03))
  for _ in range(3): assert bus.calibration(sm_with(liveCalibration={"rpyCalib": rpy})) == pytest.approx((0.01, 0.02, 0.03)), "the last good one"
  assert bus.calibration(sm_with(liveCalibration={"rpyCalib": [0.0, 0.1, -0.05]})) == pytest.approx((0.0, 0.1, -0.05))
  assert len(lines) == 2 and "refused" in lines[0] and "(3 times)" in lines[1], lines
  assert BusInputs(Episodes(lines.append)).calibration(sm_with(liveCalibration={"rpyCalib": rpy})) == DEFAULT_RPY, "before a good one: the default"

@pytest.mark.parametrize("v_ego", [float("nan"), float("inf"), -1e30, 1e30, 101.0])
def test_speed_out_of_range_is_refused(v_ego):
  bus = BusInputs(Episodes(lambda line: None))
  assert bus.car_state(sm_with(carState={"vEgo": 12.5, "leftBlinker": True})).vEgo == 12.5
  car = bus.car_state(sm_with(carState={"vEgo": v_ego, "rightBlinker": True}))
  assert (car.vEgo, car.leftBlinker, car.rightBlinker) == (12.5, False, True), "only the bad field keeps its last good value"

def test_episodes_log_one_line_at_the_start_and_the_count_at_the_end():
  lines = []
  episodes = Episodes(lines.append)
  for _ in range(15): episodes.happened("x", "x started")
  episodes.ended("x", "x ended")
  episodes.happened("x", "x started")
  episodes.ended("x", "x ended")
  assert lines == ["x started", "x ended (15 times)", "x started"], "a single occurrence needs no closing line"
