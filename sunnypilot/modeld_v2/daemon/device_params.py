"""What modeld reads from openpilot's Params on a device: the car's actuator delays (CarParams) and sunnypilot's CameraOffset. On a PC,
modeld's flags stand in.

openpilot's modeld (selfdrive/modeld/modeld.py @6c6be47b) blocks on Params' CarParams at start and uses `longitudinalActuatorDelay`; the
steering delay it feeds is liveDelay.lateralDelay, which lagd starts at `steerActuatorDelay + 0.2` (selfdrive/locationd/lagd.py @01d35d5c,
`initial_lag`) until it has an estimate. So the lateral delay here already holds the 0.2 s, and nothing adds it again.
`openpilot.common.params` exists only on a device: it is imported when asked, and without it the flags stand in. Every read goes through
DeviceParams: a parameter can never stop a daemon.
"""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sunnypilot.modeld_v2.daemon.bus_inputs import check_camera_offset, delay_ok

# A typical car when no CarParams can be read: a Toyota TSS2 torque-steering car (opendbc car/toyota/interface.py @0035b675:
# steerActuatorDelay 0.12 s; its longitudinalActuatorDelay stays the CarParams default of opendbc car/interfaces.py, 0.15 s)
TYPICAL_STEER_ACTUATOR_DELAY, TYPICAL_LONG_ACTUATOR_DELAY = 0.12, 0.15
LAGD_EXTRA = 0.2  # lagd's initial lateral delay over steerActuatorDelay
CAR_PARAMS_POLL_S = 0.1  # how often a daemon waiting for CarParams looks again

@dataclass(frozen=True)
class Delays:
  lateral: float  # seconds, before liveDelay publishes an estimate: steerActuatorDelay + LAGD_EXTRA
  longitudinal: float  # longitudinalActuatorDelay
  source: str

def from_car_params(steer_actuator_delay: float, long_actuator_delay: float, source: str) -> Delays:
  return Delays(steer_actuator_delay + LAGD_EXTRA, long_actuator_delay, source)

TYPICAL_CAR = from_car_params(TYPICAL_STEER_ACTUATOR_DELAY, TYPICAL_LONG_ACTUATOR_DELAY, "a typical car")

class DeviceParams:
  """openpilot's Params as the daemons use them, unable to crash a daemon: openpilot raises UnknownKeyName for a key its params_keys.h
  does not list (common/params @084747c: sunnypilot's ModelManager_ActiveBundle and CameraOffset are not there), so a key this openpilot
  does not know, or any error reading one, is "unset" (None), and a write that fails is dropped; each said once per key."""
  def __init__(self, params: Any, report: Callable[[str], None]):
    self.params, self.report, self.failed = params, report, set[str]()

  def _failed(self, key: str, what: str, e: Exception) -> None:
    if key not in self.failed:
      self.failed.add(key)
      self.report(f"Params {key}: {what} failed ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}): taken as unset")

  def get(self, key: str) -> Any:
    """The value of `key`, or None when it is unset, unknown to this openpilot or unreadable."""
    try: return self.params.get(key)
    except Exception as e:  # UnknownKeyName, a corrupt value, a Params of another era's signature
      self._failed(key, "reading it", e)
      return None

  def put_bool(self, key: str, value: bool) -> None:
    try: self.params.put_bool(key, value)
    except Exception as e: self._failed(key, "writing it", e)

def device_params(report: Callable[[str], None]) -> DeviceParams | None:
  """openpilot's Params behind DeviceParams, or None on a PC (no openpilot installed, or one whose Params cannot be opened: said)."""
  try:
    from openpilot.common.params import Params  # type: ignore[import-not-found]
  except ImportError:
    return None
  try: return DeviceParams(Params(), report)
  except Exception as e:
    report(f"openpilot's Params cannot be opened ({type(e).__name__}: {e}): none are read")
    return None

def read_car_params(params: DeviceParams, car: Any, stop: threading.Event, report: Callable[[str], None]) -> Delays:
  """The delays of the CarParams in `params`, waiting until card writes them, as openpilot's modeld does (polled, so that a SIGTERM still
  ends the wait); a typical car's, said so, when the daemon is told to stop first or when CarParams cannot be read as one."""
  waited = False
  while (raw := params.get("CarParams")) is None and "CarParams" not in params.failed:
    if not waited: report("waiting for CarParams (card writes them when the car is recognized)")
    waited = True
    if stop.wait(CAR_PARAMS_POLL_S): return dataclasses.replace(TYPICAL_CAR, source="a typical car (stopped while waiting for CarParams)")
  if raw is None: return dataclasses.replace(TYPICAL_CAR, source="a typical car (CarParams unreadable)")
  try:
    with car.CarParams.from_bytes(raw) as cp: steer, long = float(cp.steerActuatorDelay), float(cp.longitudinalActuatorDelay)
  except Exception as e: return dataclasses.replace(TYPICAL_CAR, source=f"a typical car (CarParams not readable: {type(e).__name__})")
  if not (delay_ok(steer + LAGD_EXTRA) and delay_ok(long)):  # a broken CarParams must not reach action_t: a typical car's, said so
    return dataclasses.replace(TYPICAL_CAR, source=f"a typical car (CarParams delays {steer!r}, {long!r} refused)")
  return from_car_params(steer, long, "CarParams")

def camera_offset(params: DeviceParams, fallback: float) -> float:
  """sunnypilot's CameraOffset parameter in metres (modeld_v2 reads it every 60 frames), or `fallback` when it is unset, unknown to this
  openpilot, unreadable or out of check_camera_offset's range."""
  try: return check_camera_offset(float(params.get("CameraOffset")))
  except (TypeError, ValueError): return fallback
