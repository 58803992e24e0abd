"""route_replay on a small route written for the test (synthetic_route: road_scene frames of a comma 4, os04c10 1344x760, encoded to
HEVC with PyAV, and an rlog of liveCalibration / carState / roadCameraState events written with the schema). The replay's outputs are
checked against an onnxruntime reference computed here (openpilot_reference's Openpilot and conftest's numpy warp), not the tool's own."""
import json
import os
import shutil
import subprocess
import sys

import av
import numpy as np
import pytest
from openpilot_logging.logreader import LogReader

from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, dm_warp_matrix, get_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.replay.onnx_reference import OnnxReference
from sunnypilot.modeld_v2.replay.route_replay import main
from sunnypilot.modeld_v2.replay.synthetic_route import FIRST_ID, encode_hevc, write_log, write_segment
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import ROOT, reference_dm_warp, reference_warp
from openpilot_reference import Openpilot, step_inputs

FRAME = camerad_frame(1344, 760)
FRAMES = 24
RPY, HEIGHT = [0.0, 0.03, -0.01], 1.3

@pytest.fixture(scope="module")
def route(tmp_path_factory) -> str:
  folder = tmp_path_factory.mktemp("route") / "2026-12-03--04-00-00--0"
  write_segment(str(folder), (FRAME.width, FRAME.height), FRAMES, rpy=RPY, height=HEIGHT)
  return str(folder)

def decoded(path: str) -> list[np.ndarray]:
  """The video's frames in camerad's layout, decoded here."""
  bufs = []
  with av.open(path) as container:
    for picture in container.decode(video=0):
      nv12, buf = picture.to_ndarray(format="nv12"), np.zeros(FRAME.size, np.uint8)
      y, uv = FRAME.planes(buf)
      y[:], uv[:] = nv12[:FRAME.height], nv12[FRAME.height:]
      bufs.append(buf)
  return bufs

def calibrated_warps() -> list[np.ndarray]:
  """openpilot's (road, wide) M_inv for the log's calibration."""
  road, wide = SENSOR_CAMERAS["os04c10"]
  return [get_warp_matrix(RPY, road.intrinsics).astype(np.float32), get_warp_matrix(RPY, wide.intrinsics, bigmodel_frame=True).astype(np.float32)]

def expected_outputs(route: str, onnx: str, m_invs: list | None = None) -> list[np.ndarray]:
  """openpilot's inputs for this log, written out: the calibration's warp (or per frame `m_invs`), carState's vEgo with no blinkers (no
  desire), left-hand traffic, action_t = (modeld's default 0.32 s lateral delay, 0.15 s longitudinal + 0.3 s smoothing) + 1.5 frames;
  onnxruntime on the frames warped in numpy."""
  reference = Openpilot({"onnx": onnx})
  host = {"traffic_convention": np.array([[1, 0]], np.float32), "action_t": np.array([[0.32 + 0.075, 0.15 + 0.3 + 0.075]], np.float32),
          "desire": np.zeros((1, 8), np.float32)}
  outs = []
  for k, (road_buf, wide_buf) in enumerate(zip(decoded(os.path.join(route, "fcamera.hevc")), decoded(os.path.join(route, "ecamera.hevc")))):
    m_inv = calibrated_warps() if m_invs is None else m_invs[k]
    warped = [reference_warp(buf, FRAME, m)[0] for buf, m in ((road_buf, m_inv[0]), (wide_buf, m_inv[1]))]
    outs.append(reference.step(np.stack(warped), host["desire"], {n: host[n] for n in reference.host}).reshape(-1))
  return outs

def expected_driver_outputs(route: str, dm_onnx: str) -> list[np.ndarray]:
  """openpilot's dmonitoringmodeld inputs for this segment, written out: each dcamera.hevc frame's Y plane warped to 1440x960 with
  M_inv = inv(dmonitoringmodel_intrinsics @ inv(the OS04C10 fisheye's)) (conftest's numpy warp, border 16), calib = the log's rpyCalib;
  onnxruntime on them."""
  import onnxruntime as ort
  session, m_inv = ort.InferenceSession(dm_onnx, providers=["CPUExecutionProvider"]), dm_warp_matrix("os04c10")
  calib = np.array([RPY], np.float32)
  return [session.run(["outputs"], {"input_img": reference_dm_warp(buf, FRAME, m_inv, 1440, 960)[0], "calib": calib})[0].reshape(-1)
          for buf in decoded(os.path.join(route, "dcamera.hevc"))]

@pytest.fixture(scope="module")
def both_artifacts(native_artifacts, dm_artifacts, tmp_path_factory) -> str:
  """modeld's and dmonitoringmodeld's bundles in one artifacts folder, as a device has them."""
  folder = tmp_path_factory.mktemp("both")
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  return str(folder)

def test_replay_in_lockstep_matches_onnxruntime(route, native_artifacts, dm_artifacts, both_artifacts, tmp_path):
  """modeld on the road cameras and dmonitoringmodeld on dcamera.hevc, both in lockstep: every frame's raw outputs against onnxruntime
  computed here, driverStateV2's fields by openpilot's formulas on them, check.json passed for both, and the pictures."""
  import json
  out = tmp_path / "out"
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", route, "--artifacts", both_artifacts, "--onnx",
                        os.path.join(native_artifacts, "native.onnx"), "--dm-onnx", os.path.join(dm_artifacts, "dmonitoring_model.onnx"),
                        "--tolerance", "1e-4", "--frames", "4:20", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout + run.stderr
  segment = out / os.path.basename(route)
  events = list(LogReader(str(segment / "modeld_rlog.zst")))
  ids = {s: [getattr(e, s).frameId for e in events if e.which() == s] for s in ("modelV2", "drivingModelData", "cameraOdometry", "driverStateV2")}
  assert all(v == list(range(FIRST_ID, FIRST_ID + FRAMES)) for v in ids.values()), f"every frame published once, in order: {ids}"
  models = [e.modelV2 for e in events if e.which() == "modelV2"]
  assert all(e.valid for e in events), "a calibration was published before the first frame"
  expected = expected_outputs(route, os.path.join(native_artifacts, "native.onnx"))
  for k, (m, want) in enumerate(zip(models, expected, strict=True)):
    np.testing.assert_allclose(np.frombuffer(bytes(m.rawPredictions), np.float32), want, rtol=0, atol=1e-4, err_msg=f"frame {k} vs onnxruntime")
  slices = read_bundle(os.path.join(dm_artifacts, "dmonitoring_model.bin"))[0]["extras"]["metadata"]["output_slices"]
  states = [e.driverStateV2 for e in events if e.which() == "driverStateV2"]
  for k, (d, want) in enumerate(zip(states, expected_driver_outputs(route, os.path.join(dm_artifacts, "dmonitoring_model.onnx")), strict=True)):
    raw = np.frombuffer(bytes(d.rawPredictions), np.float32)
    np.testing.assert_allclose(raw, want, rtol=0, atol=1e-4, err_msg=f"driver frame {k} vs onnxruntime")
    face_prob, descs = (raw[slices[n][0]:slices[n][1]] for n in ("face_prob_lhd", "face_descs_rhd"))  # openpilot's fill: sigmoid, the first 6 as they are
    assert d.leftDriverData.faceProb == pytest.approx(1 / (1 + np.exp(-face_prob[0])), rel=1e-5)
    np.testing.assert_array_equal(list(d.rightDriverData.facePosition), descs[3:5])
  check = json.loads((segment / "check.json").read_text())
  assert check["passed"] and check["frames"] == FRAMES and check["driver_frames"] == FRAMES and check["field_max"] <= 1e-4, check
  assert check["fields_compared"] > 100 and check["driver_fields_compared"] >= 12, "driverStateV2's fields compared too (frameId, wheelOnRightProb, 5 per side)"
  assert max(h["max"] for h in check["heads"].values()) <= 1e-4 and "driverStateV2:face_descs_lhd" in check["heads"], check["heads"].keys()
  with av.open(str(segment / "overlay.mp4")) as video: assert sum(1 for _ in video.decode(video=0)) == 16, "--frames 4:20 draws 16 frames"
  assert (segment / "plots.png").stat().st_size > 10_000
  assert "PASSED" in run.stdout and f"{FRAMES} frames sent, {FRAMES} published, 0 dropped" in run.stdout
  assert f"driver camera: {FRAMES} frames sent, {FRAMES} driverStateV2 published" in run.stdout

def test_float16_bundles_are_checked_with_float16s_tolerance(route, native_artifacts, dm_artifacts, tmp_path):
  """Both daemons' models built in float16 against onnxruntime on their float32 ONNX, no --tolerance: the check takes float16's 1e-2 with
  differences relative to the value above 1 (an exp'd std of 100 moves by 0.1 in half), says so, and passes; every raw head within it."""
  import json

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.replay.reference_check import difference
  folder, out = tmp_path / "half", tmp_path / "out"
  folder.mkdir()
  onnxs = {"model.bin": os.path.join(native_artifacts, "native.onnx"), "dmonitoring_model.bin": os.path.join(dm_artifacts, "dmonitoring_model.onnx")}
  for name, onnx_name in onnxs.items(): compile_model(str(folder / name), onnx=onnx_name, log=lambda s: None, precision="float16")
  for name, src in (("warp_split.bin", native_artifacts), ("dm_warp_1344x760.bin", dm_artifacts)): shutil.copy(os.path.join(src, name), folder / name)
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", route, "--artifacts", str(folder), "--onnx",
                        os.path.join(native_artifacts, "native.onnx"), "--dm-onnx", os.path.join(dm_artifacts, "dmonitoring_model.onnx"),
                        "--no-pictures", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0 and "(tolerance 0.01)" in run.stderr + run.stdout, run.stdout + run.stderr
  check = json.loads((out / os.path.basename(route) / "check.json").read_text())
  assert check["passed"] and check["tolerance"] == 1e-2 and check["frames"] == FRAMES and check["driver_frames"] == FRAMES, check
  assert 0 < max(h["max"] for h in check["heads"].values()) <= 1e-2, "computed in half: not float32's values, within float16's tolerance"
  assert difference([200.0, 0.5], [199.0, 0.4], relative=True) == pytest.approx(0.1) and difference([200.0], [199.0]) == 1.0

def test_jobs_against_a_bundle_and_the_fallbacks_for_a_log_without_calibration_or_car_state(route, native_artifacts, tmp_path):
  """Two segments in parallel processes, one of them with no liveCalibration and no carState: a warning each, the default calibration
  (every message invalid until a calibration arrives), vEgo 0. Each is checked --against the bundle modeld runs: its outputs bit for bit,
  and the fleet report over both says so."""
  import json
  drive = tmp_path / "realdata"
  shutil.copytree(route, drive / "2026-12-03--04-00-00--0")
  shutil.copytree(route, drive / "2026-12-03--04-00-00--1")
  write_log(str(drive / "2026-12-03--04-00-00--1" / "rlog.zst"), FRAMES, "os04c10", calibration=False, car_state=False)
  out = tmp_path / "out"
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", str(drive), "--artifacts", native_artifacts, "--jobs", "2",
                        "--against", os.path.join(native_artifacts, "model.bin"), "--no-pictures", "--out", str(out)],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout + run.stderr
  assert "no liveCalibration: modeld uses the default calibration" in run.stderr and "no carState: vEgo 0" in run.stderr
  for seg, calibrated in (("2026-12-03--04-00-00--0", True), ("2026-12-03--04-00-00--1", False)):
    models = [e for e in LogReader(str(out / seg / "modeld_rlog.zst")) if e.which() == "modelV2"]
    assert [e.modelV2.frameId for e in models] == list(range(FIRST_ID, FIRST_ID + FRAMES)) and all(e.valid == calibrated for e in models)
    check = json.loads((out / seg / "check.json").read_text())
    assert check["passed"] and check["frames"] == FRAMES and all(h["max"] == 0 for h in check["heads"].values()), check
    # the published fields: modeld's in-graph parse against the reference's host parse, their float32 arithmetic apart (1e-6 relative)
    assert check["field_max"] <= 1e-5, check["fields_past_tolerance"]
  fleet = json.loads((out / "fleet.json").read_text())  # one report for both: every head bit for bit over the fleet too
  assert (fleet["executor"], fleet["passed"], fleet["frames"]) == ("2 local processes", 2, 2 * FRAMES) and all(h["max"] == 0 for h in fleet["heads"].values())
  assert "fleet (2 local processes): 2/2 segments: 2 passed, 0 failed, 0 errors" in run.stdout and (out / "fleet.png").exists()

def test_the_check_feeds_modelds_camera_offset(route, native_artifacts, tmp_path):
  """--camera-offset through modeld and the reference check alike. modeld's outputs match onnxruntime fed sunnypilot's CameraOffset shear,
  written out here (modeld_v2/camera_offset_helper.py @5b23aa70 and modeld.py: the applied offset starts at 0 and moves a tenth of the way
  to the target on each liveCalibration update, so after n updates it is target * (1 - 0.9^n); M_inv becomes
  [[1, o/h, -o/h * cy], [0, 1, 0], [0, 0, 1]] @ M_inv with the calibration's height h and the camera's cy), and check.json passes: the
  check fed its reference the same shear. A recalibration with a pitch calibrationd never publishes is refused (the angles stay), its
  height taken, and it counts as an update."""
  import json
  offset, folder = 0.6, tmp_path / "2026-12-03--04-00-00--0"
  recalibrations = {5: (RPY, 1.5), 10: ([0.0, 1e30, 0.0], 1.5), 16: (RPY, HEIGHT)}
  shutil.copytree(route, folder)
  write_log(str(folder / "rlog.zst"), FRAMES, "os04c10", rpy=RPY, height=HEIGHT, recalibrations=recalibrations)
  out = tmp_path / "out"
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", str(folder), "--artifacts", native_artifacts, "--onnx",
                        os.path.join(native_artifacts, "native.onnx"), "--tolerance", "1e-4", "--no-pictures", "--camera-offset", str(offset),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0, run.stdout + run.stderr
  assert any("liveCalibration.rpyCalib = " in line and "refused" in line for line in run.stderr.splitlines()), run.stderr
  cameras, m_invs = SENSOR_CAMERAS["os04c10"], []
  for k in range(FRAMES):
    since = [f for f in sorted(recalibrations) if f <= k]
    o = offset * (1 - 0.9 ** (1 + len(since)))  # the first calibration arrives with frame 0
    h = recalibrations[since[-1]][1] if since else HEIGHT
    shears = [np.array([[1, o / h, -o / h * cam.intrinsics[1, 2]], [0, 1, 0], [0, 0, 1]]) for cam in cameras]
    m_invs.append([(shear @ m).astype(np.float32) for shear, m in zip(shears, calibrated_warps(), strict=True)])
  onnx = os.path.join(native_artifacts, "native.onnx")
  expected, unshifted = expected_outputs(str(folder), onnx, m_invs), expected_outputs(str(folder), onnx)
  assert min(np.abs(a - b).max() for a, b in zip(expected, unshifted)) > 1e-3, "the shear moves every frame's outputs 10x past the tolerance"
  models = [e.modelV2 for e in LogReader(str(out / folder.name / "modeld_rlog.zst")) if e.which() == "modelV2"]
  for k, (m, want) in enumerate(zip(models, expected, strict=True)):
    np.testing.assert_allclose(np.frombuffer(bytes(m.rawPredictions), np.float32), want, rtol=0, atol=1e-4, err_msg=f"frame {k} vs onnxruntime")
  check = json.loads((out / folder.name / "check.json").read_text())
  assert check["passed"] and check["frames"] == FRAMES and check["field_max"] <= 1e-4, check

def broken(route: str, tmp_path, what: str) -> str:
  folder = tmp_path / "segment"
  shutil.copytree(route, folder)
  if what == "no video": os.remove(folder / "fcamera.hevc")
  elif what == "no log": os.remove(folder / "rlog.zst")
  elif what == "truncated": (folder / "fcamera.hevc").write_bytes((folder / "fcamera.hevc").read_bytes()[:8000])
  elif what == "unknown size": encode_hevc(str(folder / "fcamera.hevc"), [np.full((360, 320), 128, np.uint8)] * 3, 320, 240)
  elif what == "out of step": write_log(str(folder / "rlog.zst"), FRAMES + 6, "os04c10")
  elif what == "garbage log": (folder / "rlog.zst").write_bytes(b"\x28\xb5\x2f\xfd" + b"\x01" * 100)
  elif what == "size changes":  # the first half at the segment's size, then 1928x1208: two HEVC streams one after the other, as a decoder meets them
    big = camerad_frame(1928, 1208)
    encode_hevc(str(tmp_path / "big.hevc"), [np.full((big.height * 3 // 2, big.width), 128, np.uint8)] * (FRAMES // 2), big.width, big.height)
    encode_hevc(str(tmp_path / "small.hevc"), [np.full((FRAME.height * 3 // 2, FRAME.width), 128, np.uint8)] * (FRAMES // 2), FRAME.width, FRAME.height)
    for name in ("fcamera.hevc", "ecamera.hevc"): (folder / name).write_bytes((tmp_path / "small.hevc").read_bytes() + (tmp_path / "big.hevc").read_bytes())
  return str(folder)

@pytest.mark.parametrize("what, message", [
  ("no video", "no road camera video (looked for fcamera.hevc"), ("no log", "no log (looked for rlog"),
  ("truncated", "frames and log out of step: fcamera.hevc has"), ("unknown size", "320x240 frames are no known comma camera's"),
  ("out of step", f"fcamera.hevc has {FRAMES} frames, the log names {FRAMES + 6} (roadCameraState)"), ("garbage log", "not a readable openpilot log"),
  ("size changes", f"the video changes from 1344x760 to 1928x1208 at frame {FRAMES // 2}"),  # was replayed scaled into the first size, exit 0
])
def test_bad_route_is_one_line_and_writes_nothing(route, native_artifacts, tmp_path, capsys, what, message):
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as e: main([broken(route, tmp_path, what), "--artifacts", native_artifacts, "--out", str(out)])
  err = capsys.readouterr().err
  lines = err.strip().splitlines()  # a size change is met while decoding, after modeld started and said what it runs: the error comes last
  assert e.value.code == 2 and message in lines[-1] and "Traceback" not in err and (len(lines) == 1 or what == "size changes"), err
  assert not out.exists(), "nothing written"

@pytest.mark.parametrize("offset", ["1.5", "-2", "nan"])
def test_camera_offset_beyond_modelds_range_is_one_line(route, native_artifacts, tmp_path, capsys, offset):
  """--camera-offset takes what modeld takes: finite metres, at most 1 either way (sunnypilot's CameraOffset stays within the car)."""
  with pytest.raises(SystemExit) as e: main([route, "--artifacts", native_artifacts, "--camera-offset", offset, "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "argument --camera-offset: a camera offset must be a number of metres in [-1, 1], got" in err.strip().splitlines()[-1], err
  assert not (tmp_path / "out").exists()

def test_frames_are_named_by_road_encode_idx_and_served_in_sequence(route, tmp_path):
  """As in a real rlog or qlog: roadEncodeIdx names each video frame (segmentId -> frameId, timestamps; here only every 3rd
  roadCameraState is logged, as in a qlog). Ids that skip (camera drops on the device) are served consecutively, with a warning."""
  from sunnypilot.modeld_v2.replay.route_segment import open_segment
  folder = tmp_path / "segment"
  shutil.copytree(route, folder)
  ids = [FIRST_ID + k + (k >= 10) for k in range(FRAMES)]  # one camera frame dropped before the 11th
  write_log(str(folder / "rlog.zst"), FRAMES, "os04c10", frame_ids=ids, encode_idx=True, camera_state_every=3)
  segment = open_segment(str(folder))
  assert [f.frame_id for f in segment.frames] == list(range(FIRST_ID, FIRST_ID + FRAMES))
  assert [f.sof for f in segment.frames] == [10**9 + k * 50_000_000 - 30_000_000 for k in range(FRAMES)]
  assert [f.log_time for f in segment.frames] == [10**9 + k * 50_000_000 + 5_000_000 for k in range(FRAMES)], "the roadEncodeIdx events"
  assert any("frame ids skip" in w for w in segment.warnings) and segment.sensor == "os04c10"

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_the_packaged_reference_matches_the_tests(tmp_path, generation):
  """OnnxReference (route_replay --onnx/--vision...) against test_generations' Openpilot: the same ONNX, frames and host inputs."""
  files = stand_in_models.write(generation, "tiny", str(tmp_path / f"{generation}.onnx"), seed=8)["files"]
  ours, theirs, rng = OnnxReference(files), Openpilot(files), np.random.default_rng(9)
  for step in range(10):
    road, wide = rng.integers(0, 256, (2, FRAME.size), dtype=np.uint8)
    m_inv = np.stack([np.array([[2, 0, 2 * rng.integers(0, 160)], [0, 2, 2 * rng.integers(0, 124)], [0, 0, 1]], np.float32) for _ in range(2)])
    desire, host = step_inputs(rng, step, theirs.host, theirs)
    warped = np.stack([reference_warp(buf, FRAME, m)[0] for buf, m in ((road, m_inv[0]), (wide, m_inv[1]))])
    want = theirs.step(warped, desire, host)
    got = ours.step(road, wide, FRAME, host | {"tfm": m_inv, "desire": desire})
    np.testing.assert_array_equal(got, want, err_msg=f"{generation} step {step}")

def test_fake_camerad_serves_a_route(route, openpilot_prefix):
  """fake_camerad --route: the segment's decoded frames over VisionIPC, in camerad's layout, with the log's frame ids."""
  import time

  from msgq.visionipc import VisionIpcClient
  proc = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.replay.fake_camerad", "--route", route, "--start-delay", "2"], cwd=ROOT,
                          stderr=subprocess.PIPE, text=True)
  try:
    client, deadline = VisionIpcClient("camerad", 0, False), time.monotonic() + 60
    while not client.connect(False):
      assert time.monotonic() < deadline and proc.poll() is None, "fake_camerad did not start its VisionIPC server"
      time.sleep(0.01)
    got = {}
    while len(got) < FRAMES and (buf := client.recv(3000)) is not None: got[client.frame_id] = np.array(buf.data[:FRAME.size])
    assert proc.wait(timeout=30) == 0, proc.stderr.read()
  finally:
    if proc.poll() is None: proc.kill()
  assert sorted(got) == list(range(FIRST_ID, FIRST_ID + FRAMES))
  for k, buf in enumerate(decoded(os.path.join(route, "fcamera.hevc"))): np.testing.assert_array_equal(got[FIRST_ID + k], buf, err_msg=f"frame {k}")

def test_demo_replays_a_route_with_both_daemons_beside_an_earlier_replay(route, native_artifacts, dm_artifacts, tmp_path):
  """demo --route wrote into route_replay's out/replay (overwriting an earlier replay's results), ran dmonitoringmodeld only when an earlier
  run had left its bundles, and refused --dm-onnx. Now its results go to OUT/demo_replay, it builds (here: reuses, the same sources) the DM
  pair for the route's camera, and the DM model is checked against onnxruntime on --dm-onnx."""
  folder = tmp_path / "artifacts"
  folder.mkdir()
  shutil.copy(os.path.join(native_artifacts, "model.bin"), folder / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "warp_split.bin"), folder / "warp_1344x760_split.bin")  # the names the demo builds
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  earlier = tmp_path / "out" / "replay" / os.path.basename(route)
  earlier.mkdir(parents=True)
  (earlier / "check.json").write_text("an earlier route_replay's")
  run = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.tools.demo", "--route", route, "--artifacts", str(folder), "--onnx",
                        os.path.join(native_artifacts, "native.onnx"), "--dm-onnx", os.path.join(dm_artifacts, "dmonitoring_model.onnx"),
                        "--out", str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert run.returncode == 0 and "PASSED" in run.stdout and "compiling" not in run.stderr, run.stdout + run.stderr
  assert "reusing" in run.stderr and f"{folder / 'dm_warp_1344x760.bin'}" in run.stderr, run.stderr
  out = tmp_path / "out" / "demo_replay" / os.path.basename(route)
  check = json.load(open(out / "check.json"))
  assert (out / "overlay.mp4").exists() and check["driver_frames"] == FRAMES and any(h.startswith("driverStateV2:") for h in check["heads"])
  assert (earlier / "check.json").read_text() == "an earlier route_replay's" and os.listdir(earlier) == ["check.json"]

def test_synthetic_route_appears_whole_or_not_at_all(tmp_path, monkeypatch, capsys):
  """Interrupted while encoding: no segment folder and no temporary one; a non-empty folder or a file is refused before any work."""
  from sunnypilot.modeld_v2.replay import synthetic_route
  def half_written(folder, *args, **kwargs):
    os.makedirs(folder)
    open(os.path.join(folder, "fcamera.hevc"), "wb").write(b"\0" * 10)
    raise KeyboardInterrupt
  monkeypatch.setattr(synthetic_route, "write_segment", half_written)
  assert synthetic_route.main([str(tmp_path / "seg"), "--frames", "2"]) == 130 and os.listdir(tmp_path) == []
  (tmp_path / "full").mkdir(), (tmp_path / "full" / "x").write_text("")
  (tmp_path / "file").write_text("")
  for target in ("full", "file"):
    with pytest.raises(SystemExit) as e: synthetic_route.main([str(tmp_path / target)])
    assert e.value.code == 2 and "is not an empty folder" in capsys.readouterr().err

def test_ctrl_c_while_drawing_says_what_was_written(route, native_artifacts, tmp_path, capsys, monkeypatch):
  """Ctrl-C while the overlay was drawn said 'no log written for the segment in progress' with a complete modeld_rlog.zst on disk."""
  from sunnypilot.modeld_v2.replay import route_overlay
  def interrupted(*args, **kwargs): raise KeyboardInterrupt
  monkeypatch.setattr(route_overlay, "write_overlay", interrupted)
  monkeypatch.setenv("OPENPILOT_PREFIX", "unused")  # main sets its own: restored after the test
  out = tmp_path / "out"
  with pytest.raises(SystemExit) as e: main([route, "--artifacts", native_artifacts, "--out", str(out)])
  err = capsys.readouterr().err.strip().splitlines()[-1]
  log = out / os.path.basename(route) / "modeld_rlog.zst"
  assert e.value.code == 130 and err == f"route_replay: interrupted: wrote {log} for {os.path.basename(route)}", err
  assert len([e for e in LogReader(str(log)) if e.which() == "modelV2"]) == FRAMES, "the log it names is whole"

def replay_processes(marker: str) -> list[int]:
  """Processes whose command line holds `marker` (a path unique to one test): the replays and their modelds."""
  pids = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try: cmdline = open(f"/proc/{pid}/cmdline", "rb").read()
    except OSError: continue
    if marker.encode() in cmdline and int(pid) != os.getpid(): pids.append(int(pid))
  return pids

@pytest.mark.parametrize("how", ["SIGTERM to route_replay", "Ctrl-C to its process group"])
def test_stopping_parallel_replays_stops_every_one(route, native_artifacts, tmp_path, how):
  """SIGTERM to `route_replay --jobs 2` ended the parent only: both child replays and their modelds ran on and wrote logs. Ctrl-C to the
  process group exited 2, each child blaming modeld ('modeld exited (130)'). Now both end every replay and modeld: 130 within 5 s,
  'interrupted'."""
  import signal
  import time
  artifacts = tmp_path / "artifacts"  # a path of this test's own: the processes it starts are found by it
  shutil.copytree(native_artifacts, artifacts)
  drive = tmp_path / "realdata"
  for k in range(3): shutil.copytree(route, drive / f"2026-12-03--04-00-00--{k}")
  proc = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.replay.route_replay", str(drive), "--artifacts", str(artifacts), "--jobs", "2",
                           "--no-pictures", "--out", str(tmp_path / "out")], cwd=ROOT, stderr=subprocess.PIPE, text=True, start_new_session=True)
  lines = []
  while len([line for line in lines if "frames 1344x760" in line]) < 2:  # both replays have their segment open
    assert (line := proc.stderr.readline()), "".join(lines)
    lines.append(line)
  if how.startswith("SIGTERM"): proc.send_signal(signal.SIGTERM)
  else: os.killpg(proc.pid, signal.SIGINT)
  assert proc.wait(timeout=5) == 130, "".join(lines)  # its report written, everything it started ended
  err = "".join(lines) + proc.stderr.read()
  deadline = time.monotonic() + 30
  while (left := replay_processes(str(artifacts))) and time.monotonic() < deadline: time.sleep(0.1)
  assert not left, f"still running: {left}\n{err}"
  assert "modeld exited" not in err and "Traceback" not in err, err
  assert err.count("route_replay: interrupted") == 3 and "1 not started" in err, err

def test_a_check_of_one_daemon_says_the_other_went_unchecked(route, dm_artifacts, both_artifacts, tmp_path, capsys, monkeypatch):
  """--dm-onnx without a driving-model reference, both daemons running: the summary said 'reference check over 24 frames ... PASSED' with
  no word that modeld's outputs went unchecked. Now it names the daemon it checked and the one it did not, and so do check.json and the
  record a fleet reads."""
  import json
  monkeypatch.setenv("OPENPILOT_PREFIX", "unused")  # main sets its own: restored after the test
  out, record = tmp_path / "out", tmp_path / "record.json"
  code = main([route, "--artifacts", both_artifacts, "--dm-onnx", os.path.join(dm_artifacts, "dmonitoring_model.onnx"), "--no-pictures",
               "--out", str(out), "--result", str(record)])
  stdout = capsys.readouterr().out
  assert code == 0 and f"reference check of dmonitoringmodeld over {FRAMES} driver frames, tolerance 0.001: PASSED" in stdout, stdout
  assert "NOT CHECKED: modeld's outputs (no driving-model reference: --onnx" in stdout, stdout
  check = json.loads((out / os.path.basename(route) / "check.json").read_text())
  assert check["checked"] == ["dmonitoringmodeld"] and list(check["unchecked"]) == ["modeld"] and check["passed"], check
  got = json.loads(record.read_text())
  assert got["status"] == "passed" and got["reason"].startswith("modeld not checked (no driving-model reference"), got
