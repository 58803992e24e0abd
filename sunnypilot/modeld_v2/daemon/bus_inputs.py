"""Bus inputs checked where they enter modeld: one method per service returns values the model and the messages can use, or the last good
ones when a message carries a non-finite or out-of-range number. Unchecked, one NaN vEgo reaches the model's recurrent state and every
output stays NaN until a restart; a 1e30 calibration makes the warp read one pixel for the whole image.

Each bad input is logged once when it starts and once, with its count, when good values return (common/logs.Episodes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import capnp

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.messaging import lateral_delay
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.model.calibration import CALIBRATION_HEIGHT, DEFAULT_RPY

V_EGO_MAX = 100.0  # m/s (360 km/h): a larger |vEgo| is a broken message, not a car
DELAY_MAX = 5.0  # s: an actuator delay beyond this is a broken setting or estimate
HEIGHT_LIMITS = (0.5, 3.0)  # metres: a camera height outside this is a broken calibration, not a windshield mount
CAMERA_OFFSET_MAX = 1.0  # metres either way: sunnypilot's CameraOffset moves the camera within the car, never out of it
# (roll, pitch, yaw) bounds in radians: calibrationd publishes pitch and yaw clipped to its widest limits (mici's pitch) plus 0.005
# (openpilot selfdrive/locationd/calibrationd.py, sanity_clip); it never estimates roll, a mount rolled beyond 0.5 rad is no mount
RPY_LIMITS = ((-0.5, 0.5), (-0.148101, 0.22735988), (-0.07412048084718224, 0.07412048084718235))

def delay_ok(value: float) -> bool:
  """The one rule for actuator delays: a finite number of seconds in [0, DELAY_MAX] (a negative one can make action_t zero, a divisor)."""
  return math.isfinite(value) and 0.0 <= value <= DELAY_MAX

def parse_delay(text: str) -> float:
  """--lat-delay / --long-delay: seconds, by delay_ok's rule (ValueError naming it)."""
  try: value = float(text)
  except ValueError: value = math.nan
  if not delay_ok(value): raise ValueError(f"expected a number from 0 to {DELAY_MAX:g} seconds, got {text!r}")
  return value

def parse_camera_offset(text: str) -> float:
  """--camera-offset: metres, by check_camera_offset's rule (ValueError naming it)."""
  try: value = float(text)
  except ValueError: raise ValueError(f"expected a number of metres, got {text!r}") from None
  return check_camera_offset(value)

def check_camera_offset(value: float) -> float:
  """The one rule for sunnypilot's CameraOffset (flag or parameter): finite metres within CAMERA_OFFSET_MAX either way."""
  if not (math.isfinite(value) and abs(value) <= CAMERA_OFFSET_MAX):
    raise ValueError(f"a camera offset must be a number of metres in [-{CAMERA_OFFSET_MAX:g}, {CAMERA_OFFSET_MAX:g}], got {value!r}")
  return value

@dataclass(frozen=True)
class CarInputs:
  """The carState fields modeld and DesireHelper read, checked (a CarStateLike)."""
  vEgo: float = 0.0
  leftBlinker: bool = False
  rightBlinker: bool = False
  steeringPressed: bool = False
  steeringTorque: float = 0.0
  leftBlindspot: bool = False
  rightBlindspot: bool = False

class BusInputs:
  """The last good value of each checked input, and the episodes of bad ones."""
  def __init__(self, episodes: Episodes):
    self.episodes = episodes
    self.car = CarInputs()
    self.rpy: tuple[float, ...] = DEFAULT_RPY
    self.calibrated = False  # a liveCalibration was accepted: until then the warp runs on DEFAULT_RPY and every message is invalid
    self.height = CALIBRATION_HEIGHT
    self.lat_delay: float | None = None

  def messages(self, sm: Any) -> None:
    """Messages the SubMaster dropped as malformed or of another type, per service: a line when it starts, the count when good ones return.
    (openpilot's own SubMaster, used where its cereal is installed, keeps no such count: then this does nothing.)"""
    for service, new in getattr(sm, "dropped", {}).items():
      key = f"{service} messages"
      if new > 0: self.episodes.happened(key, f"{service}: dropped a malformed message ({sm.drop_reason[service]}); using the last good one", new)
      elif sm.updated[service]: self.episodes.ended(key, f"{service}: good messages again after dropping malformed ones")

  def _checked(self, key: str, good: bool, value: Any, last: Any) -> bool:
    if good: self.episodes.ended(key, f"{key} is good again after bad values")
    else: self.episodes.happened(key, f"{key} = {value!r} refused: using the last good value {last!r}")
    return good

  def car_state(self, sm: Any) -> CarInputs:
    """carState: vEgo finite with |vEgo| <= V_EGO_MAX, steeringTorque finite; else the last good value of that field."""
    if not sm.seen.get(TOPICS.car_state): return self.car
    cs = sm[TOPICS.car_state]
    v_ego, torque = float(cs.vEgo), float(cs.steeringTorque)
    good_v = self._checked("carState.vEgo", math.isfinite(v_ego) and abs(v_ego) <= V_EGO_MAX, v_ego, self.car.vEgo)
    good_t = self._checked("carState.steeringTorque", math.isfinite(torque), torque, self.car.steeringTorque)
    self.car = CarInputs(v_ego if good_v else self.car.vEgo, bool(cs.leftBlinker), bool(cs.rightBlinker), bool(cs.steeringPressed),
                         torque if good_t else self.car.steeringTorque, bool(cs.leftBlindspot), bool(cs.rightBlindspot))
    return self.car

  def _floats(self, sm: Any, service: str, field: str, most: int) -> tuple[float, ...] | None:
    """At most `most` values of a list field of the last `service` message, or None when its pointer leads outside the message's bytes:
    the SubMaster checks a message's type and root, capnp checks a list's bounds only when it is read (then KjException, which would stop
    the frame loop). A longer list than expected costs no more than `most` values per frame."""
    key = f"{service}.{field}"
    try:
      values = getattr(sm[service], field)
      values = tuple(float(values[i]) for i in range(min(len(values), most)))
    except capnp.KjException as e:
      self.episodes.happened(f"{key} unreadable", f"{key} unreadable ({str(e).splitlines()[0][:120]}): using the last good value")
      return None
    self.episodes.ended(f"{key} unreadable", f"{key} readable again after unreadable messages")
    return values

  def calibration(self, sm: Any) -> tuple[float, ...]:
    """The calibration's rpyCalib: three finite angles within RPY_LIMITS; else the last good calibration (DEFAULT_RPY before one, and
    `calibrated` stays False: a refused calibration is not one)."""
    topic = TOPICS.calibration
    if topic is None or not sm.seen.get(topic) or (rpy := self._floats(sm, topic, "rpyCalib", 4)) is None: return self.rpy  # 4: more than 3 is refused
    good = len(rpy) == 3 and all(math.isfinite(a) and lo <= a <= hi for a, (lo, hi) in zip(rpy, RPY_LIMITS, strict=True))
    if self._checked(f"{topic}.rpyCalib", good, list(rpy), list(self.rpy)): self.rpy, self.calibrated = rpy, True
    return self.rpy

  def camera_height(self, sm: Any) -> float:
    """The calibration's height[0] (metres) within HEIGHT_LIMITS; else the last good one (CALIBRATION_HEIGHT before one)."""
    topic = TOPICS.calibration
    if topic is None or not sm.seen.get(topic) or not (heights := self._floats(sm, topic, "height", 1)): return self.height
    height = heights[0]
    if self._checked(f"{topic}.height", math.isfinite(height) and HEIGHT_LIMITS[0] <= height <= HEIGHT_LIMITS[1], height, self.height):
      self.height = height
    return self.height

  def lateral_delay(self, sm: Any, fallback: float) -> float:
    """The lateral delay topic's lateralDelay (the configured `fallback` before an estimate): within delay_ok's rule; else the last good one."""
    delay = lateral_delay(sm, fallback)
    last = fallback if self.lat_delay is None else self.lat_delay
    if not self._checked(f"{TOPICS.lateral_delay}.lateralDelay", delay_ok(delay), delay, last): return last
    self.lat_delay = delay
    return delay
