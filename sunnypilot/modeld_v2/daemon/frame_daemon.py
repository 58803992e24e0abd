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
from typing import Any, Generic, TypeVar

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import BIG_DRIVING, CHESTNUT_DRIVING, DRIVING, DaemonBundles, NoWarp, check_set, has_big_model, load_pair, model_file
from sunnypilot.modeld_v2.daemon.big_model import BIG_MODEL_TIMEOUT_S, BigModel
from sunnypilot.modeld_v2.daemon.camera_sync import Geometry
from sunnypilot.modeld_v2.daemon.daemon_spec import Clock, DaemonSpec, Frame, Loaded
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, ModelSet, ModelSets, Trust
from sunnypilot.modeld_v2.daemon.model_switch import CHESTNUT_KEY, ActiveSetParam, Candidate, ModelSwitch, trigger_for
from sunnypilot.modeld_v2.daemon.process import config_background, config_realtime
from sunnypilot.modeld_v2.daemon.run_state import RunState, state_of
from sunnypilot.modeld_v2.daemon.schema import SCHEMA
from sunnypilot.modeld_v2.daemon.shadow import Warming, context_frames, engaged, run_shadow
from sunnypilot.modeld_v2.daemon.status import STATUS_EVERY_S, FrameDrops, Status
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.model.calibration import sensor_for_size

log = logging.getLogger(__name__)
P = TypeVar("P")

RECONNECT_AFTER_S = 0.5  # no frame for this long: camerad may have restarted (--reconnect-after)
STATE_EVERY = 10  # frames between rewrites of the run state (a warm-up's progress), besides each change
class FrameDaemon(Generic[P]):
  """A model daemon: `spec` run on camerad's frames, the model of the set asked for loaded for the live cameras and switched while frames
  run (daemon/model_switch.py). What frames run on is the switch's `current`, and only there."""
  def __init__(self, spec: DaemonSpec[P], episodes: Episodes, artifacts: str, model_sets: str | None = None, trust: Trust | None = None,
               planes: list | None = None, timings: list | None = None, reconnect_after_s: float = RECONNECT_AFTER_S,
               status_every_s: float = STATUS_EVERY_S, params: Any = None, while_engaged: str = "defer", warm_up_timeout_s: float | None = None,
               big_model_timeout_s: float = BIG_MODEL_TIMEOUT_S):
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
    self.warming: Warming | None = None  # a set warming up in the shadow of the running one (daemon/shadow.py)
    self.big: BigModel | None = None  # the running set's big model, when it names one (daemon/big_model.py)
    self.driving: Loaded[P] | None = None  # what frames run on: the running set's model, or its big one once that took over
    self.while_engaged = while_engaged  # WHILE_ENGAGED: what a set asked for while openpilot is engaged waits for
    self.warm_up_timeout_s = warm_up_timeout_s  # how long a warm-up may take (None: shadow.Warming's own)
    self.big_model_timeout_s = big_model_timeout_s
    self.engaged = False  # openpilot is engaged (the selfdrive state topic's `enabled`), as of the last frame
    self.run_state = RunState(spec.name)  # what runs and what is on its way, for a person and a UI (daemon/run_state.py)
    self.since: tuple[float, int | None] = (0.0, None)  # when the running model took over: wall clock, its first frame's id
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
      for loaded in self.switch.handles() + ([self.warming.candidate.handle] if self.warming else []): loaded.adapter.drop_camera_buffers()
      return True
    if self.warming is not None: self.drop_warming("it was loaded for cameras that are gone", failed=False)
    if self.big is not None: self.big.end()  # the set's reload for the new cameras starts its big model again
    self.big = None
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
    self.use(candidate, fresh=True)
    adapter, model = candidate.handle.adapter, os.path.basename(model_file(candidate.model_set, self.spec.bundles))
    log.info(f"loaded {candidate.model_set}: {model} + {os.path.basename(candidate.handle.warp)}{self.spec.about(candidate.handle)} for "
             f"{name.removesuffix(': ')}{' ' if name else ''}"
             f"{geometry} in {(time.perf_counter() - t) * 1e3:.0f} ms ({'camera buffers read in place' if adapter.in_place else 'frames copied'})")
    return True

  def planes_of(self, model_set: ModelSet, kind: DaemonBundles) -> list | None:
    """The shape of `model_set`'s model's frames input: the default set's as check_artifacts read it, another's from check_set (its
    model vouched for and checked; one line when the set has no model of this daemon's, or none it can run)."""
    if model_set.name == DEFAULT_SET and kind is self.spec.bundles and self.planes is not None: return self.planes
    return check_set(model_set, report=lambda line: None, kind=kind)  # its warps' lines: load_pair says them

  def prepare(self, model_set: ModelSet, geometry: Geometry, kind: DaemonBundles | None = None) -> Loaded[P]:
    """`model_set`'s model fused with its warp for `geometry`, loaded (each bundle vouched for by the set before a byte of its kernels is
    read) and warmed up on zero frames: ArtifactError, one line, when any step fails. On the frame thread (at start, or for new cameras,
    while no frame runs) its lines are said once and a pair that fails is refused until one of its files changes; the switch thread calls
    it for the next set while frames run."""
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner  # tinygrad: imported when a model is loaded, not at start
    waiting, kind = threading.current_thread() is threading.main_thread(), kind or self.spec.bundles
    report = self.episodes.once if waiting else log.warning
    try: sensor = sensor_for_size(geometry.main.width, geometry.main.height)
    except ValueError as e: raise ArtifactError(str(e)) from None
    planes = self.planes_of(model_set, kind)
    def load(model: str, warp: str, verify: Any, digests: dict[str, str]) -> Loaded[P]:
      adapter = ModelRunner(model, warp, verify=verify)
      try:
        loaded = Loaded(adapter, HostInputs(adapter.numpy_inputs, report), sensor, warp, digests[model], planes,
                        self.spec.own(adapter, sensor, warp, report), kind.big)
        self.warm_up(loaded)
      except ValueError as e:  # a model whose outputs this daemon cannot read: the set's problem, one line
        adapter.close()
        raise ArtifactError(str(e)) from None
      except BaseException:  # whatever else failed (a device error in the warm-up, Ctrl-C), the adapter goes with it
        adapter.close()
        raise
      return loaded
    return load_pair(model_set, geometry.main, geometry.extra, planes, load, report, self.refused if waiting else None, kind)

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

  def use(self, candidate: Candidate[Loaded[P]], fresh: bool) -> None:
    """Frames run on `candidate`'s model from the next one (the spec's part; `fresh`: its recurrent state starts from zero), and that
    frame's line names it; its big model (big_pick), if there is one, starts loading beside it (daemon/big_model.py)."""
    self.spec.use(candidate.handle, self.camera, fresh)
    self.first_frame, self.since, self.driving = True, (time.time(), None), candidate.handle
    if self.big is not None: self.big.end()
    self.big = None
    if self.spec.bundles is DRIVING and (pick := self.big_pick(candidate.model_set)) is not None:
      (model_set, kind), geometry = pick, self.geometry
      assert geometry is not None, "a set is used for the cameras it was loaded for"
      self.big = BigModel(model_set.name, lambda: self.prepare(model_set, geometry, kind), self.discard, self.params, self.big_model_timeout_s)

  def big_pick(self, running: ModelSet) -> tuple[ModelSet, DaemonBundles] | None:
    """The big model beside `running`, read each time a set takes over: on a sunnypilot device, the driving model of the set its model
    manager picked for the Chestnut (CHESTNUT_KEY), when that set opens here; else `running`'s own big model, if it names one."""
    if self.params is not None and (name := ActiveSetParam(self.params, CHESTNUT_KEY).requested()[0]):
      try: return self.sets.open(name), CHESTNUT_DRIVING
      except ArtifactError as e: self.episodes.once(f"the Chestnut pick (set {name}) is not used as the big model: {e}")
    return (running, BIG_DRIVING) if has_big_model(running) else None

  def discard(self, loaded: Loaded[P]) -> None:
    """A loaded set no frame runs on any more: the switch closes it, on its thread while frames run."""
    loaded.adapter.close()

  # *** between frames ***

  def switched(self, loaded: bool) -> bool:
    """Between two frames: the set the switch thread loaded, when it was loaded for the live camera geometry (else it is loaded again),
    warms up in the shadow of the running one (daemon/shadow.py); with none running, frames run on it from the next one. Whether a model
    runs now."""
    if (candidate := self.switch.take_for(self.geometry)) is None: return loaded
    if not loaded or self.running_set is None:
      self.take_over(candidate, fresh=True)
      self.running()
      return True
    if self.warming is not None: self.drop_warming(f"set {candidate.model_set.name} was asked for meanwhile", failed=False)
    self.warming = Warming(candidate, context_frames(candidate.handle.adapter.metadata), limit_s=self.warm_up_timeout_s)
    self.switch.shadowing(candidate)
    self.record_state()
    running = self.model_set.name if self.model_set else "?"
    log.info(f"set {candidate.model_set.name} warms up in the shadow of set {running}: " +
             (f"{self.warming.needed} frames until its context is its own" if self.warming.needed else "it keeps nothing between frames"))
    return True

  def changeover(self) -> None:
    """Between two frames, a warm set takes over, unless the driver is engaged and such changes wait for a disengagement."""
    warming = self.warming
    if warming is None or not warming.full: return
    if self.engaged and self.while_engaged == "defer":
      if not warming.deferred:
        log.info(f"set {warming.name} is warm: it takes over once openpilot disengages (--switch-while-engaged defer)")
        warming.deferred = True
        self.record_state()
      return
    self.warming = None
    self.take_over(warming.candidate, fresh=warming.needed == 0)

  def take_over(self, candidate: Candidate[Loaded[P]], fresh: bool) -> None:
    self.use(candidate, fresh)
    self.switch.changed_over(candidate)

  def shadow_frame(self, frame: Frame, inputs: Any) -> None:
    """The warming set's run on this frame, after the running set's messages went out: dropped (one line) when its outputs are not
    finite or its context did not fill in time."""
    warming = self.warming
    assert warming is not None
    if warming.timed_out():
      self.drop_warming(f"its context did not fill in {warming.timeout_s:.0f} s ({warming.progress()})", failed=True)
    elif not run_shadow(warming.candidate.handle, self.spec.host_values(inputs), frame.frames.bufs):
      self.drop_warming(f"non-finite outputs on frame {frame.frames.meta.frame_id} of its warm-up ({warming.progress()})", failed=True)
    else:
      if warming.done == 0: log.info(f"frame {frame.frames.meta.frame_id}: the first of set {warming.name} in the shadow")
      warming.done += 1

  def drop_warming(self, why: str, failed: bool) -> None:
    """The warming set goes (closed by the switch thread); one that `failed` is not tried again until asked for again."""
    warming, self.warming = self.warming, None
    if warming is None: return
    log.warning(f"set {warming.name} dropped from its warm-up: {why}; set {self.model_set.name if self.model_set else '?'} keeps running")
    if failed: self.switch.shadow_failed(warming.candidate, why)
    else:
      self.switch.shadowing(None)
      self.switch.release(warming.candidate.handle)
    self.record_state()

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
      self.use(back, fresh=True)

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
    gate = [TOPICS.selfdrive_state] if TOPICS.selfdrive_state is not None and TOPICS.selfdrive_state not in self.spec.subscribed else []
    pm, sm = pub_master(list(self.spec.services)), sub_master([*self.spec.subscribed, *gate])
    if not self.camera.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published = FrameDrops(), 0
    self.switch.start()
    log.info(f"model sets: {self.sets.describe()}" + (f"; a switch is asked for by {self.switch.trigger}" if self.sets.root or self.params else ""))
    self.camera.alive()
    if loaded: self.running()
    try:
      while not self.exit.is_set() and (max_frames is None or published < max_frames):
        if self.switch.ready is not None: loaded = self.switched(loaded)  # the changeover point: between two frames
        if self.warming is not None: self.changeover()
        if self.big is not None: self.drive_big()
        frames = self.camera.recv() if loaded else None
        t_recv = time.monotonic_ns()
        if frames is None:
          if self.camera.stalled(self.reconnect_after_s) and self.camera.connect(): loaded, drops = self.reattached(loaded), FrameDrops()
          if not loaded: self.exit.wait(0.1)
          continue
        self.episodes.ended("reconnect", "frames again after reconnecting to camerad")
        sm.update(0)
        self.engaged = engaged(sm)
        dropped, drop_perc = drops.update(frames.meta.frame_id)
        self.status.dropped += dropped
        if t_recv >= self.status.next_ns: log.info(self.status.line(t_recv, published))
        published += self.step(pm, sm, Frame(frames, dropped, drop_perc), t_recv)
        if published == 1: gc.collect()  # the first frame built the message templates (pycapnp's schema objects hold reference cycles)
    finally:
      self.switch.stop()
      if self.big is not None: self.big.end()
      self.run_state.remove()
    log.info(f"the frame loop left {gc.collect()} objects in reference cycles (the collector is off while it runs)")
    log.info(f"exiting after {published} published frames")
    return 0

  def step(self, pm: Any, sm: Any, frame: Frame, t_recv: int) -> int:
    """One frame on the model frames run on, stamped at each of STAGE_STAMPS: its inputs, the model run, the spec's publish, then the
    models in the shadow. 1 if it published."""
    spec, loaded = self.spec, self.driving
    assert loaded is not None
    inputs = spec.inputs(sm, frame, loaded)
    try: outputs, clock, stamps = self.run_model(loaded, frame, inputs)
    except Exception as e:
      if not loaded.big or self.big is None: raise
      # the small one, warm in its shadow, runs this frame and the next
      self.big.fail(f"a device error at run time: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
      self.drive_big()
      loaded = self.driving
      assert loaded is not None, "the small one drives again"
      outputs, clock, stamps = self.run_model(loaded, frame, inputs)
    finite = self.outputs_finite(loaded, outputs, frame.frames.meta.frame_id)
    if not finite and loaded.big and self.big is not None: self.big.fail(f"non-finite outputs on frame {frame.frames.meta.frame_id}")
    filled = outputs if finite else np.nan_to_num(outputs, nan=0.0, posinf=0.0, neginf=0.0)  # invalid, but no NaN in what is published
    done = spec.publish(pm, loaded, filled, finite, frame, inputs, clock)
    row = [frame.frames.meta.frame_id, t_recv, *stamps, done.fill, done.serialize, done.send, time.monotonic_ns()] if done is not None else None
    if done is not None: self.status.times.append(done.execution_time)
    if self.first_frame:  # which model runs is no field of today's messages: said here, frame by frame of a change (and in the run state)
      self.first_frame, self.since = False, (self.since[0], frame.frames.meta.frame_id)
      name = self.model_set.name if self.model_set else "?"
      log.info(f"frame {frame.frames.meta.frame_id}: the first on set {name} (model {loaded.digest[:16]}{', the big one' if loaded.big else ''})")
    self.probation(finite)
    if self.warming is not None: self.shadow_frame(frame, inputs)
    if self.big is not None and self.running_set is not None:
      self.big.after_frame(self.running_set, spec.host_values(inputs), frame.frames.bufs, frame.frames.meta.frame_id)
    if row is not None and self.timings is not None: self.timings.append([*row, time.monotonic_ns()])  # the shadows' end too
    if frame.frames.meta.frame_id % STATE_EVERY == 0 or self.since[1] == frame.frames.meta.frame_id: self.record_state()
    return int(done is not None)

  def run_model(self, loaded: Loaded[P], frame: Frame, inputs: Any) -> tuple[np.ndarray, Clock, tuple[int, int, int, int]]:
    """`loaded` run on this frame's inputs: its outputs, the clock around the step, and the monotonic ns after the inputs, the copy, the
    run and the readback."""
    start = time.perf_counter()
    loaded.host.write(self.spec.host_values(inputs))
    t_inputs_s, t_inputs = time.perf_counter(), time.monotonic_ns()
    loaded.adapter.copy_frames(frame.frames.bufs)
    t_copy = time.monotonic_ns()
    loaded.adapter.run()
    t_run = time.monotonic_ns()
    outputs = self.spec.read_outputs(loaded)
    return outputs, Clock(start, t_inputs_s, time.perf_counter()), (t_inputs, t_copy, t_run, time.monotonic_ns())

  def drive_big(self) -> None:
    """Between two frames: frames run on the set's big model once it took over, on its small one before and after it failed."""
    assert self.big is not None
    target = self.big.between_frames(may_take_over=not (self.engaged and self.while_engaged == "defer")) or self.running_set
    if target is not None and target is not self.driving:
      self.spec.use(target, self.camera, fresh=False)  # each warm in the other's shadow
      self.driving, self.first_frame, self.since = target, True, (time.time(), None)
      self.record_state()

  def record_state(self) -> None:
    """The run state from what runs and what is on its way (daemon/run_state.py)."""
    self.run_state.update(**state_of(self.switch, self.driving, self.since, self.warming, self.big))
