"""Compile any ONNX model into a plain bundle whose `run` takes the ONNX's inputs by name and returns its outputs by name.

  python -m sunnypilot.modeld_v2.compile.compile_onnx --onnx dmonitoring.onnx --output dmonitoring.bin
  python -m sunnypilot.modeld_v2.compile.compile_onnx --onnx model.onnx --shape input=1x3x224x224 --output model.bin   # fix a dynamic dimension

The bundle runs as `load_bundle(path).run(**{input name: Tensor})` -> {output name: Tensor}, or with numpy arrays through
`numpy_runner.NumpyRunner(path)(**{input name: array})` -> {output name: array}. Inputs keep the ONNX's dtypes and shapes (after --shape);
the returned tensors are the bundle's own buffers, overwritten by the next call. Every ONNX input must have a fixed shape: a dynamic one
is refused, naming its dimensions, unless --shape gives it. Set tinygrad's flags (DEV, FLOAT16=1, IMAGE=1, ...) in the environment as for
compile_modeld; they are recorded in the bundle's provenance. --precision float16 (the default under FLOAT16=1) computes in half with the
ONNX's input and output dtypes kept (compile/precision.py).
"""
from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.compile_job import BundleCompile, add_compile_flags
from sunnypilot.modeld_v2.compile.onnx_model import ModelError, Spec, graph_inputs, onnx_dims, onnx_np_dtype, read_onnx
from sunnypilot.modeld_v2.compile.precision import OnnxRun
from sunnypilot.modeld_v2.format.fields import dtype_name, np_dtype

if TYPE_CHECKING:
  from onnx import ModelProto
  from tinygrad import Tensor

logger = logging.getLogger(__name__)

def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
  """`name=1x3x224x224` -> ("name", (1, 3, 224, 224))."""
  if not (m := re.fullmatch(r"(.+)=(\d+(?:x\d+)*)", text)) or any(int(d) < 1 for d in m[2].split("x")):
    raise ModelError(f"--shape takes name=AxBxC with sizes of at least 1 (e.g. input=1x3x224x224), got {text!r}")
  return m[1], tuple(int(d) for d in m[2].split("x"))

def plan_inputs(path: str, shapes: dict[str, tuple[int, ...]] | None = None) -> tuple[ModelProto, dict[str, Spec]]:
  """The ONNX model and its inputs {name: (shape, numpy dtype)}, every dimension fixed: by the ONNX, or by `shapes` (which must agree with
  the ONNX's fixed dimensions). Outputs need no declared shape: the capture finds them."""
  model, shapes, inputs = read_onnx(path), shapes or {}, dict[str, Spec]()
  if unknown := sorted(set(shapes) - {v.name for v in graph_inputs(model)}):
    raise ModelError(f"{path}: --shape names {unknown}, which are not inputs of the model (inputs: {sorted(v.name for v in graph_inputs(model))})")
  for v in graph_inputs(model):
    if not v.type.HasField("tensor_type"): raise ModelError(f"{path}: input {v.name} is not a tensor ({v.type.WhichOneof('value')}): not supported")
    dims, given = onnx_dims(v), shapes.get(v.name)
    if given is not None:
      if len(given) != len(dims) or any(isinstance(d, int) and d != g for d, g in zip(dims, given)):
        raise ModelError(f"{path}: --shape {v.name}={'x'.join(map(str, given))} does not fit its ONNX shape {_dims_text(dims)}")
      dims = given
    if dynamic := [d for d in dims if not isinstance(d, int)]:
      raise ModelError(f"{path}: input {v.name} has a dynamic shape {_dims_text(dims)} (dimension{'s' * (len(dynamic) > 1)} "
                       f"{', '.join(map(str, dynamic))}): "
                       f"fix it with --shape {v.name}={'x'.join(str(d) if isinstance(d, int) else 'N' for d in dims)}")
    inputs[v.name] = (tuple(int(d) for d in dims), onnx_np_dtype(v))  # every dimension fixed: ints
  return model, inputs

def _dims_text(dims: tuple) -> str: return "(" + ", ".join(map(str, dims)) + ")"

def fresh(t: Tensor) -> Tensor:
  """An output as a buffer of its own, written by the captured kernels: a graph output that is an input, a view of one, or a constant
  realized before the capture would otherwise be no kernel at all, or the caller's own buffer."""
  return t.clone() if t.uop.base.is_realized else t.contiguous()

def make_step(runner: OnnxRun, outputs: list[str]) -> Callable[..., dict[str, Tensor]]:
  """The function TinyJit captures: the ONNX inputs by name in, {output name: tensor} out."""
  def step(**inputs: Tensor) -> dict[str, Tensor]:
    out = runner(inputs)
    return {name: fresh(out[name]) for name in outputs}
  return step

def compile_onnx(output: str, onnx: str, shapes: dict[str, tuple[int, ...]] | None = None, log: Callable[[str], None] = logger.info,
                 beam: int | None = None, fuse_layers: bool = False, precision: str | None = None) -> dict:
  """Compile the ONNX at `onnx` into a bundle at `output`; returns a summary. Fails before any work when `output` cannot be written, `beam`
  cannot search here, or an input's shape is not fixed. `beam`, `fuse_layers`, `precision`: as for compile_modeld."""
  job = BundleCompile(output, (onnx,), beam, precision)
  model, specs = plan_inputs(onnx, shapes)
  outputs = [v.name for v in model.graph.output]
  log(f"{onnx}: inputs {', '.join(f'{n} {s} {np.dtype(d).name}' for n, (s, d) in specs.items()) or 'none'}; outputs {', '.join(outputs)}; "
      f"{job.precision}, on {job.device}")
  try: jit, part, _ = job.capture(lambda: make_step(job.onnx_runner(onnx), outputs), lambda: job.random_inputs(specs), fuse_layers, log)
  except ArtifactError: raise
  except Exception as e:  # tinygrad's ONNX runner or scheduler on a graph it cannot run: the reason, not a traceback
    raise ModelError(f"{onnx}: tinygrad cannot run this model: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from e
  metadata = {"kind": "onnx", "source": os.path.basename(onnx), "layer_boundaries": not fuse_layers,
              "onnx_metadata": {p.key: p.value for p in model.metadata_props}}
  assert jit.captured is not None, "job.capture captured it"
  returned = {k: (t.shape, np_dtype(dtype_name(t.dtype))) for k, t in jit.captured.ret.items()}
  summary = job.write(part, specs, returned, metadata) | {"jit": jit, "part": part}
  log(f"wrote {output}: {summary['kernels']} kernels per call (+{summary['onetime']} once at load), {summary['weight_bytes'] / 1e6:.2f} MB weights, "
      f"{summary['bytes'] / 1e6:.2f} MB bundle, {summary['compile_s']:.1f} s")
  return summary

@interruptible("compile_onnx")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("compile_onnx", __doc__)
  parser.add_argument("--onnx", required=True, help="the ONNX model")
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--shape", action="append", default=[], metavar="NAME=AxBxC",
                      help="fix the shape of an input with dynamic dimensions (repeat for several inputs)")
  add_compile_flags(parser)
  args = parser.parse_args(argv)
  try:
    shapes = dict(parse_shape(s) for s in args.shape)
    if len(shapes) != len(args.shape): raise ModelError(f"--shape gives an input twice: {args.shape}")
    compile_onnx(args.output, args.onnx, shapes, log=logger.info, beam=args.beam, fuse_layers=args.fuse_layers, precision=args.precision)
  except (ModelError, ArtifactError) as e:
    parser.exit(2, f"compile_onnx: error: {e}\n")
  return 0

if __name__ == "__main__":
  sys.exit(main())
