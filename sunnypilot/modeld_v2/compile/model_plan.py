"""The plan of an openpilot model: everything about it but its weights. Which layout it is (native, supercombo, vision + policy, vision +
off-policy + on-policy, or the driver-monitoring model), each input's role, its generation, output slices, queues, and the bundle's input
and output specs.

Input roles come from the ONNX's names and shapes. Native models (`new_img` + states) and the driver-monitoring model (`input_img`, the
warped driver camera, + `calib`): each input X with an output next_X is a state, every other input a host input. Queued models: the
images, the desire history, features_buffer and prev_desired_curv become openpilot's input queues, kept as states (input_queues); `desire`
is this frame's one-hot pulse; every other input is a host input.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from sunnypilot.modeld_v2.compile.input_queues import (
  CURVATURE,
  FEATURES,
  FRAME_PLANES,
  ROAD_IMAGE,
  WIDE_IMAGE,
  InputQueues,
  QueueError,
  check_frame_skip,
  derive_frame_skip,
  is_history,
  make_split_input_queues,
  make_supercombo_input_queues,
  queue_role,
)
from sunnypilot.modeld_v2.compile.onnx_model import ModelError, OnnxInfo, load_onnx, main_output, merge_slices, model_slices
from sunnypilot.modeld_v2.format.bundle import check_output_slices, next_name, state_names, unpaired_state_outputs
from sunnypilot.modeld_v2.model.generations import GENERATIONS, GenerationError, derive
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import check_dm_heads
from sunnypilot.modeld_v2.model.parse_model_outputs import check_head_sizes

LAYOUTS = {"native": ("model",), "supercombo": ("model",), "split": ("vision", "policy"), "multi_policy": ("vision", "off_policy", "on_policy")}
FLAGS = {"model": "--onnx", "vision": "--vision", "policy": "--policy", "off_policy": "--off-policy", "on_policy": "--on-policy"}
FRAMES, DESIRE, HOST, STATE, QUEUE, GATE = "frames", "desire", "host", "state", "queue", "gate"  # what each bundle input is
PREPARE_ONLY = "prepare_only"  # the gate input of a queued bundle: (1, 1), above 0.5 on a prepare-only frame
# the frames input of a one-model layout: a native driving model's warped planes, the driver-monitoring model's warped driver camera
# (openpilot's dmonitoringmodeld feeds the DM warp's output as input_img)
NATIVE_FRAMES, DM_FRAMES = "new_img", "input_img"
DMONITORING = "dmonitoring"  # the driver-monitoring model's layout: no generation, its heads openpilot's dmonitoringmodeld parse
RULES = ("images have 'img' in their name and shape (1, 6n, H, W), 'big' for the wide camera; the desire history is the 3-D input whose name "
         "starts with 'desire'; features_buffer and prev_desired_curv are fed back from hidden_state and desired_curvature; any other input "
         "that is not a (1, L>1, N) history is a host input")

# *** roles ***

def _native_roles(path: str, info: OnnxInfo) -> dict[str, str]:
  """new_img is the frames, X with an output next_X a state, anything else a host input; a next_X with no X is half a state pair."""
  inputs, outputs = info["inputs"], info["outputs"]
  if orphans := unpaired_state_outputs(inputs, outputs):
    raise ModelError(f"{path}: half a state pair: outputs {list(orphans)} have no inputs {list(orphans.values())} "
                     "(a state is an input X with an output next_X)")
  states = state_names(inputs, outputs)
  for name in states:
    if outputs[next_name(name)] != inputs[name]:
      raise ModelError(f"{path}: state {name} {inputs[name]} and {next_name(name)} {outputs[next_name(name)]} differ in shape or dtype")
  return {name: FRAMES if name in (NATIVE_FRAMES, DM_FRAMES) else STATE if name in states else HOST for name in inputs}

def _queued_roles(path: str, info: OnnxInfo) -> dict[str, str]:
  roles = {}
  for name, (shape, _) in info["inputs"].items():
    role = queue_role(name, shape)
    if role is None and ("img" in name or is_history(shape)): raise ModelError(f"{path}: input {name} {shape} fits no rule: {RULES}")
    roles[name] = role or HOST
  return roles

# *** the plan: everything about a model but its weights ***

PlanSpecs = dict[str, tuple[tuple[int, ...], npt.DTypeLike]]  # a bundle's inputs or outputs as a plan declares them: {name: (shape, numpy dtype)}

@dataclass(frozen=True)
class Plan:
  """A model's plan, for every layout. A native model's states are inputs with the role STATE; a queued model's plan is a QueuedPlan."""
  layout: str
  paths: dict[str, str]  # model ("model", or "vision", "policy", "off_policy", "on_policy") -> ONNX path
  roles: dict[str, dict[str, str]]  # model -> {ONNX input: role}
  dtypes: dict[str, dict[str, np.dtype]]  # model -> {ONNX input: numpy dtype}
  outputs: dict[str, str]  # model -> the output read
  slices: dict[str, list[int]]  # the bundle's output slices
  specs: PlanSpecs  # the bundle's inputs {name: (shape, numpy dtype)}
  out_specs: PlanSpecs
  input_roles: dict[str, str]  # bundle input -> FRAMES, DESIRE, HOST, STATE, QUEUE or GATE
  metadata: dict[str, str]  # the ONNX metadata_props, merged
  input_shapes: dict[str, tuple]  # every ONNX input
  generation: str
  generation_source: str  # "onnx" (derived) or "--generation"

@dataclass(frozen=True)
class QueuedPlan(Plan):
  """A supercombo, vision + policy or vision + off-policy + on-policy model: a plan with openpilot's input queues."""
  queues: InputQueues

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
  frame_skip, queues, and the bundle's input and output specs. A queued model's plan is a QueuedPlan."""
  layout, paths = _paths(onnx, vision, policy, off_policy, on_policy)
  infos = {k: load_onnx(p) for k, p in paths.items()}
  if "model" in infos: layout = next((name for name, frames in ((DMONITORING, DM_FRAMES), ("native", NATIVE_FRAMES)) if frames in infos["model"]["inputs"]),
                                      "supercombo")
  if layout == DMONITORING and generation is not None: raise ModelError(f"{paths['model']}: a driver-monitoring model has no --generation")
  outputs = {k: main_output(paths[k], info) for k, info in infos.items()}
  own_slices = {k: model_slices(paths[k], info, outputs[k]) for k, info in infos.items()}
  widths = {k: infos[k]["outputs"][outputs[k]][0][-1] for k in infos}
  heads = check_dm_heads if layout == DMONITORING else check_head_sizes
  for k in infos:  # the loader's own check of a bundle's output_slices, per file: a head a daemon cannot parse fails here, not in the car
    try: check_output_slices(own_slices[k], widths[k]); heads(own_slices[k])
    except ValueError as e: raise ModelError(f"{paths[k]}: output_slices: {e}") from None
  slices = merge_slices({k: (own_slices[k], widths[k]) for k in infos})
  dtypes = {k: {n: d for n, (_, d) in info["inputs"].items()} for k, info in infos.items()}
  metadata = {k: v for info in reversed(infos.values()) for k, v in info["metadata"].items()}
  shapes: dict[str, tuple] = {}  # every model's inputs by name: an input two models share has one shape
  for k, info in infos.items():
    for name, (shape, _) in info["inputs"].items():
      if shapes.setdefault(name, shape) != shape: raise ModelError(f"input {name} is {shapes[name]} in one model and {shape} in {paths[k]}")
  try: found = DMONITORING if layout == DMONITORING else derive(layout, shapes, slices, generation)
  except GenerationError as e: raise ModelError(f"{', '.join(paths.values())}: {e}") from None
  common = {"layout": layout, "paths": paths, "dtypes": dtypes, "outputs": outputs, "slices": slices, "metadata": metadata, "input_shapes": shapes,
            "generation": found, "generation_source": "onnx" if generation is None else "--generation"}
  try:
    if frame_skip is not None: frame_skip = check_frame_skip(frame_skip, "--frame-skip")
    if layout in ("native", DMONITORING): return _plan_native(infos, **common)
    return _plan_queued(infos, own_slices, frame_skip, **common)
  except QueueError as e: raise ModelError(f"{', '.join(paths.values())}: {e}") from None

def _plan_native(infos: dict[str, OnnxInfo], **common: Any) -> Plan:
  (path,), info = common["paths"].values(), infos["model"]
  if "outputs" not in info["outputs"]:  # the fused part and the daemons read `outputs`; states are the other outputs
    raise ModelError(f"{path}: a {common['layout']} model's output vector must be named 'outputs' (it has {sorted(info['outputs'])})")
  roles = _native_roles(path, info)
  states = {next_name(n): n for n, role in roles.items() if role == STATE}
  specs: PlanSpecs = {n: (s, np.uint8 if roles[n] == FRAMES else d if roles[n] == STATE else np.float32) for n, (s, d) in info["inputs"].items()}
  out_specs: PlanSpecs = {n: (s, d if n in states else np.float32) for n, (s, d) in info["outputs"].items()}
  return Plan(roles={"model": roles}, specs=specs, out_specs=out_specs, input_roles=roles, **common)

def _plan_queued(infos: dict[str, OnnxInfo], own_slices: dict[str, dict[str, list[int]]], frame_skip: int | None, **common: Any) -> QueuedPlan:
  paths, slices = common["paths"], common["slices"]
  roles, shapes = {k: _queued_roles(paths[k], info) for k, info in infos.items()}, common["input_shapes"]
  found = {role: name for model_roles in roles.values() for name, role in model_roles.items() if role != HOST}
  if ROAD_IMAGE not in found or WIDE_IMAGE not in found:
    raise ModelError(f"{', '.join(paths.values())}: a queued model takes a road and a wide image ({RULES}); these take {sorted(shapes)}")
  if shapes[found[ROAD_IMAGE]] != shapes[found[WIDE_IMAGE]]:
    raise ModelError(f"the road image {found[ROAD_IMAGE]} {shapes[found[ROAD_IMAGE]]} and the wide image {found[WIDE_IMAGE]} "
                     f"{shapes[found[WIDE_IMAGE]]} differ in shape")
  first = next(iter(infos))
  if len(infos) > 1 and FEATURES in roles[first].values(): raise ModelError(f"{paths[first]}: the vision model cannot take features_buffer: it makes them")
  if frame_skip is None: frame_skip = _frame_skip(paths, infos, shapes)
  queues = make_supercombo_input_queues(shapes, frame_skip) if len(infos) == 1 else \
    make_split_input_queues({n: shapes[n] for n in infos[first]["inputs"]}, shapes, frame_skip)
  feedback = _feedback(paths[first], own_slices[first], slices, found, shapes)
  host = {name: shapes[name] for model_roles in roles.values() for name, role in model_roles.items() if role == HOST}
  _, planes_h, planes_w = queues["img_q"].shape[1:]
  specs: PlanSpecs = {"new_img": ((2, FRAME_PLANES, planes_h, planes_w), np.uint8)}
  if "desire_q" in queues: specs["desire"] = ((1, queues["desire_q"].shape[1]), np.float32)
  if clash := sorted(set(host) & (set(specs) | set(queues) | {PREPARE_ONLY})): raise ModelError(f"host inputs {clash} clash with the bundle's own inputs")
  specs |= {name: (shape, np.float32) for name, shape in host.items()} | {PREPARE_ONLY: ((1, 1), np.float32)} | \
    {name: (q.shape, q.dtype) for name, q in queues.items()}
  n_out = sum(info["outputs"][common["outputs"][k]][0][-1] for k, info in infos.items())
  out_specs = {"outputs": ((1, n_out), np.float32)} | {next_name(name): (q.shape, q.dtype) for name, q in queues.items()}
  input_roles = {"new_img": FRAMES} | ({"desire": DESIRE} if "desire" in specs else {}) | dict.fromkeys(host, HOST) | {PREPARE_ONLY: GATE} | \
    dict.fromkeys(queues, QUEUE)
  return QueuedPlan(roles=roles, specs=specs, out_specs=out_specs, input_roles=input_roles, **common,
                    queues=InputQueues(queues, frame_skip, feedback, GENERATIONS[common["generation"]]))

def _frame_skip(paths: dict[str, str], infos: dict[str, OnnxInfo], shapes: dict[str, tuple]) -> int:
  """The models' own frame_skip (they must agree), else the rule of derive_frame_skip."""
  said = {paths[k]: check_frame_skip(info["metadata"]["frame_skip"], f"{paths[k]}: frame_skip metadata")
          for k, info in infos.items() if "frame_skip" in info["metadata"]}
  if len(set(said.values())) > 1: raise ModelError(f"the models disagree on frame_skip: {said}")
  return derive_frame_skip({"frame_skip": next(iter(said.values()))} if said else {}, shapes)

def _feedback(path: str, first_slices: dict[str, list[int]], slices: dict[str, list[int]], found: dict[str, str], shapes: dict[str, tuple]) -> dict:
  """[start, stop] of the outputs each fed-back queue is pushed from: feat_q from hidden_state in `first_slices`, the first model's (at
  `path`; its output leads the bundle's, so the columns are the same in both), curv_q from the desired_curvature head's mean."""
  feedback = {}
  if FEATURES in found:
    if "hidden_state" not in first_slices: raise ModelError(f"{path}: output_slices has no hidden_state: features_buffer is fed back from it")
    hidden = feedback["feat_q"] = first_slices["hidden_state"]
    if (n := hidden[1] - hidden[0]) != (feature_len := shapes["features_buffer"][2]):
      raise ModelError(f"{path}: hidden_state has {n} values, features_buffer {shapes['features_buffer']} takes {feature_len}")
  if CURVATURE in found:
    width = shapes[found[CURVATURE]][2]
    if "desired_curvature" not in slices: raise ModelError(f"no output_slices has desired_curvature: {found[CURVATURE]} is fed back from it")
    start, stop = slices["desired_curvature"]
    if stop - start not in (width, 2 * width):
      raise ModelError(f"desired_curvature has {stop - start} values, {found[CURVATURE]} takes {width} (the head's mean, before its std)")
    feedback["curv_q"] = [start, start + width]  # an MDN head: its means come first
  return feedback

# *** the command-line flags of a driving model's files ***

# a driving model's ONNX files, as compile_model takes them; vision first, since a bundle's outputs concatenate the models in this order
MODEL_FILES = ("onnx", "vision", "policy", "off_policy", "on_policy")
MODEL_FILE_HELP = {"onnx": "a native (new_img + states) or supercombo driving model",
                   "vision": "the vision model of a split pair or triple (with --policy, or --off-policy and --on-policy)",
                   "policy": "the policy of a vision + policy pair", "off_policy": "the off-policy of a vision + off-policy + on-policy triple",
                   "on_policy": "the on-policy of a vision + off-policy + on-policy triple"}

def add_model_flags(parser: argparse.ArgumentParser, use: str = "") -> None:
  """--onnx, --vision, --policy, --off-policy, --on-policy: one driving model's ONNX files; `use` ends each help line."""
  for key in MODEL_FILES: parser.add_argument(f"--{key.replace('_', '-')}", help=MODEL_FILE_HELP[key] + use)

def model_files(args: argparse.Namespace) -> dict[str, str]:
  """{compile_model keyword: path} of the model files given."""
  return {key: path for key in MODEL_FILES if (path := getattr(args, key, None))}
