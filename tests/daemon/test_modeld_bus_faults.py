"""modeld against bad input on the bus: broken numbers (speed, torque, calibration, delays, the camera offset), broken messages, the host
inputs it writes. Each test reproduces a failure seen before the fix."""
import dataclasses
import subprocess
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs, check_camera_offset
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY

import modeld_daemon
from conftest import ROOT
from modeld_daemon import SOF0, Daemon, finite_and_valid, frames_for, reference

artifacts, split_09 = modeld_daemon.artifacts, modeld_daemon.split_09  # the daemon tests' fixtures, by name

def test_nan_speed_once_is_replaced_by_the_last_good(split_09, openpilot_prefix):
  """One carState with vEgo = NaN used to turn every output of a split_09 model NaN, valid, until a restart."""
  daemon = Daemon(split_09)
  for frame_id in range(40):
    daemon.send(frame_id, float("nan") if frame_id == 25 else 20.0)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(finite_and_valid(daemon, i) for i in range(21, 40)), "finite and valid throughout (calibration from frame 20 on)"
  assert [daemon.raw(i) for i in range(40)] == reference(split_09, list(range(40))), "the NaN frame ran on the last good speed, 20 m/s"
  assert sum("carState.vEgo = nan refused" in line for line in daemon.lines) == 1, daemon.lines

class SM(SimpleNamespace):
  """A SubMaster stand-in holding real cereal readers."""
  def __getitem__(self, service): return self.data[service]

def sm_with(**messages) -> SM:
  """{service: {field: value}} -> an SM that has seen each message."""
  from sunnypilot.modeld_v2.daemon.messaging import new_message
  data = {}
  for service, fields in messages.items():
    msg = new_message(service)
    for name, value in fields.items(): setattr(getattr(msg, service), name, value)
    data[service] = getattr(msg.as_reader(), service)
  return SM(seen=dict.fromkeys(data, True), updated=dict.fromkeys(data, True), data=data)

@pytest.mark.parametrize("rpy", [[float("nan"), 0, 0], [0, float("inf"), 0], [0, 1e30, 0], [0, 0.5, 0], [0.0, 0.01]])
def test_calibration_out_of_range_is_refused(rpy):
  lines = []
  bus = BusInputs(Episodes(lines.append))
  assert bus.calibration(sm_with(liveCalibration={"rpyCalib": [0.01, 0.02, 0.03]})) == pytest.approx((0.01, 0.02, 0.03))
  for _ in range(3): assert bus.calibration(sm_with(liveCalibration={"rpyCalib": rpy})) == pytest.approx((0.01, 0.02, 0.03)), "the last good one"
  assert bus.calibration(sm_with(liveCalibration={"rpyCalib": [0.0, 0.1, -0.05]})) == pytest.approx((0.0, 0.1, -0.05))
  assert len(lines) == 2 and "refused" in lines[0] and "(3 times)" in lines[1], lines
  assert BusInputs(Episodes(lines.append)).calibration(sm_with(liveCalibration={"rpyCalib": rpy})) == DEFAULT_RPY, "before a good one: the default"

@pytest.mark.parametrize("height", [float("nan"), float("-inf"), 1e30, 0.0, -1.22, 3.5])
def test_camera_height_out_of_range_is_refused(height):
  """The CameraOffset shear divides by liveCalibration.height: a NaN or zero height would reach the warp."""
  lines = []
  bus = BusInputs(Episodes(lines.append))
  assert bus.camera_height(sm_with(liveCalibration={"height": []})) == 1.22, "before a height: sunnypilot's assumed 1.22 m"
  assert bus.camera_height(sm_with(liveCalibration={"height": [1.4]})) == pytest.approx(1.4)
  assert bus.camera_height(sm_with(liveCalibration={"height": [height]})) == pytest.approx(1.4), "the last good one"
  assert len(lines) == 1 and "liveCalibration.height" in lines[0] and "refused" in lines[0], lines

def calibration_cut_before_its_lists() -> bytes:
  """A liveCalibration whose segment ends where its rpyCalib list starts: the root and the struct are whole, so a SubMaster takes it, and
  capnp raises only when a list is read (its pointer leads past the end). Wire format: capnproto.org/encoding (segment table, then words)."""
  import struct

  from sunnypilot.modeld_v2.daemon.messaging import new_message
  msg = new_message("liveCalibration")
  msg.liveCalibration.rpyCalib, msg.liveCalibration.height = [0.0123, 0.0456, 0.0789], [1.25]
  raw = bytearray(msg.to_bytes())
  words = (raw.find(struct.pack("<f", 0.0123)) - 8) // 8  # the list's first word, counted from the segment's start
  assert int.from_bytes(raw[:4], "little") == 0 and words > 0, "one segment, the list after the structs"
  return bytes(raw[:4] + words.to_bytes(4, "little") + raw[8:8 + 8 * words])

def test_an_unreadable_calibration_list_keeps_the_last_good_values():
  """SubMaster keeps a message's reader, so a list that lies outside the message's bytes raises (capnp.KjException) only when BusInputs
  reads it: the frame loop would stop. The last good calibration and height stay, once logged, until a readable message comes."""
  from sunnypilot.modeld_v2.daemon.messaging import log
  with log.Event.from_bytes(calibration_cut_before_its_lists()) as event:
    cut = SM(seen={"liveCalibration": True}, data={"liveCalibration": event.liveCalibration})
  lines = []
  bus = BusInputs(Episodes(lines.append))
  good = sm_with(liveCalibration={"rpyCalib": [0.01, 0.02, 0.03], "height": [1.4]})
  assert bus.calibration(good) == pytest.approx((0.01, 0.02, 0.03)) and bus.camera_height(good) == pytest.approx(1.4)
  for _ in range(3): assert bus.calibration(cut) == pytest.approx((0.01, 0.02, 0.03)) and bus.camera_height(cut) == pytest.approx(1.4)
  assert bus.calibration(good) == pytest.approx((0.01, 0.02, 0.03)) and bus.camera_height(good) == pytest.approx(1.4)
  assert [line.split(" (")[0] for line in lines] == ["liveCalibration.rpyCalib unreadable", "liveCalibration.height unreadable",
                                                     "liveCalibration.rpyCalib readable again after unreadable messages",
                                                     "liveCalibration.height readable again after unreadable messages"], lines

def test_modeld_keeps_running_through_an_unreadable_calibration(split_09, openpilot_prefix):
  """The same message on the bus: modeld used to abort in the SubMaster's copy of it (a C++ exception pycapnp does not translate)."""
  daemon = Daemon(split_09)
  daemon.exchange(range(10))
  for frame_id in range(10, 13):
    daemon.replay.pm.send("liveCalibration", calibration_cut_before_its_lists())
    daemon.exchange([frame_id])
  daemon.exchange(range(13, 25))  # FakeCamerad publishes a good calibration again at frame 20
  assert daemon.stop() == 0 and daemon.published == list(range(25))
  assert [daemon.raw(i) for i in range(25)] == reference(split_09, list(range(25))), "the last good calibration throughout"
  lines = "".join(daemon.lines)
  assert lines.count("liveCalibration.rpyCalib unreadable") == 1 and "rpyCalib readable again after unreadable messages" in lines, lines

@pytest.mark.parametrize("offset", [float("nan"), float("inf"), 1.5, -2.0])
def test_camera_offset_out_of_range_is_refused(offset, tmp_path):
  """The flag at parse time, the parameter (read every 60 frames on a device) by the same rule: the last good value stays."""
  from sunnypilot.modeld_v2.daemon.device_params import camera_offset
  with pytest.raises(ValueError, match="camera offset"): check_camera_offset(offset)
  assert camera_offset(SimpleNamespace(get=lambda key, return_default=True: str(offset).encode()), 0.25) == 0.25
  assert camera_offset(SimpleNamespace(get=lambda key, return_default=True: b"-0.3"), 0.25) == pytest.approx(-0.3)
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(tmp_path), "--camera-offset", str(offset)],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "Traceback" not in out.stderr and "argument --camera-offset: " in out.stderr.strip().splitlines()[-1], out.stderr

def test_broken_car_params_delays_fall_back_to_a_typical_car(tmp_path):
  """A NaN or negative actuator delay in CarParams would reach action_t (a divisor): modeld takes a typical car's and says so."""
  from openpilot_logging.cereal import car

  from sunnypilot.modeld_v2.daemon.device_params import read_car_params
  for steer, long, good in [(0.17, 0.33, True), (float("nan"), 0.33, False), (0.17, -0.5, False), (9.0, 0.1, False)]:
    blob = car.CarParams.new_message(steerActuatorDelay=steer, longitudinalActuatorDelay=long).to_bytes()
    delays = read_car_params(SimpleNamespace(get=lambda key, blob=blob: blob, failed=set()), car, threading.Event(), lambda line: None)
    if good: assert (delays.lateral, delays.longitudinal, delays.source) == (pytest.approx(0.37), pytest.approx(0.33), "CarParams")
    else: assert (delays.lateral, delays.longitudinal) == (pytest.approx(0.32), 0.15) and "refused" in delays.source, delays

@pytest.mark.parametrize("v_ego", [float("nan"), float("inf"), -1e30, 1e30, 101.0])
def test_speed_out_of_range_is_refused(v_ego):
  bus = BusInputs(Episodes(lambda line: None))
  assert bus.car_state(sm_with(carState={"vEgo": 12.5, "leftBlinker": True})).vEgo == 12.5
  car = bus.car_state(sm_with(carState={"vEgo": v_ego, "rightBlinker": True}))
  assert (car.vEgo, car.leftBlinker, car.rightBlinker) == (12.5, False, True), "only the bad field keeps its last good value"

def test_steering_torque_and_lateral_delay_out_of_range_are_refused(monkeypatch):
  from sunnypilot.modeld_v2.daemon import bus_inputs, messaging
  from sunnypilot.modeld_v2.daemon.topics import TOPICS
  bus = BusInputs(Episodes(lambda line: None))
  assert bus.car_state(sm_with(carState={"vEgo": 3.0, "steeringTorque": 1.5})).steeringTorque == 1.5
  assert bus.car_state(sm_with(carState={"vEgo": 4.0, "steeringTorque": float("nan")})).steeringTorque == 1.5
  for module in (messaging, bus_inputs): monkeypatch.setattr(module, "TOPICS", dataclasses.replace(TOPICS, lateral_delay="liveDelay"))  # bundled: none
  delays = {"liveDelay": SimpleNamespace(lateralDelay=0.31)}
  sm = SM(seen={"liveDelay": True}, data=delays)
  assert bus.lateral_delay(sm, 0.2) == pytest.approx(0.31)
  for bad in (float("nan"), -0.375, 1e30):
    delays["liveDelay"].lateralDelay = bad
    assert bus.lateral_delay(sm, 0.2) == pytest.approx(0.31), f"{bad}: the last good estimate"
  assert BusInputs(Episodes(lambda line: None)).lateral_delay(sm, 0.2) == 0.2, "before a good estimate: the configured delay"

def test_episodes_log_one_line_at_the_start_and_the_count_at_the_end():
  lines = []
  episodes = Episodes(lines.append)
  for _ in range(15): episodes.happened("x", "x started")
  episodes.ended("x", "x ended")
  episodes.happened("x", "x started")
  episodes.ended("x", "x ended")
  assert lines == ["x started", "x ended (15 times)", "x started"], "a single occurrence needs no closing line"

def test_malformed_messages_are_dropped_counted_and_logged_once(split_09, openpilot_prefix):
  """Another event type on carState (capnp KjException), bytes that are not capnp (ValueError): modeld used to die on both."""
  from sunnypilot.modeld_v2.daemon.messaging import new_message
  daemon = Daemon(split_09)
  daemon.exchange(range(10))
  for frame_id, raw in ((10, new_message("roadCameraState").to_bytes()), (11, b"\x01\x02 not capnp"), (12, b"12345678" * 5)):
    daemon.car.send("carState", raw)
    daemon.replay.send(frame_id, *frames_for(frame_id), sof=SOF0 + frame_id * 50_000_000)
    daemon.receive(frame_id)
  daemon.exchange(range(13, 20))
  assert daemon.stop() == 0 and daemon.published == list(range(20))
  assert [daemon.raw(i) for i in range(20)] == reference(split_09, list(range(20))), "the dropped messages left the last good speed in place"
  lines = "".join(daemon.lines)
  assert lines.count("carState: dropped a malformed message (an Event of type roadCameraState)") == 1, lines
  assert "carState: good messages again after dropping malformed ones (3 times)" in lines, lines

@pytest.mark.xfail(strict=True, reason="msgq's receive asserts size > 0 (msgq_msg_recv) and aborts the subscriber before Python sees the message")
def test_zero_length_message(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  try:
    daemon.exchange(range(5))
    daemon.car.send("carState", b"")
    daemon.exchange(range(5, 10))
  finally: code = daemon.stop()  # the camera server goes either way
  assert code == 0

def test_refused_calibrations_never_make_the_frame_calibrated():
  """Every liveCalibration refused from the first (rpyCalib of 2 values, or NaN): modelV2 was valid=True while the warp ran on the default
  calibration. A refused calibration is not one: the frame stays uncalibrated, so every message is invalid, until one is accepted."""
  from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR
  from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
  from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs
  from sunnypilot.modeld_v2.model.fill_model_msg import FrameInfo
  inputs, state = FrameInputs(BusInputs(Episodes(lambda line: None))), DrivingState()
  inputs.use_cameras("os04c10", main_wide=False)
  def frame(rpy) -> FrameInfo:
    fed = inputs.step(sm_with(liveCalibration={"rpyCalib": rpy}), TYPICAL_CAR, state)
    return FrameInfo(1, 1, 0, 1, 0.0, 0, 0.0, fed.calibrated, fed.lat_t, fed.long_t)
  for rpy in ([0.0, 0.01], [float("nan"), 0.0, 0.0], [0.0, 0.01, 0.0, 0.0]):
    assert not any(frame(rpy).valid.values()), rpy
  assert all(frame([0.0, 0.02, 0.01]).valid.values()), "an accepted calibration makes the frame valid"
  assert all(frame([0.0, 0.01]).valid.values()), "a refused one after it keeps the last good calibration"

def test_host_inputs_are_written_in_place_and_the_unfed_ones_said_once():
  """A model input modeld has no value for, or whose size differs from modeld's, stays zero with one line (navigation inputs silently:
  openpilot left them at zero); the others are written into the model's own buffers, frame after frame; a view a flat write would miss
  is refused when the model loads."""
  from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
  lines: list[str] = []
  views = {"desire": np.zeros((1, 8), np.float32), "traffic_convention": np.zeros((1, 3), np.float32), "mystery": np.zeros(2, np.float32),
           "nav_features": np.zeros(4, np.float32), "img_tfm": np.zeros((2, 3, 3), np.float32)}
  host = HostInputs(views, lines.append)
  for k in range(3):
    host.write({"desire": np.arange(8, dtype=np.float32) + k, "traffic_convention": [1, 0], "img_tfm": np.full((2, 3, 3), k, np.float32)})
    assert views["desire"].tolist() == [list(range(k, k + 8))] and (views["img_tfm"] == k).all()
  assert not views["traffic_convention"].any() and not views["mystery"].any() and not views["nav_features"].any()
  assert lines == ["host input traffic_convention (3 values) does not take modeld's 2: it stays zero",
                   "host input mystery (2 values) has no source here: it stays zero"]
  with pytest.raises(ArtifactError, match="desire is not contiguous"): HostInputs({"desire": np.zeros((8, 2), np.float32).T}, lines.append)
