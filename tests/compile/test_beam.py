"""Searched kernels in the bundle: --beam on the compilers, recorded in provenance, replayed with no search and no compiler, refused on NULL."""
import os
import subprocess
import sys

import numpy as np
import pytest

from sunnypilot.modeld_v2.compile_warp import main as compile_warp_main
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.model.camera_frame import unpadded_frame

from conftest import NO_COMPILE, ROOT, reference_warp, run_python, warp_in_fresh_process

TINY = unpadded_frame(64, 32)  # a warp small enough to search in seconds

def test_searched_warp_replays_without_a_compiler(tmp_path, capfd):
  path = str(tmp_path / "warp.bin")
  assert compile_warp_main(["--frame", TINY.spec, "--any-camera", "--warp-to", "32x16", "--split-frames", "--beam", "1", "--output", path]) == 0
  err = capfd.readouterr().err
  assert "searching 3 kernels with BEAM=1" in err and "BEAM=1: kernel 3 of ~3" in err, err
  assert read_bundle(path)[0]["provenance"]["flags"]["BEAM"] == 1
  rng = np.random.default_rng(0)
  bufs, m = rng.integers(0, 256, (2, TINY.size), dtype=np.uint8), np.stack([np.eye(3), [[2, 0.1, 3], [0, 2, 1], [0, 0, 1]]]).astype(np.float32)
  got = warp_in_fresh_process(path, bufs, m, tmp_path).reshape(2, 6, 8, 16)
  for cam in range(2):
    expected, ties = reference_warp(bufs[cam], TINY, m[cam], 32, 16)
    assert not ((got[cam] != expected) & ~ties).any(), f"camera {cam}: the searched warp differs from the numpy reference"

@pytest.mark.parametrize("how", [{"argv": ["--beam", "2"]}, {"env": {"BEAM": "2"}}], ids=["--beam", "BEAM env"])
def test_search_on_null_is_refused_before_any_work(tmp_path, how):
  out = str(tmp_path / "warp.bin")
  cmd = [sys.executable, "-m", "sunnypilot.modeld_v2.compile_warp", "--frame", TINY.spec, "--any-camera", "--warp-to", "32x16", "--output", out,
         *how.get("argv", [])]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ | {"DEV": "NULL"} | how.get("env", {}))
  assert proc.returncode == 2 and "needs the target device" in proc.stderr.strip().splitlines()[-1] and "Traceback" not in proc.stderr, proc.stderr
  assert not os.path.exists(out) and "capturing" not in proc.stderr

def tiny_native_onnx(path: str) -> None:
  """A native model small enough to search in seconds: new_img (2, 6, 8, 16) + desire + a state pair, as the compiler reads them."""
  import onnx
  from onnx import TensorProto, helper, numpy_helper

  from sunnypilot.modeld_v2.tools.stand_in_models import output_slices_prop
  rng = np.random.default_rng(1)
  w = numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w")
  nodes = [helper.make_node("Cast", ["new_img"], ["f"], to=TensorProto.FLOAT), helper.make_node("ReduceMean", ["f"], ["m"], axes=[1, 2, 3], keepdims=0),
           helper.make_node("Reshape", ["m", "shape12"], ["m12"]), helper.make_node("MatMul", ["desire", "w"], ["d"]),
           helper.make_node("Slice", ["state_q", "one", "two", "zero"], ["last"]),
           helper.make_node("Add", ["d", "last"], ["h"]), helper.make_node("Tanh", ["h"], ["ht"]),
           helper.make_node("Concat", ["m12", "ht"], ["outputs"], axis=1), helper.make_node("Concat", ["last", "ht"], ["next_state_q"], axis=0)]
  consts = [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in (("shape12", [1, 2]), ("one", [1]), ("two", [2]), ("zero", [0]))]
  graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("new_img", TensorProto.UINT8, (2, 6, 8, 16)),
                                            helper.make_tensor_value_info("desire", TensorProto.FLOAT, (1, 8)),
                                            helper.make_tensor_value_info("state_q", TensorProto.FLOAT, (2, 4))],
                            [helper.make_tensor_value_info("outputs", TensorProto.FLOAT, (1, 6)),
                             helper.make_tensor_value_info("next_state_q", TensorProto.FLOAT, (2, 4))], [w, *consts])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
  model.metadata_props.add(key="output_slices", value=output_slices_prop({"test_head": 6}))  # no head modeld parses: a 6-value pose is refused
  onnx.save(model, path)

def test_searched_model_replays_without_a_compiler_and_matches_onnxruntime(tmp_path):
  import onnxruntime as ort

  from sunnypilot.modeld_v2.compile_modeld import main as compile_modeld_main
  onnx_path, bundle = str(tmp_path / "tiny.onnx"), str(tmp_path / "tiny.bin")
  tiny_native_onnx(onnx_path)
  assert compile_modeld_main(["--onnx", onnx_path, "--beam", "1", "--output", bundle]) == 0
  assert read_bundle(bundle)[0]["provenance"]["flags"]["BEAM"] == 1
  rng = np.random.default_rng(2)
  feeds = {"new_img": rng.integers(0, 256, (2, 6, 8, 16), dtype=np.uint8), "desire": rng.standard_normal((1, 8)).astype(np.float32),
           "state_q": rng.standard_normal((2, 4)).astype(np.float32)}
  np.savez(tmp_path / "feeds.npz", **feeds)
  out = run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
f = np.load({str(tmp_path / 'feeds.npz')!r})
inputs = {{k: Tensor(f[k]).realize() for k in f.files}}
outs = {{"outputs": Tensor(np.zeros((1, 6), np.float32)).realize(), "next_state_q": Tensor(np.zeros((2, 4), np.float32)).realize()}}
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.runtime.loader import load_bundle
load_bundle({bundle!r}).run(**inputs, output_buffers=outs)
print(*(bytes(outs[k].uop.base.buffer.as_memoryview(force_zero_copy=True)).hex() for k in ("outputs", "next_state_q")))
""")
  got = [np.frombuffer(bytes.fromhex(h), np.float32) for h in out.split()]
  expected = ort.InferenceSession(onnx_path).run(["outputs", "next_state_q"], feeds)
  for g, e in zip(got, expected): np.testing.assert_allclose(g.reshape(e.shape), e, rtol=1e-4, atol=1e-5)
