"""The model daemon: VisionIPC camera frames in, one fused warp+model run per frame, modelV2 / drivingModelData / cameraOdometry out.

  python -m sunnypilot.modeld_v2.modeld --artifacts out/artifacts/cpu_native_tiny [--max-frames N] [--rhd]   # the demo's folder on a CPU

`--artifacts` holds `model.bin` (compile_modeld) and warp bundles (compile_warp) for the camera geometries it may meet; the daemon
picks the warp whose frame layout matches the live camera buffers (a --split-frames warp first: it reads them in place). When camerad
comes back with another geometry, the daemon switches to that geometry's warp and intrinsics, or waits, publishing nothing, until one is built.

The model bundle's generation (recorded by compile_modeld; derived from what an older bundle records) decides the rules in generations.py:
where the action's curvature comes from, what prev_desired_curv sees, the smoothing and low-speed hold, and what the frame after a drop
pushes. On that prepare-only frame the fused graph runs once with its `prepare_only` gate on and nothing is published.
Delays: on a device CarParams (read from openpilot's Params at start, waiting for it as openpilot's modeld does) give the longitudinal
actuator delay and the lateral one until liveDelay publishes; on a PC --lat-delay and --long-delay stand in.

Model sets (daemon/model_sets.py): --artifacts is the default set; with --model-sets ROOT the set asked for (ROOT/active on a PC,
sunnypilot's ModelManager_ActiveBundle parameter on a device) is loaded and warmed up by a thread beside the frames and takes over between
two frames (daemon/model_switch.py); a set whose first 20 frames give non-finite outputs is dropped for the previous one; at start a set
that fails falls back to the last that ran, then the default. With --trusted-keys every bundle must be signed (format/signature.py).

This file is the frame loop, in the order things happen; the cameras (sync, geometry, reconnect) are camera_sync.py's, finding and
checking the bundles artifacts.py's, the sets and their switch model_sets.py's and model_switch.py's, the model's inputs from the bus
state frame_inputs.py's.
"""
from __future__ import annotations

import dataclasses
import gc
import logging
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, finite_float, interruptible, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import NoWarp, check_artifacts, load_pair, model_file, model_planes
from sunnypilot.modeld_v2.daemon.bus_inputs import CAMERA_OFFSET_MAX, BusInputs, parse_camera_offset, parse_delay
from sunnypilot.modeld_v2.daemon.camera_sync import CameraSync, Geometry
from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR, TYPICAL_STEER_ACTUATOR_DELAY, Delays
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs, HostInputs, cameras_of
from sunnypilot.modeld_v2.daemon.graph_parse import GraphParse, graph_parse_of
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.messaging import claim_bus
from sunnypilot.modeld_v2.daemon.model_sets import DEVICE_MODEL_SETS, DEVICE_TRUSTED_KEYS, ModelSet, ModelSets, Trust, sets_root
from sunnypilot.modeld_v2.daemon.model_switch import Candidate, ModelSwitch, trigger_for
from sunnypilot.modeld_v2.daemon.process import config_background, config_realtime, core_arg, exit_code, stop_on_signals
from sunnypilot.modeld_v2.daemon.status import STATUS_EVERY_S, FrameDrops, Status, write_timings
from sunnypilot.modeld_v2.format.bundle import read_header
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY, sensor_for_size, warp_matrices
from sunnypilot.modeld_v2.model.fill_model_msg import (
  SERVICES,
  FrameInfo,
  camera_odometry_fields,
  driving_model_data_fields,
  host_fields,
  model_v2_fields,
)
from sunnypilot.modeld_v2.model.generations import GENERATIONS, of_bundle
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

if TYPE_CHECKING:
  from sunnypilot.modeld_v2.runtime.loader import Verify

SUBSCRIBED = ("deviceState", "carState", "roadCameraState", "liveCalibration", "driverMonitoringState", "carControl", "liveDelay")  # sm.update each frame
RECONNECT_AFTER_S = 0.5  # no frame for this long: camerad may have restarted (--reconnect-after)
PARAMS_EVERY = 60  # frames between reads of sunnypilot's CameraOffset parameter (modeld_v2/modeld.py @13ce8664)
# openpilot's modeld (selfdrive/modeld/modeld.py @6c6be47b) runs config_realtime_process(7, 54) on a device: core 7, SCHED_FIFO priority 54
DEVICE_CORE, REALTIME_PRIORITY = 7, 54

log = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Prepared:
  """A set's driving model fused with the warp for one camera geometry, loaded and warmed up: what frames run on (a switch's handle)."""
  adapter: Any
  host_inputs: HostInputs
  sensor: str
  warp: str
  digest: str  # the model bundle's content hash: which model runs, published as model_id
  planes: list | None  # the model's new_img shape: what a warp must make for it
  graph: GraphParse | None = None  # the model's output parse in its graph, when it has one this build publishes (else parsed on the host)
  parse_note: str = ""  # where its outputs are parsed and why: said when frames first run on it

  @property
  def model_id(self) -> int:
    """The first 64 bits of the model's content hash: modelV2.locationMonoTimeDEPRECATED carries it (see publish)."""
    return int(self.digest[:16], 16)

class ModelD:
  def __init__(self, artifacts: str, rhd: bool = False, lat_delay: float = TYPICAL_CAR.lateral,
               long_delay: float = TYPICAL_CAR.longitudinal, send_raw: bool = False, camera_offset: float = 0.0, timings: list | None = None,
               reconnect_after_s: float = RECONNECT_AFTER_S, status_every_s: float = STATUS_EVERY_S, model_sets: str | None = None,
               trust: Trust | None = None):
    self.artifacts, self.reconnect_after_s = artifacts, reconnect_after_s
    self.flag_delays = Delays(lat_delay, long_delay, "--lat-delay/--long-delay")
    self.timings = timings  # if a list: per published frame, [frame_id, *STAGE_STAMPS in monotonic ns] (benchmarks.bench_daemon reads them)
    self.exit = threading.Event()
    self.geometry: Geometry | None = None
    self.episodes = Episodes(log.warning)  # conditions that repeat frame after frame: a line when they start, a count when they end
    self.state = DrivingState()  # what crosses frames besides the model's states: the input side reads it, the output side advances it
    self.bytes = MessageBytes(self.episodes.once)  # the messages' bytes, through a template per service
    self.send_raw = send_raw
    self.parser: OutputParser | None = None  # the loaded model's output parse on the host
    self.reads: ParsedReads | None = None  # what the driving state reads of the host's parse
    self.graph: GraphParse | None = None  # the loaded model's output parse in its graph, when it has one this build publishes
    self.missing: dict[str, dict[str, str]] | None = None  # per service, the fields a model's first frame leaves default: said once
    self.inputs = FrameInputs(BusInputs(self.episodes), rhd, camera_offset)  # the bus state -> the model's host inputs, frame by frame
    self.camera = CameraSync(self.exit, self.episodes)
    self.refused: dict[str, tuple] = {}  # warp -> (model's, warp's file_key) when the pair failed to load: tried again once either changes
    self.status = Status(status_every_s)
    self.sets = ModelSets(artifacts, model_sets, trust or Trust())
    self.core: int | None = None  # the core the frame thread is pinned to, if any: the switch thread keeps off it
    self.unloaded: tuple[ModelSet, list | None] | None = None  # the set that ran and its model's planes, when no set runs since a reload failed
    from sunnypilot.modeld_v2.daemon.device_params import device_params
    self.params = device_params()  # openpilot's Params on a device, else None
    # what frames run on is the switch's `current`, and only there (adapter, host_inputs, model_set and model_id below read it)
    self.switch: ModelSwitch[Prepared] = ModelSwitch(self.sets, trigger_for(self.sets, self.params), self.prepare, self.discard,
                                                     thread_setup=lambda: config_background(self.core),
                                                     report=self.episodes.once)

  @property
  def running_set(self) -> Prepared | None:
    """The loaded set frames run on (the switch's current handle), or None."""
    return self.switch.current.handle if self.switch.current is not None else None

  @property
  def adapter(self) -> Any: return self.running_set.adapter if self.running_set is not None else None

  @property
  def host_inputs(self) -> HostInputs | None:
    """The running model's host inputs, written each frame."""
    return self.running_set.host_inputs if self.running_set is not None else None

  @property
  def model_set(self) -> ModelSet | None: return self.switch.current.model_set if self.switch.current is not None else None

  @property
  def model_id(self) -> int:
    """Which model runs, published in every modelV2 (Prepared.model_id); 0 when none does."""
    return self.running_set.model_id if self.running_set is not None else 0

  def load(self) -> bool:
    """Load the model with the warp (and intrinsics) of the live camera geometry and warm it up; False when no warp fits (then wait).
    What loading (or failing to) left in reference cycles is freed here, and what it made is frozen out of later collections: the one
    after the first published frame then scans only what frames made. The collector is off while frames run."""
    gc.unfreeze()  # a reload: the previous model's objects may be garbage now
    loaded = self._load()
    gc.collect()
    gc.freeze()
    return loaded

  def _load(self) -> bool:
    """The model and warp for the live camera geometry: at start the first set that loads (the one asked for, the last that ran, the
    default), later the running set again."""
    try: geometry = self.camera.live_geometry()
    except ValueError as e:
      self.episodes.once(f"{e}: waiting for another camera geometry")
      return False
    if geometry == self.geometry and self.adapter is not None:  # camerad restarted: only its buffers are gone, the sets loaded stay
      for prepared in self.switch.handles(): prepared.adapter.drop_camera_buffers()
      return True
    planes = self.running_set.planes if self.running_set is not None else None
    running = self.switch.new_context(geometry)  # closes the sets loaded for the old geometry; the switch thread loads for this one now
    if running is None and self.unloaded is not None: running, planes = self.unloaded  # its reload failed: it is the one tried again
    self.geometry, self.unloaded = geometry, None
    try: sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e:
      self.episodes.once(f"{e}: waiting for a known camera")
      if running is not None: self.unloaded = running, planes
      return False
    t = time.perf_counter()
    # the set that ran, for these cameras; when it cannot run on them, another in fallback order, else wait for this one
    candidate, error = self.switch.reload(running, geometry, lambda model_set: self.prepare(model_set, geometry, planes))
    if candidate is None:
      if running is not None: self.unloaded = running, planes  # tried again first next time, its model's header not read again
      if error is not None and not isinstance(error, NoWarp): self.episodes.once(f"{error}; waiting: tried again when one of them changes")
      return False
    self.use_prepared(candidate)
    log.info(f"loaded {candidate.model_set}: {os.path.basename(model_file(candidate.model_set))} + {os.path.basename(candidate.handle.warp)} for "
             f"{geometry} in {(time.perf_counter() - t) * 1e3:.0f} ms ({'camera buffers read in place' if self.adapter.in_place else 'frames copied'})")
    return True

  def prepare(self, model_set: ModelSet, geometry: Geometry, planes: list | None = None) -> Prepared:
    """`model_set`'s driving model fused with its warp for `geometry`, loaded (each bundle vouched for by the set before a byte of its
    kernels is read) and warmed up on zero frames: ArtifactError when any step fails, the model's outputs included. On the frame thread
    (at start, or the running set again for another geometry, while no frame runs) its lines are said once and a pair that fails is
    refused until one of its files changes; the switch thread calls it for the next set while frames run. `planes`: the model's new_img
    shape when known (the running set: its model is then read only by the load, and a broken file fails as the pair)."""
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
    waiting = threading.current_thread() is not self.switch.thread
    try: sensor = sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e: raise ArtifactError(str(e)) from None
    planes = planes or model_planes(read_header(model_file(model_set)))
    report = self.episodes.once if waiting else log.warning
    def load(model_path: str, warp: str, verify: Verify, digests: dict[str, str]) -> Prepared:
      adapter = ModelRunner(model_path, warp, verify=verify)
      notes: list[str] = []
      try:
        prepared = Prepared(adapter, HostInputs(adapter.numpy_inputs, report), sensor, warp, digests[model_path], planes,
                            graph_parse_of(adapter, notes.append), "".join(notes))
        self.warm_up(prepared)
      except BaseException:  # whatever failed (a bundle's fault, a device error in the warm-up, Ctrl-C), the adapter goes with it
        adapter.close()
        raise
      return prepared
    return load_pair(model_set, geometry.main, geometry.extra, planes, load, report, self.refused if waiting else None)

  def warm_up(self, prepared: Prepared) -> None:
    """Three runs on a valid transform and zero frames, then their frames, bindings and states forgotten; ArtifactError when the outputs
    are not finite (a model that cannot run here)."""
    adapter = prepared.adapter
    adapter.numpy_inputs[HOST_TRANSFORM][:] = warp_matrices(cameras_of(prepared.sensor, self.camera.main_wide), DEFAULT_RPY)
    zeros = np.zeros(adapter.warp_frame_size, np.uint8)
    adapter.hold_gil(False)  # on the switch thread, beside the frames: each kernel call lets the frame thread run
    try:
      for _ in range(3):
        adapter.copy_frames(dict.fromkeys(CAMERA_BUFFERS, zeros))
        adapter.run()
      finite = bool(np.isfinite(adapter.output_array()).all())
    finally: adapter.hold_gil(True)  # frames: a frame's kernels back to back
    adapter.reset_warmup_buffers()
    if not finite: raise ArtifactError("its outputs on zero frames are not finite")

  def discard(self, prepared: Prepared) -> None:
    """A loaded set no frame runs on any more (dropped, replaced after the next one passed its first frames, or loaded for cameras that
    are gone): the switch closes it, on its thread while frames run."""
    prepared.adapter.close()

  def use_prepared(self, candidate: Candidate[Prepared]) -> None:
    """Run frames with `candidate` from the next one on: its host inputs, its output layout and its generation's rules, and the
    intrinsics of its sensor's cameras."""
    prepared, self.unloaded = candidate.handle, None
    self.parser, self.missing = OutputParser(prepared.adapter.output_slices), {s: {} for s in SERVICES}
    self.reads = ParsedReads.of(self.parser.parsed)  # views of the parser's buffer, refilled by each parse
    self.graph = prepared.graph
    if self.graph is not None: self.graph.unbind()  # its first frame is parsed on the host: that builds the templates its block goes into
    if prepared.parse_note: self.episodes.once(prepared.parse_note)
    generation, source = of_bundle(prepared.adapter.metadata)
    self.state.rules = GENERATIONS[generation]
    self.episodes.once(f"generation {generation} ({source}): {self.state.rules.about}")
    if "prepare_only" not in prepared.adapter.numpy_inputs:
      self.episodes.once("this bundle has no prepare_only gate (native, or built before it): frames after a drop run a full step")
    self.inputs.use_cameras(prepared.sensor, self.camera.main_wide)

  def change_over(self, candidate: Candidate[Prepared], back: bool = False) -> None:
    """Between two frames: run on `candidate` (a set the switch thread loaded, or with `back` the previous set after the new one failed)
    from the next frame on, its recurrent state and queues from zero, lat_planner_state too (fed back from the model's outputs); what
    controls see carries on (the action is smoothed against the last one, the lane-change state stays)."""
    self.use_prepared(candidate)
    if back: candidate.handle.adapter.reset_states()
    self.state.lat_planner_state[:] = 0.0

  def reattached(self, loaded: bool) -> bool:
    """camerad went away or restarted, and its buffers with it: connected again, load for its geometry (the same one: only the camera
    mappings and their bindings are dropped); a new stream has new buffers and frame ids from its own start. Whether a model runs now."""
    previous, was_loaded, loaded = self.geometry, loaded, self.load()
    self.camera.alive()
    if loaded and self.geometry != previous: log.info(f"camera geometry changed to {self.geometry}: reloaded")
    elif loaded and was_loaded: self.episodes.happened("reconnect", f"no frames for {self.reconnect_after_s:g} s: reconnected to camerad")
    if loaded and not was_loaded: self.running()  # after waiting for a warp or a model that loads
    return loaded

  def published_finite(self, frame: FrameInfo, values: np.ndarray, reads: ParsedReads) -> FrameInfo:
    """`frame`, marked invalid when what was computed from finite outputs is not finite (outputs near float32's limits can make an
    infinite curvature or std): what is published is checked, not only what the model returned."""
    if self.state.published_finite(values, reads):
      if frame.outputs_finite: self.episodes.ended("published", "computed values finite again")
      return frame
    self.episodes.happened("published", f"frame {frame.frame_id}: values computed from the outputs are not finite (outputs near float32's limits): "
                           "its messages marked valid=False, the action starts again from zero")
    return dataclasses.replace(frame, outputs_finite=False)

  def publish(self, pm: Any, parsed: dict[str, np.ndarray] | None, outputs: np.ndarray, frame: FrameInfo, fed: Any) -> tuple[int, int, int]:
    """One frame's three messages: the driving state advanced, then modelV2 filled, made and sent (what controls wait for) before the
    other two. The monotonic ns after modelV2 was filled, made and sent. `parsed`: the host's parse, None when the graph's is published
    (publish_block)."""
    if parsed is None: return self.publish_block(pm, outputs, frame, fed)
    state = self.state.update(self.reads, frame, fed.car, fed.lateral_active)
    frame, missing = self.published_finite(frame, self.parser.values, self.reads), self.missing or dict.fromkeys(SERVICES)
    valid = frame.valid
    fields = model_v2_fields(parsed, state, frame, outputs if self.send_raw else None, missing["modelV2"])
    fields["locationMonoTimeDEPRECATED"] = self.model_id  # which model ran this frame: log.capnp has no field for it (README, "Model sets")
    t_fill = time.monotonic_ns()
    model_v2 = self.bytes.to_bytes("modelV2", fields, valid["modelV2"], t_fill)
    t_serialize = time.monotonic_ns()
    pm.send("modelV2", model_v2)
    t_send = time.monotonic_ns()
    pm.send("drivingModelData", self.bytes.to_bytes("drivingModelData", driving_model_data_fields(parsed, state, frame, missing["drivingModelData"]),
                                                    valid["drivingModelData"], time.monotonic_ns()))
    pm.send("cameraOdometry", self.bytes.to_bytes("cameraOdometry", camera_odometry_fields(parsed, frame, missing["cameraOdometry"]),
                                                  valid["cameraOdometry"], time.monotonic_ns()))
    if self.missing is not None:  # the model's first frame: what its heads leave default, once
      for service, gaps in self.missing.items():
        for path, reason in gaps.items(): self.episodes.once(f"{service}.{path} stays default: {reason}")
      self.missing = None
    if self.graph is not None and self.graph.writers is None and not self.graph.bind(self.bytes, self.daemon_fields(state, frame, outputs)):
      self.graph = None  # the templates cannot take the block (said): this model is parsed on the host from now on
    return t_fill, t_serialize, t_send

  def daemon_fields(self, state: Any, frame: FrameInfo, outputs: np.ndarray) -> dict[str, dict[str, Any]]:
    """With the parse in the graph, each message's fields that are not the block's: host_fields, and the model's identity (see publish)."""
    host = host_fields(state, frame, outputs if self.send_raw else None, self.graph.layout.fcw)
    host["modelV2"]["locationMonoTimeDEPRECATED"] = self.model_id
    return host

  def publish_block(self, pm: Any, outputs: np.ndarray, frame: FrameInfo, fed: Any) -> tuple[int, int, int]:
    """publish with the output parse in the model's graph: the driving state from the block's views, then per service the host's fields
    and the block's floats copied into its byte template (graph_parse)."""
    graph = self.graph
    state = self.state.update(graph.reads, frame, fed.car, fed.lateral_active)
    frame = self.published_finite(frame, graph.checked_values(), graph.reads)
    valid, host = frame.valid, self.daemon_fields(state, frame, outputs)
    t_fill = time.monotonic_ns()
    model_v2 = graph.bytes_of("modelV2", host["modelV2"], valid["modelV2"], t_fill)
    t_serialize = time.monotonic_ns()
    pm.send("modelV2", model_v2)
    t_send = time.monotonic_ns()
    pm.send("drivingModelData", graph.bytes_of("drivingModelData", host["drivingModelData"], valid["drivingModelData"], time.monotonic_ns()))
    pm.send("cameraOdometry", graph.bytes_of("cameraOdometry", host["cameraOdometry"], valid["cameraOdometry"], time.monotonic_ns()))
    return t_fill, t_serialize, t_send

  def running(self) -> None:
    """The line that says frames now run (route_replay and the benchmarks wait for it): after a load that found a model and a warp."""
    log.info(f"running: set {self.model_set.name if self.model_set else '?'}, main {'wide' if self.camera.main_wide else 'road'} camera"
             f"{', extra wide camera' if self.camera.use_extra else ''}")
    self.status.start(time.monotonic_ns())  # the status lines count from here

  def switched(self, loaded: bool) -> bool:
    """Between two frames: change over to the set the switch thread loaded, when it was loaded for the live camera geometry (else it is
    loaded again). Whether a model runs now."""
    if (candidate := self.switch.take_for(self.geometry)) is None: return loaded
    self.change_over(candidate)
    self.switch.changed_over(candidate)
    if not loaded: self.running()
    return True

  def probation(self, finite: bool) -> None:
    """After a frame's messages went out (nothing reads the model's outputs any more): a set on probation that gave non-finite outputs
    is dropped for the previous set, which runs from the next frame."""
    if self.switch.probation and (back := self.switch.frame_ran(finite)) is not None: self.change_over(back, back=True)

  def outputs_finite(self, outputs: np.ndarray, frame_id: int) -> bool:
    """False for a run with a NaN or inf output, after zeroing the recurrent states it wrote: every later run would read them."""
    if np.isfinite(outputs).all():
      self.episodes.ended("outputs", "model outputs finite again after non-finite runs")
      return True
    self.adapter.reset_states()
    self.episodes.happened("outputs", f"frame {frame_id}: non-finite model outputs: recurrent states reset, its messages marked valid=False")
    return False

  def run(self, max_frames: int | None = None, core: int | None = None) -> int:
    from sunnypilot.modeld_v2.daemon.device_params import camera_offset, on_device, read_car_params
    from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
    params = self.params
    device = on_device()
    self.core = DEVICE_CORE if core is None and device else core
    log.info(config_realtime(self.core, REALTIME_PRIORITY if device else None))
    log.info(f"signatures: {self.sets.trust.describe()}")
    delays = self.flag_delays if params is None else read_car_params(params)
    log.info(f"delays from {delays.source}: lateral {delays.lateral:.3f} s until liveDelay publishes, longitudinal {delays.longitudinal:.3f} s")
    pm = pub_master(list(SERVICES))
    sm = sub_master(list(SUBSCRIBED))
    if not self.camera.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published = FrameDrops(), 0
    self.switch.start()
    log.info(f"model sets: {self.sets.describe()}; a switch is asked for by {self.switch.trigger}")
    self.camera.alive()
    if loaded: self.running()
    while not self.exit.is_set() and (max_frames is None or published < max_frames):
      if self.switch.ready is not None: loaded = self.switched(loaded)  # the changeover point: between two frames
      frames = self.camera.recv_frames() if loaded else None
      t_recv = time.monotonic_ns()
      if frames is None:
        if self.camera.stalled(self.reconnect_after_s) and self.camera.connect(): loaded, drops = self.reattached(loaded), FrameDrops()
        if not loaded: self.exit.wait(0.1)
        continue
      self.episodes.ended("reconnect", "frames again after reconnecting to camerad")
      buf_main, meta_main, buf_extra, meta_extra = frames
      sm.update(0)
      if params is not None and sm.frame % PARAMS_EVERY == 0: self.inputs.camera_offset_target = camera_offset(params, self.inputs.camera_offset_target)
      dropped, drop_perc = drops.update(meta_main.frame_id)
      self.status.dropped += dropped
      if t_recv >= self.status.next_ns: log.info(self.status.line(t_recv, published))
      fed = self.inputs.step(sm, delays, self.state, prepare_only=dropped > 0)
      running = self.running_set  # for this frame (a changeover happens only between frames): one lookup, not one per use
      running.host_inputs.write(fed.host)
      t_inputs = time.monotonic_ns()
      t0 = time.perf_counter()  # openpilot's modelExecutionTime covers the model run and the parsing of its outputs
      adapter = running.adapter
      adapter.copy_frames(dict(zip(CAMERA_BUFFERS, (buf_main, buf_extra), strict=True)))
      t_copy = time.monotonic_ns()
      adapter.run()
      t_run = time.monotonic_ns()
      outputs = adapter.output_array()
      in_graph = self.graph is not None and self.graph.writers is not None
      if in_graph: adapter.output_array(FLOAT_BLOCK)  # the graph's parse, into the array graph.block (waits for the device)
      t_readback = time.monotonic_ns()
      finite = self.outputs_finite(outputs, meta_main.frame_id)
      if dropped > 0:  # prepare-only: the frame went through the queues the generation pushes then, nothing is published
        self.episodes.happened("drops", f"frame {meta_main.frame_id}: {dropped} frame(s) dropped before it: prepare-only, nothing published")
        self.probation(finite)
        continue
      self.episodes.ended("drops", "frame ids jumped on consecutive frames")
      filled = outputs if finite else np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)  # invalid, but no NaN in the action history
      parsed = None if in_graph else self.parser(filled)  # the graph parses the same way: non-finite outputs as 0
      execution_time = time.perf_counter() - t0
      road_frame = sm["roadCameraState"].frameId if sm.seen.get("roadCameraState") else meta_main.frame_id
      frame = FrameInfo(meta_main.frame_id, meta_extra.frame_id, meta_main.timestamp_eof, road_frame, drop_perc, dropped, execution_time,
                        fed.calibrated, fed.lat_t, fed.long_t, finite, not self.camera.clock_frozen)
      self.status.times.append(execution_time)
      t_fill, t_serialize, t_send = self.publish(pm, parsed, filled, frame, fed)
      if self.timings is not None:
        self.timings.append([meta_main.frame_id, t_recv, t_inputs, t_copy, t_run, t_readback, t_fill, t_serialize, t_send, time.monotonic_ns()])
      published += 1
      self.probation(finite)
      if published == 1: gc.collect()  # the first frame built the message templates (pycapnp's schema objects hold reference cycles)
    self.switch.stop()
    log.info(f"the frame loop left {gc.collect()} objects in reference cycles (the collector is off while it runs)")
    log.info(f"exiting after {published} published frames")
    return 0

@interruptible("modeld")
def main(argv: list[str] | None = None) -> int:
  import msgq
  parser = cli_parser("modeld", __doc__)
  parser.add_argument("--artifacts", required=True, help="folder with model.bin and warp bundles")
  parser.add_argument("--max-frames", type=positive_int, help="exit after publishing this many frames")
  parser.add_argument("--rhd", action="store_true", help="right-hand drive traffic convention (else driverMonitoringState.isRHD decides)")
  parser.add_argument("--lat-delay", type=checked(parse_delay), default=TYPICAL_CAR.lateral, help="on a PC: the lateral delay in seconds, 0 to 5, as liveDelay "
                      "gives it (steerActuatorDelay + 0.2); liveDelay.lateralDelay replaces it when published, CarParams on a device. Default "
                      f"{TYPICAL_CAR.lateral:g}: a Toyota TSS2 torque car's steerActuatorDelay {TYPICAL_STEER_ACTUATOR_DELAY:g} (opendbc) + 0.2")
  parser.add_argument("--long-delay", type=checked(parse_delay), default=TYPICAL_CAR.longitudinal, help="on a PC: the longitudinal actuator delay in seconds, "
                      f"0 to 5 (CarParams.longitudinalActuatorDelay on a device). Default"
                      f" {TYPICAL_CAR.longitudinal:g}: that car's (opendbc's CarParams default)")
  parser.add_argument("--camera-offset", type=checked(parse_camera_offset), default=0.0,
                      help="on a PC: sunnypilot's CameraOffset in metres, at most "
                      f"{CAMERA_OFFSET_MAX:g} either way: the camera seen as moved sideways by this much (a shear of the warp); the CameraOffset "
                      "parameter on a device")
  parser.add_argument("--send-raw", action="store_true", default=bool(os.environ.get("SEND_RAW_PRED")), help="put raw outputs in modelV2.rawPredictions")
  parser.add_argument("--core", type=core_arg, help=f"pin modeld to this CPU core; on a device modeld runs on core {DEVICE_CORE} at SCHED_FIFO "
                      f"priority {REALTIME_PRIORITY} (where permitted), as openpilot's modeld does (a realtime process can starve others on a PC)")
  parser.add_argument("--reconnect-after", type=finite_float(0.1, 3600), default=RECONNECT_AFTER_S, help="seconds without frames before modeld "
                      f"re-attaches to camerad, which may have restarted (default {RECONNECT_AFTER_S:g}); route_replay's lockstep sets it high: its "
                      "frames pause while its reference check catches up, and a frame sent while modeld re-attaches would be lost")
  parser.add_argument("--status-every", type=finite_float(0, 3600), default=STATUS_EVERY_S, help="seconds between status lines (frames "
                      f"published and dropped, modelExecutionTime p50 and max) while frames run; 0: none (default {STATUS_EVERY_S:g})")
  parser.add_argument("--timings", help="on exit, write per published frame [frame_id, monotonic ns at each of STAGE_STAMPS] as JSON here (benchmarks)")
  parser.add_argument("--trusted-keys", help="a folder of publishers' Ed25519 public keys (*.pem, sign_bundle --generate-key writes them): every "
                      "bundle must then be signed by one of them (its own .sig, or a signed manifest naming it), else it is refused with one line "
                      f"before any of its kernels is read. On a comma device {DEVICE_TRUSTED_KEYS} when it exists. Without: bundles load unsigned")
  parser.add_argument("--model-sets", help="the folder of installed model sets (install_models writes ROOT/<name>/): the set asked for (ROOT/active "
                      "on a PC, sunnypilot's ModelManager_ActiveBundle parameter on a device) is loaded while frames run and switched to between "
                      f"two frames; a set that fails falls back to the last that ran, then to --artifacts. On a comma device {DEVICE_MODEL_SETS}")
  args = parser.parse_args(argv)
  prefix = os.environ.get("OPENPILOT_PREFIX")
  bus = f"the bus{f' OPENPILOT_PREFIX={prefix}' if prefix else ''}"
  if args.timings:
    try: check_output_path(args.timings)
    except ArtifactError as e: parser.exit(2, f"modeld: error: --timings: {e}\n")
  from sunnypilot.modeld_v2.daemon.device_params import on_device
  device = on_device()
  try: root = sets_root(args.model_sets, device)
  except ArtifactError as e: parser.exit(2, f"modeld: error: {e}\n")
  try: trust = Trust.for_daemon(args.trusted_keys, device)
  except ArtifactError as e: parser.exit(2, f"modeld: error: --trusted-keys: {e}\n")
  if (claim := claim_bus()) is None: parser.exit(2, f"modeld: error: another modeld is already running on {bus}\n")
  daemon = ModelD(args.artifacts, args.rhd, args.lat_delay, args.long_delay, args.send_raw, args.camera_offset, [] if args.timings else None,
                  args.reconnect_after, args.status_every, root, trust)
  stopped_by = stop_on_signals(daemon.exit)
  try: check_artifacts(args.artifacts, report=daemon.episodes.once, trust=trust)
  except ArtifactError as e: parser.exit(2, f"modeld: error: {e}\n")
  try: code = daemon.run(args.max_frames, args.core)
  except msgq.MultiplePublishersError: parser.exit(2, f"modeld: error: another process took over publishing {', '.join(SERVICES)} on {bus}: exiting\n")
  finally: claim.close()
  if args.timings:
    write_timings(args.timings, daemon.timings)
  return exit_code(stopped_by, code)  # Ctrl-C: the shell's convention, 130

if __name__ == "__main__":
  sys.exit(main())
