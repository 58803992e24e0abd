"""compile_onnx: any ONNX as a bundle taking inputs and returning outputs by name, checked against onnxruntime in a fresh process with the
compiler disabled; views, constants and graphs with no per-call kernel; dynamic shapes; bad input; --beam, FLOAT16 and the QCOM cross-compile."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sunnypilot.modeld_v2.compile.compile_onnx import main
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.tools.inspect_bundle import main as inspect_main

from conftest import NO_COMPILE, ROOT, run_python

def save(path, nodes, inputs, outputs, inits=()) -> str:
  graph = helper.make_graph(nodes, "t", [helper.make_tensor_value_info(*i) for i in inputs], [helper.make_tensor_value_info(*o) for o in outputs],
                            list(inits))
  onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), str(path))
  return str(path)

def patterns_onnx(path) -> str:
  """Graph patterns the driving models never show: pooling, a gather by int64 indices, an output that is a view of an input, one that is an
  input itself, a constant and a shape (both independent of the inputs)."""
  rng = np.random.default_rng(0)
  w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
  table = numpy_helper.from_array(rng.standard_normal((10, 5)).astype(np.float32), "table")
  nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node("Relu", ["c"], ["r"]),
           helper.make_node("MaxPool", ["r"], ["pooled"], kernel_shape=[2, 2], strides=[2, 2]),
           helper.make_node("Gather", ["table", "idx"], ["emb"]),
           helper.make_node("Flatten", ["x"], ["flat"]), helper.make_node("Identity", ["idx"], ["same"]),
           helper.make_node("Constant", [], ["const"], value=numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3))),
           helper.make_node("Shape", ["x"], ["shape"])]
  return save(path, nodes, [("x", TensorProto.FLOAT, (1, 3, 8, 8)), ("idx", TensorProto.INT64, (4,))],
              [("pooled", TensorProto.FLOAT, (1, 4, 4, 4)), ("emb", TensorProto.FLOAT, (4, 5)), ("flat", TensorProto.FLOAT, (1, 192)),
               ("same", TensorProto.INT64, (4,)), ("const", TensorProto.FLOAT, (2, 3)), ("shape", TensorProto.INT64, (4,))], [w, table])

@pytest.fixture(scope="module")
def patterns(tmp_path_factory) -> tuple[str, str]:
  """The patterns ONNX and its bundle, compiled once through the CLI."""
  folder = tmp_path_factory.mktemp("patterns")
  path, bundle = patterns_onnx(folder / "patterns.onnx"), str(folder / "patterns.bin")
  assert main(["--onnx", path, "--output", bundle]) == 0
  return path, bundle

def fresh_process_outputs(bundle: str, feeds: list[dict], folder, env: dict | None = None) -> list[dict]:
  """NumpyRunner on each feed in turn, in a new process that cannot compile: the outputs by name."""
  for i, f in enumerate(feeds): np.savez(folder / f"in{i}.npz", **f)
  run_python(f"""
import numpy as np
from tinygrad import Device
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
run = NumpyRunner({bundle!r}, device=Device.DEFAULT)
for i in range({len(feeds)}):
  f = np.load({str(folder)!r} + f"/in{{i}}.npz")
  np.savez({str(folder)!r} + f"/out{{i}}.npz", **run(**{{k: f[k] for k in f.files}}))
""", env=env)
  return [dict(np.load(folder / f"out{i}.npz")) for i in range(len(feeds))]

def onnxruntime(path: str, feed: dict) -> dict:
  import onnxruntime as ort
  session = ort.InferenceSession(path)
  return dict(zip((o.name for o in session.get_outputs()), session.run(None, feed)))

def test_inputs_and_outputs_by_name_match_onnxruntime(patterns, tmp_path, capsys):
  path, bundle = patterns
  rng = np.random.default_rng(1)
  feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "idx": rng.integers(0, 10, 4)} for _ in range(2)]
  for feed, got in zip(feeds, fresh_process_outputs(bundle, feeds, tmp_path)):
    expected = onnxruntime(path, feed)
    assert sorted(got) == sorted(expected)
    for name, value in expected.items():
      assert got[name].dtype == value.dtype and got[name].shape == value.shape, name
      np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)  # the second call: views follow the new inputs
  capsys.readouterr()
  assert inspect_main(["inspect", bundle]) == 0
  shown = capsys.readouterr().out
  for line in ("input  x                        (1, 3, 8, 8)         <f4", "input  idx                      (4,)                 <i8",
               "output pooled                   (1, 4, 4, 4)         <f4", "output shape                    (4,)                 <i8"):
    assert line in shown, shown
  assert inspect_main(["verify", bundle]) == 0 and "verified" in capsys.readouterr().out

def test_outputs_independent_of_the_inputs_need_no_per_call_kernel(tmp_path):
  """A graph whose outputs are all constants captures no per-call kernel (tinygrad prunes them into one-time work, or there is none): the
  bundle still holds them and returns them, whatever the inputs. A graph with no inputs at all works the same way."""
  const = numpy_helper.from_array(np.array([[1.5, -2.0]], np.float32))
  path = save(tmp_path / "const.onnx", [helper.make_node("Constant", [], ["k"], value=const), helper.make_node("Shape", ["x"], ["s"]),
                                        helper.make_node("Mul", ["k", "k"], ["k2"])],
              [("x", TensorProto.FLOAT, (3, 5))], [("k", TensorProto.FLOAT, (1, 2)), ("s", TensorProto.INT64, (2,)), ("k2", TensorProto.FLOAT, (1, 2))])
  no_inputs = save(tmp_path / "no_inputs.onnx", [helper.make_node("Constant", [], ["k"], value=const), helper.make_node("Exp", ["k"], ["e"])], [],
                   [("e", TensorProto.FLOAT, (1, 2))])
  for onnx_path in (path, no_inputs):
    bundle = onnx_path.replace(".onnx", ".bin")
    assert main(["--onnx", onnx_path, "--output", bundle]) == 0
    assert read_bundle(bundle)[0]["parts"]["run"]["header"]["calls"] == [], "nothing depends on the inputs: nothing runs per call"
    feeds = [{"x": np.full((3, 5), v, np.float32)} for v in (1, 2)] if onnx_path == path else [{}]
    for feed, got in zip(feeds, fresh_process_outputs(bundle, feeds, tmp_path)):
      expected = onnxruntime(onnx_path, feed)
      assert sorted(got) == sorted(expected) and all(np.array_equal(got[k], v) and got[k].dtype == v.dtype for k, v in expected.items()), (got, expected)

def test_numpy_runner_names_what_is_wrong_with_an_input(patterns):
  from sunnypilot.modeld_v2.runtime.kernel_replay import InputError
  from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
  run, x, idx = NumpyRunner(patterns[1]), np.zeros((1, 3, 8, 8), np.float32), np.zeros(4, np.int64)
  for kwargs, message in (({"x": x}, "expected inputs \\['idx', 'x'\\], got \\['x'\\]"),
                          ({"x": x.astype(np.float64), "idx": idx}, "input x: expected shape \\(1, 3, 8, 8\\) float32, got \\(1, 3, 8, 8\\) float64"),
                          ({"x": x[0], "idx": idx}, "input x: expected shape \\(1, 3, 8, 8\\) float32, got \\(3, 8, 8\\) float32")):
    with pytest.raises(InputError, match=message): run(**kwargs)
  assert run(x=x, idx=idx)["pooled"].shape == (1, 4, 4, 4)

def test_numpy_runner_outputs_are_arrays_of_their_own(patterns):
  """Each call's outputs stay what onnxruntime computes for its inputs after later calls overwrite the bundle's buffers."""
  from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
  path, bundle = patterns
  run, rng = NumpyRunner(bundle), np.random.default_rng(2)
  feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32), "idx": rng.integers(0, 10, 4)} for _ in range(3)]
  kept = [run(**feed) for feed in feeds]
  for feed, got in zip(feeds, kept):
    for name, value in onnxruntime(path, feed).items():
      assert got[name].flags.writeable and got[name].flags.c_contiguous, name
      np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=name)

def test_a_returned_buffer_no_call_touches_carries_its_bytes():
  """At the capture level, with no ONNX: a function returning a tensor realized before the capture (no kernel writes it) and one it
  computes; the plain replay returns both, the first from the bytes the part stored."""
  from tinygrad import Tensor

  from sunnypilot.modeld_v2.compile.capture import capture
  from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
  const = Tensor(np.arange(4, dtype=np.float32) - 1.5).realize()
  _, (header, blob), _ = capture(lambda x: {"y": (x * 2).contiguous(), "k": const}, lambda: {"x": Tensor(np.ones(4, np.float32)).realize()})
  assert any("init" in header["buffers"][r["buffer"]] for r in header["returns"]["tensors"])
  out = Replay(header, blob)(x=Tensor(np.full(4, 3, np.float32)).realize())
  np.testing.assert_array_equal(out["k"].numpy(), [-1.5, -0.5, 0.5, 1.5])
  np.testing.assert_array_equal(out["y"].numpy(), [6, 6, 6, 6])

def cli(capsys, argv: list[str]) -> tuple[int, str]:
  with pytest.raises(SystemExit) as e: main(argv)
  return e.value.code, capsys.readouterr().err

def test_dynamic_shape_is_refused_unless_fixed(tmp_path, capsys):
  path = save(tmp_path / "dyn.onnx", [helper.make_node("Relu", ["x"], ["y"])], [("x", TensorProto.FLOAT, ("batch", 3, "width"))],
              [("y", TensorProto.FLOAT, ("batch", 3, "width"))])
  out = tmp_path / "dyn.bin"
  for extra, message in (([], "input x has a dynamic shape (batch, 3, width) (dimensions batch, width): fix it with --shape x=Nx3xN"),
                         (["--shape", "x=2x4x5"], "--shape x=2x4x5 does not fit its ONNX shape (batch, 3, width)"),
                         (["--shape", "y=2x3x5"], "--shape names ['y'], which are not inputs of the model (inputs: ['x'])"),
                         (["--shape", "x=2x0x5"], "--shape takes name=AxBxC with sizes of at least 1"),
                         (["--shape", "x=2x3x5", "--shape", "x=2x3x6"], "--shape gives an input twice")):
    code, err = cli(capsys, ["--onnx", path, "--output", str(out), *extra])
    assert code == 2 and message in err and err.count("\n") == 1 and "capturing" not in err, err
    assert not out.exists()
  assert main(["--onnx", path, "--output", str(out), "--shape", "x=2x3x5"]) == 0
  feed = {"x": np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)}
  np.testing.assert_array_equal(fresh_process_outputs(str(out), [feed], tmp_path)[0]["y"], np.maximum(feed["x"], 0))

def test_bad_input_is_one_line_exit_2_and_no_file(patterns, tmp_path, capsys):
  det = save(tmp_path / "det.onnx", [helper.make_node("Det", ["x"], ["y"])], [("x", TensorProto.FLOAT, (3, 3))], [("y", TensorProto.FLOAT, ())])
  # an op tinygrad has but cannot run on this graph (from ONNX's own backend test data): a failure inside the runner, reported as one line
  prelu = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "pytorch-converted", "test_PReLU_1d_multiparam", "model.onnx")
  ok = patterns[0]
  (tmp_path / "folder").mkdir()
  out = tmp_path / "x.bin"
  cases = [([det, out], "ops not supported by tinygrad's ONNX runner: Det"), ([str(tmp_path / "missing.onnx"), out], "no such ONNX file"),
           ([ok, tmp_path / "folder"], "is a folder: give a file name"), ([ok, tmp_path / "nowhere" / "x.bin"], "does not exist"),
           ([prelu, out], "tinygrad cannot run this model: IndexError")]
  for (onnx_path, output), message in cases:
    code, err = cli(capsys, ["--onnx", str(onnx_path), "--output", str(output)])
    last = err.splitlines()[-1]
    assert code == 2 and message in last and last.startswith("compile_onnx: error: ") and "Traceback" not in err, err
    assert onnx_path == prelu or err.count("\n") == 1, "refused before any work: the error is all it prints"
    assert not out.exists() and os.listdir(tmp_path / "folder") == [] and not any(p.name.startswith("x.bin") for p in tmp_path.iterdir())
  for argv, env, message in ((["--onnx", det], {}, "ops not supported"), (["--onnx", ok, "--beam", "2"], {"DEV": "NULL"}, "needs the target device")):
    proc = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.compile.compile_onnx", *argv, "--output", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=os.environ | env)
    assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not out.exists()

def test_beam_and_float16_replay_without_a_compiler(tmp_path):
  """--beam 1 under FLOAT16=1 (openpilot's device build: float16 is then the default precision) on a convolution: both recorded; the
  searched half kernels replay in a fresh process with the compiler disabled, return float32 as the ONNX declares, and stay within the
  float16 bound of onnxruntime's float32 (test_precision: 3 roundings of u = 2^-11 per layer, one layer here, of the output's RMS)."""
  w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
  path = save(tmp_path / "conv.onnx", [helper.make_node("Conv", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, (1, 3, 8, 8))],
              [("y", TensorProto.FLOAT, (1, 4, 6, 6))], [w])
  bundle = str(tmp_path / "f16.bin")
  proc = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.compile.compile_onnx", "--onnx", path, "--output", bundle, "--beam", "1"], cwd=ROOT,
                        capture_output=True, text=True, timeout=300, env=os.environ | {"FLOAT16": "1"})
  assert proc.returncode == 0 and "BEAM=1: kernel" in proc.stderr, proc.stderr
  head = read_bundle(bundle)[0]
  assert head["provenance"]["flags"]["BEAM"] == 1 and head["provenance"]["flags"]["FLOAT16"] == 1 and head["extras"]["metadata"]["precision"] == "float16"
  feed = {"x": np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)}
  got, expected = fresh_process_outputs(bundle, [feed], tmp_path, env={"FLOAT16": "1"})[0]["y"], onnxruntime(path, feed)["y"]
  assert got.dtype == np.float32
  np.testing.assert_allclose(got, expected, rtol=0, atol=3 * 2.0 ** -11 * float(np.sqrt(np.mean(np.square(expected)))))
  assert not np.array_equal(got, expected), "computed in half: not float32's values"

@pytest.mark.skipif(importlib.util.find_spec("tinymesa") is None, reason="tinymesa (the qcom extra) is not installed")
def test_qcom_cross_compile_of_the_driver_monitoring_stand_in(tmp_path):
  """The DM stand-in cross-compiled for Adreno on x86 (DEV=NULL:IR3:a630 with the seed's flags: float16 and IMAGE), then mock-executed on
  NULL through NumpyRunner with the compiler disabled."""
  onnx_path, bundle = str(tmp_path / "dm.onnx"), str(tmp_path / "dm.bin")
  run_python(f"""
from sunnypilot.modeld_v2.tools import stand_in_models
from sunnypilot.modeld_v2.compile.compile_onnx import compile_onnx
stand_in_models.write("dmonitoring", "tiny", {onnx_path!r})
compile_onnx({bundle!r}, {onnx_path!r}, log=lambda s: None)
""", env={"DEV": "NULL:IR3:a630", "IMAGE": "1", "FLOAT16": "1", "NOLOCALS": "1", "JIT_BATCH_SIZE": "0"})
  head = read_bundle(bundle)[0]
  assert (head["provenance"]["device"], head["provenance"]["target"]) == ("QCOM", "QCOM:IR3:a630")
  assert {k: head["extras"]["input_specs"][k][:2] for k in ("input_img", "calib")} == {"input_img": [[1, 1440 * 960], "|u1"], "calib": [[1, 3], "<f4"]}
  part = head["parts"]["run"]["header"]
  # FLOAT16=1 builds float16: the stand-in's 110 kB of float32 weights as 55 kB of half, read from the ONNX although NULL runs nothing
  assert head["extras"]["metadata"]["precision"] == "float16" and {b["dtype"] for b in part["buffers"] if "init" in b} >= {"dtypes.half"}
  assert sum(b["init"][1] - b["init"][0] for b in part["buffers"] if "init" in b) > 5 * 10**4, "captured on NULL, the weights still came from the ONNX"
  out = run_python(f"""
import numpy as np
from tinygrad import Device
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
runner = NumpyRunner({bundle!r}, allow_device=True)
out = runner.run(**runner.inputs)  # NULL runs nothing and has nothing to copy out: the tensors, not their values
print({{k: list(v.shape) for k, v in out.items()}}, runner.run.call_kinds)
""", env={"DEV": "NULL", "JIT_BATCH_SIZE": "0"})
  assert out.strip() == "{'outputs': [1, 545]} ['graph']", out  # 33 head values (see below) + 512 features
  assert head["extras"]["metadata"]["onnx_metadata"]["generation"] == "dmonitoring"

def test_driver_monitoring_stand_in_as_the_readme_runs_it(tmp_path):
  """The README's example: the DM stand-in (openpilot's dmonitoringmodeld.py inputs and output, written out here by hand), compiled with
  compile_onnx and run through NumpyRunner in a fresh process with no compiler, against onnxruntime on the same ONNX."""
  import onnxruntime as ort

  from sunnypilot.modeld_v2.tools.stand_in_models import main as stand_in_main
  path, bundle = str(tmp_path / "dmonitoring.onnx"), str(tmp_path / "dmonitoring.bin")
  assert stand_in_main(["--generation", "dmonitoring", "--output", path]) == 0
  session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
  assert {i.name: (tuple(i.shape), i.type) for i in session.get_inputs()} == {"input_img": ((1, 1440 * 960), "tensor(uint8)"),
                                                                               "calib": ((1, 3), "tensor(float)")}
  # the current DM layout (sunnypilot's dmonitoringmodeld.py @41dea5d4): wheel_on_right 1, then per driver side face_descs 12 and the face,
  # eyes-visible, eyes-closed and phone probabilities; then the 512 features
  assert {o.name: tuple(o.shape) for o in session.get_outputs()} == {"outputs": (1, 1 + 2 * (12 + 4) + 512)}
  assert main(["--onnx", path, "--output", bundle]) == 0
  rng = np.random.default_rng(3)
  feed = {"input_img": rng.integers(0, 256, (1, 1440 * 960), dtype=np.uint8), "calib": rng.standard_normal((1, 3)).astype(np.float32)}
  got = fresh_process_outputs(bundle, [feed], tmp_path)[0]
  np.testing.assert_allclose(got["outputs"], onnxruntime(path, feed)["outputs"], rtol=1e-4, atol=1e-5)
