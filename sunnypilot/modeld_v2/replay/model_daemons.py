"""The model daemons a replay runs: modeld (and dmonitoringmodeld, for a driver camera) as subprocesses in the replay's msgq namespace,
with the flags a replay gives them, what they publish, and how they fail. route_replay and the benchmarks start them through `Modeld`."""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading
import time

from sunnypilot.modeld_v2.common.cli import child_env
from sunnypilot.modeld_v2.replay.route_segment import RouteError

OUTPUT_SERVICES = ("modelV2", "drivingModelData", "cameraOdometry")
DRIVER_SERVICE = "driverStateV2"
MODELD_START_S, FRAME_TIMEOUT_S = 600.0, 60.0  # modeld's first start fuses and caches the bundle; a frame takes milliseconds
ECHO_QUIET = ("reconnected to camerad", "modeld: status:", "dmonitoringmodeld: status:")  # modeld's lines the replay does not pass on: it says its own progress

def modeld_flags(args: argparse.Namespace, send_raw: bool) -> list[str]:
  """modeld's flags for a replay. In lockstep modeld re-attaches only after FRAME_TIMEOUT_S without frames: frames pause while the
  reference catches up, and a frame sent while modeld re-attached would be lost unseen."""
  return (["--lat-delay", str(args.lat_delay), "--long-delay", str(args.long_delay), "--camera-offset", str(args.camera_offset)]
          + ["--rhd"] * args.rhd + ["--send-raw"] * send_raw + ["--reconnect-after", str(FRAME_TIMEOUT_S)] * (not args.realtime))

def dmonitoringmodeld_flags(args: argparse.Namespace, send_raw: bool) -> list[str]:
  """dmonitoringmodeld's flags for a replay: in lockstep it re-attaches only after FRAME_TIMEOUT_S without frames, as modeld."""
  return ["--send-raw"] * send_raw + ["--reconnect-after", str(FRAME_TIMEOUT_S)] * (not args.realtime)

class ModeldKilled(RouteError):
  """modeld ended by a signal the replay did not send (killed, out of memory): not the segment's fault, a retry may get past it."""

class Modeld:
  """modeld (or `daemon`: dmonitoringmodeld) in a subprocess in this process's msgq namespace, with `flags` after --artifacts; its log lines
  are kept (the last ones quoted when it fails) and, with `echo`, passed on. It runs in a session of its own: a Ctrl-C at the terminal
  reaches the replay, which stops the daemon itself, instead of both at once; it ends with the replay (cli.end_with_parent) if the replay
  is killed."""
  def __init__(self, artifacts: str, flags: list[str], echo: bool = True, daemon: str = "modeld"):
    self.name = daemon
    self.proc = subprocess.Popen([sys.executable, "-m", f"sunnypilot.modeld_v2.{daemon}", "--artifacts", artifacts, *flags], stderr=subprocess.PIPE,
                                 text=True, env=child_env() | {"PYTHONUNBUFFERED": "1"}, start_new_session=True)
    self.lines: list[str] = []
    self.echo = echo
    self.thread = threading.Thread(target=self._read, daemon=True)
    self.thread.start()

  def _read(self) -> None:
    assert self.proc.stderr is not None, "stderr=PIPE"
    for line in iter(self.proc.stderr.readline, ""):
      self.lines.append(line)
      if self.echo and not any(quiet in line for quiet in ECHO_QUIET): sys.stderr.write(line)  # what it could not use (a host input with no source, ...)

  def check(self) -> None:
    if self.proc.poll() is not None:
      raise (ModeldKilled if self.proc.returncode < 0 else RouteError)(f"{self.name} exited ({self.proc.returncode}): {self.last_line()}")

  def last_line(self) -> str: return "".join(self.lines[-3:]).strip().replace("\n", " | ") if self.lines else "no output"

  def wait_running(self, timeout: float = MODELD_START_S) -> None:
    deadline = time.monotonic() + timeout
    while not any("running:" in line for line in self.lines):
      self.check()
      if time.monotonic() > deadline: raise RouteError(f"{self.name} did not start in {timeout:.0f} s: {self.last_line()}")
      time.sleep(0.01)

  def stop(self) -> None:
    if self.proc.poll() is None: self.proc.send_signal(signal.SIGTERM)
    try: self.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.thread.join(timeout=5)

def start_daemons(args: argparse.Namespace, modeld_raw: bool, dm_raw: bool | None) -> list[Modeld]:
  """modeld, and dmonitoringmodeld unless `dm_raw` is None; each with --send-raw when its check reads the raw outputs."""
  daemons = [Modeld(args.artifacts, modeld_flags(args, modeld_raw))]
  if dm_raw is not None: daemons.append(Modeld(args.artifacts, dmonitoringmodeld_flags(args, dm_raw), daemon="dmonitoringmodeld"))
  return daemons
