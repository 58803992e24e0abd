"""route_replay's lockstep against stalls of the serving side: route_replay itself stopped (SIGSTOP, then SIGCONT) at the worst moment, between
a frame's road and wide buffers, as a loaded machine or a debugger stops it. The outputs are checked against the bundle modeld runs (--against):
bit for bit, so a frame run twice or skipped (modeld's recurrent state moved) fails the check, not only a frame that never came."""
import json
import os
import signal
import subprocess

import pytest
from openpilot_logging.logreader import LogReader

from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
from sunnypilot.modeld_v2.replay.route_replay import main
from sunnypilot.modeld_v2.replay.synthetic_route import FIRST_ID, write_segment

FRAMES = 16
STALLED = (FIRST_ID + 3, FIRST_ID + 9)  # the frames after whose road buffer route_replay is stopped

@pytest.fixture(scope="module")
def route(tmp_path_factory) -> str:
  folder = tmp_path_factory.mktemp("lockstep") / "2026-12-03--06-00-00--0"
  write_segment(str(folder), (1344, 760), FRAMES, driver=False)
  return str(folder)

def stop_this_process(seconds: float) -> subprocess.Popen:
  """SIGSTOP this process; a shell SIGCONTs it `seconds` after the kernel shows it stopped. Returns the shell, to be waited for."""
  pid = os.getpid()
  waker = subprocess.Popen(["sh", "-c", f"until grep -q '^State:[[:space:]]*T' /proc/{pid}/status; do :; done; sleep {seconds}; kill -CONT {pid}"])
  os.kill(pid, signal.SIGSTOP)
  return waker

def test_a_stall_between_the_road_and_the_wide_frame_is_survived(route, native_artifacts, tmp_path, monkeypatch, capsys):
  """route_replay stopped for 150 ms after frames' road buffers went out and before their wide ones: modeld's camera sync took the road
  frame, gave up on the wide one after 100 ms, and lockstep waited 60 s for an answer that never came, then reported a good segment as
  an error ('modeld published nothing for frame N in 60 s'). Now every frame is published once, in order, bit for bit the bundle's."""
  send_frame, wakers, stalled = FakeCamerad.send_frame, [], set()
  def stalling(self, stream, data, frame_id, sof, eof):
    delivered = send_frame(self, stream, data, frame_id, sof, eof)
    if stream == VisionStreamType.ROAD and frame_id in STALLED and frame_id not in stalled:  # once per frame: not again if it is sent again
      stalled.add(frame_id)
      wakers.append(stop_this_process(0.15))
    return delivered
  monkeypatch.setattr(FakeCamerad, "send_frame", stalling)
  monkeypatch.setenv("OPENPILOT_PREFIX", "unused")  # main sets its own: restored after the test
  out = tmp_path / "out"
  code = main([route, "--artifacts", native_artifacts, "--against", os.path.join(native_artifacts, "model.bin"), "--no-pictures", "--out", str(out)])
  for waker in wakers: assert waker.wait(timeout=10) == 0
  stdout, err = capsys.readouterr()
  assert code == 0 and len(wakers) == len(STALLED), stdout + err
  segment = out / os.path.basename(route)
  ids = [e.modelV2.frameId for e in LogReader(str(segment / "modeld_rlog.zst")) if e.which() == "modelV2"]
  assert ids == list(range(FIRST_ID, FIRST_ID + FRAMES)), "every frame published once, in order"
  check = json.loads((segment / "check.json").read_text())
  assert check["passed"] and check["frames"] == FRAMES and all(h["max"] == 0 for h in check["heads"].values()), check
