import os
from types import SimpleNamespace

import pytest

from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.format.bundle import write_bundle
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
from sunnypilot.modeld_v2.tools.inspect_bundle import main

from conftest import conv_net

def test_inspect_and_verify(tmp_path, capsys):
  fn, make = conv_net()
  _, (header, blob), _ = capture(fn, make)
  good, bad, corrupt = str(tmp_path / "good.bin"), str(tmp_path / "bad.bin"), str(tmp_path / "corrupt.bin")
  write_bundle(good, {"run": (header, blob)}, {"metadata": {"kind": "test"}})
  assert main(["inspect", good]) == 0
  out = capsys.readouterr().out
  binaries = len({tuple(p["lib"]) for p in header["programs"]})
  assert f"built with {imported_tinygrad()} for CPU" in out and f"{len(header['programs'])} programs ({binaries} binaries)" in out and "check: seed 0" in out
  assert main(["verify", good]) == 0 and "PASS run: return[0]" in capsys.readouterr().out
  wrong = header | {"check": header["check"] | {"outputs": {k: "0" * 64 for k in header["check"]["outputs"]}}}
  write_bundle(bad, {"run": (wrong, blob)}, {})  # a valid file whose recorded results differ from what it computes
  assert main(["verify", bad]) == 1 and "FAIL run: return[0]" in capsys.readouterr().out
  with open(good, "rb") as f: data = f.read()
  with open(corrupt, "wb") as f: f.write(data[:-10])
  assert main(["verify", corrupt]) == 2 and "truncated" in capsys.readouterr().err

def test_inspect_prints_each_inputs_role(native_artifacts, capsys):
  assert main(["inspect", f"{native_artifacts}/model.bin"]) == 0
  lines = {line.split()[1]: line.split()[-1] for line in capsys.readouterr().out.splitlines() if line.startswith("  input ")}
  assert lines == {"new_img": "frames", "desire": "host", "traffic_convention": "host", "action_t": "host", "state_feat_q": "state"}

def test_inspect_shows_the_generation_recorded_or_derived(native_artifacts, tmp_path, capsys):
  from sunnypilot.modeld_v2.format.bundle import read_parts
  assert main(["inspect", f"{native_artifacts}/model.bin"]) == 0
  assert "  generation: native (recorded, from the ONNX): today's: " in capsys.readouterr().out
  parts, extras = read_parts(f"{native_artifacts}/model.bin")  # a bundle from before generations were recorded
  extras["metadata"] = {k: v for k, v in extras["metadata"].items() if not k.startswith("generation")}
  write_bundle(old := str(tmp_path / "old.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras)
  assert main(["inspect", old]) == 0
  assert "  generation: native (derived: the bundle records none)" in capsys.readouterr().out

def test_inspect_says_where_the_output_parse_runs(native_artifacts, tmp_path, capsys):
  from sunnypilot.modeld_v2.format.bundle import read_parts
  assert main(["inspect", f"{native_artifacts}/model.bin"]) == 0
  assert "  output parse: in the graph: message_floats holds modelV2 1440, drivingModelData 19, cameraOdometry 24 floats" in capsys.readouterr().out
  parts, extras = read_parts(f"{native_artifacts}/model.bin")  # as a bundle from before the parse was in the graph records it
  extras["metadata"] = {k: v for k, v in extras["metadata"].items() if k != "message_floats"}
  write_bundle(old := str(tmp_path / "old.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras)
  assert main(["inspect", old]) == 0
  assert "  output parse: on the host (built before the parse was in the graph, or with --host-parse)" in capsys.readouterr().out
def test_profile_reports_each_kernels_flops_bytes_time_and_roofline(tmp_path, capsys):
  """A bundle of one (64x128) @ (128x32) float32 matmul: tinygrad's estimates recorded with the kernel must be its FLOPs (2*M*N*K, one
  multiply and one add per term) and at least the bytes of its operands and result, each once; the bound is max(FLOPs/peak, bytes/peak)."""
  import json

  import numpy as np

  from conftest import realized
  rng = np.random.default_rng(0)
  w = realized(rng.standard_normal((128, 32)).astype(np.float32))
  _, (header, blob), _ = capture(lambda x: (x @ w).contiguous(), lambda: {"x": realized(rng.standard_normal((64, 128)).astype(np.float32))})
  path, out = str(tmp_path / "mm.bin"), str(tmp_path / "profile.json")
  write_bundle(path, {"run": (header, blob)}, {"input_specs": {"x": [[64, 128], "<f4", "CPU"]}, "output_specs": {}})
  assert main(["profile", path, "--rounds", "3", "--peak-tflops", "0.001", "--peak-tbs", "0.0001", "--json", out]) == 0
  text = capsys.readouterr().out
  result = json.load(open(out))
  kernels = [c for c in result["calls"] if c["name"] != "copy"]
  assert len(kernels) == 1 and "roofline lower bound" in text and kernels[0]["name"] in text
  k = kernels[0]
  assert k["ops"] == 2 * 64 * 128 * 32
  assert k["bytes"] >= 4 * (64 * 128 + 128 * 32 + 64 * 32)
  assert k["s"] > 0 and k["bound_s"] == max(k["ops"] / 1e9, k["bytes"] / 1e8) and abs(k["flops_per_s"] - k["ops"] / k["s"]) < 1e-6 * k["flops_per_s"]

def test_profile_refuses_bad_peaks(tmp_path, capsys):
  import pytest
  with pytest.raises(SystemExit) as e: main(["profile", str(tmp_path / "none.bin"), "--peak-tflops", "0"])
  assert e.value.code == 2 and "argument --peak-tflops: expected a number above 0" in capsys.readouterr().err

def test_errors_are_one_line_named_for_the_command_and_the_file_at_fault(native_artifacts, tmp_path, capsys):
  """inspect_bundle's errors had no `inspect_bundle: error:` prefix; `profile --warp missing.bin` blamed the model bundle."""
  model, missing = f"{native_artifacts}/model.bin", str(tmp_path / "missing.bin")
  assert main(["profile", model, "--warp", missing]) == 2
  assert capsys.readouterr().err == f"inspect_bundle: error: {missing}: cannot read: No such file or directory\n"
  assert main(["verify", missing]) == 2
  assert capsys.readouterr().err == f"inspect_bundle: error: {missing}: cannot read: No such file or directory\n"

# openpilot's driver-monitoring heads (selfdrive/modeld/dmonitoringmodeld.py's parse, the current layout) as [start:stop] in its 545 floats
DM_SLICES = {"face_descs_lhd": (0, 12), "face_prob_lhd": (12, 13), "eyes_visible_prob_lhd": (13, 14), "eyes_closed_prob_lhd": (14, 15),
             "using_phone_prob_lhd": (15, 16), "face_descs_rhd": (16, 28), "face_prob_rhd": (28, 29), "eyes_visible_prob_rhd": (29, 30),
             "eyes_closed_prob_rhd": (30, 31), "using_phone_prob_rhd": (31, 32), "wheel_on_right": (32, 33), "features": (33, 545)}

def test_inspect_of_a_compile_onnx_bundle_shows_its_output_slices_as_data(tmp_path, capsys):
  """compile_onnx records the ONNX's metadata: inspect printed comma's output_slices as the 600-character base64 pickle."""
  from sunnypilot.modeld_v2.compile import compile_onnx
  from sunnypilot.modeld_v2.tools import stand_in_models
  stand_in_models.write("dmonitoring", "tiny", str(tmp_path / "dm.onnx"))
  assert compile_onnx.main(["--onnx", str(tmp_path / "dm.onnx"), "--output", str(tmp_path / "dm.bin")]) == 0
  capsys.readouterr()
  assert main(["inspect", str(tmp_path / "dm.bin")]) == 0
  out = capsys.readouterr().out
  assert max(len(line) for line in out.splitlines()) < 200 and "gASV" not in out, out
  assert "  onnx metadata output_slices (comma's pickled slices, read as data): 12 heads, 545 floats" in out
  heads = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith("    ") and line.strip().endswith("]")}
  assert heads == {name: f"[{a}:{b}]" for name, (a, b) in DM_SLICES.items()}
  assert "  output outputs                  (1, 545)" in out

def test_a_pickle_that_would_run_code_is_never_run(tmp_path):
  """output_slices comes from the ONNX: a pickle calling os.remove is named as not comma's slices, and nothing runs."""
  import base64
  import pickle

  from sunnypilot.modeld_v2.tools.inspect_bundle import onnx_metadata_lines
  victim = tmp_path / "victim"
  victim.write_text("precious")
  class Remove:
    def __reduce__(self): return (os.remove, (str(victim),))
  lines = onnx_metadata_lines({"output_slices": base64.b64encode(pickle.dumps({"head": Remove()})).decode(), "note": "x" * 600})
  assert victim.exists() and "that are not comma's pickled slices (output_slices may only hold dicts and slices, found posix.remove)" in lines[0]
  assert lines[1] == "  onnx metadata note: 600 characters, not shown"

def test_inspect_of_a_folder_lists_its_bundles(native_artifacts, tmp_path, capsys):
  """inspect refused a folder; it lists each bundle's kind, device, size, content hash and whether it is signed."""
  import shutil

  from sunnypilot.modeld_v2.format.bundle import content_digest
  from sunnypilot.modeld_v2.tools import sign_bundle
  folder = tmp_path / "set"
  shutil.copytree(native_artifacts, folder, ignore=shutil.ignore_patterns("*.onnx"))
  assert sign_bundle.main(["--generate-key", str(tmp_path / "k.pem")]) == 0
  assert sign_bundle.main(["--key", str(tmp_path / "k.pem"), str(folder / "warp_packed.bin")]) == 0
  (folder / "notes.bin").write_bytes(b"not a bundle")
  capsys.readouterr()
  assert main(["inspect", str(folder)]) == 0
  rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
  size = lambda name: f"{os.path.getsize(folder / name):,}"
  digest = lambda name: content_digest(str(folder / name))[:16]
  assert rows["model.bin"][1:5] == ["model", "CPU", size("model.bin"), digest("model.bin")] and rows["model.bin"][5:] == ["unsigned"]
  assert rows["warp_split.bin"][1:6] == ["warp", "CPU", size("warp_split.bin"), digest("warp_split.bin"), "unsigned"]
  assert rows["warp_packed.bin"][5:8] == ["signed", "by", "key"]
  assert rows["notes.bin"][1:4] == ["not", "a", "bundle:"]
  assert main(["verify", str(folder)]) == 2 and "is a folder: inspect lists its bundles, verify takes one" in capsys.readouterr().err

def test_inspect_shows_the_precision_and_verify_replays_a_float16_bundle(native_artifacts, tmp_path, capsys):
  """A float16 bundle says so, with its weights' bytes as half; a float32 one and a warp say theirs; verify replays the half kernels'
  recorded check bit for bit; a precision the reader does not know is refused in one line."""
  from sunnypilot.modeld_v2.compile.compile_onnx import compile_onnx
  from sunnypilot.modeld_v2.format.bundle import read_parts
  from sunnypilot.modeld_v2.tools import stand_in_models
  onnx = stand_in_models.write("dmonitoring", "tiny", str(tmp_path / "dm.onnx"), seed=1)["files"]["onnx"]
  half = compile_onnx(str(tmp_path / "dm16.bin"), onnx, log=lambda s: None, precision="float16")["output"]
  assert main(["inspect", half]) == 0
  line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  precision: "))
  assert line.startswith("  precision: float16 (weights and activations in half") and "initial buffers: half " in line, line
  assert main(["verify", half]) == 0 and "PASS run: " in capsys.readouterr().out
  assert main(["inspect", f"{native_artifacts}/model.bin"]) == 0 and "  precision: float32 (the ONNX's own dtypes)" in capsys.readouterr().out
  assert main(["inspect", f"{native_artifacts}/warp_split.bin"]) == 0 and "  precision: float32 (a warp: " in capsys.readouterr().out
  parts, extras = read_parts(half)
  write_bundle(odd := str(tmp_path / "odd.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()},
               extras | {"metadata": extras["metadata"] | {"precision": "bfloat16"}}, check=False)
  assert main(["inspect", odd]) == 2 and "precision 'bfloat16' is none of ('float32', 'float16')" in capsys.readouterr().err

def test_profile_runs_the_driver_monitoring_frame(dm_artifacts, tmp_path, capsys):
  """`profile dmonitoring_model.bin --warp dm_warp.bin` fed the road cameras' pair to a pair that reads the driver camera alone, and raised
  'copy_frames() has not been given its camera frame yet'. Now every call of the fused frame is timed: the warp's kernels, then the model's."""
  import json

  from sunnypilot.modeld_v2.format.bundle import read_parts
  out = str(tmp_path / "dm_profile.json")
  model, warp = f"{dm_artifacts}/dmonitoring_model.bin", f"{dm_artifacts}/dm_warp_1344x760.bin"
  assert main(["profile", model, "--warp", warp, "--rounds", "1", "--json", out]) == 0
  result = json.load(open(out))
  names = [c["name"] for c in result["calls"] if c["name"] != "copy"]
  expected = [h.programs[c.program].name for path in (warp, model) for h, _ in read_parts(path)[0].values() for c in h.calls if c.kind == "program"]
  assert sorted(names) == sorted(expected) and result["what"] == "the warp fused in front of the model (frames uploaded)"
  assert "dmonitoring_model.bin" in capsys.readouterr().err

def test_peaks_preset_picks_each_kernels_rate_by_its_arithmetic(dm_artifacts, tmp_path, capsys):
  """--peaks h200: a float16 bundle's kernels that read or write half are bounded by the H200's dense FP16 tensor-core rate (1,979 TFLOP/s
  with sparsity: 989.5 dense), the float32 ones (the warp's coordinates) by its 67 TFLOP/s FP32; bytes by 4.8 TB/s."""
  import json

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  half = str(tmp_path / "dm16.bin")
  compile_model(half, onnx=f"{dm_artifacts}/dmonitoring_model.onnx", log=lambda s: None, precision="float16")
  out = str(tmp_path / "p.json")
  assert main(["profile", half, "--warp", f"{dm_artifacts}/dm_warp_1344x760.bin", "--rounds", "1", "--peaks", "h200", "--json", out]) == 0
  calls = [c for c in json.load(open(out))["calls"] if c["name"] != "copy"]
  kinds = {c["arithmetic"] for c in calls}
  assert kinds == {"fp16", "fp32"}, kinds  # the conv layers in half; the warp (uint8 in and out, float32 coordinates) and casts in float
  for c in calls:
    assert c["peak_flops"] == (989.5e12 if c["arithmetic"] == "fp16" else 67e12)
    assert c["bound_s"] == max(c["ops"] / c["peak_flops"], c["bytes"] / 4.8e12)
  assert "NVIDIA H200 Tensor Core GPU datasheet" in capsys.readouterr().out
  with pytest.raises(SystemExit) as e: main(["profile", half, "--peaks", "h200", "--peak-tflops", "67"])
  assert e.value.code == 2 and "--peaks sets the peaks" in capsys.readouterr().err

def test_tensor_cores_are_read_from_a_cuda_kernels_ptx():
  """tinygrad 0.14.0's CUDA tensor-core kernels issue these instructions (as rendered for sm_90 with TC_OPT=1, and ALLOW_TF32=1 for float)."""
  from sunnypilot.modeld_v2.format.part import Param
  from sunnypilot.modeld_v2.tools.kernel_profile import PEAKS, arithmetic
  half, single = (SimpleNamespace(signature=(Param("data0", 0, dt, (4,)), Param("data1", 1, dt, (4,)))) for dt in ("dtypes.half", "dtypes.float"))
  fp16_mma = b'asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, ...")'
  tf32_mma = b'asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, ...")'
  assert arithmetic(half, fp16_mma) == ("fp16", "fp16") and arithmetic(half, b"ld.global.b16") == ("fp16", None)
  assert arithmetic(single, tf32_mma) == ("fp32", "tf32") and arithmetic(single, b"fma.rn.f32") == ("fp32", None)
  h200 = PEAKS["h200"]
  assert arithmetic(single, tf32_mma).peak(h200) == 494.5e12 and arithmetic(single, b"").peak(h200) == 67e12
  assert arithmetic(half, b"").peak(h200) == arithmetic(half, fp16_mma).peak(h200) == 989.5e12
