"""The frame-daemon skeleton both model daemons run on: start-up, the camera link, loading a model set for the live cameras, the frame loop
with its timing stamps, the model switch and its fallbacks, status lines and shutdown. A daemon is a `DaemonSpec`: what it subscribes to
and publishes, how a frame becomes its model's inputs, how the outputs become messages (modeld.py, dmonitoringmodeld.py).

Each frame, in this order (openpilot's modeld and dmonitoringmodeld loops, selfdrive/modeld @084747c, read the same way):
  change over to a set the switch thread loaded (between two frames)  ->  receive the camera frame(s)  ->  read the bus  ->
  the spec's inputs  ->  host inputs written, frames bound, the model run, outputs read back  ->  the spec publishes  ->  probation.
The stamps of STAGE_STAMPS are taken here, so a benchmark reads both daemons the same way.
"""
from __future__ import annotations

import gc
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DaemonBundles, NoWarp, check_set, load_pair, model_file
from sunnypilot.modeld_v2.daemon.camera_sync import CameraLink, Frames, Geometry
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, ModelSet, ModelSets, Trust
from sunnypilot.modeld_v2.daemon.model_switch import ModelSwitch, trigger_for
from sunnypilot.modeld_v2.daemon.process import config_background, config_realtime
from sunnypilot.modeld_v2.daemon.schema import SCHEMA
from sunnypilot.modeld_v2.daemon.status import STATUS_EVERY_S, FrameDrops, Status
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.model.calibration import sensor_for_size

log = logging.getLogger(__name__)
P = TypeVar("P")

RECONNECT_AFTER_S = 0.5  # no frame for this long: camerad may have restarted (--reconnect-after)

@dataclass(frozen=True)
class Loaded(Generic[P]):
  """A set's model fused with the warp for one camera geometry, loaded and warmed up: what frames run on (a model switch's handle)."""
  adapter: Any  # a runtime.model_runner.ModelRunner (benchmarks stub it)
  host: HostInputs  # its host inputs, written each frame
  sensor: str  # the camera sensor of the geometry it was loaded for
  warp: str
  digest: str  # the model bundle's content hash: which model runs
  planes: list | None  # the model's frames input shape: what a warp must make for it
  own: P  # what the daemon keeps with it (modeld: its output parse; dmonitoringmodeld: its parser and the warp's transform)

  @property
  def model_id(self) -> int:
    """The first 64 bits of the model's content hash."""
    return int(self.digest[:16], 16)

@dataclass(frozen=True)
class Frame:
  """One frame as the loop received it: the camera frames, their metadata and what openpilot's drop accounting made of its frame id."""
  frames: Frames
  dropped: int  # frames dropped right before this one
  drop_perc: float  # openpilot's filtered frameDropPerc

class Clock(NamedTuple):
  """perf_counter seconds around a frame's model step: before its host inputs are written, after, and after the outputs are read back."""
  start: float
  inputs: float
  readback: float

class Published(NamedTuple):
  """What a spec's publish did: the modelExecutionTime it published, and the monotonic ns after its first message was filled, made and sent."""
  execution_time: float
  fill: int
  serialize: int
  send: int

class DaemonSpec(Protocol[P]):
  """What a model daemon says; FrameDaemon does the rest."""
  name: str  # the process: "modeld", "dmonitoringmodeld"
  services: tuple[str, ...]  # what it publishes, the one consumers wait for first
  subscribed: tuple[str, ...]  # what its frames read of the bus
  bundles: DaemonBundles  # its model's and warps' roles, names and kinds in a set
  device_core: int  # on a device: openpilot's config_realtime_process(core, priority) for this daemon
  realtime_priority: int
  last_ran: str  # its record of the last set that ran, in the model sets folder
  fresh: str  # what a model switched to starts from, for the switch's line
  warm_up_runs: int  # runs on zero frames before a loaded model counts as warmed up
  camera_name: str  # "" or "driver camera: ", before the camera's lines

  def camera(self, exit_event: threading.Event, episodes: Episodes) -> CameraLink: ...
  def start(self, params: Any, stop: threading.Event) -> None: ...
  def own(self, adapter: Any, sensor: str, warp: str, report: Callable[[str], None]) -> P: ...
  def warm_up_inputs(self, loaded: Loaded[P], camera: Any) -> None: ...
  def use(self, loaded: Loaded[P], camera: Any, back: bool) -> None: ...
  def inputs(self, sm: Any, frame: Frame, loaded: Loaded[P]) -> Any: ...
  def host_values(self, inputs: Any) -> dict[str, Any]: ...
  def read_outputs(self, loaded: Loaded[P]) -> np.ndarray: ...
  def non_finite(self) -> str: ...
  def publish(self, pm: Any, loaded: Loaded[P], outputs: np.ndarray, finite: bool, frame: Frame, inputs: Any, clock: Clock) -> Published | None:
    """This frame's messages from its `outputs` (non-finite values zeroed when not `finite`), or None when it publishes none."""
  def running(self, camera: Any) -> str: ...
  def about(self, loaded: Loaded[P]) -> str:
    """What the load's line says of the model besides its files ("" or " (its layout)")."""
    ...

class FrameDaemon(Generic[P]):
  """A model daemon: `spec` run on camerad's frames, the model of the set asked for loaded for the live cameras and switched while frames
  run (daemon/model_switch.py). What frames run on is the switch's `current`, and only there."""
  def __init__(self, spec: DaemonSpec[P], episodes: Episodes, artifacts: str, model_sets: str | None = None, trust: Trust | None = None,
               planes: list | None = None, timings: list | None = None, reconnect_after_s: float = RECONNECT_AFTER_S,
               status_every_s: float = STATUS_EVERY_S, params: Any = None):
    self.spec, self.episodes, self.artifacts, self.reconnect_after_s = spec, episodes, artifacts, reconnect_after_s
    self.planes = planes  # the default set's model's frames input shape (check_artifacts read it): its header is not read again
    self.timings = timings  # if a list: per published frame, [frame_id, *STAGE_STAMPS in monotonic ns] (benchmarks.bench_daemon reads them)
    self.exit = threading.Event()
    self.camera = spec.camera(self.exit, episodes)
    self.status = Status(status_every_s)
    self.geometry: Geometry | None = None
    self.refused: dict[str, tuple] = {}  # warp -> both files' keys when the pair failed to load (artifacts.load_pair)
    self.unloaded: ModelSet | None = None  # the set that ran, when none runs since its reload for new cameras failed
    self.core: int | None = None  # the core the frame thread is pinned to, if any: the switch thread keeps off it
    self.params = params  # openpilot's Params on a device (device_params.DeviceParams), else None
    self.first_frame = False  # a model took over since the last frame: the next frame's line says which (the published messages cannot)
    self.sets = ModelSets(artifacts, model_sets, trust or Trust(), last_ran=spec.last_ran)
    self.switch: ModelSwitch[Loaded[P]] = ModelSwitch(self.sets, trigger_for(self.sets, params), self.prepare, self.discard,
                                                      thread_setup=lambda: config_background(self.core), report=episodes.once, fresh=spec.fresh)

  @property
  def running_set(self) -> Loaded[P] | None:
    """The loaded set frames run on (the switch's current handle), or None."""
    return self.switch.current.handle if self.switch.current is not None else None

  @property
  def model_set(self) -> ModelSet | None: return self.switch.current.model_set if self.switch.current is not None else None

  # *** loading ***

  def load(self) -> bool:
    """Load the model with the warp of the live camera geometry; False when none fits (then wait). What loading (or failing to) left in
    reference cycles is freed here, and what it made is frozen out of later collections: the collector is off while frames run."""
    gc.unfreeze()  # a reload: the previous model's objects may be garbage now
    loaded = self._load()
    gc.collect()
    gc.freeze()
    return loaded

  def _load(self) -> bool:
    """At start the first set that loads (the one asked for, the last that ran, the default); for new cameras the running set again."""
    name = self.spec.camera_name
    try: geometry = self.camera.live_geometry()
    except ValueError as e:
      self.episodes.once(f"{name}{e}: waiting for another camera geometry")
      return False
    if geometry == self.geometry and self.running_set is not None:  # camerad restarted: only its buffers are gone, the sets loaded stay
      for loaded in self.switch.handles(): loaded.adapter.drop_camera_buffers()
      return True
    try: known = bool(sensor_for_size(geometry.main.width, geometry.main.height))
    except ValueError as e:
      self.episodes.once(f"{name}{e}: waiting for a known camera")
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
      self.unloaded = running  # tried again first next time
      if error is not None and not isinstance(error, NoWarp): self.episodes.once(f"{error}; waiting: tried again when one of them changes")
      return False
    self.use(candidate.handle, back=False)
    adapter, model = candidate.handle.adapter, os.path.basename(model_file(candidate.model_set, self.spec.bundles))
    log.info(f"loaded {candidate.model_set}: {model} + {os.path.basename(candidate.handle.warp)}{self.spec.about(candidate.handle)} for "
             f"{name.removesuffix(': ')}{' ' if name else ''}"
             f"{geometry} in {(time.perf_counter() - t) * 1e3:.0f} ms ({'camera buffers read in place' if adapter.in_place else 'frames copied'})")
    return True

  def planes_of(self, model_set: ModelSet, report: Callable[[str], None]) -> list | None:
    """The shape of `model_set`'s model's frames input: the default set's as check_artifacts read it, another's from check_set (its
    model vouched for and checked; one line when the set has no model of this daemon's, or none it can run)."""
    if model_set.name == DEFAULT_SET and self.planes is not None: return self.planes
    return check_set(model_set, report=lambda line: None, kind=self.spec.bundles)  # its warps' lines: load_pair says them

  def prepare(self, model_set: ModelSet, geometry: Geometry) -> Loaded[P]:
    """`model_set`'s model fused with its warp for `geometry`, loaded (each bundle vouched for by the set before a byte of its kernels is
    read) and warmed up on zero frames: ArtifactError, one line, when any step fails. On the frame thread (at start, or for new cameras,
    while no frame runs) its lines are said once and a pair that fails is refused until one of its files changes; the switch thread calls
    it for the next set while frames run."""
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner  # tinygrad: imported when a model is loaded, not at start
    waiting = threading.current_thread() is not self.switch.thread
    report = self.episodes.once if waiting else log.warning
    try: sensor = sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e: raise ArtifactError(str(e)) from None
    planes = self.planes_of(model_set, report)
    def load(model: str, warp: str, verify: Any, digests: dict[str, str]) -> Loaded[P]:
      adapter = ModelRunner(model, warp, verify=verify)
      try:
        loaded = Loaded(adapter, HostInputs(adapter.numpy_inputs, report), sensor, warp, digests[model], planes,
                        self.spec.own(adapter, sensor, warp, report))
        self.warm_up(loaded)
      except ValueError as e:  # a model whose outputs this daemon cannot read: the set's problem, one line
        adapter.close()
        raise ArtifactError(str(e)) from None
      except BaseException:  # whatever else failed (a device error in the warm-up, Ctrl-C), the adapter goes with it
        adapter.close()
        raise
      return loaded
    return load_pair(model_set, geometry.main, geometry.extra, planes, load, report, self.refused if waiting else None, self.spec.bundles)

  def warm_up(self, loaded: Loaded[P]) -> None:
    """The spec's warm-up runs on zero frames and valid inputs, then their frames, bindings and states forgotten; ArtifactError when the
    outputs are not finite (a model that cannot run here)."""
    adapter = loaded.adapter
    self.spec.warm_up_inputs(loaded, self.camera)
    zeros = np.zeros(adapter.warp_frame_size, np.uint8)
    adapter.hold_gil(False)  # on the switch thread, beside the frames: each kernel call lets the frame thread run
    try:
      for _ in range(self.spec.warm_up_runs):
        adapter.copy_frames(dict.fromkeys(adapter.camera_buffers, zeros))
        adapter.run()
      finite = bool(np.isfinite(adapter.output_array()).all())
    finally: adapter.hold_gil(True)  # frames: a frame's kernels back to back
    adapter.reset_warmup_buffers()
    if not finite: raise ArtifactError("its outputs on zero frames are not finite")

  def use(self, loaded: Loaded[P], back: bool) -> None:
    """Frames run on `loaded` from the next one (the spec's part), and that frame's line names it."""
    self.spec.use(loaded, self.camera, back)
    self.first_frame = True

  def discard(self, loaded: Loaded[P]) -> None:
    """A loaded set no frame runs on any more: the switch closes it, on its thread while frames run."""
    loaded.adapter.close()

  # *** between frames ***

  def switched(self, loaded: bool) -> bool:
    """Between two frames: change over to the set the switch thread loaded, when it was loaded for the live camera geometry (else it is
    loaded again). Whether a model runs now."""
    if (candidate := self.switch.take_for(self.geometry)) is None: return loaded
    self.use(candidate.handle, back=False)
    self.switch.changed_over(candidate)
    if not loaded: self.running()
    return True

  def reattached(self, loaded: bool) -> bool:
    """camerad went away or restarted, and its buffers with it: connected again, load for its geometry (the same one: only the camera
    mappings and their bindings are dropped); a new stream has new buffers and frame ids from its own start. Whether a model runs now."""
    previous, now = self.geometry, self.load()
    self.camera.alive()
    if now and self.geometry != previous: log.info(f"{self.spec.camera_name.removesuffix(': ') or 'camera'} geometry changed to {self.geometry}: reloaded")
    elif now and loaded: self.episodes.happened("reconnect", f"no frames for {self.reconnect_after_s:g} s: reconnected to camerad")
    if now and not loaded: self.running()  # after waiting for a warp or a model that loads
    return now

  def running(self) -> None:
    """The line that says frames now run (route_replay, the tests and the benchmarks wait for it)."""
    log.info(f"running: set {self.model_set.name if self.model_set else '?'}, {self.spec.running(self.camera)}")
    self.status.start(time.monotonic_ns())  # the status lines count from here

  def outputs_finite(self, loaded: Loaded[P], outputs: np.ndarray, frame_id: int) -> bool:
    """False for a run with a NaN or inf output, after zeroing the recurrent states it wrote: every later run would read them."""
    if np.isfinite(outputs).all():
      self.episodes.ended("outputs", "model outputs finite again after non-finite runs")
      return True
    loaded.adapter.reset_states()
    self.episodes.happened("outputs", f"frame {frame_id}: non-finite model outputs: {self.spec.non_finite()}")
    return False

  def probation(self, finite: bool) -> None:
    """After a frame's messages went out: a set on probation that gave non-finite outputs is dropped for the previous set, which runs
    from the next frame with its recurrent state reset."""
    if self.switch.probation and (back := self.switch.frame_ran(finite)) is not None:
      back.handle.adapter.reset_states()
      self.use(back.handle, back=True)

  # *** the loop ***

  def start(self, core: int | None, on_device: bool) -> None:
    """openpilot's config_realtime_process for this daemon (its core and priority on a device), then the spec's own start."""
    self.core = self.spec.device_core if core is None and on_device else core
    log.info(config_realtime(self.core, self.spec.realtime_priority if on_device else None))
    log.info(f"cereal: {SCHEMA.source if SCHEMA else '?'}; reads {TOPICS.describe(self.spec.subscribed)}")
    log.info(f"signatures: {self.sets.trust.describe()}")
    self.spec.start(self.params, self.exit)

  def run(self, max_frames: int | None = None, core: int | None = None, on_device: bool = False) -> int:
    self.start(core, on_device)
    pm, sm = pub_master(list(self.spec.services)), sub_master(list(self.spec.subscribed))
    if not self.camera.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published = FrameDrops(), 0
    self.switch.start()
    log.info(f"model sets: {self.sets.describe()}; a switch is asked for by {self.switch.trigger}")
    self.camera.alive()
    if loaded: self.running()
    try:
      while not self.exit.is_set() and (max_frames is None or published < max_frames):
        if self.switch.ready is not None: loaded = self.switched(loaded)  # the changeover point: between two frames
        frames = self.camera.recv() if loaded else None
        t_recv = time.monotonic_ns()
        if frames is None:
          if self.camera.stalled(self.reconnect_after_s) and self.camera.connect(): loaded, drops = self.reattached(loaded), FrameDrops()
          if not loaded: self.exit.wait(0.1)
          continue
        self.episodes.ended("reconnect", "frames again after reconnecting to camerad")
        sm.update(0)
        dropped, drop_perc = drops.update(frames.meta.frame_id)
        self.status.dropped += dropped
        if t_recv >= self.status.next_ns: log.info(self.status.line(t_recv, published))
        published += self.step(pm, sm, Frame(frames, dropped, drop_perc), t_recv)
        if published == 1: gc.collect()  # the first frame built the message templates (pycapnp's schema objects hold reference cycles)
    finally: self.switch.stop()
    log.info(f"the frame loop left {gc.collect()} objects in reference cycles (the collector is off while it runs)")
    log.info(f"exiting after {published} published frames")
    return 0

  def step(self, pm: Any, sm: Any, frame: Frame, t_recv: int) -> int:
    """One frame on the running set, stamped at each of STAGE_STAMPS: its inputs, the model run, the spec's publish. 1 if it published."""
    loaded = self.running_set  # for this frame (a changeover happens only between frames): one lookup, not one per use
    adapter, spec = loaded.adapter, self.spec
    inputs = spec.inputs(sm, frame, loaded)
    start = time.perf_counter()
    loaded.host.write(spec.host_values(inputs))
    t_inputs_s, t_inputs = time.perf_counter(), time.monotonic_ns()
    adapter.copy_frames(frame.frames.bufs)
    t_copy = time.monotonic_ns()
    adapter.run()
    t_run = time.monotonic_ns()
    outputs = spec.read_outputs(loaded)
    clock, t_readback = Clock(start, t_inputs_s, time.perf_counter()), time.monotonic_ns()
    finite = self.outputs_finite(loaded, outputs, frame.frames.meta.frame_id)
    filled = outputs if finite else np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)  # invalid, but no NaN in what is published
    done = spec.publish(pm, loaded, filled, finite, frame, inputs, clock)
    if done is not None:
      if self.timings is not None:
        self.timings.append([frame.frames.meta.frame_id, t_recv, t_inputs, t_copy, t_run, t_readback, done.fill, done.serialize, done.send,
                             time.monotonic_ns()])
      self.status.times.append(done.execution_time)
    if self.first_frame:  # which model runs is no field of today's messages: said here, frame by frame of a change (and in the run state)
      self.first_frame = False
      log.info(f"frame {frame.frames.meta.frame_id}: the first on set {self.model_set.name if self.model_set else '?'} (model {loaded.digest[:16]})")
    self.probation(finite)
    return int(done is not None)
