"""Switching model sets while a daemon runs frames: the request (a trigger), the load in a background thread, the changeover between two
frames, the probation of a new set's first frames, and the fallbacks. Nothing here knows modeld: a daemon gives `load(model_set,
context) -> handle` (read, verify, load and warm up; ArtifactError when it cannot) and `close(handle)`, and its frame thread calls the
rest in the order ModelSwitch's docstring gives. dmonitoringmodeld uses the same class with its own load.

The request: on a comma device the parameter sunnypilot's model manager writes for the active bundle (`ActiveSetParam`); on a PC a flag
file, ROOT/active (`ActiveSetFile`). Both name a set (model_sets.ModelSets); empty means the default. The thread looks every POLL_S.
"""
from __future__ import annotations

import gc
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.model_sets import ACTIVE_FILE, DEFAULT_SET, ModelSet, ModelSets

log = logging.getLogger(__name__)
T = TypeVar("T")

POLL_S = 0.5  # how often the thread reads the request
PROBATION_FRAMES = 20  # a new set's first frames (1 s at 20 Hz): a non-finite output among them drops it for the previous set
# While a load runs beside the frames, the interpreter hands the GIL over every this many seconds (Python's default is 5 ms): the frame
# thread releases it in every kernel call, and each return would otherwise wait up to 5 ms while the loader runs Python.
LOADING_SWITCH_INTERVAL_S = 0.0002

class ActiveSetFile:
  """A PC's request: ROOT/active holds the name of the set to run (a flag file: `echo my-set > ROOT/active`; none, empty or `default`:
  the default set). Rewriting it with the same name asks again (a set that failed is tried again)."""
  def __init__(self, sets: ModelSets):
    self.sets = sets

  def requested(self) -> tuple[str, Any]:
    """(set name, a stamp that changes whenever the request is made again)."""
    if self.sets.root is None: return "", None
    try: st = os.stat(os.path.join(self.sets.root, ACTIVE_FILE))
    except OSError: return "", None
    return self.sets.read_name(ACTIVE_FILE), (st.st_ino, st.st_size, st.st_mtime_ns)

  def __str__(self) -> str:
    return f"the flag file {os.path.join(self.sets.root, ACTIVE_FILE)}" if self.sets.root else "nothing (no --model-sets: the default set only)"

class ActiveSetParam:
  """A comma device's request: sunnypilot's model manager writes the bundle the user picked to the parameter ModelManager_ActiveBundle
  (sunnypilot/models/manager.py @1052de51 `_download_bundle`) and removes it for the default (its UI's `_select_default`); readers
  parse it as JSON (sunnypilot/models/helpers.py @13ce8664 `get_active_bundle`). The set asked for is the bundle's `internalName` (else
  its `ref`): install_models names a set's folder after its manifest's name, which a model manager sets to the same."""
  KEY = "ModelManager_ActiveBundle"

  def __init__(self, params: Any, key: str = KEY):
    self.params, self.key = params, key

  def requested(self) -> tuple[str, Any]:
    raw = self.params.get(self.key)
    if not raw: return "", None
    try: bundle = raw if isinstance(raw, dict) else json.loads(raw)
    except (TypeError, ValueError): return "", raw  # bytes of another era's encoding: no set of ours
    name = bundle.get("internalName") or bundle.get("ref") if isinstance(bundle, dict) else None
    return (name if isinstance(name, str) else ""), json.dumps(bundle, sort_keys=True, default=str)

  def __str__(self) -> str: return f"the parameter {self.key}"

# sunnypilot's second slot: the bundle its model manager picked for the Chestnut, the external accelerator that runs the big model
# (sunnypilot/models/helpers.py ACTIVE_BUNDLE_KEYS["chestnut"]; written and read as the first slot is)
CHESTNUT_KEY = "ModelManager_ActiveBundleChestnut"

def trigger_for(sets: ModelSets, params: Any) -> ActiveSetFile | ActiveSetParam:
  """A daemon's request: openpilot's Params on a comma device (daemon/device_params.device_params), else (None) the flag file."""
  return ActiveSetFile(sets) if params is None else ActiveSetParam(params)

def why(e: Exception) -> str:
  """An error as one line: an ArtifactError's message is one already; anything else is a failure of the load itself, named by its type."""
  return str(e) if isinstance(e, ArtifactError) else f"its load failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"

@dataclass(frozen=True)
class Candidate(Generic[T]):
  """A set loaded by the daemon's `load`: its handle (modeld: a warmed-up model and warp) and what it was loaded for (modeld: the camera
  geometry)."""
  model_set: ModelSet
  handle: T
  context: Any

class ModelSwitch(Generic[T]):
  """The sets a daemon runs on, and the thread that loads the next one.

  The daemon gives `load(model_set, context) -> handle` (read, verify, load and warm up a set for `context`, what a handle is loaded for:
  modeld's camera geometry; it raises when it cannot, and an ArtifactError's message is the line said) and `close(handle)`. Its frame
  thread calls everything here but `step` (the thread's), in this order:

    switch = ModelSwitch(sets, trigger, load, close, thread_setup=...)
    switch.first(context)          at start: the first set that loads (the one asked for, the last that ran, the default); None: none
                                   did (wait, and call it again later)
    switch.start()                 the thread: it watches `trigger`, loads the set asked for beside the frames, closes what was let go
    each frame:
      if switch.ready is not None:                     between two frames (one attribute read when nothing is ready)
        candidate = switch.take_for(context)           None when it was loaded for a context that is gone (it is loaded again)
        if candidate is not None: run frames on it from now on, then switch.changed_over(candidate)
      run the frame on switch.current.handle
      if switch.probation and (back := switch.frame_ran(finite)) is not None: run on `back` from the next frame, its state reset
    the context comes back the same (camerad reconnected): each of switch.handles() drops what it held of the old one (camera buffers)
    another context: model_set = switch.new_context(context) closes every handle (loaded for the old one); then
      switch.reload(model_set, context, load) loads it for the new one (its own way: the daemon knows more of the set that ran), or
      when it cannot, the others in fallback order (switch.first)
    switch.stop()                  at exit

  `current` is what frames run on, and this object its one owner: a daemon reads what runs from it and keeps no handle of its own. A
  handle the frame thread lets go (an outgoing set, a failed one) is closed by the thread, off the frames' path. Every field both
  threads change is changed under `lock`, which neither holds across a load, a close, a log line or a read of the trigger: the frame
  thread never waits on the loading. Every failure is one line, and none touches the running set."""
  def __init__(self, sets: ModelSets, trigger: Any, load: Callable[[ModelSet, Any], T], close: Callable[[T], None],
               probation_frames: int = PROBATION_FRAMES, poll_s: float = POLL_S, thread_setup: Callable[[], str] | None = None,
               report: Callable[[str], None] = log.warning, fresh: str = "its recurrent state and queues start from zero"):
    self.sets, self.trigger, self.load, self.close, self.report = sets, trigger, load, close, report  # report: `first`'s lines (once each)
    self.fresh = fresh  # what the first frame on a new set starts from, for the changeover's line
    self.probation_frames, self.poll_s, self.thread_setup = probation_frames, poll_s, thread_setup
    # the frame thread's (the thread reads `current` and `context`)
    self.current: Candidate[T] | None = None  # what frames run on
    self.confirmed = False  # whether `current` passed its first frames (kept while a context change reloads it)
    self.probation = 0  # frames `current` has left to pass
    self.previous: Candidate[T] | None = None  # the last set that passed, kept while `current` is on probation
    self.context: Any = None  # what loads are for now (modeld's camera geometry)
    # changed by both threads, under `lock`
    self.ready: Candidate[T] | None = None  # loaded by the thread, for the frame thread to take
    self.request: tuple[str, Any] = ("", None)  # the trigger's last (name, stamp)
    self.failed: dict[str, str] = {}  # set name -> why, until it is asked for again
    self.fallbacks: list[str] = []  # the sets to load when the running one fails its first frames with none kept to go back to
    self.again: str | None = None  # a set to load again for the new context
    self.loading: str | None = None  # the set the thread is loading now (for the daemon's run state; the thread's alone to write)
    self.pending: str | None = None  # the set the frame thread warms in the shadow of the running one (daemon/shadow.py), not loaded again
    self.to_record: str | None = None  # a set that passed, for the thread to record as the last that ran
    self.to_close: list[T] = []  # handles let go by the frame thread, for the thread to close
    self.lock, self.wake, self.stop_event = threading.Lock(), threading.Event(), threading.Event()
    self.thread: threading.Thread | None = None

  @property
  def requested(self) -> str: return self.request[0] or DEFAULT_SET

  def handles(self) -> list[T]:
    """The handles loaded for the context now: the running set's and the one kept to fall back to."""
    return [c.handle for c in (self.current, self.previous) if c is not None]

  # *** the daemon's frame thread ***

  def first(self, context: Any, failed: str | None = None, why_failed: str = "") -> Candidate[T] | None:
    """Load the first set that loads for `context`, in order: the one asked for, the last that ran, the default; a line for each that
    fails. None when none does (the daemon waits, and calls `first` again later). `failed`: the running set, which could not be loaded
    for `context` (another camera geometry) for `why_failed`: the others are tried, and it is not tried again until asked for again."""
    request = self.trigger.requested()
    order = [n for n in self.sets.fallbacks(request[0]) if n != failed]
    with self.lock:
      self.request, self.context = request, context
      if failed is not None: self.failed[failed] = why_failed
    if failed is not None and order: self.report(f"set {failed} cannot run on these cameras: {why_failed}; falling back to set {order[0]}")
    for i, name in enumerate(order):
      try: candidate = Candidate(model_set := self.sets.open(name), self.load(model_set, context), context)
      except Exception as e:  # whatever a set's load raises, the next set is tried (a bundle for another device once left a car without one)
        with self.lock: self.failed[name] = why(e)
        self.report(f"cannot run set {name}: {why(e)}{f'; falling back to set {order[i + 1]}' if i + 1 < len(order) else ''}")
        continue
      with self.lock: self.current, self.confirmed, self.probation, self.fallbacks = candidate, False, self.probation_frames, order[i + 1:]
      return candidate
    return None

  def new_context(self, context: Any) -> ModelSet | None:
    """What loads are for changed (modeld: camerad came back with another camera geometry): the running set and the one kept to fall
    back to were loaded for the old one and are closed here (no frame runs on them while the daemon reloads). Returns the set that ran,
    for the daemon to load again for `context` (then `reloaded`), or None when none ran. Until then the thread loads nothing: with no
    set running it would load the one asked for, a second copy of the set the daemon is loading."""
    with self.lock:
      running, previous, self.current, self.previous = self.current, self.previous, None, None
      self.context = context if running is None else None
    if previous is not None:
      log.warning(f"set {previous.model_set.name}, kept to fall back to, was loaded for cameras that are gone: closed")
      self.close(previous.handle)
    if running is None: return None
    self.close(running.handle)
    return running.model_set

  def reloaded(self, candidate: Candidate[T]) -> None:
    """The daemon loaded the set that ran again itself (after `new_context`): frames run on `candidate` now, as far through its first
    frames as before. The thread loads for its context from now on."""
    with self.lock: self.current, self.context = candidate, candidate.context

  def reload(self, running: ModelSet | None, context: Any, load: Callable[[ModelSet], T]) -> tuple[Candidate[T] | None, Exception | None]:
    """After `new_context`: `running` (the set that ran) loaded again for `context` by `load`, else, when it cannot (an ArtifactError),
    the first of the others that loads (`first` with it failed); with no set that ran, `first`. Returns (what frames run on now, None
    when nothing loads; the running set's error, None when it loaded or there was none)."""
    if running is None: return self.first(context), None
    try: candidate = Candidate(running, load(running), context)
    except ArtifactError as e: return self.first(context, failed=running.name, why_failed=str(e)), e
    self.reloaded(candidate)
    return candidate, None

  def take_for(self, context: Any) -> Candidate[T] | None:
    """`take` for the daemon's live `context`: a set loaded for a context that is gone is loaded again (`retry`), and None returned."""
    if (candidate := self.take()) is None or candidate.context == context: return candidate
    self.retry(candidate)
    return None

  def take(self) -> Candidate[T] | None:
    """A set the thread loaded and warmed up, to change over to now (between two frames), or None: one attribute read when there is none."""
    if self.ready is None: return None
    with self.lock: candidate, self.ready = self.ready, None
    return candidate

  def retry(self, candidate: Candidate[T]) -> None:
    """`candidate` was loaded for a context that is gone (the camera geometry changed while it loaded): load it again for the new one."""
    log.warning(f"the camera geometry changed while set {candidate.model_set.name} loaded: loading it again for the new one")
    with self.lock: self.again = candidate.model_set.name
    self.release(candidate.handle)

  def shadowing(self, candidate: Candidate[T] | None) -> None:
    """The frame thread warms `candidate` beside the running set (None: it warms none any more): the thread does not load that set again."""
    with self.lock: self.pending = candidate.model_set.name if candidate is not None else None

  def shadow_failed(self, candidate: Candidate[T], why_failed: str) -> None:
    """`candidate` failed its warm-up (non-finite outputs, a context that never filled): closed, and not tried again until asked for again."""
    with self.lock: self.failed[candidate.model_set.name], self.pending = why_failed, None
    self.release(candidate.handle)

  def changed_over(self, candidate: Candidate[T]) -> None:
    """Frames run on `candidate` from now on. The outgoing set stays loaded as the fallback when it had passed its first frames (the one
    kept before is closed); one that had not is closed, and a set kept before stays the fallback. With none kept, the sets to fall back
    to are the start's order (the one asked for, the last that ran, the default) without this one."""
    name = candidate.model_set.name
    order = [n for n in self.sets.fallbacks(self.request[0]) if n != name]
    with self.lock:
      outgoing, confirmed, let_go = self.current, self.confirmed, []
      if outgoing is not None and confirmed:
        if self.previous is not None: let_go.append(self.previous.handle)
        self.previous = outgoing
      elif outgoing is not None: let_go.append(outgoing.handle)
      self.current, self.confirmed, self.probation, self.pending = candidate, False, self.probation_frames, None
      self.fallbacks = [] if self.previous is not None else order
    for handle in let_go: self.release(handle)
    kept = f"; set {self.previous.model_set.name} kept until it has run {self.probation_frames} frames" if self.previous is not None else ""
    log.info(f"switched to {candidate.model_set} between two frames: {self.fresh}{kept}")
    self.wake.set()

  def frame_ran(self, finite: bool) -> Candidate[T] | None:
    """One frame ran on the current set. While it is on probation: after `probation_frames` finite ones it has passed (the previous set
    is closed and it is recorded as the last that ran); a non-finite one drops it. Returns the set to change back to then (the daemon
    runs on it from the next frame, its recurrent state reset), else None (the thread loads the next fallback, if any, meanwhile)."""
    if self.probation == 0 or self.current is None: return None
    name = self.current.model_set.name
    if finite:
      self.probation -= 1
      if self.probation == 0:
        with self.lock:
          previous, self.previous, self.confirmed, self.fallbacks, self.to_record = self.previous, None, True, [], name
        if previous is not None: self.release(previous.handle)
        self.wake.set()
        log.info(f"set {name} passed its first {self.probation_frames} frames: the set to fall back to from now on")
      return None
    with self.lock:
      self.failed[name], self.probation, back = "non-finite outputs in its first frames", 0, self.previous
      if back is not None: dropped, self.previous, self.current, self.confirmed = self.current, None, back, True
      next_set = self.next_fallback()
    if back is not None:
      self.release(dropped.handle)
      log.warning(f"set {name} gave non-finite outputs in its first frames: dropped, back to set {back.model_set.name}")
      return back
    log.warning(f"set {name} gave non-finite outputs in its first frames"
                + (f": loading set {next_set} in the background" if next_set else ": no other set to fall back to"))
    self.wake.set()
    return None

  def release(self, handle: T) -> None:
    """Let go of a handle no frame runs on: closed by the thread while it runs (a close may wait for the device), else here."""
    if self.thread is not None and self.thread.is_alive() and not self.stop_event.is_set():
      with self.lock: self.to_close.append(handle)
      self.wake.set()
    else: self.close(handle)

  # *** the thread ***

  def start(self) -> None:
    """Start the thread that watches the request, loads sets and closes what was let go."""
    self.stop_event.clear()
    self.thread = threading.Thread(target=self._watch, name="model_switch", daemon=True)
    self.thread.start()

  def stop(self, timeout: float = 0.5) -> None:
    """End the thread (a load under way is left to finish on its own after `timeout`); what was let go and not closed yet is closed here."""
    self.stop_event.set()
    self.wake.set()
    if self.thread is not None: self.thread.join(timeout)
    self.close_let_go()

  def close_let_go(self) -> None:
    with self.lock: handles, self.to_close = self.to_close, []
    for handle in handles:
      try: self.close(handle)
      except Exception as e: log.error(f"model switch: closing a set failed: {type(e).__name__}: {e}")

  def _watch(self) -> None:
    if self.thread_setup is not None: log.info(f"model switch thread: {self.thread_setup()}")
    while not self.stop_event.is_set():
      self.wake.wait(self.poll_s)
      self.wake.clear()
      self.close_let_go()
      with self.lock: name, self.to_record = self.to_record, None
      if name is not None:
        self.sets.record_ran(name)
        self.collect()
      try: self.step()
      except Exception as e:  # a bug here must never take the frames down with it: the running set keeps running
        log.error(f"model switch: {type(e).__name__}: {e}")

  def collect(self) -> None:
    """Free what loads left in reference cycles (the daemon runs with the collector off) and freeze the rest out of later collections:
    only objects made since the last freeze are scanned, here, beside the frames."""
    if gc.isenabled(): return
    t = time.perf_counter()
    found = gc.collect(0)
    gc.freeze()
    log.info(f"model switch: {found} objects in reference cycles freed in {(time.perf_counter() - t) * 1e3:.0f} ms")

  def _read_request(self, request: tuple[str, Any]) -> bool:
    """Take the trigger's `request` (under the lock); whether it is a new one (a set asked for again is tried again)."""
    if request == self.request: return False
    self.request = request
    self.failed.pop(self.requested, None)
    return True

  def next_fallback(self) -> str | None:
    """The first of `fallbacks` that has not failed (under the lock)."""
    return next((n for n in self.fallbacks if n not in self.failed), None)

  def _target(self) -> str | None:
    """The set to load next, if any (under the lock): one to load again, the next fallback of a set that failed its first frames, or a
    new request."""
    if self.again is not None: return self.again
    running = self.current.model_set.name if self.current is not None else None
    if running in self.failed and (fallback := self.next_fallback()) is not None: return fallback
    return None if self.requested in (running, self.pending) or self.requested in self.failed else self.requested

  def step(self) -> None:
    """One look at the request and, when a set is due, its load (the thread calls it every POLL_S, and when woken)."""
    request = self.trigger.requested()
    with self.lock:
      asked = self._read_request(request)
      name, context = None if self.ready is not None or self.context is None else self._target(), self.context
      if name is not None and name == self.again: self.again = None
    if asked: log.info(f"set {self.requested} asked for by {self.trigger}")
    if asked and name is None and self.current is not None and self.requested == self.current.model_set.name:
      log.info(f"set {self.requested} runs already: nothing to change")
    if name is None: return
    interval = sys.getswitchinterval()
    sys.setswitchinterval(LOADING_SWITCH_INTERVAL_S)
    self.loading = name
    try: candidate = Candidate(model_set := self.sets.open(name), self.load(model_set, context), context)
    except Exception as e:  # whatever a set's load raises, the running set runs on, and the set is not tried again until asked for again
      with self.lock:
        self.failed[name] = why(e)
        if name in self.fallbacks: self.fallbacks.remove(name)
        running = f"set {self.current.model_set.name} keeps running" if self.current is not None else "no set runs"
      log.warning(f"cannot switch to set {name}: {why(e)}; {running}")
      return
    finally:
      sys.setswitchinterval(interval)
      self.loading = None
    request = self.trigger.requested()
    with self.lock:
      asked = self._read_request(request)
      dropped = name not in self.fallbacks and self.requested != name  # another set was asked for while this one loaded
      if not dropped: self.ready = candidate
    if asked: log.info(f"set {self.requested} asked for by {self.trigger}")
    if dropped:
      log.warning(f"set {name} loaded, but set {self.requested} was asked for meanwhile: dropped")
      self.close(candidate.handle)
      self.wake.set()
      return
    log.info(f"{model_set} loaded and warmed up in the background: changing over before the next frame")
