"""QCOM cross-compiled on x86 (tinymesa's IR3 compiler on DEV=NULL:IR3:a630), then mock-executed on NULL through the real loader."""
import importlib.util

import pytest

from sunnypilot.modeld_v2.model.camera_frame import camerad_frame

from conftest import NO_COMPILE, run_python

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tinymesa") is None, reason="tinymesa (the qcom extra) is not installed")
QCOM = {"DEV": "NULL:IR3:a630", "IMAGE": "1", "FLOAT16": "1", "NOLOCALS": "1", "JIT_BATCH_SIZE": "0"}
FRAME = camerad_frame(1344, 760)

@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("qcom")
  paths = {"split": str(tmp / "warp_split.bin"), "packed": str(tmp / "warp_packed.bin"), "model": str(tmp / "model.bin")}
  run_python(f"""
from sunnypilot.modeld_v2.tools import stand_in_models
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.compile_warp import compile_warp
compile_warp({FRAME.spec!r}, "512x256", {paths['split']!r}, split_frames=True)
compile_warp({FRAME.spec!r}, "512x256", {paths['packed']!r})
stand_in_models.write("native", "tiny", {str(tmp / 'model.onnx')!r})
compile_model({paths['model']!r}, onnx={str(tmp / 'model.onnx')!r}, log=lambda s: None)
""", env=QCOM)
  return paths

def test_bundles_say_they_are_for_adreno(bundles):
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  for path in bundles.values():
    prov = read_bundle(path)[0]["provenance"]
    assert (prov["device"], prov["target"]) == ("QCOM", "QCOM:IR3:a630") and prov["flags"] | {"IMAGE": 1, "FLOAT16": 1, "NOLOCALS": 1} == prov["flags"]
    assert prov["flags"]["JIT_BATCH_SIZE"] == 0

def test_the_devices_flags_build_the_model_in_float16(bundles):
  """FLOAT16=1 as openpilot's device build sets it: the model is float16 (half weights, half between its Adreno kernels, float32 at its
  interface); the warps have no precision of their own (uint8 in and out)."""
  from sunnypilot.modeld_v2.format.bundle import read_bundle, read_parts
  head = read_bundle(bundles["model"])[0]
  assert head["extras"]["metadata"]["precision"] == "float16" and head["extras"]["output_specs"]["outputs"][1] == "<f4"
  part = read_parts(bundles["model"], device="NULL", allow_device=True)[0]["run"][0]
  big = {b.dtype for b in part.buffers if b.init is not None and b.nbytes > 4096}  # the output parse's int32 indices besides
  assert big & {"dtypes.half", "dtypes.float", "dtypes.double"} == {"dtypes.half"}, "the weights are half"
  assert any(p.dtype == "dtypes.half" for prog in part.programs for p in prog.signature)
  assert all("precision" not in read_bundle(bundles[k])[0]["extras"]["metadata"] for k in ("split", "packed"))

def test_programs_disassemble_as_adreno_ir3(bundles):
  out = run_python(f"""
from sunnypilot.modeld_v2.format.bundle import read_parts
from tinygrad.runtime.support.compiler_mesa import IR3Compiler
header, blob = read_parts({bundles['split']!r}, device="NULL", allow_device=True)[0]["run"]
for p in header.programs: IR3Compiler("a630").disassemble(bytes(blob[p.lib[0]:p.lib[1]]))
""", env=QCOM)
  assert "mov.f32f32" in out and "end" in out, out[:2000]

def test_weights_and_constants_are_in_the_bundle(bundles):
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  model = read_bundle(bundles["model"])[0]["parts"]["run"]["header"]
  assert sum(b["init"][1] - b["init"][0] for b in model["buffers"] if "init" in b) > 10**6, "captured on NULL, the weights still came from the ONNX"
  # IMAGE relayouts of the weights are one-time calls the loader runs once; what they write is not stored (it would be NULL's nothing)
  assert model["onetime_calls"], "the relayouts were split off the per-frame calls"
  prepared = {a["buffer"] for c in model["onetime_calls"] for i, a in enumerate(c["args"]) if i in model["programs"][c["program"]]["outs"]}
  assert prepared and not any("init" in model["buffers"][b] for b in prepared)

def test_qcom_bundle_refuses_cpu(bundles):
  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.format.bundle import read_parts
  with pytest.raises(ArtifactError, match="built for device QCOM, this process runs on CPU"): read_parts(bundles["model"])

def test_mock_qcom_replays_on_null_without_compiling(bundles):
  out = run_python(f"""
import numpy as np
from tinygrad import Device, Tensor
from sunnypilot.modeld_v2.runtime.loader import load_bundle, load_fused
specs, out_specs = (lambda b: (b.input_specs, b.output_specs))(load_fused({bundles['model']!r}, {bundles['split']!r}, "NULL", allow_device=True))
frame, big = (Tensor(np.zeros({FRAME.size}, np.uint8)).realize() for _ in range(2))
m = Tensor(np.zeros((2, 3, 3), np.float32)).realize()
states = {{k: Tensor(np.zeros(s.shape, s.dtype)).realize() for k, s in specs.items() if k.startswith("state")}}
outs = {{k: Tensor(np.zeros(s.shape, s.dtype)).realize() for k, s in out_specs.items() if not k.startswith("next_")}}  # outputs, message_floats
outs |= {{f"next_{{k}}": v for k, v in states.items()}}
host = Tensor(np.zeros(specs["host"].shape, np.uint8), device="NPY")
Device[Device.DEFAULT]
{NO_COMPILE}
warp = load_bundle({bundles['split']!r}, device="NULL", allow_device=True).run
for _ in range(3): warp(frame=frame, big_frame=big, M_inv=m)
print("warp", warp.call_kinds)
fused = load_fused({bundles['model']!r}, {bundles['split']!r}, "NULL", allow_device=True)
for _ in range(3): fused.run(host=host, frame=frame, big_frame=big, **states, output_buffers=outs)
print("fused", fused.run.call_kinds)
""", env={"DEV": "NULL", "JIT_BATCH_SIZE": "0"})
  lines = dict(line.split(" ", 1) for line in out.strip().splitlines())
  assert lines["warp"] == "['graph']", out
  assert lines["fused"] == "['COPY', 'graph']", "one host upload, then the warp's and the model's kernels as one graph batch"

