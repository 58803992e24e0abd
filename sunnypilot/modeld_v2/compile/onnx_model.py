"""Reading an openpilot driving model's ONNX: the graph (checked against the ops tinygrad's ONNX runner has), its inputs and outputs with
fixed shapes, and comma's output_slices metadata (a base64 pickle, read by an unpickler that admits only dicts and slices)."""
from __future__ import annotations

import io
import os
import pickle
from typing import TYPE_CHECKING, TypedDict

import numpy as np

from sunnypilot.modeld_v2.runtime.tinygrad_internals import onnx_ops

if TYPE_CHECKING:  # onnx is an optional extra, imported where a model is read
  from onnx import ModelProto, ValueInfoProto

Spec = tuple[tuple[int, ...], np.dtype]  # an ONNX input's or output's fixed shape and numpy dtype

class OnnxInfo(TypedDict):
  """What load_onnx reads of a model: the graph, its inputs and outputs {name: (shape, dtype)}, its metadata_props."""
  model: ModelProto
  inputs: dict[str, Spec]
  outputs: dict[str, Spec]
  metadata: dict[str, str]

# sunnypilot's TinygradSplitRunner (sunnypilot/models/runners/tinygrad/tinygrad_runner.py @06b23b5a) merges the parsed outputs of the
# policy, then the vision model over them, then the off-policy over both: where two models emit a head, the later one's is read
SLICE_PRECEDENCE = ("policy", "on_policy", "vision", "off_policy")

class ModelError(ValueError):
  """An ONNX model this compiler cannot turn into a bundle, with the reason."""

class _SliceUnpickler(pickle.Unpickler):
  """output_slices is comma's base64 pickled {name: slice}: admit dicts and slices, nothing else."""
  def find_class(self, module: str, name: str) -> type[slice]:
    if (module, name) == ("builtins", "slice"): return slice
    raise ModelError(f"output_slices may only hold dicts and slices, found {module}.{name}")

def _bound(value: object) -> bool: return isinstance(value, int) and not isinstance(value, bool)

def read_output_slices(encoded: str) -> dict[str, list[int]]:
  """comma's base64 pickled {name: slice} -> {name: [start, stop]}; anything else is a ModelError."""
  import base64
  try:
    slices = _SliceUnpickler(io.BytesIO(base64.b64decode(encoded, validate=True))).load()
  except ModelError: raise
  except Exception as e: raise ModelError(f"output_slices metadata is not comma's base64 pickled dict of slices: {e}") from None
  if not isinstance(slices, dict) or not all(isinstance(k, str) and isinstance(v, slice) for k, v in slices.items()):
    raise ModelError("output_slices must map names to slices")
  bad = {k: (v.start, v.stop, v.step) for k, v in slices.items() if not (v.start is None or _bound(v.start)) or not _bound(v.stop) or v.step not in (None, 1)}
  if bad: raise ModelError(f"output_slices must be integer [start:stop] slices, got {bad}")
  return {k: [v.start or 0, v.stop] for k, v in slices.items()}

# *** reading ONNX ***

def read_onnx(path: str) -> ModelProto:
  """The ONNX ModelProto at `path` (weights not loaded); clear errors for a missing or unreadable file, an empty graph, and ops tinygrad's
  ONNX runner lacks."""
  import onnx
  if not os.path.isfile(path): raise ModelError(f"{path}: no such ONNX file")
  try: model = onnx.load(path, load_external_data=False)
  except Exception as e: raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
  if not model.graph.node: raise ModelError(f"{path}: the ONNX graph is empty (corrupt or not a model)")
  unsupported = sorted({n.op_type for n in model.graph.node if n.op_type not in onnx_ops()})
  if unsupported:
    hint = " (write recurrent cells with MatMul/Sigmoid/Tanh, as comma's models do)" if {"GRU", "LSTM", "RNN"} & set(unsupported) else ""
    raise ModelError(f"{path}: ops not supported by tinygrad's ONNX runner: {', '.join(unsupported)}{hint}")
  return model

def onnx_dims(v: ValueInfoProto) -> tuple[int | str, ...]:
  """An ONNX value's declared shape: each fixed dimension's size, each dynamic one's name ("?" when it has none)."""
  return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else d.dim_param or "?" for d in v.type.tensor_type.shape.dim)

def onnx_np_dtype(v: ValueInfoProto) -> np.dtype:
  from onnx import helper
  return np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))

def graph_inputs(model: ModelProto) -> list[ValueInfoProto]:
  """The graph inputs a caller feeds: those no initializer provides."""
  inits = {i.name for i in model.graph.initializer}
  return [v for v in model.graph.input if v.name not in inits]

def load_onnx(path: str) -> OnnxInfo:
  """{"model", "inputs": {name: (shape, np dtype)}, "outputs": {...}, "metadata": {...}}; clear errors for what tinygrad cannot run."""
  model = read_onnx(path)
  def spec(v: ValueInfoProto) -> Spec:
    shape = tuple(d if isinstance(d, int) else -1 for d in onnx_dims(v))
    if any(d <= 0 for d in shape): raise ModelError(f"{path}: {v.name} has a dynamic shape {shape}: export with fixed shapes")
    return shape, onnx_np_dtype(v)
  return {"model": model, "inputs": {v.name: spec(v) for v in graph_inputs(model)},
          "outputs": {v.name: spec(v) for v in model.graph.output}, "metadata": {p.key: p.value for p in model.metadata_props}}

def main_output(path: str, info: OnnxInfo) -> str:
  """The output the bundle reads of a model: `outputs`, or its only output."""
  if "outputs" in info["outputs"]: return "outputs"
  if len(info["outputs"]) == 1: return next(iter(info["outputs"]))
  raise ModelError(f"{path}: the model has no 'outputs' output (has {sorted(info['outputs'])})")

def model_slices(path: str, info: OnnxInfo, output: str) -> dict[str, list[int]]:
  if "output_slices" not in info["metadata"]: raise ModelError(f"{path}: no output_slices in the ONNX metadata_props")
  slices = read_output_slices(info["metadata"]["output_slices"])
  n = info["outputs"][output][0][-1]
  if bad := [k for k, (a, b) in slices.items() if not 0 <= a < b <= n]: raise ModelError(f"{path}: output_slices {bad} fall outside {output} (1, {n})")
  return slices

def merge_slices(parts: dict[str, tuple[dict[str, list[int]], int]]) -> dict[str, list[int]]:
  """The bundle's output slices of models concatenated in `parts` order ({model: (slices, width)}). A head two models emit is read where
  sunnypilot's runner reads it (SLICE_PRECEDENCE); every model's own heads also stay apart as `<model>/<name>`."""
  offsets = dict(zip(parts, np.cumsum([0] + [w for _, w in parts.values()]).tolist()))
  shifted = {k: {name: [a + offsets[k], b + offsets[k]] for name, (a, b) in s.items()} for k, (s, _) in parts.items()}
  if len(parts) == 1: return next(iter(shifted.values()))
  flat: dict[str, list[int]] = {}
  for k in sorted(parts, key=SLICE_PRECEDENCE.index): flat |= shifted[k]
  return flat | {f"{k}/{name}": r for k, s in shifted.items() for name, r in s.items()}
