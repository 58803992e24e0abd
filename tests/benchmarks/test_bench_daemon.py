"""bench_daemon's in-process publish split beside another commit's tree (--baseline): that tree's modules run, this checkout's come back
afterwards, and a baseline that publishes different bytes is reported as such."""
import shutil
import sys
from pathlib import Path

import pytest

from benchmarks.bench_daemon import arg_parser, checked_args
from benchmarks.publish_path import baseline_modules, publish_split, stand_in_layout
from sunnypilot.modeld_v2.model import fill_model_msg

def test_a_baseline_tree_runs_beside_this_one_and_its_bytes_are_compared(tmp_path):
  ours = fill_model_msg
  source = Path(ours.__file__).parents[3] / "sunnypilot"
  for name in ("same", "changed"): shutil.copytree(source, tmp_path / name / "sunnypilot", ignore=shutil.ignore_patterns("__pycache__"))
  fill = tmp_path / "changed" / "sunnypilot" / "modeld_v2" / "model" / "fill_model_msg.py"
  text = fill.read_text()
  assert text.count('f["frameDropPerc"] = frame.frame_drop_perc') == 2
  fill.write_text(text.replace('f["frameDropPerc"] = frame.frame_drop_perc', 'f["frameDropPerc"] = frame.frame_drop_perc + 1.0'))  # published values differ
  for name, same in (("same", True), ("changed", False)):
    baseline = baseline_modules(str(tmp_path / name))
    assert baseline["fill_model_msg"] is not ours and baseline["fill_model_msg"].__file__.startswith(str(tmp_path / name))
    split = publish_split(*stand_in_layout("split_current"), runs=2, baseline=baseline)
    assert split["same bytes"] is same and split["baseline fill"]["n"] == split["fill"]["n"] == 2
  assert sys.modules["sunnypilot.modeld_v2.model.fill_model_msg"] is ours and all(
    not getattr(m, "__file__", None) or not m.__file__.startswith(str(tmp_path)) for k, m in sys.modules.items() if k.split(".")[0] == "sunnypilot")

def test_the_stubbed_loop_runs_modelds_frame_loop_and_leaves_nothing_behind(monkeypatch):
  """--stub-loop: ModelD.run publishes every stubbed frame, in order, its stamps in STAGE_STAMPS order; afterwards, or after a failure,
  the collector is as it was, OPENPILOT_PREFIX is what it was and the private bus is gone."""
  import gc
  import os

  from benchmarks.stubbed_loop import run_stubbed
  from sunnypilot.modeld_v2.daemon.status import STAGE_STAMPS
  monkeypatch.setenv("OPENPILOT_PREFIX", "bench_stub_test_outer")
  before = set(os.listdir("/dev/shm"))
  for parse in ("host", "graph"):
    rows = run_stubbed(*stand_in_layout("split_current"), "split_current", frames=5, idle_s=0.001, parse=parse)
    assert [row[0] for row in rows] == [1, 2, 3, 4, 5] and all(len(row) == 1 + len(STAGE_STAMPS) for row in rows)
    assert all(row[1:] == sorted(row[1:]) for row in rows), "stamps in the loop's order"
  assert gc.isenabled() and os.environ["OPENPILOT_PREFIX"] == "bench_stub_test_outer" and set(os.listdir("/dev/shm")) <= before
  gc.disable()
  try:
    with pytest.raises(ValueError): run_stubbed(stand_in_layout("split_current")[0], -1, "split_current", frames=5, idle_s=0.0)  # no such width
    assert not gc.isenabled() and os.environ["OPENPILOT_PREFIX"] == "bench_stub_test_outer" and set(os.listdir("/dev/shm")) <= before
  finally: gc.enable()

def test_the_options_each_mode_takes():
  """Every mode runs on its defaults (a stub-loop check once refused the daemon runs' defaults), and a combination a mode would ignore or
  cannot run is refused with a one-line error (exit 2)."""
  parser = arg_parser()
  for argv in ([], ["--publish-only"], ["--publish-layouts"], ["--stub-loop"], ["--stub-loop", "--stub-spin-ms", "0"]):
    args = parser.parse_args(argv)
    assert checked_args(parser, args) == ([0], [20.0, 100.0, 0.0], (1928, 1208)), argv
    assert args.publish_idle_ms == (50.0 if "--stub-loop" in argv else 0.0), argv
    assert args.parse == (["host", "graph"] if "--stub-loop" in argv else ["graph"]), argv
  for argv in (["--stub-loop", "--publish-layouts"], ["--stub-loop", "--publish-idle-ms", "0"], ["--stub-loop", "--stub-spin-ms", "60"],
               ["--baseline", "x"], ["--frames", "0"], ["--rates", "a"], ["--count-calls"], ["--parse", "gpu"], ["--stub-loop", "--parse", ""]):
    with pytest.raises(SystemExit) as e: checked_args(parser, parser.parse_args(argv))
    assert e.value.code == 2, argv

def test_dmonitoringmodeld_runs_end_to_end_only():
  """--daemon dmonitoringmodeld takes the daemon runs' options; the in-process modes (modeld's parse and publish path) and --parse are
  refused with one line (exit 2)."""
  parser = arg_parser()
  args = parser.parse_args(["--daemon", "dmonitoringmodeld", "--beams", "0,2", "--rates", "20,0"])
  assert checked_args(parser, args) == ([0, 2], [20.0, 0.0], (1928, 1208)) and args.daemon == "dmonitoringmodeld"
  for extra in (["--stub-loop"], ["--publish-layouts"], ["--publish-only"], ["--parse", "host"]):
    with pytest.raises(SystemExit) as e: checked_args(parser, parser.parse_args(["--daemon", "dmonitoringmodeld", *extra]))
    assert e.value.code == 2, extra
