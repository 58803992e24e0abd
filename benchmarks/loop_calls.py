"""Python calls and CPU time per frame of modeld's stubbed frame loop (stubbed_loop), back to back, each counted in a fresh interpreter in
a tree's root: this checkout's, or another commit's tree beside it (bench_daemon --stub-loop --count-calls [--baseline DIR])."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable

# Run in a fresh interpreter in a tree's root (this one's, or --baseline's: any tree whose benchmarks.stubbed_loop has StubCamera.recv (recv_frames before)
# and run_stubbed): modeld's frame loop stubbed, back to back; per frame, from the stub camera handing a frame over to its next receive,
# the Python calls (sys.setprofile's call and c_call events) in one run and the process's CPU time in another, unprofiled
COUNT_SNIPPET = """
import json, statistics, sys, time
from benchmarks import stubbed_loop
try: from benchmarks.publish_path import stand_in_layout
except ImportError: from benchmarks.bench_daemon import stand_in_layout  # a tree from before benchmarks/publish_path.py
generation, frames, warmup, bus, kwargs = {args!r}
slices, width = stand_in_layout(generation)
receiving = 'recv' if hasattr(stubbed_loop.StubCamera, 'recv') else 'recv_frames'  # an older tree's name
calls, marks, receive = [0], [], getattr(stubbed_loop.StubCamera, receiving)
def count(frame, event, arg):
  if event in ("call", "c_call"): calls[0] += 1
def recv_frames(self):  # the stub camera's own work (its sleep, the car's messages it sends) is not modeld's
  profiler = sys.getprofile()
  sys.setprofile(None)
  marks.append((time.process_time(), calls[0]))
  try: return receive(self)
  finally:
    marks.append((time.process_time(), calls[0]))
    sys.setprofile(profiler)
setattr(stubbed_loop.StubCamera, receiving, recv_frames)
def per_frame(profile, k):
  marks.clear()
  sys.setprofile(count if profile else None)
  try: stubbed_loop.run_stubbed(slices, width, generation, frames + warmup, 0.0, 0.0, bus, **kwargs)
  finally: sys.setprofile(None)
  return statistics.median(marks[i + 1][k] - marks[i][k] for i in range(1 + 2 * warmup, len(marks) - 1, 2))
print(json.dumps({{"calls": per_frame(True, 1), "cpu_ms": per_frame(False, 0) * 1e3}}))
"""

def count_calls(generation: str, frames: int, warmup: int, bus: bool, parses: list[str], baseline: str | None,
                log: Callable[[str], None]) -> dict[tuple[str, str], dict]:
  """{(tree, parse): {calls, cpu_ms}} per frame of the stubbed loop (`frames` after `warmup`), each in a fresh process: this tree for each
  of `parses`, and `baseline`'s (a tree from before the in-graph parse: its host parse)."""
  here, out = os.path.dirname(os.path.dirname(os.path.abspath(__file__))), {}
  runs = [("this", here, parse, {"parse": parse}) for parse in parses] + ([("baseline", baseline, "host", {})] if baseline else [])
  for tree, root, parse, kwargs in runs:
    log(f"counting calls per frame: {tree} tree, parse on the {parse} ...")
    code = COUNT_SNIPPET.format(args=(generation, frames, warmup, bus, kwargs))
    proc = subprocess.run([sys.executable, "-c", code], cwd=root, env=os.environ | {"PYTHONPATH": os.path.abspath(root)}, capture_output=True, text=True)
    if proc.returncode: raise SystemExit(f"benchmarks.bench_daemon: error: counting in {root} failed: {proc.stderr.strip().splitlines()[-1:]}")
    out[(tree, parse)] = json.loads(proc.stdout.strip().splitlines()[-1])
  return out
