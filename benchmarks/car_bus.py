"""The car's messages the daemon benchmarks publish before each frame, as a car's bus carries them between two camera frames."""
from __future__ import annotations

BUS_SERVICES = ("carState", "carControl", "driverMonitoringState")  # what a car publishes at least once per model frame besides the cameras

def bus_traffic() -> dict[str, bytes]:
  """One message per BUS_SERVICES, as a car at 20 m/s with lateral control on sends them: modeld reads each on every frame (a bus with only
  the camera states would leave its SubMaster almost nothing to read)."""
  from sunnypilot.modeld_v2.daemon.messaging import new_message
  car, control, monitoring = (new_message(s) for s in BUS_SERVICES)
  car.carState.vEgo, control.carControl.latActive, monitoring.driverMonitoringState.isRHD = 20.0, True, False
  return {s: m.to_bytes() for s, m in zip(BUS_SERVICES, (car, control, monitoring), strict=True)}
