"""ONNX's own backend test data, an outside suite written by nobody here: the pytorch-converted and pytorch-operator cases of the installed
onnx wheel (each a model with input and expected output protobufs). Every case tinygrad's ONNX runner gets right eagerly is compiled with
compile_onnx, and its bundle, replayed in one fresh process with the compiler disabled, must equal the eager result bit for bit.

  python -m pytest tests/compile/test_onnx_backend.py -q -s    # prints the counts and the reason for every case tinygrad gets wrong
"""
import collections
import glob
import os
import time
import warnings

import numpy as np
import onnx
from onnx import numpy_helper

from sunnypilot.modeld_v2.compile.compile_job import layer_boundaries
from sunnypilot.modeld_v2.compile.compile_onnx import compile_onnx

from conftest import NO_COMPILE, run_python

DATA = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")
SUITES = ("pytorch-converted", "pytorch-operator")
RTOL, ATOL = 1e-3, 1e-7  # what onnx's backend test runner allows by default against the expected outputs

def read_case(folder: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
  """The first test data set of a case: {input name: array}, {output name: expected array}, named as the model names them."""
  model = onnx.load(os.path.join(folder, "model.onnx"), load_external_data=False)
  inits = {i.name for i in model.graph.initializer}
  names_in, names_out = [v.name for v in model.graph.input if v.name not in inits], [v.name for v in model.graph.output]
  data = sorted(glob.glob(os.path.join(folder, "test_data_set_*")))[0]
  read = lambda kind, i: numpy_helper.to_array(onnx.load_tensor(os.path.join(data, f"{kind}_{i}.pb")))
  return {n: read("input", i) for i, n in enumerate(names_in)}, {n: read("output", i) for i, n in enumerate(names_out)}

def eager(path: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """tinygrad's ONNX runner, no JIT, with the realize point after each layer compile_onnx uses by default."""
  from tinygrad import Tensor
  from tinygrad.nn.onnx import OnnxRunner
  with layer_boundaries():
    out = OnnxRunner(path)({k: Tensor(v).realize() for k, v in inputs.items()})
    return {k: t.numpy() for k, t in out.items()}

def wrong(got: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> str | None:
  for name, e in expected.items():
    if got[name].shape != e.shape: return f"{name}: shape {got[name].shape}, expected {e.shape}"
    if not np.allclose(got[name], e, rtol=RTOL, atol=ATOL, equal_nan=True):
      return f"{name}: max abs error {np.nanmax(np.abs(got[name].astype(np.float64) - e)):.3g}"
  return None

def test_backend_test_data_replays_as_eager(tmp_path):
  start, skipped, passed = time.perf_counter(), {}, []
  cases = sorted(d for suite in SUITES for d in glob.glob(os.path.join(DATA, suite, "*")) if os.path.isfile(os.path.join(d, "model.onnx")))
  for folder in cases:
    name, path = os.path.basename(folder), os.path.join(folder, "model.onnx")
    inputs, expected = read_case(folder)
    try:
      with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = eager(path, inputs)
    except Exception as e:  # an op tinygrad implements but fails on for this graph: skipped, with the reason
      skipped[name] = f"eager run fails: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
      continue
    if reason := wrong(got, expected):
      skipped[name] = f"eager result differs from the expected output: {reason}"
      continue
    compile_onnx(str(tmp_path / f"{name}.bin"), path, log=lambda s: None)
    np.savez(tmp_path / f"{name}.in.npz", **inputs), np.savez(tmp_path / f"{name}.eager.npz", **got)
    passed.append(name)
  compiled = time.perf_counter()
  out = run_python(f"""
import numpy as np
from tinygrad import Device
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
for name in {passed!r}:
  inputs, eager = np.load({str(tmp_path)!r} + f"/{{name}}.in.npz"), np.load({str(tmp_path)!r} + f"/{{name}}.eager.npz")
  got = NumpyRunner({str(tmp_path)!r} + f"/{{name}}.bin")(**{{k: inputs[k] for k in inputs.files}})
  for k in eager.files:
    same = got[k].dtype == eager[k].dtype and got[k].shape == eager[k].shape and np.array_equal(got[k], eager[k], equal_nan=got[k].dtype.kind == "f")
    print(("SAME" if same else "DIFF"), name, k)
""")
  lines = out.split("\n")
  reasons = collections.Counter(r.split(":")[0] for r in skipped.values())
  print(f"\nONNX backend test data ({', '.join(SUITES)}): {len(cases)} cases, {len(passed)} compiled and replayed equal to eager, "
        f"{len(skipped)} skipped by tinygrad ({', '.join(f'{n} {r}' for r, n in reasons.items())}); "
        f"eager + compile {compiled - start:.0f} s, fresh-process replay {time.perf_counter() - compiled:.0f} s")
  for name, reason in skipped.items(): print(f"  skipped {name}: {reason}")
  assert not [line for line in lines if line.startswith("DIFF")], out
  assert sorted({line.split()[1] for line in lines if line.startswith("SAME")}) == sorted(passed)
  assert len(passed) >= 100, "tinygrad 0.14.0 runs 114 of the 117 cases right: far fewer means the comparison broke"
