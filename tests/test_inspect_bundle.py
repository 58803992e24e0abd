
from sunnypilot.modeld_v2.bundle import write_bundle
from sunnypilot.modeld_v2.capture import capture
from sunnypilot.modeld_v2.inspect_bundle import main

from conftest import conv_net

def test_inspect_and_verify(tmp_path, capsys):
  fn, make = conv_net()
  _, (header, blob), _ = capture(fn, make)
  good, bad, corrupt = str(tmp_path / "good.bin"), str(tmp_path / "bad.bin"), str(tmp_path / "corrupt.bin")
  write_bundle(good, {"run": (header, blob)}, {"metadata": {"kind": "test"}})
  assert main(["inspect", good]) == 0
  out = capsys.readouterr().out
  assert "tinygrad 0.14.0 for CPU" in out and "program" in out and f"{len(header['programs'])} distinct programs" in out and "check: seed 0" in out
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
  from sunnypilot.modeld_v2.bundle import read_parts
  assert main(["inspect", f"{native_artifacts}/model.bin"]) == 0
  assert "  generation: native (recorded, from the ONNX): 0.10 on" in capsys.readouterr().out
  parts, extras = read_parts(f"{native_artifacts}/model.bin")  # a bundle from before generations were recorded
  extras["metadata"] = {k: v for k, v in extras["metadata"].items() if not k.startswith("generation")}
  write_bundle(old := str(tmp_path / "old.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras)
  assert main(["inspect", old]) == 0
  assert "  generation: native (derived: the bundle records none)" in capsys.readouterr().out
