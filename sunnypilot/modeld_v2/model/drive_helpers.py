"""The action controlsd follows: desired curvature, acceleration and stop flag from the model's outputs.

Today's openpilot (selfdrive/modeld/modeld.py and selfdrive/controls/lib/drive_helpers.py @084747c) for today's generations
(generations.Rules.todays_action): the model's `action` head when it has one (curvature = action[0] / max(1, v)^2, acceleration =
action[1]), else the plan, with an action time under MIN_STABLE_DELAY read at that delay and scaled down linearly; the stop flag is
should_stop(v_ego, acceleration) on the unsmoothed acceleration. For the generations before:
Formulas of openpilot selfdrive/controls/lib/drive_helpers.py in the form sunnypilot modeld_v2/modeld.py (sunnypilot/sunnypilot @13ce8664)
calls them: get_accel_from_plan returns (acceleration, should_stop) from the speed at action_t and 1 s later; get_curvature_from_plan
linearises the yaw at action_t. The commaai/openpilot copy of drive_helpers.py in our source index (@500432cb) predates these functions,
so this follows the text of that generation, not a named commaai commit. The action as a whole follows get_action_from_model of
openpilot modeld.py (commaai/openpilot @6c6be47b) with sunnypilot's get_curvature_from_output (fill_model_msg.py @d671ce18): the
model's desired_curvature head when it has one and the generation is not mlsim, else the plan; the smoothing and the low-speed hold only
where the generation has them (sunnypilot modeld.py @13ce8664 get_action_from_model; generations.py says which).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sunnypilot.modeld_v2.model.constants import DT_MDL, T_IDXS
from sunnypilot.modeld_v2.model.generations import Rules
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads

MIN_SPEED = 1.0  # m/s: curvature from yaw divides by speed
V_EGO_STOPPING = 0.05  # m/s: the plan stops when its speed at action_t and 1 s later is below this
LAT_SMOOTH_SECONDS = 0.0
LONG_SMOOTH_SECONDS = 0.3  # current models' long action_t: openpilot modeld.py adds it to CarParams.longitudinalActuatorDelay (0.0 @6c6be47b)
MIN_LAT_CONTROL_SPEED = 0.3  # m/s: below this the curvature holds
MIN_STABLE_DELAY = 0.3  # s: today's plan readers take shorter action times at this one, scaled (drive_helpers.py @084747c)
STOP_SPEED, STOP_ACCEL = 0.3, 0.1  # today's should_stop: slower than this and asked to accelerate less than this
T_AXIS64 = np.array(T_IDXS)  # np.interp converts a list of times to an array on every call
T_AXIS64.flags.writeable = False

@dataclass(frozen=True)
class Action:
  desired_curvature: float = 0.0
  desired_acceleration: float = 0.0
  should_stop: bool = False

def action_times(lat_delay: float, long_delay: float, long_smooth_s: float = LONG_SMOOTH_SECONDS) -> tuple[float, float]:
  """(lat_action_t, long_action_t): actuator delay + one frame since capture + half a frame to the middle of the next interval; the
  longitudinal one also covers its smoothing. The model's `action_t` input and the action below use the same two times."""
  return lat_delay + 1.5 * DT_MDL, long_delay + long_smooth_s + 1.5 * DT_MDL

def smooth_value(val: float, prev_val: float, tau: float, dt: float = DT_MDL) -> float:
  """First-order low pass with time constant tau; tau 0 passes the value through."""
  alpha = 1 - np.exp(-dt / tau) if tau > 0 else 1.0
  return float(alpha * val + (1 - alpha) * prev_val)

def get_accel_from_plan(speeds: np.ndarray, accels: np.ndarray, t_idxs: np.ndarray | list[float], action_t: float = DT_MDL,
                        v_ego_stopping: float = V_EGO_STOPPING) -> tuple[float, bool]:
  """The constant acceleration that reaches the plan's speed at action_t from the current speed and acceleration, and whether the plan
  stops (its speed at action_t and one second later both below v_ego_stopping)."""
  assert len(speeds) == len(t_idxs), f"plan has {len(speeds)} speeds for {len(t_idxs)} times"
  v_target = float(np.interp(action_t, t_idxs, speeds))
  v_target_1s = float(np.interp(action_t + 1.0, t_idxs, speeds))
  a_target = 2 * (v_target - float(speeds[0])) / action_t - float(accels[0])
  return a_target, v_target < v_ego_stopping and v_target_1s < v_ego_stopping

def todays_accel_from_plan(speeds: np.ndarray, accels: np.ndarray, t_idxs: np.ndarray, action_t: float) -> float:
  """Today's get_accel_from_plan: the plan's speed at action_t (under MIN_STABLE_DELAY: at it, scaled by action_t / MIN_STABLE_DELAY)."""
  v_now = float(speeds[0])
  if action_t < MIN_STABLE_DELAY: v_target = v_now + action_t / MIN_STABLE_DELAY * (float(np.interp(MIN_STABLE_DELAY, t_idxs, speeds)) - v_now)
  else: v_target = float(np.interp(action_t, t_idxs, speeds))
  return 2 * (v_target - v_now) / action_t - float(accels[0])

def todays_curvature_from_plan(yaws: np.ndarray, yaw_rates: np.ndarray, t_idxs: np.ndarray, v_ego: float, action_t: float) -> float:
  """Today's get_curvature_from_plan: the yaw at action_t (under MIN_STABLE_DELAY: at it, scaled)."""
  psi = action_t / MIN_STABLE_DELAY * float(np.interp(MIN_STABLE_DELAY, t_idxs, yaws)) if action_t < MIN_STABLE_DELAY else \
    float(np.interp(action_t, t_idxs, yaws))
  return curv_from_psis(psi, float(yaw_rates[0]), v_ego, action_t)

def should_stop(v_ego: float, accel: float) -> bool: return v_ego < STOP_SPEED and accel < STOP_ACCEL  # today's drive_helpers

def curv_from_psis(psi_target: float, psi_rate: float, v_ego: float, action_t: float) -> float:
  """The curvature whose linear ramp from the current yaw rate reaches yaw psi_target at action_t."""
  v_ego = max(v_ego, MIN_SPEED)
  return 2 * psi_target / (v_ego * action_t) - psi_rate / v_ego

def get_curvature_from_plan(yaws: np.ndarray, yaw_rates: np.ndarray, t_idxs: np.ndarray | list[float], v_ego: float, action_t: float) -> float:
  return curv_from_psis(float(np.interp(action_t, t_idxs, yaws)), float(yaw_rates[0]), v_ego, action_t)

def get_action(reads: ParsedReads, prev: Action, lat_action_t: float, long_action_t: float, v_ego: float, rules: Rules,
               lat_smooth_s: float = LAT_SMOOTH_SECONDS, long_smooth_s: float = LONG_SMOOTH_SECONDS) -> Action:
  """This frame's action from the parsed outputs (plan required), smoothed against the previous frame's as the generation's rules say."""
  if rules.todays_action: return todays_action(reads, prev, lat_action_t, long_action_t, v_ego, lat_smooth_s, long_smooth_s)
  assert reads.speeds is not None and reads.accels is not None and reads.yaws is not None and reads.yaw_rates is not None, "a plan head"
  accel, stop = get_accel_from_plan(reads.speeds, reads.accels, T_AXIS64, long_action_t)
  accel = smooth_value(accel, prev.desired_acceleration, long_smooth_s)
  if reads.desired_curvature is not None and not rules.curvature_from_plan: curvature = float(reads.desired_curvature[0])
  else: curvature = get_curvature_from_plan(reads.yaws, reads.yaw_rates, T_AXIS64, v_ego, lat_action_t)
  if rules.smooth_and_hold:
    curvature = smooth_value(curvature, prev.desired_curvature, lat_smooth_s) if v_ego > MIN_LAT_CONTROL_SPEED else prev.desired_curvature
  return Action(curvature, accel, bool(stop))

def todays_action(reads: ParsedReads, prev: Action, lat_action_t: float, long_action_t: float, v_ego: float, lat_smooth_s: float,
                  long_smooth_s: float) -> Action:
  """get_action_from_model of today's openpilot (modeld.py @084747c)."""
  if reads.action is not None:
    accel, curvature = float(reads.action[1]), float(reads.action[0]) / max(1.0, v_ego) ** 2
  else:
    assert reads.speeds is not None and reads.accels is not None and reads.yaws is not None and reads.yaw_rates is not None, "a plan head"
    accel = todays_accel_from_plan(reads.speeds, reads.accels, T_AXIS64, long_action_t)
    curvature = todays_curvature_from_plan(reads.yaws, reads.yaw_rates, T_AXIS64, v_ego, lat_action_t)
  stop = should_stop(v_ego, accel)
  accel = smooth_value(accel, prev.desired_acceleration, long_smooth_s)
  curvature = smooth_value(curvature, prev.desired_curvature, lat_smooth_s) if v_ego > MIN_LAT_CONTROL_SPEED else prev.desired_curvature
  return Action(curvature, accel, bool(stop))
