"""One report for many replayed segments, whichever executor ran them (route_replay --jobs N: local processes; --ray: Ray tasks).

Each segment's replay (route_replay FOLDER --result FILE) writes one record: its status (passed, failed: past the tolerance, replayed: no
reference given, error: it could not be replayed, lost: the replay or its modeld was killed), the reason in one line, and its Result
(frames sent and published, seconds, the check). FleetReport takes the records as segments finish, says done / total with an ETA, and
at the end writes OUT/fleet.json (per output head the max and mean absolute difference over all segments and the segments where it
peaks; per segment its status and reason; frames and frames per second in total), OUT/fleet.png (a histogram of the per-segment max
differences, the worst segments named) and one summary line.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import textwrap
import time
from typing import Any

FLEET_JSON, FLEET_PNG = "fleet.json", "fleet.png"
PEAKS, WORST_NAMED = 3, 8  # segments listed per head where it peaks; segments named on the picture
TIMES = ("wall_s", "started", "ended", "task_started", "task_ended")  # the replay process's (and Ray task's) times, seconds since the epoch

log = logging.getLogger(__name__)

# *** one segment's record ***

def result_record(result: Any) -> dict:
  """A finished replay's record (segment_report.Result): passed or failed by its check, or replayed when there was no reference."""
  record = dataclasses.asdict(result) | {"status": "replayed", "reason": None}
  if (check := result.check) is not None:
    record["status"], record["reason"] = ("passed", None) if check["passed"] else ("failed", past_tolerance(check))
    if unchecked := check.get("unchecked"):  # a daemon that ran unchecked: said beside the verdict
      record["reason"] = "; ".join([*filter(None, [record["reason"]]), *(f"{daemon} not checked ({why})" for daemon, why in unchecked.items())])
  return record

def past_tolerance(check: dict) -> str:
  """The worst head or published field past the check's tolerance, in one line."""
  name, head = max(check["heads"].items(), key=lambda kv: kv[1]["max"], default=("", {"max": 0.0}))
  if head["max"] > check["tolerance"]: worst = f"head {name} max {head['max']:.3g} (frame {head['peak_frame']})"
  else:
    path, f = max(check["fields_past_tolerance"].items(), key=lambda kv: kv[1]["max"])
    worst = f"field {path} max {f['max']:.3g} (frame {f['peak_frame']})"
  return f"{worst} past the tolerance {check['tolerance']:g}"

def error_record(segment: str, reason: str, lost: bool = False) -> dict:
  """A segment that could not be replayed (`lost`: its replay or modeld was killed, which a retry may get past)."""
  return {"segment": segment, "status": "lost" if lost else "error", "reason": reason, "sent": 0, "published": 0, "seconds": 0.0, "check": None,
          "files": []}

def write_record(path: str, record: dict) -> None:
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  with replaced_atomically(path) as (tmp,), open(tmp, "w") as f: json.dump(record, f)

def read_record(path: str) -> dict | None:
  """The record a replay wrote, or None when it wrote none (killed before its end)."""
  try:
    with open(path) as f: return json.load(f)
  except (OSError, ValueError): return None

# *** the fleet ***

def segment_max(record: dict) -> float | None:
  """The largest head difference of a checked segment (None without a check)."""
  return max((h["max"] for h in record["check"]["heads"].values()), default=0.0) if record.get("check") else None

def duration(seconds: float) -> str:
  seconds = round(seconds)
  return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"

class FleetReport:
  """The records of a fleet run as they come in (`add`), a progress line for each, and the report at the end (`write`)."""
  def __init__(self, segments: list[str], out: str, executor: str):
    self.segments, self.out, self.executor = segments, out, executor
    self.records: dict[str, dict] = {}
    self.t0 = time.monotonic()

  def add(self, record: dict) -> None:
    self.records[record["segment"]] = record
    done, total, elapsed = len(self.records), len(self.segments), time.monotonic() - self.t0
    counts = self.counts()
    eta = f", ETA {duration(elapsed / done * (total - done))}" if done < total else ""
    log.info(f"{done}/{total} segments done in {duration(elapsed)}{eta} ({counts['passed']} passed, {counts['failed']} failed, "
             f"{counts['error']} errors): {record['segment']} {record['status']}" + (f": {record['reason']}" if record["reason"] else ""))

  def counts(self) -> dict[str, int]:
    statuses = [r["status"] for r in self.records.values()]
    return {s: statuses.count(s) for s in ("passed", "failed", "replayed", "error")}

  def exit_code(self) -> int:
    """2 when a segment could not be replayed, else 1 when one is past its tolerance, else 0."""
    counts = self.counts()
    return 2 if counts["error"] else 1 if counts["failed"] else 0

  def report(self, interrupted: bool = False) -> dict:
    seconds = time.monotonic() - self.t0
    records = [self.records[s] for s in self.segments if s in self.records]
    checked = [r for r in records if r.get("check")]
    heads: dict[str, dict] = {}
    for name in dict.fromkeys(n for r in checked for n in r["check"]["heads"]):
      having = [r for r in checked if name in r["check"]["heads"]]
      frames = sum(r["check"]["frames"] for r in having)
      peaks = sorted(having, key=lambda r: -r["check"]["heads"][name]["max"])[:PEAKS]
      heads[name] = {"max": max(r["check"]["heads"][name]["max"] for r in having),
                     "mean": sum(r["check"]["heads"][name]["mean"] * r["check"]["frames"] for r in having) / max(frames, 1),  # per frame, over all
                     "peak_segments": [{"segment": r["segment"], "max": r["check"]["heads"][name]["max"],
                                        "peak_frame": r["check"]["heads"][name]["peak_frame"]} for r in peaks]}
    frames = sum(r["sent"] for r in records)
    return {"executor": self.executor, "segments": len(self.segments), "done": len(records), "interrupted": interrupted,
            "not_done": [s for s in self.segments if s not in self.records], **self.counts(),
            "tolerance": next((r["check"]["tolerance"] for r in checked), None), "frames": frames, "seconds": seconds,
            "frames_per_s": frames / seconds if seconds else 0.0, "heads": heads,
            "per_segment": [{"segment": r["segment"], "status": r["status"], "reason": r["reason"], "frames": r["sent"], "seconds": r["seconds"],
                             "max": segment_max(r), "attempts": r.get("attempts", 1), "node": r.get("node")} | {k: r.get(k) for k in TIMES} for r in records]}

  def write(self, interrupted: bool = False) -> str:
    """fleet.json and fleet.png in OUT (each written whole or not at all); returns the summary line."""
    from sunnypilot.modeld_v2.common.files import replaced_atomically
    report = self.report(interrupted)
    os.makedirs(self.out, exist_ok=True)
    with replaced_atomically(path := os.path.join(self.out, FLEET_JSON)) as (tmp,), open(tmp, "w") as f: json.dump(report, f, indent=1)
    draw(picture := os.path.join(self.out, FLEET_PNG), report)
    return summary(report) + f"; wrote {path}, {picture}"

def summary(report: dict) -> str:
  worst = max(report["heads"].items(), key=lambda kv: kv[1]["max"], default=None)
  return (f"fleet ({report['executor']}): {report['done']}/{report['segments']} segments"
          + (" (interrupted)" if report["interrupted"] else "")
          + f": {report['passed']} passed, {report['failed']} failed, {report['error']} errors"
          + (f", {report['replayed']} unchecked" if report["replayed"] else "")
          + f"; {report['frames']} frames in {duration(report['seconds'])} ({report['frames_per_s']:.1f} frames/s)"
          + (f"; worst head {worst[0]} {worst[1]['max']:.3g} ({worst[1]['peak_segments'][0]['segment']})" if worst else ""))

def draw(path: str, report: dict) -> None:
  """A histogram of the per-segment max differences (log scale; bit-exact segments in a bar of their own), the tolerance, and the worst
  segments named beside it."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  from sunnypilot.modeld_v2.common.files import replaced_atomically
  rows = [r for r in report["per_segment"] if r["max"] is not None]
  values = np.array([r["max"] for r in rows], np.float64)
  finite = values[np.isfinite(values) & (values > 0)]
  fig, (ax, side) = plt.subplots(1, 2, figsize=(12, 5), gridspec_kw={"width_ratios": [3, 2]})
  if len(finite):
    lo, hi = math.floor(np.log10(finite.min())), math.ceil(np.log10(finite.max())) + (finite.min() == finite.max())
    failed = np.array([r["status"] == "failed" for r in rows])[np.isfinite(values) & (values > 0)]  # a published field may fail it too
    ax.hist([finite[~failed], finite[failed]], bins=np.logspace(lo, hi, 4 * (hi - lo) + 1), stacked=True, color=["tab:blue", "tab:red"],
            label=["passed", "failed"])
    ax.set_xscale("log")
  if (exact := int((values == 0).sum())) or not len(finite):
    ax.text(0.02, 0.95, f"{exact} segment(s) bit-exact (0)", transform=ax.transAxes, va="top")
  if (infinite := int(np.isinf(values).sum())):
    ax.text(0.02, 0.88, f"{infinite} segment(s) with outputs missing or malformed (inf)", transform=ax.transAxes, va="top")
  if report["tolerance"] is not None and len(finite): ax.axvline(report["tolerance"], color="tab:red", ls="--", label=f"tolerance {report['tolerance']:g}")
  ax.set_xlabel("largest absolute difference of any output head, per segment")
  ax.set_ylabel("segments")
  if len(finite): ax.legend(loc="upper right")
  ax.set_title(f"{report['done']}/{report['segments']} segments: {report['passed']} passed, {report['failed']} failed, {report['error']} errors"
               + (" (interrupted)" if report["interrupted"] else ""))
  worst = sorted(rows, key=lambda r: -r["max"])[:WORST_NAMED]
  errors = [r for r in report["per_segment"] if r["status"] == "error"][:WORST_NAMED]
  lines = ["worst segments"] + [f"{r['max']:.3g}  {r['segment']}  {r['status']}" for r in worst]
  lines += ["", "could not be replayed"] + [f"{r['segment']}\n  {textwrap.shorten(r['reason'] or '', 70)}" for r in errors] if errors else []
  side.axis("off")
  side.text(0, 1, "\n".join(lines), va="top", family="monospace", fontsize=8)
  fig.tight_layout()
  with replaced_atomically(path) as (tmp,): fig.savefig(tmp, format="png", dpi=90)
  plt.close(fig)
