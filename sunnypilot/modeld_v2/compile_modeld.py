"""Compile an openpilot driving model (ONNX) of any generation into a plain bundle that takes the warp's output.

  python -m sunnypilot.modeld_v2.compile_modeld --onnx driving.onnx --output driving.bin              # native or supercombo
  python -m sunnypilot.modeld_v2.compile_modeld --vision vision.onnx --policy policy.onnx --output driving.bin
  python -m sunnypilot.modeld_v2.compile_modeld --vision vision.onnx --off-policy off.onnx --on-policy on.onnx --output driving.bin

Every bundle runs as `run(new_img=..., desire=..., <host inputs by ONNX name>=..., <states>=..., output_buffers={...})`. Input roles come
from the ONNX's names and shapes. Native models (`new_img` + states): each input X with an output next_X is a state, every other input a
host input. Queued models (supercombo, vision + policy, vision + off-policy + on-policy): the images, the desire history, features_buffer
and prev_desired_curv become openpilot's input queues, compiled in as states (see input_queues); `desire` is this frame's one-hot pulse;
every other input is a host input under its ONNX name and shape. A queued bundle also takes `prepare_only` (1, 1): above 0.5 the queues
that the generation does not push on a prepare-only frame (generations.py) keep their entries, so the frame after a drop is still one
launch. The generation is derived from the ONNX inputs and heads, or given with --generation where more than one or none fits, and recorded
in the bundle. Host inputs are float32, cast in the graph to the model's dtype;
`outputs` is float32 (the models' outputs concatenated in the order given). docs/FORMAT.md has the metadata each bundle carries.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import io
import os
import pickle
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.bundle import ArtifactError, check_output_path, state_names, write_bundle
from sunnypilot.modeld_v2.cli import add_compile_flags, add_model_flags, interruptible
from sunnypilot.modeld_v2.generations import GENERATIONS, GenerationError, Rules, derive
from sunnypilot.modeld_v2.input_queues import (
  CURVATURE,
  FEATURES,
  FRAME_PLANES,
  POLICY_INPUTS,
  ROAD_IMAGE,
  WIDE_IMAGE,
  Queue,
  QueueError,
  check_frame_skip,
  derive_frame_skip,
  every,
  is_history,
  make_split_input_queues,
  make_supercombo_input_queues,
  planes,
  pooled,
  push,
  queue_role,
)
from sunnypilot.modeld_v2.tinygrad_internals import onnx_ops, patched_onnx_ops

__all__ = ["POLICY_INPUTS", "ModelError", "Plan", "compile_model", "derive_frame_skip", "make_split_input_queues", "make_supercombo_input_queues",
           "make_step", "plan_model", "read_output_slices"]

LAYOUTS = {"native": ("model",), "supercombo": ("model",), "split": ("vision", "policy"), "multi_policy": ("vision", "off_policy", "on_policy")}
# sunnypilot's TinygradSplitRunner (sunnypilot/models/runners/tinygrad/tinygrad_runner.py @06b23b5a) merges the parsed outputs of the
# policy, then the vision model over them, then the off-policy over both: where two models emit a head, the later one's is read
SLICE_PRECEDENCE = ("policy", "on_policy", "vision", "off_policy")
FLAGS = {"model": "--onnx", "vision": "--vision", "policy": "--policy", "off_policy": "--off-policy", "on_policy": "--on-policy"}
FRAMES, DESIRE, HOST, STATE, QUEUE, GATE = "frames", "desire", "host", "state", "queue", "gate"  # what each bundle input is
PREPARE_ONLY = "prepare_only"  # the gate input of a queued bundle: (1, 1), above 0.5 on a prepare-only frame
RULES = ("images have 'img' in their name and shape (1, 6n, H, W), 'big' for the wide camera; the desire history is the 3-D input whose name "
         "starts with 'desire'; features_buffer and prev_desired_curv are fed back from hidden_state and desired_curvature; any other input "
         "that is not a (1, L>1, N) history is a host input")

class ModelError(ValueError):
  """An ONNX model this compiler cannot turn into a bundle, with the reason."""

class _SliceUnpickler(pickle.Unpickler):
  """output_slices is comma's base64 pickled {name: slice}: admit dicts and slices, nothing else."""
  def find_class(self, module: str, name: str):
    if (module, name) == ("builtins", "slice"): return slice
    raise ModelError(f"output_slices may only hold dicts and slices, found {module}.{name}")

def _bound(value: Any) -> bool: return isinstance(value, int) and not isinstance(value, bool)

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

def read_onnx(path: str) -> Any:
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

def onnx_dims(v: Any) -> tuple[int | str, ...]:
  """An ONNX value's declared shape: each fixed dimension's size, each dynamic one's name ("?" when it has none)."""
  return tuple(d.dim_value if d.HasField("dim_value") and d.dim_value > 0 else d.dim_param or "?" for d in v.type.tensor_type.shape.dim)

def onnx_np_dtype(v: Any) -> np.dtype:
  from onnx import helper
  return np.dtype(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type))

def graph_inputs(model: Any) -> list[Any]:
  """The graph inputs a caller feeds: those no initializer provides."""
  inits = {i.name for i in model.graph.initializer}
  return [v for v in model.graph.input if v.name not in inits]

def load_onnx(path: str) -> dict:
  """{"model", "inputs": {name: (shape, np dtype)}, "outputs": {...}, "metadata": {...}}; clear errors for what tinygrad cannot run."""
  model = read_onnx(path)
  def spec(v) -> tuple[tuple, Any]:
    shape = tuple(d if isinstance(d, int) else -1 for d in onnx_dims(v))
    if any(d <= 0 for d in shape): raise ModelError(f"{path}: {v.name} has a dynamic shape {shape}: export with fixed shapes")
    return shape, onnx_np_dtype(v)
  return {"model": model, "inputs": {v.name: spec(v) for v in graph_inputs(model)},
          "outputs": {v.name: spec(v) for v in model.graph.output}, "metadata": {p.key: p.value for p in model.metadata_props}}

def main_output(path: str, info: dict) -> str:
  """The output the bundle reads of a model: `outputs`, or its only output."""
  if "outputs" in info["outputs"]: return "outputs"
  if len(info["outputs"]) == 1: return next(iter(info["outputs"]))
  raise ModelError(f"{path}: the model has no 'outputs' output (has {sorted(info['outputs'])})")

def model_slices(path: str, info: dict, output: str) -> dict[str, list[int]]:
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
  flat = {}
  for k in sorted(parts, key=SLICE_PRECEDENCE.index): flat |= shifted[k]
  return flat | {f"{k}/{name}": r for k, s in shifted.items() for name, r in s.items()}

# *** roles ***

def _native_roles(path: str, info: dict) -> dict[str, str]:
  """new_img is the frames, X with an output next_X a state, anything else a host input; a next_X with no X is half a state pair."""
  inputs, outputs = info["inputs"], info["outputs"]
  if orphans := sorted(n for n in outputs if n.startswith("next_") and n[5:] not in inputs):
    raise ModelError(f"{path}: half a state pair: outputs {orphans} have no inputs {[n[5:] for n in orphans]} (a state is an input X with an output next_X)")
  states = state_names(inputs, outputs)
  for name in states:
    if outputs[f"next_{name}"] != inputs[name]:
      raise ModelError(f"{path}: state {name} {inputs[name]} and next_{name} {outputs[f'next_{name}']} differ in shape or dtype")
  return {name: FRAMES if name == "new_img" else STATE if name in states else HOST for name in inputs}

def _queued_roles(path: str, info: dict) -> dict[str, str]:
  roles = {}
  for name, (shape, _) in info["inputs"].items():
    role = queue_role(name, shape)
    if role is None and ("img" in name or is_history(shape)): raise ModelError(f"{path}: input {name} {shape} fits no rule: {RULES}")
    roles[name] = role or HOST
  return roles

# *** the plan: everything about a model but its weights ***

@dataclass
class Plan:
  layout: str
  paths: dict[str, str]  # model ("model", or "vision", "policy", "off_policy", "on_policy") -> ONNX path
  roles: dict[str, dict[str, str]]  # model -> {ONNX input: role}
  dtypes: dict[str, dict[str, Any]]  # model -> {ONNX input: numpy dtype}
  outputs: dict[str, str]  # model -> the output read
  slices: dict[str, list[int]]  # the bundle's output slices
  frame_skip: int | None
  queues: dict[str, Queue]
  specs: dict[str, tuple[tuple, Any]]  # the bundle's inputs {name: (shape, numpy dtype)}
  out_specs: dict[str, tuple[tuple, Any]]
  input_roles: dict[str, str]  # bundle input -> FRAMES, DESIRE, HOST, STATE, QUEUE or GATE
  hidden: list[int] | None  # [start, stop] of hidden_state in the first model's output: what the feature queue gets
  curvature: list[int] | None  # [start, stop] in the bundle's outputs: what the curvature queue gets
  metadata: dict[str, str]  # the ONNX metadata_props, merged
  input_shapes: dict[str, tuple]  # every ONNX input
  generation: str
  generation_source: str  # "onnx" (derived) or "--generation"

  @property
  def rules(self) -> Rules: return GENERATIONS[self.generation]

def _paths(onnx: str | None, vision: str | None, policy: str | None, off_policy: str | None, on_policy: str | None) -> tuple[str, dict[str, str]]:
  given = {k: v for k, v in (("model", onnx), ("vision", vision), ("policy", policy), ("off_policy", off_policy), ("on_policy", on_policy)) if v}
  layout = next((name for name, keys in LAYOUTS.items() if set(given) == set(keys)), None)
  if layout is None:
    raise ModelError("give --onnx, or --vision with --policy, or --vision with --off-policy and --on-policy; "
                     f"got {', '.join(FLAGS[k] for k in given) or 'none'}")
  return layout, {k: given[k] for k in LAYOUTS[layout]}

def plan_model(onnx: str | None = None, vision: str | None = None, policy: str | None = None, off_policy: str | None = None,
               on_policy: str | None = None, frame_skip: int | None = None, generation: str | None = None) -> Plan:
  """Read and check the ONNX (one model, a vision + policy pair or a vision + off-policy + on-policy triple): roles, output slices,
  frame_skip, queues, and the bundle's input and output specs."""
  layout, paths = _paths(onnx, vision, policy, off_policy, on_policy)
  infos = {k: load_onnx(p) for k, p in paths.items()}
  if "model" in infos: layout = "native" if "new_img" in infos["model"]["inputs"] else "supercombo"
  outputs = {k: main_output(paths[k], info) for k, info in infos.items()}
  own_slices = {k: model_slices(paths[k], info, outputs[k]) for k, info in infos.items()}
  slices = merge_slices({k: (own_slices[k], infos[k]["outputs"][outputs[k]][0][-1]) for k in infos})
  dtypes = {k: {n: d for n, (_, d) in info["inputs"].items()} for k, info in infos.items()}
  metadata = {k: v for info in reversed(infos.values()) for k, v in info["metadata"].items()}
  shapes = {n: s for info in infos.values() for n, (s, _) in info["inputs"].items()}
  try: found = derive(layout, shapes, slices, generation)
  except GenerationError as e: raise ModelError(f"{', '.join(paths.values())}: {e}") from None
  common = {"layout": layout, "paths": paths, "dtypes": dtypes, "outputs": outputs, "slices": slices, "metadata": metadata, "input_shapes": shapes,
            "generation": found, "generation_source": "onnx" if generation is None else "--generation"}
  try:
    if frame_skip is not None: frame_skip = check_frame_skip(frame_skip, "--frame-skip")
    if layout == "native": return _plan_native(infos, **common)
    return _plan_queued(infos, own_slices, frame_skip, **common)
  except QueueError as e: raise ModelError(f"{', '.join(paths.values())}: {e}") from None

def _plan_native(infos: dict, **common) -> Plan:
  (path,), info = common["paths"].values(), infos["model"]
  if "outputs" not in info["outputs"]:  # the fused part and modeld read `outputs`; states are the other outputs
    raise ModelError(f"{path}: a native model's output vector must be named 'outputs' (it has {sorted(info['outputs'])})")
  roles = _native_roles(path, info)
  specs = {n: (s, np.uint8 if roles[n] == FRAMES else d if roles[n] == STATE else np.float32) for n, (s, d) in info["inputs"].items()}
  out_specs = {n: (s, d if n.startswith("next_") and roles.get(n[5:]) == STATE else np.float32) for n, (s, d) in info["outputs"].items()}
  return Plan(roles={"model": roles}, frame_skip=None, queues={}, specs=specs, out_specs=out_specs, input_roles=roles, hidden=None, curvature=None,
              **common)

def _plan_queued(infos: dict, own_slices: dict, frame_skip: int | None, **common) -> Plan:
  paths, slices = common["paths"], common["slices"]
  roles = {k: _queued_roles(paths[k], info) for k, info in infos.items()}
  shapes: dict[str, tuple] = {}
  for k, info in infos.items():
    for name, (shape, _) in info["inputs"].items():
      if shapes.setdefault(name, shape) != shape: raise ModelError(f"input {name} is {shapes[name]} in one model and {shape} in {paths[k]}")
  found = {role: name for model_roles in roles.values() for name, role in model_roles.items() if role != HOST}
  if ROAD_IMAGE not in found or WIDE_IMAGE not in found:
    raise ModelError(f"{', '.join(paths.values())}: a queued model takes a road and a wide image ({RULES}); these take {sorted(shapes)}")
  if shapes[found[ROAD_IMAGE]] != shapes[found[WIDE_IMAGE]]:
    raise ModelError(f"the road image {found[ROAD_IMAGE]} {shapes[found[ROAD_IMAGE]]} and the wide image {found[WIDE_IMAGE]} "
                     f"{shapes[found[WIDE_IMAGE]]} differ in shape")
  first = next(iter(infos))
  if len(infos) > 1 and FEATURES in roles[first].values(): raise ModelError(f"{paths[first]}: the vision model cannot take features_buffer: it makes them")
  if frame_skip is None:
    said = {paths[k]: check_frame_skip(info["metadata"]["frame_skip"], f"{paths[k]}: frame_skip metadata")
            for k, info in infos.items() if "frame_skip" in info["metadata"]}
    if len(set(said.values())) > 1: raise ModelError(f"the models disagree on frame_skip: {said}")
    frame_skip = derive_frame_skip({"frame_skip": next(iter(said.values()))} if said else {}, shapes)
  queues = make_supercombo_input_queues(shapes, frame_skip) if len(infos) == 1 else \
    make_split_input_queues({n: shapes[n] for n in infos[first]["inputs"]}, shapes, frame_skip)
  hidden = curvature = None
  if FEATURES in found:
    if "hidden_state" not in own_slices[first]: raise ModelError(f"{paths[first]}: output_slices has no hidden_state: features_buffer is fed back from it")
    hidden = own_slices[first]["hidden_state"]
    if (n := hidden[1] - hidden[0]) != (feature_len := shapes["features_buffer"][2]):
      raise ModelError(f"{paths[first]}: hidden_state has {n} values, features_buffer {shapes['features_buffer']} takes {feature_len}")
  if CURVATURE in found:
    width = shapes[found[CURVATURE]][2]
    if "desired_curvature" not in slices: raise ModelError(f"no output_slices has desired_curvature: {found[CURVATURE]} is fed back from it")
    start, stop = slices["desired_curvature"]
    if stop - start not in (width, 2 * width):
      raise ModelError(f"desired_curvature has {stop - start} values, {found[CURVATURE]} takes {width} (the head's mean, before its std)")
    curvature = [start, start + width]  # an MDN head: its means come first
  host = {name: shapes[name] for model_roles in roles.values() for name, role in model_roles.items() if role == HOST}
  _, planes_h, planes_w = queues["img_q"].shape[1:]
  specs: dict[str, tuple[tuple, Any]] = {"new_img": ((2, FRAME_PLANES, planes_h, planes_w), np.uint8)}
  if "desire_q" in queues: specs["desire"] = ((1, queues["desire_q"].shape[1]), np.float32)
  if clash := sorted(set(host) & (set(specs) | set(queues) | {PREPARE_ONLY})): raise ModelError(f"host inputs {clash} clash with the bundle's own inputs")
  specs |= {name: (shape, np.float32) for name, shape in host.items()} | {PREPARE_ONLY: ((1, 1), np.float32)} | \
    {name: (q.shape, q.dtype) for name, q in queues.items()}
  n_out = sum(info["outputs"][common["outputs"][k]][0][-1] for k, info in infos.items())
  out_specs = {"outputs": ((1, n_out), np.float32)} | {f"next_{name}": (q.shape, q.dtype) for name, q in queues.items()}
  input_roles = {"new_img": FRAMES} | ({"desire": DESIRE} if "desire" in specs else {}) | dict.fromkeys(host, HOST) | {PREPARE_ONLY: GATE} | \
    dict.fromkeys(queues, QUEUE)
  return Plan(roles=roles, frame_skip=frame_skip, queues=queues, specs=specs, out_specs=out_specs, input_roles=input_roles, hidden=hidden,
              curvature=curvature, **common)

# *** the compiled step ***

def _write(output_buffers: dict, values: dict) -> None:
  """Compute every value before writing any buffer, so a caller may alias next_X to X (the part reads X before it writes next_X)."""
  from tinygrad import Tensor
  temps = {k: v.contiguous() for k, v in values.items()}
  Tensor.realize(*temps.values())
  Tensor.realize(*(output_buffers[k].assign(t) for k, t in temps.items()))

def _as(t, dtype: Any):
  """`t` in a numpy dtype's tinygrad equivalent, cast in the graph only if it differs."""
  from tinygrad import dtypes
  from tinygrad.dtype import to_dtype
  target = to_dtype(np.dtype(dtype).name)
  if t.dtype == target: return t
  narrowed = dtypes.is_float(t.dtype) and dtypes.is_float(target) and target.itemsize < t.dtype.itemsize
  return t.cast(target).contiguous() if narrowed else t.cast(target)  # tinygrad folds cast(cast(x, half), float) to x: keep the rounding

def make_step(plan: Plan, runners: dict):
  """The function TinyJit captures for a plan, with an OnnxRunner per model."""
  def run(model: str, values: dict):
    """One model on the values of its inputs, cast to its dtypes; its output read, as float32, computed once."""
    feeds = {name: _as(values[name], dtype) for name, dtype in plan.dtypes[model].items()}
    return _as(runners[model](feeds)[plan.outputs[model]], np.float32).contiguous()

  if plan.layout == "native":
    def native(output_buffers, **inputs):
      out = runners["model"]({name: _as(inputs[name], dtype) for name, dtype in plan.dtypes["model"].items()})
      _write(output_buffers, {k: _as(out[k], plan.out_specs[k][1]) for k in output_buffers})
    return native

  models, fs, queues, rules = list(plan.paths), plan.frame_skip, plan.queues, plan.rules
  # on a prepare-only frame only the images advance, and the desire where the generation pushes it then
  held = {"feat_q", "curv_q"} | (set() if rules.prepare_pushes_desire else {"desire_q"})
  def queued(output_buffers, new_img, prepare_only, **inputs):
    state = {name: inputs.pop(name) for name in queues}
    skip = prepare_only.reshape(1, 1) > 0.5
    new = {name: push(state[name], new_img[i:i + 1]) for i, name in enumerate(("img_q", "big_img_q"))}
    values = inputs | {queues[name].feeds: planes(new[name], fs) for name in new}
    if "desire_q" in queues:
      new["desire_q"] = push(state["desire_q"], values.pop("desire").reshape(1, -1))
      values[queues["desire_q"].feeds] = pooled(new["desire_q"], fs)
    if "curv_q" in queues:  # this step's curvature joins after the run; zeros where the generation is not fed it
      curv = every(state["curv_q"], fs)
      values[queues["curv_q"].feeds] = curv if rules.feeds_prev_curvature else curv.zeros_like()
    if len(models) == 1:
      if "feat_q" in queues: values["features_buffer"] = every(state["feat_q"], fs)  # a single model sees past features only
      out = run(models[0], values)
      producer = out
    else:  # the vision model's hidden_state of this frame is the newest feature the policies see
      producer = run(models[0], values)
      if "feat_q" in queues:
        new["feat_q"] = push(state["feat_q"], producer[:, slice(*plan.hidden)])
        values["features_buffer"] = every(new["feat_q"], fs)
      out = producer.cat(*(run(k, values) for k in models[1:]), dim=1)
    if "feat_q" in queues and "feat_q" not in new: new["feat_q"] = push(state["feat_q"], producer[:, slice(*plan.hidden)])
    if "curv_q" in queues: new["curv_q"] = push(state["curv_q"], out[:, slice(*plan.curvature)])
    new = {name: skip.where(state[name], q) if name in held else q for name, q in new.items()}
    _write(output_buffers, {"outputs": out} | {f"next_{name}": new[name] for name in queues})
  return queued

# *** compile ***

def _np_str(dtype) -> str: return np.dtype(dtype).str

LAYER_OPS = ("Conv", "MatMul", "Gemm")

@contextlib.contextmanager
def layer_boundaries(on: bool = True) -> Iterator[None]:
  """Realize the output of every convolution and matrix product while ONNX runners trace. Left free, tinygrad 0.14.0's scheduler fuses a
  convolution into the next one and recomputes it for every tap of the second (supercombo's backbones) and nests the GRU's matrix
  products the same way; a boundary per layer computes each once."""
  def realized(op):
    return functools.wraps(op)(lambda *args, **kwargs: op(*args, **kwargs).contiguous())
  with patched_onnx_ops({name: realized(onnx_ops()[name]) for name in LAYER_OPS if on}): yield

def compile_model(output: str, onnx: str | None = None, vision: str | None = None, policy: str | None = None, frame_skip: int | None = None,
                  off_policy: str | None = None, on_policy: str | None = None, log=print, beam: int | None = None, fuse_layers: bool = False,
                  generation: str | None = None) -> dict:
  """Compile one ONNX (native or supercombo), a vision + policy pair or a vision + off-policy + on-policy triple into a bundle at `output`.
  Returns a summary. Fails before any work when `output` cannot be written or `beam` cannot search here. `beam`: search every kernel
  with BEAM on this device (None: tinygrad's BEAM setting). `fuse_layers`: no realize point per layer (see layer_boundaries).
  `generation`: the model's generation (generations.GENERATIONS) when its ONNX does not tell."""
  from tinygrad import Device, Tensor
  from tinygrad.nn.onnx import OnnxRunner

  from sunnypilot.modeld_v2.capture import capture, compile_session, search_level
  t0, dev = time.perf_counter(), Device.DEFAULT
  check_output_path(output, inputs=(onnx, vision, policy, off_policy, on_policy))
  level = search_level(beam)
  plan = plan_model(onnx, vision, policy, off_policy, on_policy, frame_skip, generation)
  log(f"{plan.layout} ({', '.join(f'{k} {p}' for k, p in plan.paths.items())}), generation {plan.generation} ({plan.generation_source}), "
      f"frame_skip {plan.frame_skip}, on {dev}")
  rng = np.random.default_rng(0)
  def make(shape, dtype) -> Tensor:
    value = rng.integers(0, 256, shape, dtype=np.uint8) if np.dtype(dtype) == np.uint8 else rng.standard_normal(shape).astype(dtype)
    return Tensor(value, device=dev).realize()
  make_inputs = lambda: {k: make(*s) for k, s in plan.specs.items()} | {"output_buffers": {k: make(*s) for k, s in plan.out_specs.items()}}
  with compile_session() as null_holds_data, layer_boundaries(not fuse_layers):  # weights load into device buffers: host-backed on NULL
    step = make_step(plan, {k: OnnxRunner(p) for k, p in plan.paths.items()})
    log("capturing (call 0 runs eagerly and compiles the kernels, call 1 captures), then self-checking against the TinyJit replay ...")
    jit, part, inputs = capture(step, make_inputs, null_holds_data=null_holds_data, beam=level, log=log)
  metadata = {"kind": "model", "layout": plan.layout, "generation": plan.generation, "generation_source": plan.generation_source,
              "layer_boundaries": not fuse_layers,
              "frame_skip": plan.frame_skip, "output_slices": plan.slices, "input_roles": plan.input_roles,
              "onnx_roles": plan.roles, "input_shapes": {n: list(s) for n, s in plan.input_shapes.items()},
              "output_shapes": {k: list(s) for k, (s, _) in plan.out_specs.items()},
              "stand_in": plan.metadata.get("stand_in"), "sources": {k: os.path.basename(p) for k, p in plan.paths.items()}}
  extras = {"input_specs": {k: (list(s), _np_str(d), dev) for k, (s, d) in plan.specs.items()},
            "output_specs": {k: (list(s), _np_str(d), dev) for k, (s, d) in plan.out_specs.items()}, "metadata": metadata}
  size = write_bundle(output, {"run": part}, extras, flags={"BEAM": level})
  header = part[0]
  weights = sum(b["init"][1] - b["init"][0] for b in header["buffers"] if "init" in b)
  summary = {"output": output, "layout": plan.layout, "kernels": sum(c["kind"] == "program" for c in header["calls"]), "calls": len(header["calls"]),
             "programs": len(header["programs"]), "weight_bytes": weights, "bytes": size, "compile_s": time.perf_counter() - t0,
             "jit": jit, "part": part, "inputs": inputs}
  log(f"wrote {output}: {summary['kernels']} kernels ({summary['programs']} distinct), {weights / 1e6:.1f} MB weights, {size / 1e6:.1f} MB bundle, "
      f"{summary['compile_s']:.1f} s" + (f"  [{plan.metadata['stand_in']}]" if plan.metadata.get("stand_in") else ""))
  return summary

@interruptible("compile_modeld")
def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  add_model_flags(parser)
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--generation", choices=tuple(GENERATIONS), help="the model's generation, which decides modeld's rules (curvature source, "
                      "prev_desired_curv feed, smoothing, prepare-only pushes; see README). Default: derived from the ONNX inputs and heads; "
                      "required when they fit none or several")
  parser.add_argument("--frame-skip", help="frames between the queues' samples, at least 1 (default: the ONNX's frame_skip, else 1 for a "
                      "features_buffer of >= 99 entries, else 4)")
  add_compile_flags(parser)
  args = parser.parse_args(argv)
  try:
    frame_skip = None if args.frame_skip is None else check_frame_skip(args.frame_skip, "--frame-skip")
    compile_model(args.output, args.onnx, args.vision, args.policy, frame_skip, args.off_policy, args.on_policy,
                  log=lambda s: print(s, file=sys.stderr, flush=True), beam=args.beam, fuse_layers=args.fuse_layers, generation=args.generation)
  except (ModelError, QueueError, ArtifactError) as e:
    parser.exit(2, f"compile_modeld: error: {e}\n")
  return 0

if __name__ == "__main__":
  sys.exit(main())
