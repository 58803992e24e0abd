"""A model daemon (modeld, dmonitoringmodeld) in a subprocess for the daemon tests: its own OPENPILOT_PREFIX through the fixture, every
line it logs recorded, started until it says frames run and stopped with SIGTERM."""
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import ROOT

class DaemonProcess:
  """`command` (a module run with -m, or -c code) with `args`; `env` added to this process's. `ready`: the line to wait for (None: none)."""
  def __init__(self, command: tuple[str, ...], args: tuple[str, ...] = (), env: dict | None = None, ready: str | None = "running:"):
    self.name = command[-1].rsplit(".", 1)[-1] if command[0] == "-m" else "the daemon"
    self.proc = subprocess.Popen([sys.executable, *command, *args], cwd=ROOT, stderr=subprocess.PIPE, text=True,
                                 env=os.environ | {"PYTHONUNBUFFERED": "1"} | (env or {}))
    self.lines: list[str] = []
    self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stderr.readline, "")), daemon=True)
    self.reader.start()
    if ready is not None: self.wait_for_line(ready)

  def wait_for_line(self, text: str, timeout: float = 60, after: int = 0) -> int:
    """Wait until the daemon logged a line containing `text` (after line number `after`); returns the number of lines seen then."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if any(text in line for line in self.lines[after:]): return len(self.lines)
      assert self.proc.poll() is None, f"{self.name} exited: {''.join(self.lines)}"
      time.sleep(0.02)
    raise AssertionError(f"{self.name} never said {text!r}: {''.join(self.lines)}")

  def stop(self, signum: int = signal.SIGTERM) -> int:
    """Its exit code after `signum`, every line it wrote read."""
    self.proc.send_signal(signum)
    code = self.proc.wait(timeout=20)
    self.reader.join(timeout=10)
    return code

  def left_no_cycles(self) -> bool:
    """The daemon's exit line: its frame loop, with the collector off (openpilot's config_realtime_process), made no reference cycle that
    would never be freed."""
    return any("the frame loop left 0 objects in reference cycles" in line for line in self.lines)

def exchange_until(daemon, text: str | tuple[str, ...], start: int, most: int = 400, after: int | None = None) -> int:
  """Send `daemon` frames one after the other (each waited for: its `exchange`) until it said `text` (or one of them; after line `after`,
  default: from now); the next frame id. A switch of model sets is waited for so, every frame published on the way."""
  seen, texts = len(daemon.lines) if after is None else after, (text,) if isinstance(text, str) else text
  said = lambda: any(t in line for line in daemon.lines[seen:] for t in texts)
  if said(): return start
  for frame_id in range(start, start + most):
    daemon.exchange([frame_id])
    if said(): return frame_id + 1
  raise AssertionError(f"{daemon.name} never said {text!r} in {most} frames: {''.join(daemon.lines[seen:])}")
