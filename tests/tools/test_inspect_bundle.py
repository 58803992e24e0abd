
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
  assert "  generation: native (recorded, from the ONNX): 0.10 on" in capsys.readouterr().out
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
