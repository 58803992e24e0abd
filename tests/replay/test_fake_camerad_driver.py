"""fake_camerad's driver stream: the cabin scene over VisionIPC (VISION_STREAM_DRIVER) with driverCameraState, its own frame counter; and
one fake_camerad per bus (a newcomer runs the README's block twice)."""
import subprocess
import sys
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.replay.cabin_scene import cabin_scene

from conftest import ROOT

FRAME = camerad_frame(1344, 760)

def connect(stream: int, proc: subprocess.Popen | None = None, timeout: float = 60):
  from msgq.visionipc import VisionIpcClient
  client, deadline = VisionIpcClient("camerad", stream, False), time.monotonic() + timeout
  while not client.connect(False):
    assert time.monotonic() < deadline and (proc is None or proc.poll() is None), "no VisionIPC server"
    time.sleep(0.01)
  return client

def test_send_driver_in_process(openpilot_prefix):
  """The frame's bytes, id and timestamps over VisionIPC, and driverCameraState with the same id, timestamps and the sensor."""
  from sunnypilot.modeld_v2.daemon.messaging import sub_master
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
  replay = FakeCamerad(FRAME, driver=True)
  try:
    client, sm = connect(VisionStreamType.DRIVER), sub_master(["driverCameraState", "roadCameraState"])
    assert client.width == FRAME.width and client.height == FRAME.height and client.stride == FRAME.stride and client.uv_offset == FRAME.uv_offset
    buf = cabin_scene(FRAME, 11)
    replay.send_driver(11, buf, sof=5_000, eof=7_000)
    got = client.recv(3000)
    assert got is not None and client.frame_id == 11 and client.timestamp_sof == 5_000 and client.timestamp_eof == 7_000
    np.testing.assert_array_equal(np.array(got.data[:FRAME.size]), buf)
    deadline = time.monotonic() + 5
    while not sm.updated["driverCameraState"]:
      assert time.monotonic() < deadline, "no driverCameraState"
      sm.update(20)
    state = sm["driverCameraState"]
    assert (state.frameId, state.timestampSof, state.timestampEof, str(state.sensor)) == (11, 5_000, 7_000, "os04c10")
    assert not sm.updated["roadCameraState"], "a driver frame is not a road frame"
  finally:
    replay.close()

def test_no_driver_stream_unless_asked(openpilot_prefix):
  from msgq.visionipc import VisionIpcClient

  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
  replay = FakeCamerad(FRAME)
  try:
    connect(VisionStreamType.ROAD)
    assert VisionStreamType.DRIVER not in set(VisionIpcClient.available_streams("camerad", False))
    with pytest.raises(ValueError, match="serves no driver stream"): replay.send_driver(0, cabin_scene(FRAME, 0))
  finally:
    replay.close()

def test_the_command_serves_the_cabin_beside_the_road(openpilot_prefix):
  """--driver: driver frames 0, 1, 2, ... are the cabin scene of their own ids; --skip drops road frames only."""
  proc = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.replay.fake_camerad", "--camera", "1344x760", "--driver", "--frames", "12",
                           "--skip", "3,4", "--start-delay", "2", "--no-wide"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
  try:
    driver, road = connect(VisionStreamType.DRIVER, proc), connect(VisionStreamType.ROAD, proc)
    got, road_ids = {}, []
    while len(got) < 12 and (buf := driver.recv(3000)) is not None:
      got[driver.frame_id] = np.array(buf.data[:FRAME.size])
      if road.recv(100) is not None: road_ids.append(road.frame_id)
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
  finally:
    if proc.poll() is None: proc.kill()
  assert sorted(got) == list(range(12))
  for frame_id, buf in got.items(): np.testing.assert_array_equal(buf, cabin_scene(FRAME, frame_id), err_msg=f"driver frame {frame_id}")
  assert not {3, 4} & set(road_ids) and len(road_ids) >= 5, road_ids

def test_driver_with_route_is_refused(capsys):
  from sunnypilot.modeld_v2.replay import fake_camerad
  with pytest.raises(SystemExit) as e: fake_camerad.main(["--route", "somewhere", "--driver"])
  assert e.value.code == 2 and "--driver serves a synthetic cabin" in capsys.readouterr().err

def test_a_second_fake_camerad_on_the_bus_exits_2_and_the_first_serves_on(openpilot_prefix):
  """The second one took the camera topics and killed the first with a 20-line MultiplePublishersError traceback."""
  command = [sys.executable, "-m", "sunnypilot.modeld_v2.replay.fake_camerad", "--camera", "1344x760", "--no-wide"]
  first = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE, text=True)
  try:
    road = connect(VisionStreamType.ROAD, first)
    assert road.recv(3000) is not None
    second = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert second.returncode == 2 and second.stderr == f"fake_camerad: error: another fake_camerad is already serving the bus " \
                                                       f"OPENPILOT_PREFIX={openpilot_prefix}\n", second.stderr
    ids = [road.frame_id for _ in range(5) if road.recv(3000) is not None]
    assert first.poll() is None and len(ids) == 5 and ids == sorted(ids), "the first serves on"
  finally:
    first.terminate()
    _, err = first.communicate(timeout=30)
  assert first.returncode == 0 and "Traceback" not in err, err
