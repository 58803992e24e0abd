"""modeld as a process: arguments refused at parse time, one modeld per bus, another publisher taking its topics, Ctrl-C, the status
line. Each fault test reproduces a failure seen before the fix."""
import re
import signal
import subprocess
import sys
import time

import pytest

import modeld_daemon
from conftest import ROOT
from modeld_daemon import Daemon

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name

@pytest.mark.parametrize("flag,value", [("--lat-delay", "nan"), ("--lat-delay", "-inf"), ("--long-delay", "-0.375"), ("--long-delay", "6"),
                                        ("--lat-delay", "abc"), ("--max-frames", "0"), ("--max-frames", "-3"), ("--core", "100000"),
                                        ("--core", "seven"), ("--reconnect-after", "0"), ("--reconnect-after", "nan")])
def test_bad_arguments_are_refused_at_parse_time(flag, value, tmp_path):
  """--long-delay -0.375 made action_t zero: ZeroDivisionError on the first frame; NaN delays reached the model."""
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(tmp_path), flag, value], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "Traceback" not in out.stderr and f"error: argument {flag}: " in out.stderr.strip().splitlines()[-1], out.stderr

def wait_for_exit(daemon: Daemon, signum: int | None = None) -> tuple[int, list[str]]:
  """modeld's exit status (after `signum`, if given) and every line it wrote."""
  if signum is not None: daemon.proc.send_signal(signum)
  code = daemon.proc.wait(timeout=20)
  daemon.replay.close()
  deadline = time.monotonic() + 5  # the reader thread may still be taking the last line from the pipe
  while time.monotonic() < deadline and not any("exiting" in line for line in daemon.lines): time.sleep(0.01)
  return code, daemon.lines

def test_a_second_modeld_on_the_same_bus_is_refused(artifacts, openpilot_prefix):
  """msgq lets the newest publisher take a topic and kills the older one's next send: the running modeld died with a traceback."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2 and out.stderr == f"modeld: error: another modeld is already running on the bus OPENPILOT_PREFIX={openpilot_prefix}\n"
  daemon.exchange(range(5, 10))
  assert daemon.stop() == 0, "the first one kept running"

def test_another_publisher_taking_over_ends_modeld_in_one_line(artifacts, openpilot_prefix):
  import msgq
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  intruder = msgq.pub_sock("modelV2")
  intruder.send(b"12345678")
  daemon.send(5)
  code, lines = wait_for_exit(daemon)
  del intruder
  assert code == 2 and "Traceback" not in "".join(lines) and "took over publishing modelV2" in lines[-1], lines

def test_ctrl_c_exits_130_without_a_traceback(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  daemon.exchange(range(3))
  code, lines = wait_for_exit(daemon, signal.SIGINT)
  assert code == 130 and "Traceback" not in "".join(lines) and lines[-1] == "modeld: exiting after 3 published frames\n", lines

def test_a_status_line_says_frames_drops_and_execution_time(artifacts, openpilot_prefix):
  """There was no way to see what modeld does short of subscribing: it logs a status line every few seconds (--status-every) while
  frames run, of the frames published, dropped and their modelExecutionTime since the line before."""
  from sunnypilot.modeld_v2.daemon.status import Status
  status = Status(every_s=2)
  status.start(0)
  status.times += [0.004, 0.003, 0.010]
  status.dropped += 2
  assert status.line(2 * 10**9, 3) == "status: 3 frames published, 3 in the last 2.0 s, 2 dropped, modelExecutionTime p50 4.0 ms, max 10.0 ms"
  assert status.next_ns == 4 * 10**9 and status.line(9 * 10**9, 3) == "status: 3 frames published, 0 in the last 7.0 s, 0 dropped", "after a stall"
  daemon = Daemon(artifacts, args=("--status-every", "0.2"))
  first = len(daemon.lines)
  frame_id = 0
  while sum("status:" in line for line in daemon.lines[first:]) < 2:  # lockstep frames until two lines came
    daemon.exchange([frame_id])
    frame_id += 1
    assert frame_id < 2000, daemon.lines
  assert daemon.stop() == 0
  second = [line for line in daemon.lines if "status:" in line][1]
  line = re.search(r"status: (\d+) frames published, (\d+) in the last [\d.]+ s, 0 dropped, modelExecutionTime p50 [\d.]+ ms", second)
  total, recent = map(int, line.groups())
  assert 0 < recent <= total < frame_id, (second, frame_id)
