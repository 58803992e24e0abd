"""The bus topics the daemons read, by role: each role resolves once, at import, to the name the installed schema's services list has,
today's first. openpilot renamed four of them (#38585, #38601, 2026-08-08/10; the Event union's ordinals stayed): roadCameraState ->
narrowRoadCameraState, driverCameraState -> cabinCameraState, liveCalibration -> extrinsicsCalibration, liveDelay -> lateralDelay.
A daemon subscribing by the old names on today's device would never see a calibration: every modelV2 would stay invalid.

A role no name of which the schema lists is None (read as never published), except the ones a daemon cannot run without (REQUIRED):
then `problem` says so in one line and the daemons refuse to start. Code reads `TOPICS.calibration`, a plain string: nothing per frame.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

from sunnypilot.modeld_v2.daemon.schema import SCHEMA

@dataclass(frozen=True)
class Topics:
  """A topic name per role (None: this schema has none)."""
  road_camera_state: str | None  # frameAge: how far the model lags the road camera
  cabin_camera_state: str | None
  calibration: str | None  # the warp's rpy and camera height, dmonitoringmodeld's calib
  lateral_delay: str | None  # the steering delay estimate the action is timed with
  device_state: str | None
  car_state: str | None
  driver_monitoring_state: str | None  # isRHD
  car_control: str | None  # latActive
  selfdrive_state: str | None  # whether openpilot is engaged

  def describe(self, names: Sequence[str] | None = None) -> str:
    """The names chosen (of `names` only, if given) with their roles, for the daemons' start line."""
    chosen = [(getattr(self, f.name), f.name.replace("_", " ")) for f in fields(self)]
    return ", ".join(f"{name} ({role})" for name, role in chosen if name is not None and (names is None or name in names))

# role -> its names, today's first (older schemas carry `enabled` in controlsState, today's in selfdriveState)
NAMES: dict[str, tuple[str, ...]] = {
  "road_camera_state": ("narrowRoadCameraState", "roadCameraState"),
  "cabin_camera_state": ("cabinCameraState", "driverCameraState"),
  "calibration": ("extrinsicsCalibration", "liveCalibration"),
  "lateral_delay": ("lateralDelay", "liveDelay"),
  "device_state": ("deviceState",),
  "car_state": ("carState",),
  "driver_monitoring_state": ("driverMonitoringState",),
  "car_control": ("carControl",),
  "selfdrive_state": ("selfdriveState", "controlsState"),
}
REQUIRED = ("calibration", "car_state")  # no warp without a calibration, no action without the car's speed

def resolve(services: Sequence[str]) -> Topics:
  """Each role's name among `services` (a schema's services list), today's first; ValueError, one line, for a list that names a topic
  twice or lacks every name of a required role."""
  if dup := sorted({s for s in services if list(services).count(s) > 1}):
    raise ValueError(f"the schema's services list names {', '.join(dup)} more than once: which one is read cannot be told")
  listed = set(services)
  chosen = {role: next((name for name in names if name in listed), None) for role, names in NAMES.items()}
  if missing := [role for role in REQUIRED if chosen[role] is None]:
    raise ValueError("the schema's services list has no " + "; no ".join(f"{r.replace('_', ' ')} topic (any of {', '.join(NAMES[r])})" for r in missing))
  return Topics(**chosen)

def topics_of_schema() -> tuple[Topics | None, str]:
  """(the installed schema's topics, or None; the reason when None)."""
  if SCHEMA is None: return None, "no cereal schema"
  try: return resolve(SCHEMA.services), ""
  except ValueError as e: return None, f"{SCHEMA.source}: {e}"

TOPICS_OR_NONE, problem = topics_of_schema()
# every reader takes its names from here; a process whose schema cannot run the daemons still imports (daemon_main refuses it first)
TOPICS = TOPICS_OR_NONE or Topics(*(names[-1] for names in NAMES.values()))
