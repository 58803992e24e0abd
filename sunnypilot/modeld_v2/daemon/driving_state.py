"""What modeld carries from frame to frame besides the model's recurrent states: the lane-change state machine and the desire it feeds
back, the last action (the next is smoothed against it), the lat_planner_state some models take, the FCW history and the confidence
buffer. ModelD owns one and passes it explicitly: the input side reads the desire and lat_planner_state before the model runs, `update`
advances everything after it, in openpilot's order (selfdrive/modeld/modeld.py @6c6be47b: the action from this frame's plan, FCW and
confidence as the messages are filled, then DesireHelper from the desire state just published; its desire is the next frame's input)."""
from __future__ import annotations

import numpy as np

from sunnypilot.modeld_v2.model.constants import DESIRE_LEN, DT_MDL, LAT_PLANNER_SOLUTION_WIDTH
from sunnypilot.modeld_v2.model.desire_helper import CarStateLike, Desire, DesireHelper
from sunnypilot.modeld_v2.model.drive_helpers import LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS, T_AXIS64, Action, get_action
from sunnypilot.modeld_v2.model.fill_model_msg import Confidence, FrameInfo, FrameState, HardBrake
from sunnypilot.modeld_v2.model.generations import GENERATIONS, Rules
from sunnypilot.modeld_v2.model.parse_model_outputs import POLY_PATH_LIMIT
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads

DESIRE_PULSES = np.eye(DESIRE_LEN, dtype=np.float32)  # row d: the desire input on the frame desire d starts; row 0 (none): all zero
DESIRE_PULSES[0] = 0
DESIRE_PULSES.flags.writeable = False
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the messages' floats: a finite float64 past this is published as inf

class DrivingState:
  def __init__(self, rules: Rules = GENERATIONS["split_09"], lat_smooth_s: float = LAT_SMOOTH_SECONDS, long_smooth_s: float = LONG_SMOOTH_SECONDS):
    self.rules, self.lat_smooth_s, self.long_smooth_s = rules, lat_smooth_s, long_smooth_s
    self.desire_helper = DesireHelper()
    self.hard_brake, self.confidence = HardBrake(), Confidence()
    self.action = Action()  # the last published action
    self.prev_desire = 0  # the desire of the last frame the model saw (0: none)
    self.lat_planner_state = np.zeros(LAT_PLANNER_SOLUTION_WIDTH, np.float32)  # the lat_planner_state input of models that have one

  def desire_input(self) -> np.ndarray:
    """The model's desire input for this frame: DesireHelper's desire one-hot, index 0 (none) zeroed, and only on its rising edge (the
    model decides when the manoeuvre is done). Call it on every frame the model sees, prepare-only ones included, as openpilot does:
    openpilot keeps the one-hot vectors and takes where(now - previous > 0.99, now, 0). The result is a read-only row of DESIRE_PULSES."""
    now = self.desire_helper.desire if 0 < self.desire_helper.desire < DESIRE_LEN else 0
    pulse = DESIRE_PULSES[now if now != self.prev_desire else 0]
    self.prev_desire = now
    return pulse

  def update(self, reads: ParsedReads, frame: FrameInfo, car_state: CarStateLike, lateral_active: bool) -> FrameState:
    """Advance every state by this published frame's parsed outputs (`reads`: their views, ParsedReads); what its messages publish of
    them. `car_state`: carState (a reader or any CarStateLike); `lateral_active`: carControl.latActive."""
    if reads.speeds is not None:
      self.action = get_action(reads, self.action, frame.lat_action_t, frame.long_action_t, max(float(car_state.vEgo), 0.0), self.rules,
                               self.lat_smooth_s, self.long_smooth_s)
    if reads.lat_planner is not None:  # sunnypilot modeld.py @002f69b0: the solution's yaw and curvature one frame ahead
      self.lat_planner_state[2:4] = [np.interp(DT_MDL, T_AXIS64, reads.lat_planner[0]), np.interp(DT_MDL, T_AXIS64, reads.lat_planner[1])]
    hard_brake, confidence = False, "green"
    if reads.hard_brake_5 is not None:  # .item: a Python float of the float32 value, no numpy scalar
      assert reads.hard_brake_3 is not None and reads.gas is not None and reads.brake is not None and reads.steer is not None, "one meta layout"
      hard_brake = self.hard_brake.update(reads.hard_brake_5.item(0), reads.hard_brake_3.item(0))
      confidence = self.confidence.update(frame.frame_id, reads.gas, reads.brake, reads.steer)
    state = reads.desire_state  # DesireHelper sees the lane-change probability just published (0 without a desire_state head)
    self.desire_helper.update(car_state, lateral_active, state.item(Desire.laneChangeLeft) + state.item(Desire.laneChangeRight) if state is not None else 0.0)
    return FrameState(self.action if reads.speeds is not None else None, hard_brake, confidence, int(self.desire_helper.lane_change_state),
                      int(self.desire_helper.lane_change_direction))

  def published_finite(self, parsed_values: np.ndarray, reads: ParsedReads) -> bool:
    """Whether what this frame publishes is finite as float32: every parsed value (`parsed_values`: the parse's values, its derived
    lane-line times aside, which may be NaN), the action (a slow car's curvature, 2 yaw / (v t), overflows float32 first) and the path
    fitted to the plan. When not, the action and lat_planner_state start again from zero: the next frame is smoothed against them."""
    if np.isfinite(parsed_values).all() and np.isfinite(self.lat_planner_state).all() \
       and abs(self.action.desired_curvature) <= FLOAT32_MAX and abs(self.action.desired_acceleration) <= FLOAT32_MAX \
       and (reads.positions is None or np.abs(reads.positions).max() < POLY_PATH_LIMIT): return True
    self.action, self.lat_planner_state[:] = Action(), 0.0
    return False
