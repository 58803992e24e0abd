"""The package's one logger configuration. Every module logs through `logging.getLogger(__name__)`; a command line calls `setup(prog)`
once, and its diagnostics read `prog: message` on stderr, whichever module wrote them. Results (tables, inspect output) stay on stdout."""
from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable
from typing import TextIO

class _Stderr(logging.StreamHandler):
  """Writes to sys.stderr as it is when a line is logged (as logging's own last-resort handler does), so a redirect made after setup, such
  as a test's capture, gets the line and a closed earlier one is never written."""
  def __init__(self) -> None:
    logging.Handler.__init__(self)  # StreamHandler's would bind one stream for good

  @property
  def stream(self) -> TextIO: return sys.stderr

def setup(prog: str) -> None:
  """The process's log lines to stderr as `prog: message`: this package's from INFO up (`__main__` is the CLI module run with -m), other
  libraries' from WARNING up. Called again (a second CLI in one process), it replaces the first setup."""
  handler = _Stderr()
  handler.setFormatter(logging.Formatter(f"{prog}: %(message)s"))
  root = logging.getLogger()
  for old in [h for h in root.handlers if isinstance(h, _Stderr)]: root.removeHandler(old)
  root.addHandler(handler)
  root.setLevel(logging.WARNING)
  for name in ("sunnypilot", "__main__"): logging.getLogger(name).setLevel(logging.INFO)

class Episodes:
  """The package's one mechanism for lines that would repeat frame after frame: a condition logs one line when it starts and one with its
  count when it ends (if it happened more than once); a line that has no end is logged once (`once`)."""
  def __init__(self, log: Callable[[str], None]):
    self.log = log
    self.counts: dict[str, int] = {}
    self.said: set[str] = set()

  def once(self, line: str) -> None:
    """`line`, the first time it is said (a bad bundle, an input with no source, a field a schema lacks)."""
    if line not in self.said:
      self.said.add(line)
      self.log(line)

  def happened(self, key: str, line: str, times: int = 1) -> None:
    """`key` happened (again): `line` is logged only if this starts an episode."""
    if key not in self.counts: self.log(line)
    self.counts[key] = self.counts.get(key, 0) + times

  def ended(self, key: str, line: str) -> None:
    """`key` is over for now: `line` and the count are logged if it happened more than once."""
    if (count := self.counts.pop(key, 0)) > 1: self.log(f"{line} ({count} times)")

class Progress:
  """Lines for a long job a person waits on: `start` says a stage begins (always logged), `step` where a loop is (logged when `every_s` have
  passed since the last line), so a loop may call `step` every iteration and the log still gets a line every few seconds."""
  def __init__(self, log: Callable[[str], None], every_s: float = 2.0, clock: Callable[[], float] = time.monotonic):
    self.log, self.every_s, self.clock, self.last = log, every_s, clock, -math.inf

  def start(self, line: str) -> None:
    self.last = self.clock()
    self.log(line)

  def step(self, line: str) -> None:
    if self.clock() - self.last >= self.every_s: self.start(line)
