"""openpilot's big/small pair, as its modeld runs it (selfdrive/modeld/modeld.py @084747c): a model set may name a big driving model beside
its driving model (manifest role big_driving_model; big_model.bin in a folder without one). The small one drives from the first frame while
the big one loads in the background, with openpilot's 60 s timeout; the big one takes over once warm (daemon/shadow.py: its context its
own), and the small one then runs in its shadow, so that it is warm too when it has to take over again. A big one that fails (its load,
the timeout, non-finite outputs, a device error at run time) hands back to the small one for the rest of the drive (this daemon's life),
with one line. `modelV2.big` says which runs; openpilot's UsbGpuLoading / UsbGpuActive and sunnypilot's ChestnutLoading / ChestnutActive
parameters say it to the device's UI.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sunnypilot.modeld_v2.daemon.model_switch import why
from sunnypilot.modeld_v2.daemon.shadow import context_frames, run_shadow

log = logging.getLogger(__name__)

BIG_MODEL_TIMEOUT_S = 60.0  # openpilot's modeld: BIG_MODEL_TIMEOUT
LOADING_PARAMS, ACTIVE_PARAMS = ("UsbGpuLoading", "ChestnutLoading"), ("UsbGpuActive", "ChestnutActive")  # openpilot's, sunnypilot's

class BigModel:
  """The big model of the running set, from its load to its end. The frame thread calls `between_frames` (the next frame's model: the big
  one once it took over, else None), `after_frame` (the shadow's run on this frame's inputs) and `failed` (the big one broke): nothing
  here waits on the load, which runs in its own thread."""
  def __init__(self, set_name: str, load: Callable[[], Any], close: Callable[[Any], None], params: Any, timeout_s: float = BIG_MODEL_TIMEOUT_S):
    self.set_name, self.close, self.params, self.timeout_s = set_name, close, params, timeout_s
    self.phase, self.reason, self.progress = "loading", "", ""
    self.started, self.done, self.needed = time.monotonic(), 0, 0
    self.loaded: Any = None  # the big model's Loaded, once its load returned
    self.error: BaseException | None = None
    self.lock = threading.Lock()
    self.say(True, False)
    self.thread = threading.Thread(target=self._load, args=(load,), name="big_model", daemon=True)
    self.thread.start()

  def _load(self, load: Callable[[], Any]) -> None:
    try: loaded = load()
    except BaseException as e:  # whatever the load raises is the big model's failure, never the frames'
      with self.lock: self.error = e
      return
    with self.lock:
      late = self.phase != "loading"  # timed out (or the set went) meanwhile: what it loaded is closed here
      if not late: self.loaded = loaded
    if late: self.close(loaded)

  def say(self, loading: bool, active: bool) -> None:
    """The device's UI parameters (openpilot's and sunnypilot's: the one this openpilot does not know is said once and passed over)."""
    if self.params is None: return
    for key in LOADING_PARAMS: self.params.put_bool(key, loading)
    for key in ACTIVE_PARAMS: self.params.put_bool(key, active)

  @property
  def active(self) -> bool: return self.phase == "active"

  def between_frames(self, may_take_over: bool) -> Any:
    """Its Loaded when it drives the next frame (it took over now, or before), else None. `may_take_over`: the engagement gate allows it."""
    if self.phase == "loading":
      with self.lock: loaded, error = self.loaded, self.error
      if error is not None: self.fail(f"its load failed: {why(error) if isinstance(error, Exception) else type(error).__name__}")
      elif loaded is not None:
        self.phase, self.needed = "warming", context_frames(loaded.adapter.metadata)
        log.info(f"set {self.set_name}'s big model loaded in {time.monotonic() - self.started:.1f} s: it warms up in the shadow of the small "
                 f"one ({self.needed} frames)")
      elif time.monotonic() - self.started > self.timeout_s: self.fail(f"its load took longer than {self.timeout_s:g} s")
    if self.phase == "warming" and self.done >= self.needed and may_take_over:
      self.phase = "active"
      self.say(False, True)
      log.info(f"set {self.set_name}'s big model takes over from the small one, which stays warm in its shadow")
    self.progress = f"{min(self.done, self.needed)}/{self.needed} frames" if self.phase == "warming" else ""
    return self.loaded if self.phase == "active" else None

  def after_frame(self, small: Any, host_values: dict[str, Any], bufs: dict[str, Any], frame_id: int) -> None:
    """The model in the shadow on this frame: the big one while it warms (dropped on a non-finite output), the small one while the big
    one drives (kept warm to take over again)."""
    if self.phase == "warming":
      if self.done == 0: log.info(f"frame {frame_id}: the first of the big model in the shadow")
      if run_shadow(self.loaded, host_values, bufs): self.done += 1
      else: self.fail(f"non-finite outputs on frame {frame_id} of its warm-up")
    elif self.phase == "active": run_shadow(small, host_values, bufs)

  def fail(self, reason: str) -> None:
    """The big model is done for this drive: the small one drives (warm, when the big one was active), one line."""
    was = self.phase
    with self.lock: self.phase, self.reason, loaded, self.loaded = "failed", reason, self.loaded, None
    self.say(False, False)
    log.warning(f"set {self.set_name}'s big model failed ({reason}): the small one drives for the rest of the drive"
                + (" from the next frame" if was == "active" else ""))
    if loaded is not None: self.close(loaded)

  def end(self) -> None:
    """The set goes (another takes over, the cameras changed, the daemon exits): the big model is closed, with no failure said."""
    with self.lock: self.phase, loaded, self.loaded = "ended", self.loaded, None
    self.say(False, False)
    if loaded is not None: self.close(loaded)

  def record(self) -> dict[str, Any] | None:
    """Its part of the run state."""
    if self.phase == "ended": return None
    return {"set": self.set_name, "phase": self.phase, "progress": self.progress, **({"reason": self.reason} if self.reason else {})}
