"""Watch what modeld publishes: once a second, one line per service with its message rate, frame id, valid, modelExecutionTime and a few
key fields (as openpilot users watch the bus with cereal's dump tools), and one per model daemon saying which set and model it runs, since
when, and what is on its way (a set loading or warming up in the shadow, a big model; daemon/run_state.py).

  python -m sunnypilot.modeld_v2.tools.watch [--services modelV2,drivingModelData,cameraOdometry] [--seconds N]

It subscribes over msgq to every message (not conflated: the rate counts them all) on the bus OPENPILOT_PREFIX selects, and runs until
Ctrl-C (exit 130) or for --seconds. A message that is not an Event of its service is counted as dropped on its line.
"""
from __future__ import annotations

import argparse
import logging
import math
import sys
import time
from collections.abc import Callable
from typing import Any

from sunnypilot.modeld_v2.common.cli import finite_float, interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.daemon.run_state import describe, read_state

PROG = "modeld_watch"  # its console command (pyproject.toml): what usage lines and errors name

SERVICES = ("modelV2", "drivingModelData", "cameraOdometry")
DAEMONS = ("modeld", "dmonitoringmodeld")  # whose run state each window shows (what runs, since when, what is on its way)

def _num(value: float, fmt: str = "+.5f") -> str: return format(value, fmt) if math.isfinite(value) else str(value)

def _first_last(values: Any) -> str: return f"{_num(values[0], '.2f')}..{_num(values[-1], '.2f')}" if len(values) else "-"

def model_v2_fields(m: Any) -> str:
  """modelV2: the action's curvature, the plan's x from its first point to its last, the first lead's probability, the confidence."""
  action = f"curvature {_num(m.action.desiredCurvature)}" if "action" in m.schema.fieldnames else ""
  lead = f"lead prob {m.leadsV3[0].prob:.2f}" if len(m.leadsV3) else "lead -"
  return f"{action}  plan x {_first_last(m.position.x)} m  {lead}  confidence {m.confidence}"

def driving_model_data_fields(d: Any) -> str:
  """drivingModelData: the action's curvature, the lane lines' lateral offsets and probabilities, the path's constant y coefficient."""
  lanes = d.laneLineMeta
  path_y = d.path.yCoefficients
  return (f"curvature {_num(d.action.desiredCurvature)}  lanes L {_num(lanes.leftY, '+.2f')} ({lanes.leftProb:.2f}) R {_num(lanes.rightY, '+.2f')} "
          f"({lanes.rightProb:.2f})  path y0 {_num(path_y[0], '+.3f') if len(path_y) else '-'}  lane change {d.meta.laneChangeState}")

def camera_odometry_fields(o: Any) -> str:
  """cameraOdometry: the translation and rotation (device frame) and their first stds."""
  vec = lambda v, fmt: " ".join(_num(x, fmt) for x in v) or "-"
  return f"trans {vec(o.trans, '+.2f')} m/s  rot {vec(o.rot, '+.4f')} rad/s  trans std {vec(o.transStd, '.2f')}"

FIELDS: dict[str, Callable[[Any], str]] = {"modelV2": model_v2_fields, "drivingModelData": driving_model_data_fields,
                                           "cameraOdometry": camera_odometry_fields}

def summarize(service: str, raw: bytes) -> dict | None:
  """What one line shows of a message: frame id, valid, modelExecutionTime (ms, None where the service has none) and its key fields;
  None if `raw` is not an Event of `service`."""
  import capnp

  from sunnypilot.modeld_v2.daemon.messaging import NO_TRAVERSAL_LIMIT, log
  try:
    with log.Event.from_bytes(bytes(raw), traversal_limit_in_words=NO_TRAVERSAL_LIMIT) as event:
      if str(event.which()) != service: return None
      msg = getattr(event, service)
      names = msg.schema.fieldnames
      frame = msg.frameId if "frameId" in names else None  # any service may be watched: not every one has frame ids
      return {"frame": frame, "valid": event.valid, "ms": msg.modelExecutionTime * 1e3 if "modelExecutionTime" in names else None,
              "fields": FIELDS.get(service, lambda _: "")(msg)}
  except (capnp.KjException, ValueError, IndexError):
    return None

class Watch:
  """Per service: the messages of the current window (counted), the last one's summary, the malformed ones dropped. `line` makes the
  service's line for a window of `seconds` and starts the next."""
  def __init__(self, services: list[str]):
    self.services = services
    self.count, self.dropped = dict.fromkeys(services, 0), dict.fromkeys(services, 0)
    self.last: dict[str, dict | None] = dict.fromkeys(services)

  def add(self, service: str, raw: bytes) -> None:
    if (summary := summarize(service, raw)) is None: self.dropped[service] += 1
    else: self.count[service], self.last[service] = self.count[service] + 1, summary

  def line(self, service: str, seconds: float) -> str:
    n, last, dropped = self.count[service], self.last[service], self.dropped[service]
    self.count[service] = self.dropped[service] = 0
    head = f"{service:<16} {n / seconds if seconds > 0 else 0.0:5.1f} Hz"
    tail = f"  ({dropped} malformed dropped)" if dropped else ""
    if last is None: return f"{head}  nothing received yet{tail}"
    if n == 0: return f"{head}  nothing in the last {seconds:.1f} s (last frame {last['frame']}){tail}"
    ms = f"  exec {last['ms']:6.2f} ms" if last["ms"] is not None else ""
    return f"{head}  frame {last['frame']:>7}  valid {int(last['valid'])}{ms}  {last['fields']}{tail}"

class Subscriber:
  """Unconflated msgq subscriptions to `services` behind one poller: `receive(timeout_ms)` hands every message waiting to `on_message`."""
  def __init__(self, services: list[str]):
    import msgq

    from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir
    ensure_prefix_dir()
    self.poller = msgq.Poller()
    self.socks = {s: msgq.sub_sock(s, poller=self.poller, conflate=False, timeout=0) for s in services}

  def receive(self, timeout_ms: int, on_message: Callable[[str, bytes], None]) -> None:
    self.poller.poll(max(0, timeout_ms))
    for service, sock in self.socks.items():
      while (raw := sock.receive(non_blocking=True)) is not None: on_message(service, raw)

def daemon_lines() -> list[str]:
  """A line per model daemon with a run state on this bus (daemon/run_state.py): the set and model it runs, since when, what is on its way."""
  return [f"{daemon:<16} {describe(state)}" for daemon in DAEMONS if (state := read_state(daemon)) is not None]

def watch(sub: Subscriber, seconds: float | None = None, print_line: Callable[[str], None] = print, clock: Callable[[], float] = time.monotonic) -> None:
  """Print one line per service of `sub` every second, and one per model daemon that says what it runs, for `seconds` (None: until
  interrupted); the last window may be shorter."""
  services = list(sub.socks)
  state = Watch(services)
  start = window = clock()
  while seconds is None or clock() - start < seconds:
    end = min(window + 1.0, start + seconds) if seconds is not None else window + 1.0
    sub.receive(int(max(0.0, end - clock()) * 1000) + 1, state.add)
    if (now := clock()) >= end:
      for service in services: print_line(f"{now - start:5.0f}s {state.line(service, now - window)}")
      for line in daemon_lines(): print_line(f"{now - start:5.0f}s {line}")
      window = now

def service_list(text: str) -> list[str]:
  """--services: comma-separated services of the installed schema (argparse type)."""
  from sunnypilot.modeld_v2.daemon.messaging import has_service
  names = [s.strip() for s in text.split(",") if s.strip()]
  if not names: raise argparse.ArgumentTypeError("expected comma-separated services such as modelV2,cameraOdometry")
  if unknown := [s for s in names if not has_service(s)]: raise argparse.ArgumentTypeError(f"no such service in this cereal schema: {', '.join(unknown)}")
  return list(dict.fromkeys(names))

@interruptible(PROG)
def main(argv: list[str] | None = None) -> int:
  import os
  parser = cli_parser(PROG, __doc__)
  parser.add_argument("--services", type=service_list, default=",".join(SERVICES), help=f"comma-separated services (default {','.join(SERVICES)})")
  parser.add_argument("--seconds", type=finite_float(0, 10**7, low_open=True), help="stop after this many seconds (default: until Ctrl-C)")
  args = parser.parse_args(argv)
  sub = Subscriber(args.services)  # subscribed before the line below: a message sent after it is counted
  bus = os.environ.get("OPENPILOT_PREFIX") or "the default bus (no OPENPILOT_PREFIX)"
  logging.getLogger(__name__).info(f"watching {', '.join(args.services)} on {bus}, a line per service per second; Ctrl-C stops")
  watch(sub, args.seconds, lambda line: print(line, flush=True))
  return 0

if __name__ == "__main__":
  sys.exit(main())
