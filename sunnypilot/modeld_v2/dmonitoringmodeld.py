"""The driver-monitoring daemon: camerad's driver stream in, one fused DM warp + model run per frame, driverStateV2 out.

  python -m sunnypilot.modeld_v2.dmonitoringmodeld --artifacts out/artifacts [--model-sets ROOT] [--trusted-keys DIR] [--send-raw] [--max-frames N]

`--artifacts` holds dmonitoring_model.bin (compile_modeld of openpilot's DM ONNX) and a dm_warp bundle (compile_dm_warp) per driver-camera
geometry it may meet; modeld's model.bin and warps may sit beside them, and are passed over. The daemon picks the dm_warp whose frame
layout matches the live driver buffers and binds those buffers by pointer (read in place). When camerad comes back with another geometry,
it switches to that geometry's warp and camera intrinsics, or waits, publishing nothing, until one is built. With --trusted-keys (on a
device the same folder as modeld's, when it exists) the model and its warp must be signed, as modeld's (daemon/model_sets.Trust).

Model sets, as modeld's (the same skeleton, daemon/frame_daemon.py): --artifacts is the default set; with --model-sets ROOT (on a device
modeld's folder) the DM model of the set asked for is loaded and warmed up beside the frames and takes over between two of them; a set with
no DM model, or one that fails to load or warm up, is passed over with one line; one whose first 20 frames give non-finite outputs is
dropped for the previous one; at start a set that fails falls back to the last that ran (ROOT/last_ran_dm, this daemon's own record),
then the default.

Follows openpilot selfdrive/modeld/dmonitoringmodeld.py (commaai/openpilot @63cf2e70) and sunnypilot's (sunnypilot/sunnypilot @41dea5d4):
the driver stream (VISION_STREAM_DRIVER, conflated); the warp's transform inv(dmonitoringmodel_intrinsics @ inv(driver camera intrinsics));
`calib` = the calibration's rpyCalib (zeros before one; a non-finite or out-of-range one refused, the last good kept); each frame's outputs
parsed and filled as those files do (model/parse_dmonitoring_outputs.py, model/fill_driver_state.py); modelExecutionTime covers the inputs,
the run and the readback, gpuExecutionTime the run and the readback; rawPredictions with --send-raw (or SEND_RAW_PRED); on a device
config_realtime_process(7, 5). Unlike openpilot's, a frame with non-finite outputs is published with valid=False (its values zeroed).
"""
from __future__ import annotations

import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
from sunnypilot.modeld_v2.daemon.camera_sync import DriverCamera
from sunnypilot.modeld_v2.daemon.daemon_main import daemon_main, daemon_parser
from sunnypilot.modeld_v2.daemon.daemon_spec import Clock, Frame, Loaded, Published
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_DM_FILE
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.format.bundle import read_header
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.fill_driver_state import driver_state_fields
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser

SERVICE = "driverStateV2"
# by role (daemon/topics.py): extrinsicsCalibration today, liveCalibration before; never None here (a required topic: no start without it)
SUBSCRIBED: tuple[str, ...] = (cast(str, TOPICS.calibration),)
DEVICE_CORE, REALTIME_PRIORITY = 7, 5  # openpilot's dmonitoringmodeld: config_realtime_process(7, 5)

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class DMParse:
  """What dmonitoringmodeld keeps with a loaded DM model: its output parse, and its warp's transform (the driver camera's M_inv)."""
  parser: DMOutputParser
  transform: np.ndarray

class DMonitoringModelD:
  """dmonitoringmodeld's spec (daemon/frame_daemon.DaemonSpec): the driver camera, calib from the bus, driverStateV2 out."""
  services: tuple[str, ...]
  name, services, subscribed, bundles = "dmonitoringmodeld", (SERVICE,), SUBSCRIBED, DRIVER_MONITORING
  device_core, realtime_priority, last_ran, camera_name = DEVICE_CORE, REALTIME_PRIORITY, LAST_RAN_DM_FILE, "driver camera: "
  fresh, warm_up_runs = "a DM model keeps nothing from one frame to the next", 1

  def __init__(self, episodes: Episodes, send_raw: bool = False):
    self.send_raw = send_raw
    self.bus = BusInputs(episodes)  # liveCalibration checked where it enters
    self.bytes = MessageBytes(episodes.once)

  def camera(self, exit_event: threading.Event, episodes: Episodes) -> DriverCamera: return DriverCamera(exit_event, episodes)
  def start(self, params: Any, stop: threading.Event) -> None: pass

  def own(self, adapter: Any, sensor: str, warp: str, report: Any) -> DMParse:
    """Its output parse (ValueError for heads it cannot read) and the transform for the warp's model size and `sensor`'s driver camera."""
    return DMParse(DMOutputParser(adapter.output_slices), dm_warp_matrix(sensor, tuple(read_header(warp)["extras"]["metadata"]["model_size"])))

  def warm_up_inputs(self, loaded: Loaded[DMParse], camera: DriverCamera) -> None:
    loaded.host.write({HOST_TRANSFORM: loaded.own.transform, "calib": np.zeros(3, np.float32)})

  def use(self, loaded: Loaded[DMParse], camera: DriverCamera, fresh: bool) -> None: pass  # all it reads is its own (Loaded.own)

  def inputs(self, sm: Any, frame: Frame, loaded: Loaded[DMParse]) -> dict[str, Any]:
    self.bus.messages(sm)
    return {HOST_TRANSFORM: loaded.own.transform, "calib": self.bus.calibration(sm)}

  def host_values(self, inputs: dict[str, Any]) -> dict[str, Any]: return inputs
  def read_outputs(self, loaded: Loaded[DMParse]) -> np.ndarray: return loaded.adapter.output_array()
  def non_finite(self) -> str: return "driverStateV2 published with valid=False, values zeroed"
  def about(self, loaded: Loaded[DMParse]) -> str: return f" ({loaded.own.parser.layout} layout)"
  def running(self, camera: DriverCamera) -> str: return f"driver camera, {'raw predictions sent' if self.send_raw else 'no raw predictions'}"

  def publish(self, pm: Any, loaded: Loaded[DMParse], outputs: np.ndarray, finite: bool, frame: Frame, inputs: dict[str, Any],
              clock: Clock) -> Published:
    parser, done = loaded.own.parser, clock.readback
    fields = driver_state_fields(parser(outputs), parser.probs, frame.frames.meta.frame_id, done - clock.start, done - clock.inputs,
                                 outputs.tobytes() if self.send_raw else b"")
    t_fill = time.monotonic_ns()
    data = self.bytes.to_bytes(SERVICE, fields, finite, t_fill)
    t_serialize = time.monotonic_ns()
    pm.send(SERVICE, data)
    return Published(done - clock.start, t_fill, t_serialize, time.monotonic_ns())

@interruptible("dmonitoringmodeld")
def main(argv: list[str] | None = None) -> int:
  parser = daemon_parser("dmonitoringmodeld", __doc__, f"{DRIVER_MONITORING.model_name} and dm_warp bundles (modeld's files may be there too)",
                         "put the raw outputs in driverStateV2.rawPredictions (openpilot's SEND_RAW_PRED)", DEVICE_CORE, REALTIME_PRIORITY)
  return daemon_main(parser, argv, lambda args, episodes: DMonitoringModelD(episodes, args.send_raw), Episodes(log.warning))

if __name__ == "__main__":
  sys.exit(main())
