"""What every command line of this package shares: argument types checked when the arguments are parsed (argparse then prints one
line and exits 2, before any work), Ctrl-C reported as one line with exit code 130, the shell's code for SIGINT, and SIGINT/SIGTERM
turned into one KeyboardInterrupt for a CLI that must clean up what it started (on_interrupt)."""
from __future__ import annotations

import argparse
import contextlib
import functools
import math
import os
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

T = TypeVar("T")

class Parser(argparse.ArgumentParser):
  """argparse whose usage errors are one line, `<prog>: error: <message>` with exit code 2, as every other error of a CLI here is."""
  def error(self, message: str) -> NoReturn:
    self.exit(2, f"{self.prog}: error: {message}\n")

def parser(prog: str, doc: str | None) -> Parser:
  """A CLI's parser: `prog` names it in usage and errors, its module docstring is the description, printed as written."""
  return Parser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)

def checked(parse: Callable[[str], T]) -> Callable[[str], T]:
  """An argparse type from a parser of the rule's own: its ValueError is argparse's one-line usage error (exit 2, before any work)."""
  def typed(text: str) -> T:
    try: return parse(text)
    except ValueError as e: raise argparse.ArgumentTypeError(str(e)) from None
  typed.__name__ = parse.__name__  # argparse names the type in its messages
  return typed

def positive_int(text: str) -> int:
  try: value = int(text)
  except ValueError: raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {text!r}") from None
  if value < 1: raise argparse.ArgumentTypeError(f"expected a whole number of at least 1, got {value}")
  return value

def non_negative_int(text: str) -> int:
  try: value = int(text)
  except ValueError: raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {text!r}") from None
  if value < 0: raise argparse.ArgumentTypeError(f"expected a whole number of at least 0, got {value}")
  return value

def finite_float(low: float, high: float, low_open: bool = False) -> Callable[[str], float]:
  """An argparse type: a finite number in [low, high] ((low, high] with low_open)."""
  def parse(text: str) -> float:
    try: value = float(text)
    except ValueError: value = math.nan
    if not math.isfinite(value) or value > high or value < low or (low_open and value == low):
      raise argparse.ArgumentTypeError(f"expected a number {'above' if low_open else 'from'} {low:g} {'up ' if low_open else ''}to {high:g}, got {text!r}")
    return value
  return parse

def int_list(text: str) -> set[int]:
  """`"30,31"` -> {30, 31}: comma-separated whole numbers of at least 0 (empty: none)."""
  items = [x.strip() for x in text.split(",") if x.strip()]
  if not all(x.isdigit() for x in items): raise argparse.ArgumentTypeError(f"expected comma-separated frame ids like 30,31, got {text!r}")
  return {int(x) for x in items}

PARENT_PID = "SUNNYPILOT_PARENT_PID"  # set by a tool for the processes it starts and must not leave running (route_replay's modeld and replays)

def child_env(env: dict[str, str] | None = None) -> dict[str, str]:
  """The environment for a process this one starts and must not outlive it: see end_with_parent."""
  return {**(os.environ if env is None else env), PARENT_PID: str(os.getpid())}

def end_with_parent() -> None:
  """Started with child_env: the kernel sends this process SIGTERM when its parent dies (Linux's PR_SET_PDEATHSIG), and if the parent
  is gone already it exits now, so a killed tool leaves none of its processes behind. Nothing happens without the variable, or off Linux."""
  if not (parent := os.environ.get(PARENT_PID, "")).isdigit() or not sys.platform.startswith("linux"): return
  import ctypes
  ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
  if os.getppid() != int(parent): os.kill(os.getpid(), signal.SIGTERM)

def interruptible(prog: str) -> Callable[[Callable[..., int]], Callable[..., int]]:
  """Wrap a CLI's main: its log lines read `<prog>: message` on stderr (logs.setup), and Ctrl-C (KeyboardInterrupt, wherever it lands)
  prints `<prog>: interrupted` and returns 130 instead of a traceback. Temporary files are removed on the way out by the writers themselves
  (common.files.replaced_atomically)."""
  def wrap(main: Callable[..., int]) -> Callable[..., int]:
    @functools.wraps(main)
    def run(*args: Any, **kwargs: Any) -> int:
      from sunnypilot.modeld_v2.common.logs import setup
      setup(prog)
      end_with_parent()
      try: return main(*args, **kwargs)
      except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr, flush=True)
        return 130
    return run
  return wrap

def interrupted(*_: object) -> None:
  """SIGINT or SIGTERM: stop, once. Signals after the first are ignored, so the clean-up they interrupt (stopping a daemon, removing a
  msgq namespace) runs to its end: a Ctrl-C at the terminal reaches a parallel replay's children, and its parent then tells them too."""
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: None)  # not SIG_IGN: a signal already pending then raises OSError
  raise KeyboardInterrupt

def on_interrupt() -> None:
  """SIGINT and SIGTERM raise KeyboardInterrupt, once (interrupted): a CLI's `finally` then stops and removes what it started."""
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, interrupted)

@contextlib.contextmanager
def interrupts_handled() -> Iterator[None]:
  """on_interrupt while the block runs; the handlers before are put back after."""
  before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
  on_interrupt()
  try: yield
  finally:
    for sig, handler in before.items(): signal.signal(sig, handler)
