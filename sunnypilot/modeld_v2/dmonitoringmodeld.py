"""The driver-monitoring daemon: camerad's driver stream in, one fused DM warp + model run per frame, driverStateV2 out.

  python -m sunnypilot.modeld_v2.dmonitoringmodeld --artifacts out/artifacts [--trusted-keys DIR] [--send-raw] [--max-frames N] [--timings FILE]

`--artifacts` holds dmonitoring_model.bin (compile_modeld of openpilot's DM ONNX) and a dm_warp bundle (compile_dm_warp) per driver-camera
geometry it may meet; modeld's model.bin and warps may sit beside them, and are passed over. The daemon picks the dm_warp whose frame
layout matches the live driver buffers and binds those buffers by pointer (read in place). When camerad comes back with another geometry,
it switches to that geometry's warp and camera intrinsics, or waits, publishing nothing, until one is built. With --trusted-keys (on a
device the same folder as modeld's, when it exists) the model and its warp must be signed, as modeld's (daemon/model_sets.Trust).

Follows openpilot selfdrive/modeld/dmonitoringmodeld.py (commaai/openpilot @63cf2e70) and sunnypilot's (sunnypilot/sunnypilot @41dea5d4):
the driver stream (VISION_STREAM_DRIVER, conflated); the warp's transform inv(dmonitoringmodel_intrinsics @ inv(driver camera intrinsics));
`calib` = liveCalibration.rpyCalib (zeros before one; a non-finite or out-of-range one refused, the last good kept); each frame's outputs
parsed and filled as those files do (model/parse_dmonitoring_outputs.py, model/fill_driver_state.py); modelExecutionTime covers the inputs,
the run and the readback, gpuExecutionTime the run and the readback; rawPredictions with --send-raw (or SEND_RAW_PRED); on a device
config_realtime_process(7, 5). Unlike openpilot's, a frame with non-finite outputs is published with valid=False (its values zeroed).
"""
from __future__ import annotations

import gc
import logging
import os
import sys
import threading
import time
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import finite_float, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, NoWarp, check_artifacts, load_pair
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
from sunnypilot.modeld_v2.daemon.camera_sync import DriverCamera, Geometry
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.messaging import claim_bus
from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, DEVICE_TRUSTED_KEYS, Trust, open_set
from sunnypilot.modeld_v2.daemon.process import config_realtime, core_arg, exit_code, stop_on_signals
from sunnypilot.modeld_v2.daemon.status import STATUS_EVERY_S, FrameDrops, Status, write_timings
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix, sensor_for_size
from sunnypilot.modeld_v2.model.fill_driver_state import driver_state_fields
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser
from sunnypilot.modeld_v2.runtime.frame_feeds import DRIVER_BUFFER

SERVICE = "driverStateV2"
SUBSCRIBED = ("liveCalibration",)
RECONNECT_AFTER_S = 0.5  # no driver frame for this long: camerad may have restarted (--reconnect-after)
DEVICE_CORE, REALTIME_PRIORITY = 7, 5  # openpilot's dmonitoringmodeld: config_realtime_process(7, 5)

log = logging.getLogger(__name__)

class DMonitoringModelD:
  def __init__(self, artifacts: str, send_raw: bool = False, reconnect_after_s: float = RECONNECT_AFTER_S, status_every_s: float = STATUS_EVERY_S,
               timings: list | None = None, trust: Trust | None = None):
    self.artifacts, self.send_raw, self.reconnect_after_s = artifacts, send_raw, reconnect_after_s
    self.trust = trust or Trust()  # which publishers' signatures a bundle needs (none: unsigned bundles load)
    self.timings = timings  # if a list: per published frame, [frame_id, *STAGE_STAMPS in monotonic ns] (benchmarks.bench_daemon reads them)
    self.exit = threading.Event()
    self.episodes = Episodes(log.warning)  # conditions that repeat frame after frame: a line when they start, a count when they end
    self.camera = DriverCamera(self.exit, self.episodes)
    self.bus = BusInputs(self.episodes)  # liveCalibration checked where it enters
    self.bytes = MessageBytes(self.episodes.once)
    self.status = Status(status_every_s)
    self.planes: list | None = None  # the model's input_img shape, what a warp must make: main sets it from check_artifacts
    self.refused: dict[str, tuple] = {}  # warp -> both files' keys when the pair failed to load (artifacts.load_pair)
    self.adapter: Any = None
    self.geometry: Geometry | None = None
    self.parser: DMOutputParser | None = None
    self.host: HostInputs | None = None
    self.transform = np.eye(3, dtype=np.float32)  # the driver camera's M_inv for the loaded warp

  def load(self) -> bool:
    """Load the model with the dm_warp of the live driver-camera geometry; False when none fits (then wait). As modeld: what loading left
    in reference cycles is freed, and what it made frozen out of later collections (the collector is off while frames run)."""
    gc.unfreeze()
    loaded = self._load()
    gc.collect()
    gc.freeze()
    return loaded

  def _load(self) -> bool:
    try: geometry = self.camera.live_geometry()
    except ValueError as e:
      self.episodes.once(f"driver camera: {e}: waiting for another camera geometry")
      return False
    if geometry == self.geometry and self.adapter is not None:  # camerad restarted with the same buffers' layout: new buffers, same model
      self.adapter.drop_camera_buffers()
      return True
    if self.adapter is not None: self.adapter.close()
    self.adapter, self.geometry = None, geometry
    try: sensor = sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e:
      self.episodes.once(f"driver camera: {e}: waiting for a known camera")
      return False
    t = time.perf_counter()
    try: warp = load_pair(open_set(DEFAULT_SET, self.artifacts, self.trust), geometry.main, None, self.planes,
                          lambda model, warp, verify, _: self.use(model, warp, sensor, verify), self.episodes.once, self.refused, DRIVER_MONITORING)
    except NoWarp: return False
    except ArtifactError as e:
      self.episodes.once(f"{e}; waiting: tried again when one of them changes")
      return False
    log.info(f"loaded {DRIVER_MONITORING.model_name} + {os.path.basename(warp)} ({self.parser.layout} layout) for the driver camera's {geometry} in "
             f"{(time.perf_counter() - t) * 1e3:.0f} ms ({'camera buffers read in place' if self.adapter.in_place else 'frames copied'})")
    return True

  def use(self, model: str, warp: str, sensor: str, verify: Any) -> str:
    """Load and warm up `model` with `warp` for `sensor`'s driver camera: its output parse, its host inputs, the warp's transform. An
    ArtifactError leaves nothing loaded."""
    from sunnypilot.modeld_v2.format.bundle import read_header
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
    adapter = ModelRunner(model, warp, verify=verify)
    try:
      self.parser, self.host = DMOutputParser(adapter.output_slices), HostInputs(adapter.numpy_inputs, self.episodes.once)
      self.transform = dm_warp_matrix(sensor, tuple(read_header(warp)["extras"]["metadata"]["model_size"]))
      self.host.write({HOST_TRANSFORM: self.transform, "calib": np.zeros(3, np.float32)})  # warm up on zero frames, then forget them
      adapter.copy_frames({DRIVER_BUFFER: np.zeros(adapter.warp_frame_size, np.uint8)})
      adapter.run()
      adapter.reset_warmup_buffers()
    except (ArtifactError, ValueError) as e:
      adapter.close()
      raise ArtifactError(str(e)) from None
    except BaseException:  # a device error in the warm-up, Ctrl-C: the adapter goes with it all the same
      adapter.close()
      raise
    self.adapter = adapter
    return warp

  def reattached(self, loaded: bool) -> bool:
    """camerad went away or restarted: connected again, load for its geometry (the same one: only the camera mappings go). Whether a
    model runs now."""
    previous, now = self.geometry, self.load()
    self.camera.alive()
    if now and self.geometry != previous: log.info(f"driver camera geometry changed to {self.geometry}: reloaded")
    elif now and loaded: self.episodes.happened("reconnect", f"no driver frames for {self.reconnect_after_s:g} s: reconnected to camerad")
    if now and not loaded: self.running()
    return now

  def running(self) -> None:
    """The line that says frames now run (the tests wait for it): after a load that found a model and a warp."""
    log.info(f"running: driver camera, {'raw predictions sent' if self.send_raw else 'no raw predictions'}")
    self.status.start(time.monotonic_ns())

  def outputs_finite(self, outputs: np.ndarray, frame_id: int) -> bool:
    if np.isfinite(outputs).all():
      self.episodes.ended("outputs", "model outputs finite again after non-finite runs")
      return True
    self.episodes.happened("outputs", f"frame {frame_id}: non-finite model outputs: driverStateV2 published with valid=False, values zeroed")
    return False

  def run(self, max_frames: int | None = None, core: int | None = None) -> int:
    from sunnypilot.modeld_v2.daemon.device_params import on_device
    from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
    device = on_device()
    log.info(config_realtime(DEVICE_CORE if core is None and device else core, REALTIME_PRIORITY if device else None))
    log.info(f"signatures: {self.trust.describe()}")
    pm, sm = pub_master([SERVICE]), sub_master(list(SUBSCRIBED))
    if not self.camera.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published = FrameDrops(), 0
    self.camera.alive()
    if loaded: self.running()
    while not self.exit.is_set() and (max_frames is None or published < max_frames):
      got = self.camera.recv() if loaded else None
      t_recv = time.monotonic_ns()
      if got is None:
        if self.camera.stalled(self.reconnect_after_s) and self.camera.connect(): loaded, drops = self.reattached(loaded), FrameDrops()
        if not loaded: self.exit.wait(0.1)
        continue
      self.episodes.ended("reconnect", "driver frames again after reconnecting to camerad")
      buf, meta = got
      sm.update(0)
      self.bus.messages(sm)
      self.status.dropped += drops.update(meta.frame_id)[0]
      if t_recv >= self.status.next_ns: log.info(self.status.line(t_recv, published))
      t0 = time.perf_counter()
      self.host.write({HOST_TRANSFORM: self.transform, "calib": self.bus.calibration(sm)})
      t1, t_inputs = time.perf_counter(), time.monotonic_ns()
      self.adapter.copy_frames({DRIVER_BUFFER: buf})
      t_copy = time.monotonic_ns()
      self.adapter.run()
      t_run = time.monotonic_ns()
      outputs = self.adapter.output_array()
      t2, t_readback = time.perf_counter(), time.monotonic_ns()
      finite = self.outputs_finite(outputs, meta.frame_id)
      filled = outputs if finite else np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)
      fields = driver_state_fields(self.parser(filled), self.parser.probs, meta.frame_id, t2 - t0, t2 - t1, filled.tobytes() if self.send_raw else b"")
      t_fill = time.monotonic_ns()
      data = self.bytes.to_bytes(SERVICE, fields, finite, t_fill)
      t_serialize = time.monotonic_ns()
      pm.send(SERVICE, data)
      if self.timings is not None:  # modeld's stamps; driverStateV2 is the only message, so its send ends the frame ("others" = "send")
        t_send = time.monotonic_ns()
        self.timings.append([meta.frame_id, t_recv, t_inputs, t_copy, t_run, t_readback, t_fill, t_serialize, t_send, t_send])
      self.status.times.append(t2 - t0)
      published += 1
      if published == 1: gc.collect()  # the first frame built the message template (pycapnp's schema objects hold reference cycles)
    log.info(f"the frame loop left {gc.collect()} objects in reference cycles (the collector is off while it runs)")
    log.info(f"exiting after {published} published frames")
    return 0

@interruptible("dmonitoringmodeld")
def main(argv: list[str] | None = None) -> int:
  import msgq
  parser = cli_parser("dmonitoringmodeld", __doc__)
  parser.add_argument("--artifacts", required=True, help=f"folder with {DRIVER_MONITORING.model_name} and dm_warp bundles (modeld's files may be there too)")
  parser.add_argument("--max-frames", type=positive_int, help="exit after publishing this many frames")
  parser.add_argument("--send-raw", action="store_true", default=bool(os.environ.get("SEND_RAW_PRED")),
                      help="put the raw outputs in driverStateV2.rawPredictions (openpilot's SEND_RAW_PRED)")
  parser.add_argument("--core", type=core_arg, help=f"pin the daemon to this CPU core; on a device it runs on core {DEVICE_CORE} at SCHED_FIFO "
                      f"priority {REALTIME_PRIORITY} (where permitted), as openpilot's dmonitoringmodeld does")
  parser.add_argument("--reconnect-after", type=finite_float(0.1, 3600), default=RECONNECT_AFTER_S, help="seconds without driver frames before "
                      f"the daemon re-attaches to camerad, which may have restarted (default {RECONNECT_AFTER_S:g})")
  parser.add_argument("--status-every", type=finite_float(0, 3600), default=STATUS_EVERY_S, help="seconds between status lines (frames "
                      f"published and dropped, modelExecutionTime p50 and max) while frames run; 0: none (default {STATUS_EVERY_S:g})")
  parser.add_argument("--timings", help="on exit, write per published frame [frame_id, monotonic ns at each of STAGE_STAMPS] as JSON "
                      "here (benchmarks.bench_daemon --daemon dmonitoringmodeld)")
  parser.add_argument("--trusted-keys", help="a folder of publishers' Ed25519 public keys (*.pem): the DM model and its warp must then be "
                      f"signed by one of them, else refused with one line before any of their kernels is read. On a comma device {DEVICE_TRUSTED_KEYS} "
                      "when it exists (modeld's). Without: bundles load unsigned")
  args = parser.parse_args(argv)
  from sunnypilot.modeld_v2.daemon.device_params import on_device
  keys = args.trusted_keys or (DEVICE_TRUSTED_KEYS if on_device() and os.path.isdir(DEVICE_TRUSTED_KEYS) else None)
  try: trust = Trust.from_folder(keys)
  except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: --trusted-keys: {e}\n")
  if args.timings:
    from sunnypilot.modeld_v2.common.files import check_output_path
    try: check_output_path(args.timings)
    except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: --timings: {e}\n")
  prefix = os.environ.get("OPENPILOT_PREFIX")
  bus = f"the bus{f' OPENPILOT_PREFIX={prefix}' if prefix else ''}"
  if (claim := claim_bus("dmonitoringmodeld")) is None: parser.exit(2, f"dmonitoringmodeld: error: another dmonitoringmodeld is already running on {bus}\n")
  daemon = DMonitoringModelD(args.artifacts, args.send_raw, args.reconnect_after, args.status_every, [] if args.timings else None, trust)
  stopped_by = stop_on_signals(daemon.exit)
  try: daemon.planes = check_artifacts(args.artifacts, report=daemon.episodes.once, trust=trust, kind=DRIVER_MONITORING)
  except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: {e}\n")
  try: code = daemon.run(args.max_frames, args.core)
  except msgq.MultiplePublishersError: parser.exit(2, f"dmonitoringmodeld: error: another process took over publishing {SERVICE} on {bus}: exiting\n")
  finally: claim.close()
  if args.timings:
    write_timings(args.timings, daemon.timings)
  return exit_code(stopped_by, code)

if __name__ == "__main__":
  sys.exit(main())
