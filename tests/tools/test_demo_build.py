"""The demo's rebuild rule: a bundle is reused only when its header records the same sources by content (the sha256 compile_modeld writes)
and the same build settings (a model given by another name or with other bytes, another FLOAT16, a bundle with another record: rebuilt,
saying why in one line); a missing model file is exit 2 before any work; a failed run leaves no folder it made. The compilers are
stand-ins that write a bundle header recording what the real ones record (the rule is about when they run, not what they make)."""
import hashlib
import os

import pytest
from tinygrad.helpers import Context

from sunnypilot.modeld_v2 import compile_dm_warp, compile_modeld, compile_warp
from sunnypilot.modeld_v2.compile.onnx_model import ModelError
from sunnypilot.modeld_v2.format.bundle import write_bundle
from sunnypilot.modeld_v2.tools import demo

CAMERA = (1344, 760)

def sha256(path) -> str: return hashlib.sha256(open(path, "rb").read()).hexdigest()

@pytest.fixture
def compiles(monkeypatch) -> list[str]:
  """Both compilers replaced by ones that write an empty bundle with the metadata the real ones record (sources by content; the warp's
  frame, size and layout), under this process's provenance; returns the outputs compiled, in order."""
  done = []
  def model(output, log=None, **sources):
    done.append(os.path.basename(output))
    meta = {"kind": "model", "source_sha256": {k: sha256(p) for k, p in sources.items() if p}}  # compile_modeld records them by keyword
    write_bundle(output, {"run": ({"device": "CPU"}, bytes(16))}, {"metadata": meta}, check=False)
  def warp(spec, size, output, split_frames=False):
    done.append(os.path.basename(output))
    meta = {"kind": "warp", "frame": spec, "model_size": [int(x) for x in size.split("x")], "split_frames": split_frames}
    write_bundle(output, {"run": ({"device": "CPU"}, bytes(16))}, {"metadata": meta}, check=False)
  def dm_warp(spec, output, warp_to=None, border_fill=16, log=None):
    done.append(os.path.basename(output))
    meta = {"kind": "dm_warp", "frame": spec, "model_size": [1440, 960], "border_fill": border_fill}
    write_bundle(output, {"run": ({"device": "CPU"}, bytes(16))}, {"metadata": meta}, check=False)
  monkeypatch.setattr(compile_modeld, "compile_model", model)
  monkeypatch.setattr(compile_warp, "compile_warp", warp)
  monkeypatch.setattr(compile_dm_warp, "compile_dm_warp", dm_warp)
  return done

def build(folder, models: dict, generation: str = "native") -> list[str]:
  lines = []
  demo.build_artifacts(str(folder), CAMERA, generation, "tiny", {k: str(v) for k, v in models.items()}, lines.append)
  return lines

def rebuilds(lines: list[str]) -> list[str]: return [line for line in lines if line.startswith("rebuilding")]

def test_the_model_is_rebuilt_when_its_sources_content_changes_and_only_then(tmp_path, compiles):
  folder, a, b = tmp_path / "artifacts", tmp_path / "a.onnx", tmp_path / "other.onnx"
  a.write_bytes(b"model A"), b.write_bytes(b"model B")
  assert rebuilds(build(folder, {"onnx": a})) == [] and compiles == ["model.bin", "warp_1344x760_split.bin"]
  assert rebuilds(build(folder, {"onnx": a})) == [] and len(compiles) == 2, "same inputs, same settings: reused"
  lines = rebuilds(build(folder, {"onnx": b}))
  said = f"source_sha256 {{'onnx': '{sha256(a)[:12]}'}}, this run builds {{'onnx': '{sha256(b)[:12]}'}}"
  assert compiles[2:] == ["model.bin"] and len(lines) == 1 and said in lines[0], lines
  b.write_bytes(b"model C")  # the same name, other bytes
  assert len(rebuilds(build(folder, {"onnx": b}))) == 1 and compiles[3:] == ["model.bin"]
  assert len(rebuilds(build(folder, {"vision": a, "policy": b}))) == 1, "another kind of model"
  assert rebuilds(build(folder, {"policy": b, "vision": a})) == [], "the same files in the same roles, given in another order"
  assert len(rebuilds(build(folder, {"vision": b, "policy": a}))) == 1, "the same files in swapped roles: another model"
  assert compiles.count("warp_1344x760_split.bin") == 1, "the warp's inputs never changed"

def test_other_build_flags_rebuild_both_bundles(tmp_path, compiles):
  folder, a = tmp_path / "artifacts", tmp_path / "a.onnx"
  a.write_bytes(b"model A")
  build(folder, {"onnx": a})
  with Context(FLOAT16=1): lines = rebuilds(build(folder, {"onnx": a}))
  assert len(lines) == 2 and all("it records build.flags.FLOAT16 0, this run builds 1" in line for line in lines), lines
  assert compiles == ["model.bin", "warp_1344x760_split.bin"] * 2
  assert len(rebuilds(build(folder, {"onnx": a}))) == 2, "and back"

def test_a_bundle_with_another_record_or_none_is_rebuilt(tmp_path, compiles):
  """Bundles the demo did not build are judged by the same rule: what their header records (a model built from native.onnx, run with
  --onnx other.onnx, is rebuilt; one that is not a bundle at all, too)."""
  folder, native, other = tmp_path / "artifacts", tmp_path / "native.onnx", tmp_path / "other.onnx"
  native.write_bytes(b"N"), other.write_bytes(b"O")
  build(folder, {"onnx": native})
  assert rebuilds(build(folder, {"onnx": other})) and compiles[-1] == "model.bin"
  (folder / "model.bin").write_bytes(b"something compiled by hand, long enough for a preamble")
  lines = rebuilds(build(folder, {"onnx": other}))
  assert len(lines) == 1 and "it is unreadable" in lines[0] and "not a modeld_v2 bundle" in lines[0], lines
  data = bytearray((folder / "model.bin").read_bytes())
  data[-1] ^= 1  # damaged, its header intact
  (folder / "model.bin").write_bytes(data)
  lines = rebuilds(build(folder, {"onnx": other}))
  assert len(lines) == 1 and "content hash mismatch" in lines[0], lines

def test_the_stand_in_is_written_once_and_its_bundle_follows_it(tmp_path, compiles):
  folder = tmp_path / "artifacts"
  build(folder, {})
  stand_in = folder / "native_tiny_stand_in.onnx"
  assert stand_in.exists() and compiles == ["model.bin", "warp_1344x760_split.bin"]
  assert rebuilds(build(folder, {})) == [] and len(compiles) == 2
  stand_in.write_bytes(stand_in.read_bytes() + b"\0")
  assert len(rebuilds(build(folder, {}))) == 1, "a stand-in that changed: the bundle built from it is rebuilt"
  lines = build(folder, {}, generation="split_09")
  assert (folder / "split_09_tiny_stand_in_vision.onnx").exists() and compiles[-1] == "model.bin" and len(rebuilds(lines)) == 1, lines

def test_a_missing_model_file_is_exit_2_before_any_work_and_makes_no_folder(tmp_path, capsys, monkeypatch):
  def forbidden(*args, **kwargs): raise AssertionError("work started")
  monkeypatch.setattr(demo, "build_artifacts", forbidden)
  (tmp_path / "folder").mkdir()
  for argv, message in ((["--onnx", str(tmp_path / "missing.onnx")], "--onnx"), (["--vision", str(tmp_path / "folder"), "--policy", "p.onnx"], "--vision")):
    with pytest.raises(SystemExit) as e: demo.main(argv + ["--out", str(tmp_path / "out"), "--artifacts", str(tmp_path / "new" / "artifacts")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith(f"modeld_demo: error: {message} "), err
  assert sorted(os.listdir(tmp_path)) == ["folder"]

def test_a_failed_build_leaves_no_folder_it_made(tmp_path, capsys, monkeypatch):
  def bad_model(*args, **kwargs): raise ModelError("x.onnx: not a readable ONNX model")
  monkeypatch.setattr(compile_modeld, "compile_model", bad_model)
  (tmp_path / "x.onnx").write_bytes(b"junk")
  (tmp_path / "out").mkdir()
  with pytest.raises(SystemExit) as e:
    demo.main(["--onnx", str(tmp_path / "x.onnx"), "--out", str(tmp_path / "out"), "--artifacts", str(tmp_path / "new" / "artifacts")])
  assert e.value.code == 2 and "not a readable ONNX model" in capsys.readouterr().err
  assert sorted(os.listdir(tmp_path)) == ["out", "x.onnx"] and os.listdir(tmp_path / "out") == [], "the folders it made are gone, --out stays"

def test_the_latency_plot_leaves_dropped_frames_as_gaps():
  import numpy as np
  rows = [{"frameId": i, "ms": float(i)} for i in (10, 11, 14, 15)]
  ids, ms = demo.latency_series(rows)
  assert ids.tolist() == [10, 11, 12, 13, 14, 15] and np.isnan(ms[2:4]).all() and ms[[0, 1, 4, 5]].tolist() == [10.0, 11.0, 14.0, 15.0]

def test_the_driver_monitoring_pair_follows_the_same_rule(tmp_path, compiles):
  """dmonitoring_model.bin (the DM stand-in, else --dm-onnx) and the camera's dm_warp beside the driving model's bundles: each built once,
  rebuilt when its own sources or the settings change, never because the other daemon's changed."""
  folder, real = tmp_path / "artifacts", tmp_path / "dm.onnx"
  real.write_bytes(b"a driver-monitoring model")
  dm = lambda dm_onnx=None: lines_of(demo.build_dm_artifacts, str(folder), CAMERA, "tiny", dm_onnx)
  assert rebuilds(dm()) == [] and compiles == ["dmonitoring_model.bin", "dm_warp_1344x760.bin"] and (folder / "dmonitoring_tiny_stand_in.onnx").exists()
  build(folder, {})
  assert rebuilds(dm()) == [] and compiles[2:] == ["model.bin", "warp_1344x760_split.bin"], "the driving model's bundles do not touch the DM pair"
  lines = rebuilds(dm(str(real)))
  assert compiles[4:] == ["dmonitoring_model.bin"] and len(lines) == 1 and f"this run builds {{'onnx': '{sha256(real)[:12]}'}}" in lines[0], lines
  with Context(FLOAT16=1): assert len(rebuilds(dm(str(real)))) == 2 and compiles[5:] == ["dmonitoring_model.bin", "dm_warp_1344x760.bin"]
  assert rebuilds(build(folder, {})) == [] and len(compiles) == 7, "the DM pair's rebuilds leave the driving model's bundles alone"

def lines_of(function, *args) -> list[str]:
  lines = []
  function(*args, lines.append)
  return lines

@pytest.fixture(scope="module")
def segments(tmp_path_factory) -> dict[str, str]:
  """Two tiny synthetic segments of a comma 4: one with a driver camera video, one without."""
  from sunnypilot.modeld_v2.replay.synthetic_route import write_segment
  folder = tmp_path_factory.mktemp("segments")
  for name, driver in (("driver", True), ("road_only", False)): write_segment(str(folder / name), CAMERA, 2, driver=driver)
  return {"driver": str(folder / "driver"), "road_only": str(folder / "road_only")}

def test_demo_route_builds_both_daemons_artifacts_and_replays_into_its_own_folder(tmp_path, compiles, segments, monkeypatch):
  """demo --route built the camera warp only, passed no --dm-onnx and wrote into route_replay's own out/replay. With a driver camera video
  the DM pair is built too and its ONNX is the reference; --no-dm leaves it out."""
  from sunnypilot.modeld_v2.replay import route_replay
  calls = []
  monkeypatch.setattr(route_replay, "main", lambda argv: calls.append(argv) or 0)
  out, folder = tmp_path / "out", tmp_path / "artifacts"
  assert demo.main(["--route", segments["driver"], "--out", str(out), "--artifacts", str(folder)]) == 0
  assert compiles == ["model.bin", "warp_1344x760_split.bin", "dmonitoring_model.bin", "dm_warp_1344x760.bin"]
  assert calls[0][:5] == [segments["driver"], "--artifacts", str(folder), "--out", str(out / "demo_replay")]
  assert calls[0][5:] == [f"--onnx={folder / 'native_tiny_stand_in.onnx'}", f"--dm-onnx={folder / 'dmonitoring_tiny_stand_in.onnx'}"]
  assert demo.main(["--route", segments["driver"], "--out", str(out), "--artifacts", str(tmp_path / "modeld_only"), "--no-dm"]) == 0
  assert compiles[4:] == ["model.bin", "warp_1344x760_split.bin"] and not any(a.startswith("--dm-onnx") for a in calls[1])
  assert demo.main(["--route", segments["road_only"], "--out", str(out), "--artifacts", str(folder)]) == 0
  assert len(compiles) == 6 and not any(a.startswith("--dm-onnx") for a in calls[2]), "no driver video: no dmonitoringmodeld"

def test_demo_route_dm_onnx_needs_a_driver_camera_video(tmp_path, capsys, segments, monkeypatch):
  def forbidden(*args, **kwargs): raise AssertionError("work started before the arguments were checked")
  monkeypatch.setattr(demo, "build_artifacts", forbidden)
  (onnx := tmp_path / "dm.onnx").write_bytes(b"a driver-monitoring model")
  with pytest.raises(SystemExit) as e: demo.main(["--route", segments["road_only"], "--dm-onnx", str(onnx), "--out", str(tmp_path / "out")])
  err = capsys.readouterr().err.strip().splitlines()
  assert e.value.code == 2 and err == [f"modeld_demo: error: --dm-onnx: {segments['road_only']} has no driver camera video (dcamera.hevc) for "
                                       "dmonitoringmodeld to run on"], err
  assert not (tmp_path / "out").exists()
