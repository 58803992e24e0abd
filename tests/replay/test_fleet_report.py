"""The fleet report (fleet_report) over records written out here: per head the max and the frame-weighted mean over segments, the
segments where it peaks, statuses, the summary line and the exit code."""
import json

import pytest

from sunnypilot.modeld_v2.replay.fleet_report import FleetReport, error_record

def checked_record(segment: str, frames: int, heads: dict[str, tuple[float, float, int]], tolerance: float = 1e-3) -> dict:
  """A record as a replay with a check writes it: heads {name: (max, mean, peak frame)}."""
  check = {"frames": frames, "tolerance": tolerance, "heads": {n: {"max": m, "mean": a, "peak_frame": f} for n, (m, a, f) in heads.items()},
           "fields_past_tolerance": {}, "passed": all(m <= tolerance for m, _, _ in heads.values())}
  return {"segment": segment, "status": "passed" if check["passed"] else "failed", "reason": None if check["passed"] else "past", "sent": frames,
          "published": frames, "seconds": frames / 20, "check": check, "files": []}

def test_the_fleet_report_over_records(tmp_path, caplog):
  """Per head the max over segments and the mean per frame over all of them (a segment's mean weighted by its frames), the segments where it
  peaks, worst first; statuses, frames; exit 2 with an error, 1 with a failure only, 0 when all passed."""
  records = [checked_record("a--0", 100, {"plan": (2e-4, 1e-5, 130), "lead": (1e-6, 1e-7, 101)}),
             checked_record("a--1", 300, {"plan": (5e-3, 3e-5, 250), "lead": (0.0, 0.0, 100)}),
             checked_record("a--2", 200, {"plan": (1e-4, 2e-5, 120), "lead": (3e-6, 2e-7, 110)}),
             error_record("a--3", "frames and log out of step"), checked_record("a--4", 50, {"plan": (0.0, 0.0, 100), "lead": (0.0, 0.0, 100)})]
  report = FleetReport([r["segment"] for r in records] + ["a--5"], str(tmp_path / "out"), "test")
  with caplog.at_level("INFO"):
    for r in records: report.add(r)
  assert "5/6 segments done" in caplog.text and "ETA" in caplog.text and "a--3 error: frames and log out of step" in caplog.text
  line = report.write(interrupted=True)
  got = json.loads((tmp_path / "out" / "fleet.json").read_text())
  assert got["heads"]["plan"]["max"] == 5e-3 and got["heads"]["lead"]["max"] == 3e-6
  assert got["heads"]["plan"]["mean"] == pytest.approx((1e-5 * 100 + 3e-5 * 300 + 2e-5 * 200) / 650)
  assert [p["segment"] for p in got["heads"]["plan"]["peak_segments"]] == ["a--1", "a--0", "a--2"]
  assert got["heads"]["plan"]["peak_segments"][0]["peak_frame"] == 250
  assert (got["passed"], got["failed"], got["error"], got["done"], got["not_done"], got["frames"]) == (3, 1, 1, 5, ["a--5"], 650)
  assert [s["max"] for s in got["per_segment"]] == [2e-4, 5e-3, 1e-4, None, 0.0] and got["interrupted"]
  assert line.startswith("fleet (test): 5/6 segments (interrupted): 3 passed, 1 failed, 1 errors; 650 frames") and "worst head plan 0.005 (a--1)" in line
  assert (tmp_path / "out" / "fleet.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  assert report.exit_code() == 2
  del report.records["a--3"]
  assert report.exit_code() == 1
  del report.records["a--1"]
  assert report.exit_code() == 0
