"""modeld against bad input on the bus: broken numbers, broken messages, broken timestamps. Each test reproduces a failure seen before the fix."""
import dataclasses
import hashlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
import test_modeld
from test_modeld import BIG_FRAME, FRAME, SOF0, Daemon, frames_for, reference

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs, check_camera_offset
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY

from conftest import ROOT

artifacts, split_09 = test_modeld.artifacts, test_modeld.split_09  # the daemon tests' fixtures, by name
HOUR_NS = 3600 * 10**9

def finite_and_valid(daemon: Daemon, frame_id: int) -> bool:
  msgs = daemon.messages[frame_id]
  return all(valid for _, valid in msgs.values()) and bool(np.isfinite(np.frombuffer(daemon.raw(frame_id), np.float32)).all())

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

# the carState check switched off: a NaN speed reaches the model, and only the output check stands between it and the bus
UNCHECKED_SPEED = ("-c", "import sys; from sunnypilot.modeld_v2 import modeld; from sunnypilot.modeld_v2.daemon import bus_inputs; "
                   "bus_inputs.BusInputs.car_state = lambda self, sm: bus_inputs.CarInputs(float(sm['carState'].vEgo)); sys.exit(modeld.main())")

def test_non_finite_outputs_are_published_invalid_and_reset_the_states(split_09, openpilot_prefix):
  daemon = Daemon(split_09, command=UNCHECKED_SPEED)
  for frame_id in range(40):
    daemon.send(frame_id, float("nan") if frame_id == 25 else 20.0)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(not valid for _, valid in daemon.messages[25].values()), "the NaN run is published with valid=False on every service"
  assert all(finite_and_valid(daemon, i) for i in range(26, 40)), "the next frame is finite and valid again"
  assert [daemon.raw(i) for i in range(26, 40)] == reference(split_09, list(range(26, 40))), "from zeroed states, as a fresh start"
  assert sum("non-finite model outputs: recurrent states reset" in line for line in daemon.lines) == 1, daemon.lines

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

def send_pair(daemon: Daemon, frame_id: int, wide_ahead_ns: int = 0) -> None:
  """One road + wide frame straight through the VisionIPC server, the wide one's timestamps shifted by `wide_ahead_ns`."""
  from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
  road, wide = frames_for(frame_id)
  sof = SOF0 + frame_id * 50_000_000
  daemon.replay.server.send(VisionStreamType.ROAD, road.tobytes(), frame_id, sof, sof + 20_000_000)
  daemon.replay.server.send(VisionStreamType.WIDE_ROAD, wide.tobytes(), frame_id, sof + wide_ahead_ns, sof + wide_ahead_ns + 20_000_000)

class Camera:
  """camerad at 20 Hz in a thread: frame ids counting up from `first`, the wide timestamps `wide_ahead_ns` ahead (changeable)."""
  def __init__(self, daemon: Daemon, first: int, wide_ahead_ns: int):
    self.frame_id, self.wide_ahead_ns, self.stop = first, wide_ahead_ns, threading.Event()
    def serve():
      while not self.stop.wait(0.05):  # camerad's rate, not a wait for a condition
        send_pair(daemon, self.frame_id, self.wide_ahead_ns)
        self.frame_id += 1
    self.thread = threading.Thread(target=serve, daemon=True)
    self.thread.start()

  def close(self) -> None:
    self.stop.set()
    self.thread.join()

def published_after(daemon: Daemon, frame_id: int, timeout: float = 10) -> int:
  """Collect until modelV2 for a frame id after `frame_id` arrived; that id."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    daemon.collect()
    if later := [i for i in daemon.published if i > frame_id]: return later[0]
    assert daemon.proc.poll() is None, "".join(daemon.lines)
  raise AssertionError(f"nothing published after frame {frame_id}: {''.join(daemon.lines[-20:])}")

def test_wide_camera_an_hour_ahead_then_sigterm(artifacts, openpilot_prefix):
  """The frame sync used to skip road frames forever while the wide camera's timestamps were an hour ahead: nothing published, nothing
  said, SIGTERM ignored. Now it gives up after a second, says so once per episode, recovers, and SIGTERM ends it within a second."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(10))
  camera = Camera(daemon, 10, HOUR_NS)
  try:
    daemon.wait_for_line("frame sync:", timeout=10)
    camera.wide_ahead_ns = 0
    back = camera.frame_id
    recovered = published_after(daemon, back)
    assert daemon.messages[recovered]["modelV2"][0].frameIdExtra == recovered, "published again once the clocks agree, pairs in sync"
    camera.wide_ahead_ns = HOUR_NS
    daemon.wait_for_line("frame sync:", after=len(daemon.lines))
    t = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.proc.wait(timeout=10)
    elapsed = time.monotonic() - t
  finally:
    camera.close()
    daemon.replay.close()
  assert code == 0 and elapsed < 1.0, f"exit {code} after {elapsed:.2f} s"
  assert sum("frame sync: no extra frame" in line for line in daemon.lines) == 2, "one line per episode: " + "".join(daemon.lines)

def test_idle_camera_and_frame_id_jumps_log_once_per_episode(split_09, openpilot_prefix):
  """A camera up but idle logged 'reconnected' every 0.5 s; frames arriving with jumping ids logged a line each (a generation whose frames
  after a drop are prepare-only, the ones that say so)."""
  daemon = Daemon(split_09)
  daemon.exchange(range(5))
  time.sleep(2.6)  # the stimulus: camerad up, no frames for 2.6 s (5 reconnect periods)
  daemon.exchange(range(5, 10))
  pace = threading.Event()
  for frame_id in range(12, 42, 2):  # every id a jump, at camerad's rate
    send_pair(daemon, frame_id)
    pace.wait(0.05)
  daemon.exchange(range(41, 46))
  assert daemon.stop() == 0
  lines = "".join(daemon.lines)
  assert lines.count("reconnected to camerad") == 1 and re.search(r"frames again after reconnecting to camerad \((\d+) times\)", lines), lines
  jumps = re.search(r"frame ids jumped on consecutive frames \((\d+) times\)", lines)
  assert lines.count("dropped before it") == 1 and jumps and 2 <= int(jumps[1]) <= 15, lines

def test_reconnect_after_keeps_the_camera_through_a_pause(artifacts, openpilot_prefix):
  """--reconnect-after 30 (route_replay's lockstep: its frames pause while the reference catches up): camerad idle for 1.5 s, three
  times the default 0.5 s, is no re-attachment; the frame after the pause is published."""
  daemon = Daemon(artifacts, args=("--reconnect-after", "30"))
  daemon.exchange(range(5))
  time.sleep(1.5)  # the stimulus: camerad up, no frames
  daemon.exchange(range(5, 8))
  assert daemon.stop() == 0
  assert not any("reconnect" in line for line in daemon.lines), "".join(daemon.lines)

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

@pytest.mark.parametrize("flag,value", [("--lat-delay", "nan"), ("--lat-delay", "-inf"), ("--long-delay", "-0.375"), ("--long-delay", "6"),
                                        ("--lat-delay", "abc"), ("--max-frames", "0"), ("--max-frames", "-3"), ("--core", "100000"),
                                        ("--core", "seven"), ("--reconnect-after", "0"), ("--reconnect-after", "nan")])
def test_bad_arguments_are_refused_at_parse_time(flag, value, tmp_path):
  """--long-delay -0.375 made action_t zero: ZeroDivisionError on the first frame; NaN delays reached the model."""
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(tmp_path), flag, value], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "Traceback" not in out.stderr and f"error: argument {flag}: " in out.stderr.strip().splitlines()[-1], out.stderr

def wait_for_exit(daemon: Daemon, signum: int | None = None) -> tuple[int, list[str]]:
  """modeld's exit status (after `signum`, if given) and every line it wrote."""
  if signum is not None: daemon.proc.send_signal(signum)
  code = daemon.proc.wait(timeout=20)
  daemon.replay.close()
  deadline = time.monotonic() + 5  # the reader thread may still be taking the last line from the pipe
  while time.monotonic() < deadline and not any("exiting" in line for line in daemon.lines): time.sleep(0.01)
  return code, daemon.lines

def test_a_second_modeld_on_the_same_bus_is_refused(artifacts, openpilot_prefix):
  """msgq lets the newest publisher take a topic and kills the older one's next send: the running modeld died with a traceback."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
  assert out.returncode == 2 and out.stderr == f"modeld: error: another modeld is already running on the bus OPENPILOT_PREFIX={openpilot_prefix}\n"
  daemon.exchange(range(5, 10))
  assert daemon.stop() == 0, "the first one kept running"

def test_another_publisher_taking_over_ends_modeld_in_one_line(artifacts, openpilot_prefix):
  import msgq
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  intruder = msgq.pub_sock("modelV2")
  intruder.send(b"12345678")
  daemon.send(5)
  code, lines = wait_for_exit(daemon)
  del intruder
  assert code == 2 and "Traceback" not in "".join(lines) and "took over publishing modelV2" in lines[-1], lines

def test_ctrl_c_exits_130_without_a_traceback(artifacts, openpilot_prefix):
  daemon = Daemon(artifacts)
  daemon.exchange(range(3))
  code, lines = wait_for_exit(daemon, signal.SIGINT)
  assert code == 130 and "Traceback" not in "".join(lines) and lines[-1] == "modeld: exiting after 3 published frames\n", lines

def rewrite_header(src: str, dst: str, edit) -> None:
  """A copy of bundle `src` at `dst` with its JSON header text passed through `edit`, the hash recomputed: a crafted file that passes
  the integrity check."""
  from sunnypilot.modeld_v2.format.bundle import PREAMBLE
  data = open(src, "rb").read()
  magic, version, head_len, _ = PREAMBLE.unpack_from(data)
  body = data[PREAMBLE.size:]
  head = edit(body[:head_len].decode()).encode()
  new_body = head + body[head_len:]
  open(dst, "wb").write(PREAMBLE.pack(magic, version, len(head), hashlib.sha256(new_body).digest()) + new_body)

def crafted_warps(artifacts: str, folder) -> dict[str, str]:
  """{file name: what is wrong} for warps built from the good 1344x760 one; and the good one as warp_split.bin."""
  good = os.path.join(artifacts, "warp_split.bin")
  shutil.copy(good, folder / "warp_split.bin")
  edits = {
    "deep.bin": ("deeply nested JSON", lambda h: h.replace('"metadata":{', '"metadata":{"deep":' + "[" * 100_000 + "]" * 100_000 + ",", 1)),
    "huge.bin": ("a 5000-digit integer", lambda h: h.replace('"metadata":{', '"metadata":{"n":' + "9" * 5000 + ",", 1)),
    "frame_short.bin": ("a malformed frame", lambda h: h.replace('"frame":"1344,760,1408,768,384,2428928"', '"frame":"1344,760"')),
    "frame_number.bin": ("a frame that is not a string", lambda h: h.replace('"frame":"1344,760,1408,768,384,2428928"', '"frame":7')),
    "frame_inputs.bin": ("frame inputs of another size", lambda h: h.replace('[[2428928],"|u1"', '[[2428929],"|u1"')),
    "small.bin": ("made for a 256x128 model", lambda h: h.replace('"warped":[[2,6,128,256]', '"warped":[[2,6,64,128]')),
    "no_meta.bin": ("no metadata", lambda h: h.replace('"metadata":', '"other":', 1)),
  }
  for name, (_, edit) in edits.items():
    rewrite_header(good, str(folder / name), edit)
    assert open(folder / name, "rb").read() != open(good, "rb").read(), f"{name}: the edit changed nothing"
  os.mkfifo(folder / "fifo.bin")  # reading it would block for ever
  return {name: why for name, (why, _) in edits.items()} | {"fifo.bin": "a FIFO"}

def test_warp_discovery_skips_every_crafted_warp_in_one_line(artifacts, tmp_path):
  from sunnypilot.modeld_v2.daemon.artifacts import warp_bundles
  crafted = crafted_warps(artifacts, tmp_path)
  lines = []
  found = warp_bundles(str(tmp_path), report=lines.append, new_img=[2, 6, 128, 256])
  assert [os.path.basename(p) for p, _ in found] == ["warp_split.bin"], lines
  for name, why in crafted.items():
    assert sum(f"/{name}: " in line for line in lines) == 1, f"{name} ({why}): {lines}"
  assert len(lines) == len(crafted) and all(line.startswith("skipping ") for line in lines), lines

def test_modeld_with_crafted_warps_runs_and_waits_on_a_geometry_without_a_fitting_warp(artifacts, tmp_path, openpilot_prefix):
  """Deep JSON or a huge integer killed modeld at start; a malformed frame or a warp for another model size crashed it when the camera
  connected. Now each is skipped with one line, at start and on geometry changes alike."""
  crafted = crafted_warps(artifacts, tmp_path)
  shutil.copy(os.path.join(artifacts, "model.bin"), tmp_path / "model.bin")
  big = tmp_path / "warp_big_small.bin"  # the only 1928x1208 warp makes planes for another model size
  rewrite_header(os.path.join(artifacts, "warp_big_split.bin"), str(big), lambda h: h.replace('"warped":[[2,6,128,256]', '"warped":[[2,6,64,128]'))
  daemon = Daemon(str(tmp_path))
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("no warp bundle", after=seen)
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("camera geometry changed to 1344x760", after=seen)
  daemon.exchange(range(200, 205))
  assert daemon.stop() == 0
  for name in [*crafted, big.name]: assert sum(f"/{name}: " in line and "skipping" in line for line in daemon.lines) == 1, f"{name}: {daemon.lines}"

def memory(pid: int) -> tuple[int, int]:
  """(resident kB, shared mappings) of process `pid`, from /proc: camera buffers and tinygrad's CPU buffers are shared mappings."""
  rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status") if line.startswith("VmRSS:"))
  return rss, sum(1 for line in open(f"/proc/{pid}/maps") if line.split()[1].endswith("s"))

def test_camera_geometry_changes_release_the_old_buffers(artifacts, openpilot_prefix):
  """Each geometry change used to leave the old adapter's buffers mapped until the cycle collector happened to run: ~9 MB RSS and
  ~9 shared mappings more per change here (a tiny model; a real one's buffers are larger)."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(5))
  samples = []
  for change in range(12):
    frame = BIG_FRAME if change % 2 == 0 else FRAME
    seen = len(daemon.lines)
    daemon.restart_camerad(frame)
    daemon.wait_for_line(f"camera geometry changed to {frame.width}x{frame.height}", after=seen)
    daemon.exchange(range(100 * (change + 1), 100 * (change + 1) + 3))
    samples.append(memory(daemon.proc.pid))
  assert daemon.stop() == 0
  (rss0, maps0), (rss1, maps1) = samples[1], samples[-1]  # both geometries loaded once, then 10 changes later, on the same geometry
  assert maps1 <= maps0, f"shared mappings grew from {maps0} to {maps1}: {samples}"
  assert rss1 - rss0 < 10_000, f"RSS grew by {(rss1 - rss0) / 1000:.0f} MB over 10 geometry changes: {samples}"

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

# *** the fourth round: files in the folder, refused pairs, calibrations, camera clocks, values computed from the outputs ***

def test_a_stray_file_larger_than_memory_costs_its_first_bytes(artifacts, tmp_path):
  """A 12 GB sparse dump.bin in the folder was read and hashed whole before its magic was checked (71 s, 12.7 GB RSS). Now the magic and
  the sizes the header declares are checked first: files larger than this machine's memory are skipped with one line each."""
  from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts, warp_bundles
  from sunnypilot.modeld_v2.format.bundle import read_bundle, read_header
  huge = 64 << 30  # more than the 24 GiB of memory CI machines have: a whole read would fail, not pass slowly
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), tmp_path / "warp_split.bin")
  with open(tmp_path / "dump.bin", "wb") as f: f.truncate(huge)  # sparse: no disk used
  with open(tmp_path / "padded.bin", "wb") as f:  # a real warp's bytes, then a huge sparse tail its header does not declare
    f.write(open(tmp_path / "warp_split.bin", "rb").read())
    f.truncate(huge)
  from sunnypilot.modeld_v2.format.bundle import FORMAT_VERSION, MAGIC, PREAMBLE
  with open(tmp_path / "long_header.bin", "wb") as f:  # the magic, then a header as long as the whole file
    f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, huge - PREAMBLE.size, bytes(32)))
    f.truncate(huge)
  lines = []
  found = warp_bundles(str(tmp_path), report=lines.append)
  assert [os.path.basename(p) for p, _ in found] == ["warp_split.bin"], lines
  assert sum("dump.bin: not a modeld_v2 bundle (magic" in line for line in lines) == 1, lines
  assert sum("padded.bin: the header declares a" in line and f"the file has {huge:,} bytes" in line for line in lines) == 1, lines
  assert sum(f"long_header.bin: a {huge - PREAMBLE.size:,} byte header, more than" in line for line in lines) == 1, lines
  for name in ("dump.bin", "padded.bin", "long_header.bin"):
    with pytest.raises(ArtifactError): read_bundle(str(tmp_path / name))
    with pytest.raises(ArtifactError): read_header(str(tmp_path / name))
  os.replace(tmp_path / "dump.bin", tmp_path / "model.bin")
  with pytest.raises(ArtifactError, match="model.bin: not a modeld_v2 bundle"): check_artifacts(str(tmp_path))

def test_other_bundles_and_bad_folders_are_named_as_what_they_are(artifacts, tmp_path):
  """A driving model that is not model.bin was skipped without a line; a missing --artifacts folder, or a file given as one, was reported as
  'model.bin not found'."""
  from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts, warp_bundles
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), tmp_path / "warp_split.bin")
  shutil.copy(os.path.join(artifacts, "model.bin"), tmp_path / "other_model.bin")
  lines = []
  assert len(warp_bundles(str(tmp_path), report=lines.append)) == 1
  assert lines == [f"skipping {tmp_path / 'other_model.bin'}: a model bundle, not a warp (only model.bin is read as the model)"], lines
  with pytest.raises(ArtifactError, match=r"^--artifacts .*/missing: no such folder \(it holds model.bin and warp bundles\)$"):
    check_artifacts(str(tmp_path / "missing"))
  with pytest.raises(ArtifactError, match=r"^--artifacts .*/warp_split.bin: is a file, not a folder"): check_artifacts(str(tmp_path / "warp_split.bin"))

def test_the_no_warp_hint_is_a_command_that_builds_the_warp(artifacts, tmp_path):
  """modeld's hint printed `<uv_height>`; it is camerad's layout, so the whole --frame is known: the command builds a warp modeld then takes."""
  from sunnypilot.modeld_v2.daemon.artifacts import find_warp, warp_command
  from sunnypilot.modeld_v2.daemon.camera_sync import live_frame
  client = SimpleNamespace(width=BIG_FRAME.width, height=BIG_FRAME.height, stride=BIG_FRAME.stride, uv_offset=BIG_FRAME.uv_offset, buffer_len=BIG_FRAME.size)
  live = live_frame(client)  # what modeld knows of the buffers: no uv_height
  assert live.uv_height != BIG_FRAME.uv_height
  lines = []
  assert find_warp(str(tmp_path), live, live, report=lines.append) is None
  assert warp_command(live) in lines[-1] and f"--frame {BIG_FRAME.spec} --warp-to 512x256 --split-frames" in warp_command(live), lines

def overwrite_in_place(path, data: bytes) -> None:
  """Rewrite a file's bytes in place (not renamed): what an editor or a careless copy does; its inode stays."""
  with open(path, "r+b") as f:
    f.write(data)
    f.truncate()

def test_a_model_broken_for_a_moment_refuses_the_pair_not_the_warp(artifacts, tmp_path, openpilot_prefix):
  """model.bin overwritten in place while the camera geometry changed put the good warp on a refused list for good: that camera size was
  never served again until a restart, and the log said to build the warp that was there. Now the pair is refused, and tried again once
  one of its files changes."""
  for name in ("model.bin", "warp_split.bin", "warp_big_split.bin"): shutil.copy(os.path.join(artifacts, name), tmp_path / name)
  good = (tmp_path / "model.bin").read_bytes()
  daemon = Daemon(str(tmp_path))
  daemon.exchange(range(5))
  overwrite_in_place(tmp_path / "model.bin", good[:len(good) // 2])  # broken: truncated mid-write
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("cannot load", after=seen)
  daemon.wait_for_line("failed to load with model.bin", after=seen)  # the retry sees the same files: said once, not tried again
  overwrite_in_place(tmp_path / "model.bin", good)
  daemon.wait_for_line("running:", after=seen)
  daemon.exchange(range(100, 105))
  assert daemon.stop() == 0
  after = "".join(daemon.lines[seen:])
  assert after.count("cannot load") == 1 and "no warp bundle" not in after and after.count("running:") == 1, after

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

def send_clocked(daemon: Daemon, frame_id: int, road_sof: int, wide_sof: int) -> None:
  """A road + wide pair with the given start-of-frame times, a calibration every 20 frames (as fake_camerad sends it)."""
  from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
  road, wide = frames_for(frame_id)
  daemon.replay.server.send(VisionStreamType.ROAD, road.tobytes(), frame_id, road_sof, road_sof + 20_000_000)
  daemon.replay.server.send(VisionStreamType.WIDE_ROAD, wide.tobytes(), frame_id, wide_sof, wide_sof + 20_000_000)
  if frame_id % 20 == 0: daemon.replay.send_calibration()

@pytest.mark.parametrize("clock", ["both zero", "road zero", "frozen"])
def test_camera_timestamps_that_stop_are_paired_by_frame_id_and_published_invalid(artifacts, openpilot_prefix, clock):
  """Camera timestamps all 0 (both cameras, or the road one alone), or a frozen clock: nothing was published, and the one line blamed the
  extra camera. Now a clock that stops while frame ids go on is said once, frames are paired by frame id and published valid=False; once
  the clock runs again they are valid."""
  daemon = Daemon(artifacts)
  daemon.exchange(range(20))
  start = SOF0 + 20 * 50_000_000
  stopped = {"both zero": lambda i: (0, 0), "road zero": lambda i: (0, start + i * 50_000_000), "frozen": lambda i: (start, start)}[clock]
  send_clocked(daemon, 20, *stopped(20))  # the first frame of the stop is skipped (its clock looks 25 ms short), the next pair by frame id
  for frame_id in range(21, 40):
    send_clocked(daemon, frame_id, *stopped(frame_id))
    daemon.receive(frame_id)
  for frame_id in range(40, 50):
    send_clocked(daemon, frame_id, start + frame_id * 50_000_000, start + frame_id * 50_000_000)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(daemon.messages[i]["modelV2"][0].frameIdExtra == i for i in range(21, 50)), "road and wide frames of one id paired"
  assert not any(valid for i in range(21, 40) for _, valid in daemon.messages[i].values()), "no message of a stopped clock is valid"
  assert all(finite_and_valid(daemon, i) for i in range(41, 50)), "valid again once the clock runs"
  lines = "".join(daemon.lines)
  said = re.findall(r"camera timestamps (stopped|went back)", lines)  # to 0 the clock first goes back, a frozen one stops
  assert said == ["stopped" if clock == "frozen" else "went back"] and "no extra frame within" not in lines, lines

# outputs near float32's maximum on one frame: finite, so the raw check passes, but the curvature a slow car's plan gives (2 yaw / (v t))
# and the path fitted to the plan overflow float32, the message's type. The graph's parse of them is the host parse's (test_output_parse
# holds the one to the other), written into the block's array as the graph would
HUGE_OUTPUTS = ("-c", """import sys, numpy as np
from sunnypilot.modeld_v2 import modeld
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, reference_block, trace
from sunnypilot.modeld_v2.runtime import model_runner
calls, read = [0], model_runner.ModelRunner.output_array
def huge(self, name="outputs"):
  calls[0] += name == "outputs"
  out = read(self, name)
  if calls[0] != 30: return out
  raw = np.clip(read(self) * 1e38, -3e38, 3e38)
  if name == "outputs": return raw
  out[:] = reference_block(OutputParser(self.output_slices), trace(self.output_slices), raw)
  return out
model_runner.ModelRunner.output_array = huge
sys.exit(modeld.main())""")

def test_values_computed_from_finite_outputs_are_checked_too(artifacts, openpilot_prefix):
  """Outputs finite but near float32's maximum made modeld publish action.desiredCurvature = -inf with valid=True: the check covered the
  raw outputs, not what is computed from them. Now that frame is invalid and the next ones, smoothed against a fresh action, valid."""
  daemon = Daemon(artifacts, command=HUGE_OUTPUTS)
  for frame_id in range(40):
    daemon.send(frame_id, v_ego=1.0)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  huge = [i for i in range(40) if np.abs(np.frombuffer(daemon.raw(i), np.float32)).max() > 1e37]
  assert len(huge) == 1 and huge[0] > 21 and np.isfinite(np.frombuffer(daemon.raw(huge[0]), np.float32)).all(), "one frame, its outputs finite"
  assert not any(valid for _, valid in daemon.messages[huge[0]].values()), "what was computed from them is not: every message invalid"
  assert all(finite_and_valid(daemon, i) and np.isfinite(daemon.messages[i]["modelV2"][0].action.desiredCurvature) for i in range(huge[0] + 1, 40))
  assert sum("values computed from the outputs are not finite" in line for line in daemon.lines) == 1, daemon.lines

def test_a_status_line_says_frames_drops_and_execution_time(artifacts, openpilot_prefix):
  """There was no way to see what modeld does short of subscribing: it logs a status line every few seconds (--status-every) while
  frames run, of the frames published, dropped and their modelExecutionTime since the line before."""
  from sunnypilot.modeld_v2.daemon.status import Status
  status = Status(every_s=2)
  status.start(0)
  status.times += [0.004, 0.003, 0.010]
  status.dropped += 2
  assert status.line(2 * 10**9, 3) == "status: 3 frames published, 3 in the last 2.0 s, 2 dropped, modelExecutionTime p50 4.0 ms, max 10.0 ms"
  assert status.next_ns == 4 * 10**9 and status.line(9 * 10**9, 3) == "status: 3 frames published, 0 in the last 7.0 s, 0 dropped", "after a stall"
  daemon = Daemon(artifacts, args=("--status-every", "0.2"))
  first = len(daemon.lines)
  frame_id = 0
  while sum("status:" in line for line in daemon.lines[first:]) < 2:  # lockstep frames until two lines came
    daemon.exchange([frame_id])
    frame_id += 1
    assert frame_id < 2000, daemon.lines
  assert daemon.stop() == 0
  second = [line for line in daemon.lines if "status:" in line][1]
  line = re.search(r"status: (\d+) frames published, (\d+) in the last [\d.]+ s, 0 dropped, modelExecutionTime p50 [\d.]+ ms", second)
  total, recent = map(int, line.groups())
  assert 0 < recent <= total < frame_id, (second, frame_id)

def test_a_load_that_fails_with_any_exception_closes_its_adapter(artifacts, monkeypatch):
  """prepare() closed the adapter it made only on an ArtifactError: a device error in the warm-up (or Ctrl-C) left it loaded, its memory
  (and on CUDA its host registrations) held by nothing that would close it. Now whatever is raised closes it, and is raised as it was."""
  from sunnypilot.modeld_v2 import modeld
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.camera_sync import Geometry
  from sunnypilot.modeld_v2.daemon.frame_daemon import FrameDaemon
  from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  made, closed, close = [], [], ModelRunner.close
  def closing(self) -> None:
    closed.append(self)
    close(self)
  def broken(self, prepared) -> None:
    made.append(prepared.adapter)
    raise RuntimeError("CUDA error 700 in the warm-up")
  monkeypatch.setattr(ModelRunner, "close", closing)
  monkeypatch.setattr(FrameDaemon, "warm_up", broken)
  episodes = Episodes(print)
  daemon = FrameDaemon(modeld.ModelD(episodes), episodes, artifacts)
  with pytest.raises(RuntimeError, match="CUDA error 700"): daemon.prepare(daemon.sets.open(DEFAULT_SET), Geometry((0,), FRAME, None))
  assert len(made) == 1 and closed == made
