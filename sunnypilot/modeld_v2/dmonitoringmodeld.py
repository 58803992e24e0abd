"""The driver-monitoring daemon: camerad's driver stream in, one fused DM warp + model run per frame, driverStateV2 out.

  python -m sunnypilot.modeld_v2.dmonitoringmodeld --artifacts out/artifacts [--model-sets ROOT] [--trusted-keys DIR] [--send-raw] [--max-frames N]

`--artifacts` holds dmonitoring_model.bin (compile_modeld of openpilot's DM ONNX) and a dm_warp bundle (compile_dm_warp) per driver-camera
geometry it may meet; modeld's model.bin and warps may sit beside them, and are passed over. The daemon picks the dm_warp whose frame
layout matches the live driver buffers and binds those buffers by pointer (read in place). When camerad comes back with another geometry,
it switches to that geometry's warp and camera intrinsics, or waits, publishing nothing, until one is built. With --trusted-keys (on a
device the same folder as modeld's, when it exists) the model and its warp must be signed, as modeld's (daemon/model_sets.Trust).

Model sets, as modeld's (daemon/model_sets.py, daemon/model_switch.py): --artifacts is the default set; with --model-sets ROOT (on a device
modeld's folder) the DM model of the set asked for (ROOT/active on a PC, sunnypilot's ModelManager_ActiveBundle parameter on a device) is
loaded and warmed up by modeld's switch thread beside the frames and takes over between two of them; a set with no DM model, or one that
fails to load or warm up, is passed over with one line; one whose first 20 frames give non-finite outputs is dropped for the previous
one; at start a set that fails falls back to the last that ran (ROOT/last_ran_dm, this daemon's own record), then the default.

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import finite_float, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, NoWarp, check_artifacts, check_set, load_pair, model_file
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
from sunnypilot.modeld_v2.daemon.camera_sync import DriverCamera, Geometry
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.messaging import claim_bus
from sunnypilot.modeld_v2.daemon.model_sets import (
  DEFAULT_SET,
  DEVICE_MODEL_SETS,
  DEVICE_TRUSTED_KEYS,
  LAST_RAN_DM_FILE,
  ModelSet,
  ModelSets,
  Trust,
  sets_root,
)
from sunnypilot.modeld_v2.daemon.model_switch import ModelSwitch, trigger_for
from sunnypilot.modeld_v2.daemon.process import config_background, config_realtime, core_arg, exit_code, stop_on_signals
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

@dataclass(frozen=True)
class DMPrepared:
  """A set's DM model fused with the dm_warp for one driver-camera geometry, loaded and warmed up: what frames run on (a switch's handle)."""
  adapter: Any
  parser: DMOutputParser
  host: HostInputs
  transform: np.ndarray  # the driver camera's M_inv for the warp's camera
  warp: str
  planes: list | None  # the model's input_img shape: what a warp must make for it

class DMonitoringModelD:
  def __init__(self, artifacts: str, send_raw: bool = False, reconnect_after_s: float = RECONNECT_AFTER_S, status_every_s: float = STATUS_EVERY_S,
               timings: list | None = None, trust: Trust | None = None, model_sets: str | None = None):
    self.artifacts, self.send_raw, self.reconnect_after_s = artifacts, send_raw, reconnect_after_s
    self.timings = timings  # if a list: per published frame, [frame_id, *STAGE_STAMPS in monotonic ns] (benchmarks.bench_daemon reads them)
    self.exit = threading.Event()
    self.episodes = Episodes(log.warning)  # conditions that repeat frame after frame: a line when they start, a count when they end
    self.camera = DriverCamera(self.exit, self.episodes)
    self.bus = BusInputs(self.episodes)  # liveCalibration checked where it enters
    self.bytes = MessageBytes(self.episodes.once)
    self.status = Status(status_every_s)
    self.planes: list | None = None  # the default set's model's input_img shape, what a warp must make: main sets it from check_artifacts
    self.refused: dict[str, tuple] = {}  # warp -> both files' keys when the pair failed to load (artifacts.load_pair)
    self.geometry: Geometry | None = None
    # the sets: --artifacts the default; with --model-sets the one asked for, switched to between two frames (modeld's switch, its own
    # record of the last set that ran: a set may hold a driving model and no DM model, or a DM model that fails where the driving one runs)
    self.sets = ModelSets(artifacts, model_sets, trust or Trust(), last_ran=LAST_RAN_DM_FILE)
    self.core: int | None = None  # the core the frame thread is pinned to, if any: the switch thread keeps off it
    self.unloaded: ModelSet | None = None  # the set that ran, when none runs since its reload for new cameras failed
    from sunnypilot.modeld_v2.daemon.device_params import device_params
    # what frames run on is the switch's `current`, and only there (adapter, parser, host and transform below read it)
    self.switch: ModelSwitch[DMPrepared] = ModelSwitch(self.sets, trigger_for(self.sets, device_params()), self.prepare, self.discard,
                                                       thread_setup=lambda: config_background(self.core), report=self.episodes.once,
                                                       fresh="a DM model keeps nothing from one frame to the next")

  @property
  def trust(self) -> Trust: return self.sets.trust

  @property
  def running_set(self) -> DMPrepared | None: return self.switch.current.handle if self.switch.current is not None else None

  @property
  def adapter(self) -> Any: return self.running_set.adapter if self.running_set is not None else None

  @property
  def parser(self) -> DMOutputParser | None: return self.running_set.parser if self.running_set is not None else None

  @property
  def host(self) -> HostInputs | None: return self.running_set.host if self.running_set is not None else None

  @property
  def transform(self) -> np.ndarray | None: return self.running_set.transform if self.running_set is not None else None

  def load(self) -> bool:
    """Load the model with the dm_warp of the live driver-camera geometry; False when none fits (then wait). As modeld: what loading left
    in reference cycles is freed, and what it made frozen out of later collections (the collector is off while frames run)."""
    gc.unfreeze()
    loaded = self._load()
    gc.collect()
    gc.freeze()
    return loaded

  def _load(self) -> bool:
    """At start the first set that loads (the one asked for, the last that ran, the default); for new cameras the running set again."""
    try: geometry = self.camera.live_geometry()
    except ValueError as e:
      self.episodes.once(f"driver camera: {e}: waiting for another camera geometry")
      return False
    if geometry == self.geometry and self.adapter is not None:  # camerad restarted with the same buffers' layout: new buffers, same model
      for prepared in self.switch.handles(): prepared.adapter.drop_camera_buffers()
      return True
    try: known = bool(sensor_for_size(geometry.main.width, geometry.main.height))
    except ValueError as e:
      self.episodes.once(f"driver camera: {e}: waiting for a known camera")
      known = False
    # what was loaded for the old geometry is closed; the switch thread loads for this one, none for a camera no set can run on
    running = self.switch.new_context(geometry if known else None) or self.unloaded
    self.geometry, self.unloaded = geometry, None
    if not known:
      self.unloaded = running
      return False
    t = time.perf_counter()
    candidate, error = self.switch.reload(running, geometry, lambda model_set: self.prepare(model_set, geometry))
    if candidate is None:
      self.unloaded = running
      if error is not None and not isinstance(error, NoWarp): self.episodes.once(f"{error}; waiting: tried again when one of them changes")
      return False
    model = os.path.basename(model_file(candidate.model_set, DRIVER_MONITORING))
    log.info(f"loaded {candidate.model_set}: {model} + {os.path.basename(candidate.handle.warp)} ({self.parser.layout} layout) for the driver "
             f"camera's {geometry} in {(time.perf_counter() - t) * 1e3:.0f} ms "
             f"({'camera buffers read in place' if self.adapter.in_place else 'frames copied'})")
    return True

  def prepare(self, model_set: ModelSet, geometry: Geometry) -> DMPrepared:
    """`model_set`'s DM model fused with its dm_warp for `geometry`, loaded (each bundle vouched for by the set before a byte of its
    kernels is read) and warmed up on a zero frame: ArtifactError, one line, when any step fails (a set with no DM model, its outputs
    not finite). On the frame thread (at start, or for new cameras, while no frame runs) its lines are said once and a pair that fails is
    refused until one of its files changes; the switch thread calls it for the next set while frames run."""
    waiting = threading.current_thread() is not self.switch.thread
    report = self.episodes.once if waiting else log.warning
    try: sensor = sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e: raise ArtifactError(str(e)) from None
    # the default's model was checked before waiting for camerad (its header not read again); another set's is checked here, as it was
    planes = self.planes if model_set.name == DEFAULT_SET and self.planes is not None else \
      check_set(model_set, report=lambda line: None, kind=DRIVER_MONITORING)  # its warps' lines: load_pair says them
    return load_pair(model_set, geometry.main, None, planes, lambda model, warp, verify, _: self.use(model, warp, sensor, verify, planes, report),
                     report, self.refused if waiting else None, DRIVER_MONITORING)

  def use(self, model: str, warp: str, sensor: str, verify: Any, planes: list | None, report: Callable[[str], None]) -> DMPrepared:
    """Load and warm up `model` with `warp` for `sensor`'s driver camera: its output parse, its host inputs, the warp's transform. An
    ArtifactError (its outputs on a zero frame not finite among them) leaves nothing loaded."""
    from sunnypilot.modeld_v2.format.bundle import read_header
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
    adapter = ModelRunner(model, warp, verify=verify)
    try:
      prepared = DMPrepared(adapter, DMOutputParser(adapter.output_slices), HostInputs(adapter.numpy_inputs, report),
                            dm_warp_matrix(sensor, tuple(read_header(warp)["extras"]["metadata"]["model_size"])), warp, planes)
      prepared.host.write({HOST_TRANSFORM: prepared.transform, "calib": np.zeros(3, np.float32)})  # warm up on a zero frame, then forget it
      adapter.hold_gil(False)  # on the switch thread, beside the frames: each kernel call lets the frame thread run
      try:
        adapter.copy_frames({DRIVER_BUFFER: np.zeros(adapter.warp_frame_size, np.uint8)})
        adapter.run()
        finite = bool(np.isfinite(adapter.output_array()).all())
      finally: adapter.hold_gil(True)
      adapter.reset_warmup_buffers()
      if not finite: raise ArtifactError("its outputs on a zero frame are not finite")
    except (ArtifactError, ValueError) as e:
      adapter.close()
      raise ArtifactError(str(e)) from None
    except BaseException:  # a device error in the warm-up, Ctrl-C: the adapter goes with it all the same
      adapter.close()
      raise
    return prepared

  def discard(self, prepared: DMPrepared) -> None:
    """A loaded set no frame runs on any more: the switch closes it, on its thread while frames run."""
    prepared.adapter.close()

  def switched(self, loaded: bool) -> bool:
    """Between two frames: change over to the set the switch thread loaded for the live driver camera (a DM model keeps no state from one
    frame to the next: the next frame is simply its). Whether a model runs now."""
    if (candidate := self.switch.take_for(self.geometry)) is None: return loaded
    self.switch.changed_over(candidate)
    if not loaded: self.running()
    return True

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
    name = self.switch.current.model_set.name if self.switch.current is not None else "?"
    log.info(f"running: set {name}, driver camera, {'raw predictions sent' if self.send_raw else 'no raw predictions'}")
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
    self.core = DEVICE_CORE if core is None and device else core
    log.info(config_realtime(self.core, REALTIME_PRIORITY if device else None))
    log.info(f"signatures: {self.trust.describe()}")
    pm, sm = pub_master([SERVICE]), sub_master(list(SUBSCRIBED))
    if not self.camera.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published = FrameDrops(), 0
    self.switch.start()
    log.info(f"model sets: {self.sets.describe()}; a switch is asked for by {self.switch.trigger}")
    self.camera.alive()
    if loaded: self.running()
    while not self.exit.is_set() and (max_frames is None or published < max_frames):
      if self.switch.ready is not None: loaded = self.switched(loaded)  # the changeover point: between two frames
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
      running = self.running_set  # for this frame (a changeover happens only between frames): one lookup, not one per use
      adapter, parser = running.adapter, running.parser
      t0 = time.perf_counter()
      running.host.write({HOST_TRANSFORM: running.transform, "calib": self.bus.calibration(sm)})
      t1, t_inputs = time.perf_counter(), time.monotonic_ns()
      adapter.copy_frames({DRIVER_BUFFER: buf})
      t_copy = time.monotonic_ns()
      adapter.run()
      t_run = time.monotonic_ns()
      outputs = adapter.output_array()
      t2, t_readback = time.perf_counter(), time.monotonic_ns()
      finite = self.outputs_finite(outputs, meta.frame_id)
      filled = outputs if finite else np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)
      fields = driver_state_fields(parser(filled), parser.probs, meta.frame_id, t2 - t0, t2 - t1, filled.tobytes() if self.send_raw else b"")
      t_fill = time.monotonic_ns()
      data = self.bytes.to_bytes(SERVICE, fields, finite, t_fill)
      t_serialize = time.monotonic_ns()
      pm.send(SERVICE, data)
      if self.timings is not None:  # modeld's stamps; driverStateV2 is the only message, so its send ends the frame ("others" = "send")
        t_send = time.monotonic_ns()
        self.timings.append([meta.frame_id, t_recv, t_inputs, t_copy, t_run, t_readback, t_fill, t_serialize, t_send, t_send])
      self.status.times.append(t2 - t0)
      published += 1
      if self.switch.probation: self.switch.frame_ran(finite)  # a set failing its first frames: the previous one runs from the next frame
      if published == 1: gc.collect()  # the first frame built the message template (pycapnp's schema objects hold reference cycles)
    self.switch.stop()
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
  parser.add_argument("--model-sets", help="modeld's folder of installed model sets (install_models writes ROOT/<name>/): the DM model of the set "
                      "asked for (ROOT/active on a PC, sunnypilot's ModelManager_ActiveBundle parameter on a device) is loaded while frames run and "
                      "switched to between two frames; a set without one is passed over with a line; a set that fails falls back to the last that "
                      f"ran (ROOT/{LAST_RAN_DM_FILE}), then to --artifacts. On a comma device {DEVICE_MODEL_SETS}")
  args = parser.parse_args(argv)
  from sunnypilot.modeld_v2.daemon.device_params import on_device
  device = on_device()
  try: trust = Trust.for_daemon(args.trusted_keys, device)
  except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: --trusted-keys: {e}\n")
  try: root = sets_root(args.model_sets, device)
  except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: {e}\n")
  if args.timings:
    from sunnypilot.modeld_v2.common.files import check_output_path
    try: check_output_path(args.timings)
    except ArtifactError as e: parser.exit(2, f"dmonitoringmodeld: error: --timings: {e}\n")
  prefix = os.environ.get("OPENPILOT_PREFIX")
  bus = f"the bus{f' OPENPILOT_PREFIX={prefix}' if prefix else ''}"
  if (claim := claim_bus("dmonitoringmodeld")) is None: parser.exit(2, f"dmonitoringmodeld: error: another dmonitoringmodeld is already running on {bus}\n")
  daemon = DMonitoringModelD(args.artifacts, args.send_raw, args.reconnect_after, args.status_every, [] if args.timings else None, trust, root)
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
