"""The precision a model bundle computes in: float32 (the ONNX as it is) or float16, what a comma device builds (openpilot
selfdrive/modeld/SConscript @084747c: `DEV=QCOM IMAGE=1 FLOAT16=1 NOLOCALS=1 JIT_BATCH_SIZE=0`).

tinygrad 0.14.0 has no switch that runs an ONNX in half: its FLOAT16 knob halves only the image buffers of IMAGE convolutions (nothing on
CPU or CUDA), and its OnnxRunner keeps every initializer in the ONNX's own type (no dtype option). So a float16 build converts the ONNX
first (`to_float16`: float initializers, Constants and Casts to float become float16, as do the graph's float inputs and outputs) and runs
tinygrad's OnnxRunner on that (`HalfRunner`): weights are stored in half, every elementwise op computes in half, and each sum (Conv,
MatMul, pools) accumulates in float32 and rounds its result to half (tinygrad's `sum_acc_dtype`). The bundle's interface does not change:
HalfRunner casts the float inputs to half in the graph and the outputs back to the ONNX's declared dtypes, so the runtime still feeds
uint8 frames and float32 host inputs and reads float32 outputs. The same converted ONNX is what the benchmarks' half peers run.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from tinygrad import Tensor, dtypes
from tinygrad.dtype import to_dtype
from tinygrad.helpers import FLOAT16 as FLOAT16_FLAG
from tinygrad.nn.onnx import OnnxRunner

from sunnypilot.modeld_v2.format.bundle import PRECISIONS

if TYPE_CHECKING:  # onnx is an optional extra, imported where a model is read
  from onnx import GraphProto, ModelProto, TensorProto, ValueInfoProto

OnnxRun = Callable[[dict[str, Tensor]], dict[str, Tensor]]  # an ONNX model in the graph: {input name: Tensor} -> {output name: Tensor}

FLOAT32, FLOAT16 = PRECISIONS
HALF_MAX = 65504.0  # the largest finite float16: a weight beyond it is clipped, not made infinite
# inputs that ONNX requires in float32 whatever the model computes in (Resize's roi and scales, Upsample's scales): kept float32
FLOAT32_INPUTS = {"Resize": (1, 2), "Upsample": (1,)}

def default_precision() -> str:
  """float16 when tinygrad's FLOAT16 is set (FLOAT16=1 in the environment: openpilot's device build), else float32."""
  return FLOAT16 if FLOAT16_FLAG.value else FLOAT32

def check_precision(precision: str) -> str:
  if precision not in PRECISIONS: raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
  return precision

def as_dtype(t: Tensor, dtype: npt.DTypeLike) -> Tensor:
  """`t` in a numpy dtype's tinygrad equivalent, cast in the graph only if it differs."""
  target = to_dtype(np.dtype(dtype).name)
  if t.dtype == target: return t
  narrowed = dtypes.is_float(t.dtype) and dtypes.is_float(target) and target.itemsize < t.dtype.itemsize
  return t.cast(target).contiguous() if narrowed else t.cast(target)  # tinygrad folds cast(cast(x, half), float) to x: keep the rounding

# *** the ONNX in half ***

def to_float16(model: ModelProto) -> ModelProto:
  """A copy of an ONNX ModelProto that computes in float16 (subgraphs too); metadata, names and shapes unchanged."""
  import onnx
  half = onnx.ModelProto()
  half.CopyFrom(model)
  _graph_to_float16(half.graph)
  return half

def _floats() -> tuple[int, ...]:
  from onnx import TensorProto
  return (TensorProto.FLOAT, TensorProto.DOUBLE)

def _half_tensor(t: TensorProto) -> TensorProto:
  from onnx import numpy_helper
  return numpy_helper.from_array(np.clip(numpy_helper.to_array(t), -HALF_MAX, HALF_MAX).astype(np.float16), t.name)

def _graph_to_float16(g: GraphProto) -> None:
  from onnx import AttributeProto, TensorProto, helper
  floats = _floats()
  keep = {n.input[i] for n in g.node for i in FLOAT32_INPUTS.get(n.op_type, ()) if i < len(n.input)}
  for t in g.initializer:
    if t.data_type in floats and t.name not in keep: t.CopyFrom(_half_tensor(t))
  for v in (*g.input, *g.output, *g.value_info):
    if v.type.tensor_type.elem_type in floats and v.name not in keep: v.type.tensor_type.elem_type = TensorProto.FLOAT16
  for node in g.node:
    for a in list(node.attribute):
      if a.type == AttributeProto.INT and a.name in ("to", "dtype") and a.i in floats: a.i = TensorProto.FLOAT16  # Cast, EyeLike, Random*
      elif a.type == AttributeProto.TENSOR and a.t.data_type in floats: a.t.CopyFrom(_half_tensor(a.t))  # Constant, ConstantOfShape
      elif a.type == AttributeProto.GRAPH: _graph_to_float16(a.g)
      elif a.type == AttributeProto.GRAPHS:
        for sub in a.graphs: _graph_to_float16(sub)
      elif node.op_type == "Constant" and a.name in ("value_float", "value_floats"):  # tinygrad makes these float32: a float16 tensor instead
        value = np.float16(a.f) if a.name == "value_float" else np.array(a.floats, np.float16)
        node.attribute.remove(a)
        node.attribute.append(helper.make_attribute("value", helper.make_tensor("value", TensorProto.FLOAT16, np.shape(value), np.ravel(value))))

def write_float16(path: str, out: str) -> str:
  """The ONNX at `path` converted by to_float16, written to `out` (external data loaded and inlined); returns `out`."""
  import onnx
  onnx.save(to_float16(onnx.load(path)), out)
  return out

def declared_dtypes(values: Iterable[ValueInfoProto]) -> dict[str, np.dtype]:
  from onnx import helper
  return {v.name: np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in values}

class HalfRunner:
  """tinygrad's OnnxRunner on the float16 copy `half_path` of the ONNX at `path`, called as OnnxRunner is ({input name: Tensor} ->
  {output name: Tensor}) with the original's dtypes: float inputs are rounded to half in the graph, outputs cast back to what the original
  declares."""
  def __init__(self, path: str, half_path: str):
    import onnx
    original, half = onnx.load(path, load_external_data=False), onnx.load(half_path, load_external_data=False)
    inits = {i.name for i in half.graph.initializer}
    self.input_dtypes = declared_dtypes(v for v in half.graph.input if v.name not in inits)
    self.output_dtypes = declared_dtypes(original.graph.output)
    self.runner = OnnxRunner(half_path)

  def __call__(self, inputs: dict[str, Tensor]) -> dict[str, Tensor]:
    out = self.runner({k: as_dtype(v, self.input_dtypes[k]) if k in self.input_dtypes else v for k, v in inputs.items()})
    return {k: as_dtype(v, self.output_dtypes[k]) if k in self.output_dtypes else v for k, v in out.items()}

def onnx_runner(path: str, precision: str, workdir: str) -> OnnxRun:
  """What runs the ONNX at `path` in a compile: tinygrad's OnnxRunner (float32), or a HalfRunner on its float16 copy written in `workdir`
  (which must outlive the capture: the runner reads its weights from that file when it first runs)."""
  if check_precision(precision) == FLOAT32: return OnnxRunner(path)
  fd, half = tempfile.mkstemp(suffix=".onnx", dir=workdir)
  os.close(fd)
  return HalfRunner(path, write_float16(path, half))

# *** how far float16 may move a model's outputs ***

UNIT_ROUNDOFF = 2.0 ** -11  # float16 rounds to within this of a value, relative
ROUNDINGS_PER_LAYER = 3  # a layer's input activation, its weights and its output, each stored in half (its sum accumulates in float32)
LAYER_OPS = ("Conv", "MatMul", "Gemm")
FED_BACK = ("state_", "features_buffer", "prev_desired_curv")  # inputs a frame fills from an earlier frame's outputs

def _chains(path: str) -> dict[str, int]:
  """Per graph input, the longest chain of LAYER_OPS from it to a graph output (-1: it reaches none)."""
  import onnx
  g = onnx.load(path, load_external_data=False).graph
  inits, out = {i.name for i in g.initializer}, {}
  for name in (v.name for v in g.input if v.name not in inits):
    depth = {name: 0}
    for n in g.node:
      if reached := [depth[i] for i in n.input if i in depth]:
        for o in n.output: depth[o] = max(reached) + (n.op_type in LAYER_OPS)
    out[name] = max((depth.get(o.name, -1) for o in g.output), default=-1)
  return out

def layer_depth(files: dict[str, str]) -> int:
  """L of float16_bound for a frame's models ({"onnx": path} or a vision model and its policies): the longest chain of layers from an
  input to the outputs (the vision's, then a policy's from the features it reads), plus the chain from an input the frame feeds back (a
  state, a model's own features_buffer, prev_desired_curv) once more: that input carries the previous frame's error."""
  c = {k: _chains(p) for k, p in files.items()}
  fed = lambda k, names: max((c[k][n] for n in c[k] if n.startswith(names)), default=0)
  if len(c) == 1:
    (k, chains), = c.items()
    return max(chains.values()) + fed(k, FED_BACK)
  vision, policies = c.get("vision", {}), [k for k in c if k != "vision"]
  chain = max([max(vision.values(), default=0) + max((c[k].get("features_buffer", 0) for k in policies), default=0)] + [max(c[k].values()) for k in policies])
  return chain + max((fed(k, ("prev_desired_curv",)) for k in policies), default=0)

def float16_bound(files: dict[str, str]) -> float:
  """How far a float16 build moves the outputs of the models `files` from float32's, relative to their scale: ROUNDINGS_PER_LAYER
  roundings of UNIT_ROUNDOFF per layer through layer_depth(files) layers of gain about 1 (docs/ARCHITECTURE.md, "Precision")."""
  return ROUNDINGS_PER_LAYER * layer_depth(files) * UNIT_ROUNDOFF
