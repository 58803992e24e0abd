"""openpilot's lane-change state machine: blinker, steering torque, blindspot, speed and the model's lane-change probability -> the
lane-change state and direction published in modelV2.meta, and the desire fed back into the model.

Mirrors openpilot selfdrive/controls/lib/desire_helper.py (commaai/openpilot @198ac3c1). Its keep-pulse timer is left out: in that
version no preLaneChange desire is keepLeft/keepRight, so the timer never changes the desire.
"""
from __future__ import annotations

import enum
from typing import Protocol

from sunnypilot.modeld_v2.model.constants import DT_MDL

LANE_CHANGE_SPEED_MIN = 20 * 0.44704  # 20 mph in m/s
LANE_CHANGE_TIME_MAX = 10.0  # s in laneChangeStarting/Finishing before giving up

class LaneChangeState(enum.IntEnum):  # values of log.capnp LaneChangeState
  off = 0
  preLaneChange = 1
  laneChangeStarting = 2
  laneChangeFinishing = 3

class LaneChangeDirection(enum.IntEnum):  # log.capnp LaneChangeDirection
  none = 0
  left = 1
  right = 2

class Desire(enum.IntEnum):  # log.capnp Desire: the index of the model's desire input
  none = 0
  turnLeft = 1
  turnRight = 2
  laneChangeLeft = 3
  laneChangeRight = 4
  keepLeft = 5
  keepRight = 6

class CarStateLike(Protocol):
  """The carState fields DesireHelper reads: a cereal carState reader, or any object with these attributes (read only: a frozen record
  such as daemon/bus_inputs.CarInputs is one)."""
  @property
  def vEgo(self) -> float: ...
  @property
  def leftBlinker(self) -> bool: ...
  @property
  def rightBlinker(self) -> bool: ...
  @property
  def steeringPressed(self) -> bool: ...
  @property
  def steeringTorque(self) -> float: ...
  @property
  def leftBlindspot(self) -> bool: ...
  @property
  def rightBlindspot(self) -> bool: ...

class DesireHelper:
  def __init__(self) -> None:
    self.lane_change_state = LaneChangeState.off
    self.lane_change_direction = LaneChangeDirection.none
    self.lane_change_timer = 0.0
    self.lane_change_ll_prob = 1.0  # lane-line weight: fades out while changing lanes, back in after
    self.prev_one_blinker = False
    self.desire = Desire.none

  def update(self, car_state: CarStateLike, lateral_active: bool, lane_change_prob: float) -> Desire:
    """One model frame. `lateral_active`: carControl.latActive; `lane_change_prob`: the model's desireState for laneChangeLeft +
    laneChangeRight of the frame just published."""
    one_blinker = car_state.leftBlinker != car_state.rightBlinker
    below_speed = car_state.vEgo < LANE_CHANGE_SPEED_MIN
    if not lateral_active or self.lane_change_timer > LANE_CHANGE_TIME_MAX:
      self.lane_change_state, self.lane_change_direction = LaneChangeState.off, LaneChangeDirection.none
    elif self.lane_change_state == LaneChangeState.off:
      if one_blinker and not self.prev_one_blinker and not below_speed:  # a fresh blinker above the minimum speed
        self.lane_change_state, self.lane_change_ll_prob = LaneChangeState.preLaneChange, 1.0
    elif self.lane_change_state == LaneChangeState.preLaneChange:
      self._pre_lane_change(car_state, one_blinker, below_speed)
    elif self.lane_change_state == LaneChangeState.laneChangeStarting:
      self.lane_change_ll_prob = max(self.lane_change_ll_prob - 2 * DT_MDL, 0.0)  # lane lines fade out over 0.5 s
      if lane_change_prob < 0.02 and self.lane_change_ll_prob < 0.01:  # the model is 98% sure the change is done
        self.lane_change_state = LaneChangeState.laneChangeFinishing
    elif self.lane_change_state == LaneChangeState.laneChangeFinishing:
      self.lane_change_ll_prob = min(self.lane_change_ll_prob + DT_MDL, 1.0)  # and back in over 1 s
      if self.lane_change_ll_prob > 0.99:
        self.lane_change_direction = LaneChangeDirection.none
        self.lane_change_state = LaneChangeState.preLaneChange if one_blinker else LaneChangeState.off

    idle = self.lane_change_state in (LaneChangeState.off, LaneChangeState.preLaneChange)
    self.lane_change_timer = 0.0 if idle else self.lane_change_timer + DT_MDL
    self.prev_one_blinker = one_blinker
    self.desire = Desire.none if idle else {LaneChangeDirection.left: Desire.laneChangeLeft,
                                            LaneChangeDirection.right: Desire.laneChangeRight}.get(self.lane_change_direction, Desire.none)
    return self.desire

  def _pre_lane_change(self, car_state: CarStateLike, one_blinker: bool, below_speed: bool) -> None:
    """Waiting for the driver to nudge the wheel towards the blinker's side with no car in that blindspot."""
    left = car_state.leftBlinker
    self.lane_change_direction = LaneChangeDirection.left if left else LaneChangeDirection.right
    torque_applied = car_state.steeringPressed and (car_state.steeringTorque > 0 if left else car_state.steeringTorque < 0)
    blindspot = car_state.leftBlindspot if left else car_state.rightBlindspot
    if not one_blinker or below_speed:
      self.lane_change_state, self.lane_change_direction = LaneChangeState.off, LaneChangeDirection.none
    elif torque_applied and not blindspot:
      self.lane_change_state = LaneChangeState.laneChangeStarting
