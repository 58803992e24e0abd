"""What a model daemon runs, for a person and a UI: one small JSON record per daemon and bus, rewritten whole (atomically) when it changes.

  running   the set and model frames run on (the model's content hash), since when (wall clock and frame id), big or not
  next      a set on its way: loading (the switch thread reads and warms it up), warming (in the shadow, with its progress in frames),
            deferred (warm, waiting for the driver to disengage), failed (with the one-line reason)
  big       a set's big model (openpilot's big/small pair): loading, warming, active, failed (with the reason)

The record lives beside the bus, `/dev/shm/msgq_<OPENPILOT_PREFIX>/modeld_v2.<daemon>.json` (`/dev/shm/modeld_v2.<daemon>.json` without a
prefix), so a watcher of the bus finds it (tools/watch.py, install_models --list) and it goes with the bus; the daemon removes it when it
exits. A record whose pid is gone is a daemon that died, and is read as such.
"""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any

from sunnypilot.modeld_v2.common.files import replaced_atomically

def state_path(daemon: str, prefix: str | None = None) -> str:
  """The record of `daemon` on the bus of `prefix` (default: this process's OPENPILOT_PREFIX)."""
  prefix = os.environ.get("OPENPILOT_PREFIX") if prefix is None else prefix
  return os.path.join(f"/dev/shm/msgq_{prefix}" if prefix else "/dev/shm", f"modeld_v2.{daemon}.json")

def read_state(daemon: str, prefix: str | None = None) -> dict[str, Any] | None:
  """The record of `daemon`, with `alive` (its pid runs), or None when it has none."""
  try:
    with open(state_path(daemon, prefix)) as f: state = json.load(f)
  except (OSError, ValueError): return None
  if not isinstance(state, dict): return None
  try: os.kill(int(state.get("pid", 0)), 0)
  except (OSError, ValueError): state["alive"] = False
  else: state["alive"] = True
  return state

class RunState:
  """The record a daemon keeps (see the module's docstring): `update` changes parts of it and writes it when anything changed."""
  def __init__(self, daemon: str):
    self.path = state_path(daemon)
    self.state: dict[str, Any] = {"daemon": daemon, "pid": os.getpid(), "started": time.time(), "running": None, "next": None, "big": None}

  def update(self, **parts: Any) -> None:
    if all(self.state.get(k) == v for k, v in parts.items()): return
    self.state.update(parts)
    with contextlib.suppress(OSError):  # a UI's record never stops a daemon: a full or missing /dev/shm is no frame's problem
      with replaced_atomically(self.path) as (tmp,), open(tmp, "w") as f: json.dump(self.state, f)

  def remove(self) -> None:
    with contextlib.suppress(OSError): os.remove(self.path)

def state_of(switch: Any, driving: Any, since: tuple[float, int | None], warming: Any, big: Any) -> dict[str, Any]:
  """The record's parts from a daemon's model switch, the model frames run on (a Loaded) and since when, the set warming in the shadow
  and the big model (frame_daemon.FrameDaemon's)."""
  current = switch.current
  running = {"set": current.model_set.name, "model": driving.digest[:16], "since": since[0], "since_frame": since[1],
             "big": driving.big} if current is not None and driving is not None else None
  name = current.model_set.name if current is not None else None
  if warming is not None: next_set = {"set": warming.name, "phase": "deferred" if warming.deferred else "warming", "progress": warming.progress()}
  elif (loading := switch.loading) is not None: next_set = {"set": loading, "phase": "loading"}
  elif switch.requested != name and (reason := switch.failed.get(switch.requested)) is not None:
    next_set = {"set": switch.requested, "phase": "failed", "reason": reason}
  else: next_set = None
  return {"running": running, "next": next_set, "big": big.record() if big is not None else None}

def describe(state: dict[str, Any] | None) -> str:
  """One line of a daemon's record, for a person."""
  if state is None: return "not running (no record)"
  running = state.get("running") or {}
  line = (f"set {running.get('set', '?')} (model {running.get('model', '?')}{', big' if running.get('big') else ''}) since frame "
          f"{running.get('since_frame', '?')}, {time.strftime('%H:%M:%S', time.localtime(running.get('since', 0)))}") if running else "no model runs"
  if not state.get("alive", True): line = f"died (pid {state.get('pid')}); last ran {line}"
  for key in ("next", "big"):
    if part := state.get(key):
      progress = f" {part['progress']}" if part.get("progress") else ""
      line += f"; {key}: set {part.get('set', '?')} {part.get('phase', '?')}{progress}"
      if part.get("reason"): line += f" ({part['reason']})"
  return line
