"""What a model daemon's process does before and around its frame loop: openpilot's config_realtime_process (the collector off, a core,
SCHED_FIFO on a device), the --core argument, SIGTERM / Ctrl-C turned into an exit event the loop checks between frames, and the model
switch thread kept out of the frames' way."""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import threading

def config_realtime(core: int | None, priority: int | None) -> str:
  """openpilot's config_realtime_process (common/realtime.py @0318f5a6): the garbage collector off, so that no collection pauses a frame
  (a frame loop makes no reference cycles: the daemons count them on exit, the tests check it); with a core the process pinned to it; with a
  `priority` (on a device, as openpilot does it there) SCHED_FIFO at that priority, through the device's own config_realtime_process
  where it has one. Returns what it did, for the log."""
  if priority is not None and core is not None:
    try:
      from openpilot.common.realtime import config_realtime_process  # type: ignore[import-not-found]
    except ImportError:
      config_realtime_process = None
    if config_realtime_process is not None:
      config_realtime_process(core, priority)
      gc.disable()  # openpilot's does it too; said here in one place
      return f"garbage collector off, core {core}, priority {priority}: openpilot's config_realtime_process"
  gc.disable()
  done = ["garbage collector off"]
  if core is not None:
    try:
      os.sched_setaffinity(0, [core])
      done.append(f"pinned to core {core}")
    except OSError: done.append(f"core {core} is not one of this machine's {sorted(os.sched_getaffinity(0))}: not pinned")
  if priority is not None:
    try:
      os.sched_setscheduler(0, os.SCHED_FIFO | os.SCHED_RESET_ON_FORK, os.sched_param(priority))  # what it starts (a compiler) runs normally
      done.append(f"SCHED_FIFO {priority}")
    except PermissionError: done.append(f"SCHED_FIFO {priority} not permitted here: normal priority")
  return ", ".join(done)

def core_arg(text: str) -> int:
  """A CPU core this process may run on."""
  try: core = int(text)
  except ValueError: raise argparse.ArgumentTypeError(f"expected a CPU core number, got {text!r}") from None
  if core not in (allowed := os.sched_getaffinity(0)): raise argparse.ArgumentTypeError(f"core {core} is not one this process may use: {sorted(allowed)}")
  return core

def stop_on_signals(exit_event: threading.Event) -> list[int]:
  """SIGTERM and SIGINT set `exit_event` (the frame loop ends within one wait of it) instead of raising; returns the list the signals
  received are appended to, so that main can exit 130 after a Ctrl-C, the shell's code for SIGINT."""
  stopped_by: list[int] = []
  def stop(signum: int, _frame) -> None:
    stopped_by.append(signum)
    exit_event.set()
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, stop)
  return stopped_by

def exit_code(stopped_by: list[int], code: int) -> int:
  """A daemon's exit code: 130 after Ctrl-C, else `code`."""
  return 128 + signal.SIGINT if signal.SIGINT in stopped_by else code

def config_background(frame_core: int | None) -> str:
  """The model switch thread loads beside the frames and must never be in their way: normal scheduling (the frame thread may be
  SCHED_FIFO, which a thread inherits), nice 10, and off the frame thread's core when it is pinned. Linux applies each to the calling
  thread alone. Returns what it did, for the log."""
  done = []
  with contextlib.suppress(OSError):
    if os.sched_getscheduler(0) != os.SCHED_OTHER:
      os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
      done.append("normal scheduling")
  with contextlib.suppress(OSError):
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    done.append("nice 10")
  if frame_core is not None and (others := set(range(os.cpu_count() or 1)) - {frame_core}):
    with contextlib.suppress(OSError):
      os.sched_setaffinity(0, others)
      done.append(f"off core {frame_core}")
  return ", ".join(done) or "as the frame thread"
