"""modeld on real msgq/VisionIPC: a camerad stand-in (in this process, or fake_camerad processes), modeld in a subprocess, a subscriber here.
Frames in, messages out; frames after a drop; the output parse in the graph against the host's; the README's order and the demo."""
import os
import shutil
import signal
import subprocess
import sys
import uuid

import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon.status import FrameDrops
from sunnypilot.modeld_v2.model.constants import DT_MDL

import modeld_daemon
from conftest import ROOT
from modeld_daemon import SOF0, Daemon, check_fields, reference

artifacts, split_09, split_current = modeld_daemon.artifacts, modeld_daemon.split_09, modeld_daemon.split_current  # the daemon tests' fixtures, by name

def test_100_frames_in_100_frames_out(artifacts, openpilot_prefix):
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  slices = load_bundle(os.path.join(artifacts, "model.bin")).metadata["output_slices"]
  daemon = Daemon(artifacts)
  assert any("skipping" in line and "notes.bin" in line for line in daemon.lines), "the truncated unrelated bundle is skipped with one line"
  for frame_id in range(100):
    daemon.send(frame_id)
    msgs = daemon.receive(frame_id)
    m = msgs["modelV2"]
    assert (m.frameId, m.frameIdExtra, m.timestampEof) == (frame_id, frame_id, SOF0 + frame_id * 50_000_000 + 20_000_000)
    assert m.frameDropPerc == 0 and m.modelExecutionTime > 0
    assert msgs["cameraOdometry"].timestampEof == m.timestampEof and msgs["drivingModelData"].frameIdExtra == frame_id
    check_fields(msgs, slices, todays=True)
  assert daemon.stop() == 0, "SIGTERM is a clean exit"
  # the collector is off while frames run (openpilot's config_realtime_process): a reference cycle made per frame would never be freed
  assert daemon.left_no_cycles(), daemon.lines[-3:]
  made = [daemon.made_at[i] for i in range(100)]
  assert all(m["modelV2"] < min(m["drivingModelData"], m["cameraOdometry"]) for m in made), "modelV2 is made before the other two"
  assert all(daemon.messages[i]["modelV2"][1] for i in range(21, 100)), "valid once a calibration arrived (camerad's replay sends one per second)"
  assert [daemon.raw(i) for i in range(100)] == reference(artifacts, list(range(100))), "outputs equal the adapter run directly on the same frames"

def test_split_09_frames_in_messages_out(split_09, openpilot_prefix):
  """A 0.9.x vision+policy pair end to end: every frame published, host inputs filled by name as openpilot did, fields from its heads."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  slices = load_bundle(os.path.join(split_09, "model.bin")).metadata["output_slices"]
  core = max(os.sched_getaffinity(0))
  daemon = Daemon(split_09, args=("--core", str(core)))  # pinned as openpilot's modeld is on a device (SCHED_FIFO only there)
  assert os.sched_getaffinity(daemon.proc.pid) == {core} and any(f"pinned to core {core}" in line for line in daemon.lines)
  for frame_id in range(30):
    daemon.send(frame_id)
    check_fields(daemon.receive(frame_id), slices)
  assert daemon.stop() == 0 and daemon.published == list(range(30))
  assert not any("has no source" in line for line in daemon.lines), "every host input of the generation has a source"
  assert [daemon.raw(i) for i in range(30)] == reference(split_09, list(range(30))), "the same inputs as openpilot's modeld, frame by frame"

def expected_drop_perc(frame_ids: list[int]) -> list[float]:
  """openpilot selfdrive/modeld/modeld.py @6c6be47b main(), independently: filter min(dropped, 10) with rc=10 s at 20 Hz, zero for the
  first 10 runs; perc = 100 f / (1 + f)."""
  x, out, last, k = 0.0, [], None, DT_MDL / (10.0 + DT_MDL)
  for run, frame_id in enumerate(frame_ids):
    dropped = 0 if last is None else max(0, frame_id - last - 1)
    last = frame_id
    x = 0.0 if run < 10 else (1 - k) * x + k * min(dropped, 10)
    out.append(100 * x / (1 + x))
  return out

def test_todays_generation_publishes_the_frame_after_a_drop_with_drops_filtered(artifacts, openpilot_prefix):
  """Today's openpilot (selfdrive/modeld/modeld.py @084747c) runs and publishes every frame, the one after a drop too (prepare-only frames
  went in #38252): the native stand-in's frames after each gap are published, cameraOdometry invalid on them (fill_pose_msg's
  `vipc_dropped_frames < 1`), modelV2 valid, and frameDropPerc filtered as openpilot's FirstOrderFilter does."""
  daemon = Daemon(artifacts)
  sent = [i for i in range(40) if i not in (20, 21, 30)]
  for frame_id in sent: daemon.exchange([frame_id])
  assert daemon.stop() == 0 and daemon.left_no_cycles()
  assert daemon.published == sent, "every frame sent, published once, in order"
  expected = dict(zip(sent, expected_drop_perc(sent)))
  for frame_id in daemon.published:
    (m, valid), (d, _) = daemon.messages[frame_id]["modelV2"], daemon.messages[frame_id]["drivingModelData"]
    assert m.frameDropPerc == pytest.approx(expected[frame_id], rel=1e-4, abs=1e-6) and d.frameDropPerc == m.frameDropPerc
    assert daemon.messages[frame_id]["cameraOdometry"][1] == (valid and frame_id not in (22, 31)), frame_id
  assert daemon.messages[39]["modelV2"][0].frameDropPerc > 0.5 and daemon.messages[22]["modelV2"][1], "calibrated by frame 21: valid"
  assert not any("prepare-only" in line for line in daemon.lines)

def test_prepare_only_frames_run_the_gate(split_current, openpilot_prefix):
  """Today's layout: the frame after each gap runs with the gate on (only the image queues advance) and publishes nothing; every published
  output equals the bundle run directly on the same frames with the gate on exactly there."""
  daemon = Daemon(split_current)
  sent = [i for i in range(30) if i not in (10, 11, 20)]
  for frame_id in sent:
    daemon.send(frame_id)
    if frame_id in (12, 21): daemon.wait_for_line(f"frame {frame_id}: ")
    else: daemon.receive(frame_id)
  assert daemon.stop() == 0
  published = [i for i in sent if i not in (12, 21)]
  assert daemon.published == published
  outs = dict(zip(sent, reference(split_current, sent, prepare_only=(12, 21)), strict=True))
  assert [daemon.raw(i) for i in published] == [outs[i] for i in published]
  ungated = dict(zip(sent, reference(split_current, sent), strict=True))
  assert daemon.raw(13) != ungated[13], "the gate changed what the model saw after the drop"

def test_frame_drop_filter():
  drops = FrameDrops()
  ids = list(range(15)) + [18, 19, 20]
  assert [round(drops.update(i)[1], 9) for i in ids] == [round(x, 9) for x in expected_drop_perc(ids)]

def test_the_graph_parse_publishes_what_the_host_parse_does(artifacts, native_artifacts, tmp_path_factory, openpilot_prefix):
  """One model compiled with the output parse in its graph (the default) and with --host-parse (as bundles built before it), fed the same
  frames: each says once how it parses, and publishes the same fields of all three messages with the same values (floats within 1e-6
  relative: the graph's float32 arithmetic), the same raw outputs, and once both are calibrated the same valid flags."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.replay.reference_check import flatten
  host = tmp_path_factory.mktemp("host_parse")
  compile_model(str(host / "model.bin"), onnx=os.path.join(native_artifacts, "native.onnx"), log=lambda s: None, host_parse=True)
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), host / "warp_split.bin")
  published, said = [], []
  for folder in (artifacts, str(host)):
    daemon = Daemon(folder)
    daemon.exchange(range(30))
    assert daemon.stop() == 0
    published.append({i: {s: (flatten(m.to_dict()), valid) for s, (m, valid) in daemon.messages[i].items()} for i in range(30)})
    said.append("".join(daemon.lines))
  assert said[0].count("the output parse runs in the model's graph") == 1 and "parsed on the host" not in said[0]
  assert said[1].count("has no output parse in its graph") == 1
  for i in range(30):
    for service, (graph, valid) in published[0][i].items():
      hosted, host_valid = published[1][i][service]
      assert graph.keys() == hosted.keys() and (valid == host_valid or i < 21), f"frame {i} {service}"  # calibrated by frame 21 in both
      for path, value in graph.items():
        if path == "modelExecutionTime": continue  # the time each took
        if isinstance(value, float) or (isinstance(value, list) and value and isinstance(value[0], float)):
          np.testing.assert_allclose(value, hosted[path], rtol=1e-6, atol=1e-37, err_msg=f"frame {i} {service}.{path}")
        else: assert value == hosted[path], f"frame {i} {service}.{path}"

def test_readme_order_fake_camerad_first(artifacts):
  """The README starts fake_camerad, then modeld, under a fresh OPENPILOT_PREFIX whose folder does not exist yet."""
  prefix = f"sp_test_{uuid.uuid4().hex[:10]}"
  env = os.environ | {"OPENPILOT_PREFIX": prefix, "PYTHONUNBUFFERED": "1"}
  replay = subprocess.Popen([sys.executable, "-m", "sunnypilot.modeld_v2.replay.fake_camerad", "--camera", "1344x760"], cwd=ROOT, env=env,
                            stderr=subprocess.PIPE, text=True)
  try:
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--max-frames", "5"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "exiting after 5 published frames" in out.stderr, out.stderr
    assert replay.poll() is None, f"fake_camerad died ({replay.returncode})"
  finally:
    replay.send_signal(signal.SIGTERM)
    code = replay.wait(timeout=20)
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  assert code == 0

def test_demo_runs(artifacts, native_artifacts, dm_artifacts, tmp_path):
  """Both daemons on the demo's folder: modeld's bundles and dmonitoringmodeld's, each beside the stand-in it records it was built from."""
  folder = tmp_path / "artifacts"
  folder.mkdir()
  shutil.copy(os.path.join(artifacts, "model.bin"), folder / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "native.onnx"), folder / "native_tiny_stand_in.onnx")
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), folder / "warp_1344x760_split.bin")
  for src, dst in (("dmonitoring_model.bin", "dmonitoring_model.bin"), ("dmonitoring_model.onnx", "dmonitoring_tiny_stand_in.onnx"),
                   ("dm_warp_1344x760.bin", "dm_warp_1344x760.bin")): shutil.copy(os.path.join(dm_artifacts, src), folder / dst)
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.tools.demo", "--frames", "20", "--camera", "1344x760", "--artifacts", str(folder),
                        "--out", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stdout + out.stderr
  assert "frames out (modelV2 published):   20" in out.stdout and "random-weight stand-in" in out.stdout
  assert "frames out (driverStateV2 published): 20, 0 with valid=False" in out.stdout, out.stdout
  assert "modeld exit code 0, dmonitoringmodeld exit code 0, fake_camerad exit code 0" in out.stdout
  assert "compiling" not in out.stderr, "the demo reused the prebuilt bundles"
  assert (tmp_path / "demo_latency.png").stat().st_size > 1000 and (tmp_path / "demo_preview.png").stat().st_size > 1000
