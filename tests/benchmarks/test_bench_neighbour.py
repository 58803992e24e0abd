"""bench_neighbour's statistics, windows and verdict against values worked out by hand."""
from types import SimpleNamespace

import pytest

from benchmarks.bench_neighbour import BOUND, ratio_verdict, set_windows, stats, tick_stats

MS = 1_000_000

def test_stats_are_numpys_linear_percentiles():
  # 1..100: p50 halfway between 50 and 51; p99 at rank 0.99 * 99 = 98.01, a hundredth of the way from 99 to 100
  assert stats([float(v) for v in range(100, 0, -1)]) == {"p50": 50.5, "p99": pytest.approx(99.01), "max": 100.0, "n": 100}
  assert stats([]) == {"n": 0}

def test_tick_stats_take_the_ticks_scheduled_in_the_window():
  # (schedule, start, end): started 1, 2, 3, 4 ms late, ran 3, 3, 5, 9 ms; the last is scheduled at the window's end: out
  ticks = [(0, 1 * MS, 4 * MS), (50 * MS, 52 * MS, 55 * MS), (100 * MS, 103 * MS, 108 * MS), (150 * MS, 154 * MS, 163 * MS)]
  got = tick_stats(ticks, 0, 150 * MS)
  assert got["tick_ms"]["n"] == 3 and got["tick_ms"]["p50"] == 3.0 and got["tick_ms"]["max"] == 5.0
  assert got["late_ms"]["p50"] == 2.0 and got["late_ms"]["max"] == 3.0
  assert got["done_ms"]["max"] == 8.0 and got["done_ms"]["p99"] == pytest.approx(5.0 + 0.98 * 3.0)  # rank 1.98 between 5 and 8

def test_the_verdict_is_the_p99_ratio_against_one_and_a_half():
  assert BOUND == 1.5
  assert ratio_verdict(2.0, 3.0) == (1.5, "met")
  ratio, word = ratio_verdict(2.0, 3.02)
  assert ratio == pytest.approx(1.51) and word == "not met"
  assert ratio_verdict(4.0, 2.0) == (0.5, "met")
  assert ratio_verdict(0.0, 1.0) == (float("inf"), "not met")

def test_an_alone_run_is_measured_over_its_loaded_partners_load_span():
  args = SimpleNamespace(seconds=15.0, start_at=2.0)
  s = 1_000_000_000
  runs: list[dict] = [{"loaded": False, "t0": 10 * s, "spawn": None, "running": None},
          {"loaded": True, "t0": 40 * s, "spawn": 42 * s + 5 * MS, "running": 46 * s + 5 * MS},  # loaded 4 s after modeld started
          {"loaded": False, "t0": 70 * s, "spawn": None, "running": None},
          {"loaded": True, "t0": 100 * s, "spawn": 102 * s, "running": None}]  # never running: the window runs to the run's end (115 s)
  set_windows(runs, args)
  assert runs[0]["window_ns"] == (12 * s, 16 * s) and runs[1]["window_ns"] == (42 * s + 5 * MS, 46 * s + 5 * MS)
  assert runs[2]["window_ns"] == (72 * s, 85 * s) and runs[3]["window_ns"] == (102 * s, 115 * s)
