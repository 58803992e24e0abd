"""watch: the lines it prints for messages published on a private bus (OPENPILOT_PREFIX), and its CLI's Ctrl-C and argument errors."""
import itertools
import os
import select
import signal
import subprocess
import sys

import pytest

from sunnypilot.modeld_v2.daemon import messaging
from sunnypilot.modeld_v2.tools import watch

from conftest import ROOT

def model_v2(frame_id: int, curvature: float, lead_prob: float) -> bytes:
  msg = messaging.new_message("modelV2", valid=frame_id % 2 == 0)
  m = msg.modelV2
  m.frameId, m.modelExecutionTime, m.action.desiredCurvature = frame_id, 0.0125, curvature
  m.position.x = [0.0, 12.5, 80.25]
  m.init("leadsV3", 3)[0].prob = lead_prob
  return msg.to_bytes()

def camera_odometry(frame_id: int) -> bytes:
  msg = messaging.new_message("cameraOdometry")
  msg.cameraOdometry.frameId, msg.cameraOdometry.trans, msg.cameraOdometry.rot = frame_id, [20.0, 0.25, -0.5], [0.0, 0.0, 0.0125]
  return msg.to_bytes()

def driving_model_data(frame_id: int) -> bytes:
  msg = messaging.new_message("drivingModelData")
  d = msg.drivingModelData
  d.frameId, d.modelExecutionTime, d.action.desiredCurvature = frame_id, 0.02, -0.002
  d.laneLineMeta.leftY, d.laneLineMeta.rightY, d.laneLineMeta.leftProb, d.laneLineMeta.rightProb = -1.75, 1.8, 0.9, 0.8
  d.path.yCoefficients = [0.125, 0.0, 0.0, 0.0, 0.0]
  return msg.to_bytes()

def test_a_line_per_service_per_window_with_its_rate_and_key_fields(openpilot_prefix):
  """Messages published on the bus before a window ends: the window's line has their count over the window's length as the rate, the last
  message's frame id, valid, modelExecutionTime and key fields; a message of another type on a topic is counted as malformed; a window
  with no messages says so, naming the last frame. The clock is a fake one: each reading is 0.5 s after the last."""
  pm = messaging.PubMaster(list(watch.SERVICES))  # first: a publisher's start invalidates readers connected before it (msgq), as modeld's would
  sub = watch.Subscriber(list(watch.SERVICES))
  for frame_id in (10, 11, 12): pm.send("modelV2", model_v2(frame_id, 0.0123 * (frame_id - 9), 0.75))
  for frame_id in (10, 11): pm.send("cameraOdometry", camera_odometry(frame_id))
  pm.send("drivingModelData", messaging.new_message("roadCameraState").to_bytes())
  lines, ticks = [], itertools.count(0.0, 0.5)
  watch.watch(sub, seconds=3.0, print_line=lines.append, clock=lambda: next(ticks))
  # readings: start 0; loop check 0.5, receive 1.0, now 1.5 >= end 1: the first window is 1.5 s long
  first = [line for line in lines if line.lstrip().startswith("2s")]
  assert len(first) == 3, lines
  m, d, o = first
  assert "modelV2" in m and f"{3 / 1.5:5.1f} Hz" in m and "frame      12" in m and "valid 1" in m and "exec  12.50 ms" in m, m
  assert "curvature +0.03690" in m and "plan x 0.00..80.25 m" in m and "lead prob 0.75" in m, m
  assert "drivingModelData" in d and "nothing received yet" in d and "(1 malformed dropped)" in d, d
  assert "cameraOdometry" in o and f"{2 / 1.5:5.1f} Hz" in o and "frame      11" in o and "trans +20.00 +0.25 -0.50" in o and "exec" not in o, o
  later = [line for line in lines if not line.lstrip().startswith("2s")]
  assert later and all("0.0 Hz" in line for line in later), lines
  assert any("modelV2" in line and "nothing in the last" in line and "last frame 12" in line for line in later), lines

def test_driving_model_data_fields(openpilot_prefix):
  summary = watch.summarize("drivingModelData", driving_model_data(7))
  assert summary["frame"] == 7 and summary["ms"] == pytest.approx(20.0) and summary["valid"]
  assert "curvature -0.00200" in summary["fields"] and "lanes L -1.75 (0.90) R +1.80 (0.80)" in summary["fields"] and "path y0 +0.125" in summary["fields"]
  assert watch.summarize("modelV2", b"\x00" * 24) is None and watch.summarize("modelV2", camera_odometry(1)) is None

def test_cli_prints_lines_and_ctrl_c_is_130(openpilot_prefix):
  """The CLI on the private bus: once it says it is watching, a message published shows up in its next modelV2 line; SIGINT then ends it
  with one line and exit 130."""
  pm = messaging.PubMaster(["modelV2"])
  proc = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.tools.watch", "--services", "modelV2"], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONUNBUFFERED": "1"})
  try:
    assert "watching modelV2" in proc.stderr.readline()
    pm.send("modelV2", model_v2(42, 0.001, 0.5))
    line, seen = "", []
    while "frame" not in line:  # the line of the window the message landed in: the first or, at a window's edge, the next
      assert len(seen) < 3 and select.select([proc.stdout], [], [], 30)[0], f"no line with the message: {seen}"
      seen.append(line := proc.stdout.readline())
      assert line, "watch exited"
    assert "modelV2" in line and "frame      42" in line and "lead prob 0.50" in line, line
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert proc.stderr.read().strip().splitlines() == ["modeld_watch: interrupted"]
  finally:
    if proc.poll() is None: proc.kill()
    proc.wait()
    proc.stdout.close(), proc.stderr.close()

@pytest.mark.parametrize("argv,message", [(["--services", "modelV2,noSuchService"], "no such service in this cereal schema: noSuchService"),
                                          (["--services", ","], "expected comma-separated services"), (["--seconds", "0"], "got '0'"),
                                          (["--seconds", "nan"], "got 'nan'")])
def test_bad_arguments_are_one_line_and_exit_2(capsys, argv, message):
  with pytest.raises(SystemExit) as e: watch.main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
