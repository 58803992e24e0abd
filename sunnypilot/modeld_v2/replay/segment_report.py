"""What one replayed segment leaves: its Result, OUT/<segment>/modeld_rlog.zst (every message the daemons published), check.json (the
reference check), overlay.mp4 and plots.png (route_overlay), and the summary printed at the end."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from openpilot_logging.logreader import save_log

from sunnypilot.modeld_v2.common.files import replaced_atomically
from sunnypilot.modeld_v2.daemon.messaging import log as capnp_log
from sunnypilot.modeld_v2.replay.model_daemons import DRIVER_SERVICE
from sunnypilot.modeld_v2.replay.route_segment import CameraFrame, Segment

LOG_NAME, VIDEO_NAME, PLOT_NAME, CHECK_NAME = "modeld_rlog.zst", "overlay.mp4", "plots.png", "check.json"

@dataclass
class Result:
  segment: str
  sent: int = 0
  published: int = 0
  frame_drop_perc_max: float = 0.0
  seconds: float = 0.0
  check: dict | None = None
  files: list[str] = field(default_factory=list)
  driver_sent: int = 0  # driver camera frames, through dmonitoringmodeld
  driver_published: int = 0

  @property
  def fps(self) -> float: return self.sent / self.seconds if self.seconds else 0.0

def write_log(path: str, raws: list[bytes]) -> None:
  """The messages as a cereal log (openpilot_logging's save_log, zstd by the name): written whole to a temporary name, then renamed."""
  tmp = f"{path}.tmp{os.getpid()}.zst"
  try:
    save_log(tmp, list(capnp_log.Event.read_multiple_bytes(b"".join(raws))))
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.remove(tmp)

def write_check(path: str, check: dict) -> None:
  with replaced_atomically(path) as (tmp,), open(tmp, "w") as f: json.dump(check, f, indent=1)

def draw(args: argparse.Namespace, segment: Segment, out: str, metadata: dict, by_frame: dict[str, dict[int, Any]], calibrations: dict,
         driver_frames: list[CameraFrame], report: Callable[[str], None]) -> list[str]:
  """overlay.mp4 and plots.png of the --frames range (the driver's plots over the same time, when its camera was replayed); their paths."""
  from sunnypilot.modeld_v2.replay.route_overlay import plot_drive, write_overlay  # matplotlib and PyAV: only when drawing
  frames, models, drivers = segment.frames, by_frame["modelV2"], by_frame.get(DRIVER_SERVICE, {})
  a, b = args.frames
  picked = [(k, f) for k, f in enumerate(frames) if a <= k < (b or len(frames)) and f.frame_id in models]
  report(f"{segment.name}: drawing {len(picked)} frames over the road camera ...")
  stand_in = metadata.get("stand_in")  # a random-weight stand-in: the pictures say so
  write_overlay(video := os.path.join(out, VIDEO_NAME), segment, [(k, models[f.frame_id], *calibrations[f.frame_id]) for k, f in picked], stand_in)
  seconds = lambda f: (f.log_time - frames[0].log_time) / 1e9
  start, end = (frames[picked[0][0]].log_time, frames[picked[-1][0]].log_time) if picked else (0, 0)
  states = [(seconds(f), drivers[f.frame_id]) for f in driver_frames if f.frame_id in drivers and start <= f.log_time <= end]
  plot_drive(plot := os.path.join(out, PLOT_NAME), segment.name, [(seconds(f), models[f.frame_id]) for _, f in picked], stand_in,
             states if driver_frames else None, args.rhd)
  return [video, plot]

def summarize(result: Result) -> str:
  lines = [f"{result.segment}: {result.sent} frames sent, {result.published} published, {result.sent - result.published} dropped "
           f"(frameDropPerc max {result.frame_drop_perc_max:.2f}%), {result.fps:.1f} frames/s"]
  if result.driver_sent:
    lines.append(f"  driver camera: {result.driver_sent} frames sent, {result.driver_published} driverStateV2 published by dmonitoringmodeld")
  if result.check is not None:
    c = result.check
    worst = sorted(c["heads"].items(), key=lambda kv: -kv[1]["max"])[:5]
    over = {"modeld": f"modeld over {c['frames']} frames", "dmonitoringmodeld": f"dmonitoringmodeld over {c.get('driver_frames', c['frames'])} driver frames"}
    lines.append(f"  reference check of {' and '.join(over[d] for d in c['checked'])}, tolerance {c['tolerance']:g}: {'PASSED' if c['passed'] else 'FAILED'}")
    lines += [f"    {name:24s} max {h['max']:.3g} (frame {h['peak_frame']}), mean {h['mean']:.3g}" for name, h in worst]
    lines += [f"    field {p}: max {f['max']:.3g} (frame {f['peak_frame']})" for p, f in list(c["fields_past_tolerance"].items())[:10]]
    lines += [f"  NOT CHECKED: {daemon}'s outputs ({why})" for daemon, why in c["unchecked"].items()]
  lines += [f"  wrote {p}" for p in result.files]
  return "\n".join(lines)
