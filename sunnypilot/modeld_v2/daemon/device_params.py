"""What modeld reads from openpilot's Params on a device: the car's actuator delays (CarParams) and sunnypilot's CameraOffset. On a PC,
modeld's flags stand in.

openpilot's modeld (selfdrive/modeld/modeld.py @6c6be47b) blocks on Params' CarParams at start and uses `longitudinalActuatorDelay`; the
steering delay it feeds is liveDelay.lateralDelay, which lagd starts at `steerActuatorDelay + 0.2` (selfdrive/locationd/lagd.py @01d35d5c,
`initial_lag`) until it has an estimate. So the lateral delay here already holds the 0.2 s, and nothing adds it again.
`openpilot.common.params` exists only on a device: it is imported when asked, and without it the flags stand in.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from sunnypilot.modeld_v2.daemon.bus_inputs import check_camera_offset, delay_ok

# A typical car when no CarParams can be read: a Toyota TSS2 torque-steering car (opendbc car/toyota/interface.py @0035b675:
# steerActuatorDelay 0.12 s; its longitudinalActuatorDelay stays the CarParams default of opendbc car/interfaces.py, 0.15 s)
TYPICAL_STEER_ACTUATOR_DELAY, TYPICAL_LONG_ACTUATOR_DELAY = 0.12, 0.15
LAGD_EXTRA = 0.2  # lagd's initial lateral delay over steerActuatorDelay

@dataclass(frozen=True)
class Delays:
  lateral: float  # seconds, before liveDelay publishes an estimate: steerActuatorDelay + LAGD_EXTRA
  longitudinal: float  # longitudinalActuatorDelay
  source: str

def from_car_params(steer_actuator_delay: float, long_actuator_delay: float, source: str) -> Delays:
  return Delays(steer_actuator_delay + LAGD_EXTRA, long_actuator_delay, source)

TYPICAL_CAR = from_car_params(TYPICAL_STEER_ACTUATOR_DELAY, TYPICAL_LONG_ACTUATOR_DELAY, "a typical car")

def on_device() -> bool:
  """A comma device, as openpilot decides it (openpilot.system.hardware's PC is false there); a PC, with or without openpilot, otherwise."""
  try:
    from openpilot.system.hardware import PC  # type: ignore[import-not-found]
  except ImportError:
    return False
  return not PC

def device_params():
  """openpilot's Params, or None on a PC (no openpilot installed)."""
  try:
    from openpilot.common.params import Params  # type: ignore[import-not-found]
  except ImportError:
    return None
  return Params()

def read_car_params(params) -> Delays:
  """The delays of the CarParams in `params` (device_params()), waiting until card writes them, as openpilot's modeld does."""
  try:
    from cereal import car  # type: ignore[import-not-found]
  except ImportError:
    from openpilot_logging.cereal import car
  with car.CarParams.from_bytes(params.get("CarParams", block=True)) as cp:
    steer, long = float(cp.steerActuatorDelay), float(cp.longitudinalActuatorDelay)
  if not (delay_ok(steer + LAGD_EXTRA) and delay_ok(long)):  # a broken CarParams must not reach action_t: a typical car's, said so
    return dataclasses.replace(TYPICAL_CAR, source=f"a typical car (CarParams delays {steer!r}, {long!r} refused)")
  return from_car_params(steer, long, "CarParams")

def camera_offset(params, fallback: float) -> float:
  """sunnypilot's CameraOffset parameter in metres (modeld_v2 reads it every 60 frames), or `fallback` when it is unset,
  unreadable or out of check_camera_offset's range."""
  try: return check_camera_offset(float(params.get("CameraOffset", return_default=True)))
  except (TypeError, ValueError): return fallback
