"""One frame's model inputs from the bus, in the one order modeld follows: the messages checked (BusInputs), the action times from the
delays, the warp transforms with sunnypilot's CameraOffset, then every host input by name with the desire and lat_planner_state the
DrivingState carries. modeld runs `FrameInputs.step` on each frame it receives; route_replay's reference check runs the same on the log
state at each frame, so the reference is fed exactly what modeld fed its model.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs, CarInputs
from sunnypilot.modeld_v2.daemon.device_params import Delays
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, CameraConfig, apply_camera_offset, warp_matrices
from sunnypilot.modeld_v2.model.drive_helpers import action_times

ZERO_HOST_INPUTS = ("nav_features", "nav_instructions")  # openpilot left navigation inputs at zero once nav was gone
DRIVING_STYLE = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # sunnypilot's default driving_style input (modeld.py @002f69b0)

def rhd_of(sm, rhd: bool) -> bool:
  """Right-hand traffic: the --rhd flag, else driverMonitoringState.isRHD."""
  return rhd or bool(sm.seen.get(TOPICS.driver_monitoring_state) and sm[TOPICS.driver_monitoring_state].isRHD)

def lateral_active(sm) -> bool: return bool(sm.seen.get(TOPICS.car_control) and sm[TOPICS.car_control].latActive)

def host_inputs(m_inv: np.ndarray, desire: np.ndarray, rhd: bool, v_ego: float, lat_delay: float, lat_t: float, long_t: float,
                lat_planner_state: np.ndarray, prepare_only: bool = False) -> dict[str, Any]:
  """The value of every host input modeld has a source for, by name, from checked bus values (BusInputs). `lat_delay` is the whole
  lateral delay (liveDelay's, which holds lagd's 0.2 s): lateral_control_params takes it as it is."""
  return {HOST_TRANSFORM: m_inv, "desire": desire, "traffic_convention": [0, 1] if rhd else [1, 0], "action_t": [lat_t, long_t],
          "lateral_control_params": [max(v_ego, 0.0), lat_delay], "driving_style": DRIVING_STYLE, "prepare_only": [float(prepare_only)],
          "lat_planner_state": lat_planner_state}

class HostInputs:
  """A model's host input views by name, and how each frame's values go into them: each view flattened once (ArtifactError if one is not
  contiguous, so a flat write would miss it), and on the first frame every input with no value, or whose size does not match its value's,
  reported and left zero (modeld's values keep their names and sizes)."""
  def __init__(self, inputs: dict[str, np.ndarray], report: Callable[[str], None]):
    self.report, self.flat = report, {}
    for name, view in inputs.items():
      if not np.shares_memory(flat := view.reshape(-1), view): raise ArtifactError(f"host input {name} is not contiguous: a flat write would miss it")
      self.flat[name] = flat
    self.targets: list[tuple[str, np.ndarray]] | None = None  # (name, flat view) of every input written: made on the first frame

  def write(self, values: dict[str, Any]) -> None:
    """`values` (host_inputs) into the views; an array is flattened, a list goes in as it is."""
    if self.targets is None: self.targets = self._targets(values)
    for name, flat in self.targets:
      value = values[name]
      flat[:] = value.reshape(-1) if type(value) is np.ndarray else value

  def _targets(self, values: dict[str, Any]) -> list[tuple[str, np.ndarray]]:
    targets = []
    for name, flat in self.flat.items():
      if name in values and np.size(values[name]) == flat.size: targets.append((name, flat))
      elif name in values: self.report(f"host input {name} ({flat.size} values) does not take modeld's {np.size(values[name])}: it stays zero")
      elif name not in ZERO_HOST_INPUTS: self.report(f"host input {name} ({flat.size} values) has no source here: it stays zero")
    return targets

@dataclass(frozen=True)
class FrameValues:
  """One frame's inputs: the host inputs by name, and the checked bus values its messages are filled from."""
  host: dict[str, Any]
  car: CarInputs
  lat_t: float  # drive_helpers.action_times: the model's action_t and the published action use the same two
  long_t: float
  lateral_active: bool  # carControl.latActive
  calibrated: bool  # a liveCalibration was accepted (BusInputs.calibrated): every message is invalid before

def cameras_of(sensor: str, main_wide: bool) -> tuple:
  """The (main, extra) cameras of `sensor`: (road, wide), or the wide one twice when the main stream is the wide camera."""
  road, wide = SENSOR_CAMERAS[sensor]
  return (wide, wide) if main_wide else (road, wide)

class FrameInputs:
  """What the input sequence carries from frame to frame: the last good bus values, the applied CameraOffset, the transforms of the last
  calibration. `camera_offset_target` (metres) is the flag's or the parameter's; the applied offset follows it (sunnypilot's EMA)."""
  def __init__(self, bus: BusInputs, rhd: bool = False, camera_offset: float = 0.0):
    self.bus, self.rhd = bus, rhd
    self.camera_offset_target, self.camera_offset = camera_offset, 0.0
    self.cameras: tuple[CameraConfig, CameraConfig] | None = None  # (main, extra) intrinsics of the live geometry: use_cameras
    self.rpy: tuple | None = None  # the calibration transforms() last computed m_inv for
    self.m_inv = np.zeros((2, 3, 3), np.float32)
    self.offset_key: tuple | None = None  # (cameras, rpy, height, applied offset) offset_m_inv was made for
    self.offset_m_inv = self.m_inv

  def use_cameras(self, sensor: str, main_wide: bool) -> None:
    """The (main, extra) cameras of `sensor` (cameras_of) from now on."""
    self.cameras, self.rpy = cameras_of(sensor, main_wide), None

  def transforms(self, rpy) -> np.ndarray:
    """M_inv for both cameras, recomputed only when the calibration changes."""
    assert self.cameras is not None, "use_cameras first"
    if self.rpy != (rpy := tuple(rpy)):
      self.rpy, self.m_inv = rpy, warp_matrices(self.cameras, rpy)
    return self.m_inv

  def offset_transforms(self, sm) -> np.ndarray:
    """M_inv for both cameras with sunnypilot's CameraOffset: the applied offset moves a tenth of the way to the target on each calibration
    update (modeld_v2/camera_offset_helper.py @5b23aa70), with the calibration's camera height; the shear is remade only when one of
    them (or the cameras) changes."""
    m_inv = self.transforms(self.bus.calibration(sm))
    if sm.updated.get(TOPICS.calibration): self.camera_offset = 0.9 * self.camera_offset + 0.1 * self.camera_offset_target
    if self.camera_offset == 0: return m_inv
    assert self.cameras is not None, "use_cameras first"
    if self.offset_key != (key := (self.cameras, self.rpy, self.bus.camera_height(sm), self.camera_offset)):
      self.offset_key, self.offset_m_inv = key, np.stack([apply_camera_offset(m, camera.intrinsics, key[2], self.camera_offset)
                                                          for m, camera in zip(m_inv, self.cameras, strict=True)])
    return self.offset_m_inv

  def step(self, sm, delays: Delays, state: DrivingState, prepare_only: bool = False) -> FrameValues:
    """This frame's inputs from the bus state `sm` (a SubMaster, or what one would hold), the configured `delays` (liveDelay replaces the
    lateral one when published) and the desire and lat_planner_state the driving `state` carries. Call it once per frame the model sees."""
    self.bus.messages(sm)
    car, lat_delay = self.bus.car_state(sm), self.bus.lateral_delay(sm, delays.lateral)
    lat_t, long_t = action_times(lat_delay, delays.longitudinal)
    host = host_inputs(self.offset_transforms(sm), state.desire_input(), rhd_of(sm, self.rhd), car.vEgo, lat_delay, lat_t, long_t,
                       state.lat_planner_state, prepare_only)
    return FrameValues(host, car, lat_t, long_t, lateral_active(sm), self.bus.calibrated)
