"""Random-weight stand-ins for every driving-model generation sunnypilot users run: openpilot's input names, shapes and dtypes, its output
heads as `output_slices`, seeded weights.

No real comma weights are reachable from here, so these exist to exercise the whole pipeline. Their outputs mean nothing.

  python -m sunnypilot.modeld_v2.tools.stand_in_models --generation split_09 --size tiny --output models/split_09.onnx

Generations (names and shapes from the history of openpilot's selfdrive/modeld/modeld.py and compile_modeld.py):
  native             new_img + desire, traffic_convention, action_t + state_feat_q -> outputs + next_state_feat_q
  supercombo_20hz    0.9.x supercombo, float16 images and host inputs: input_imgs, big_input_imgs, desire (1,100,8), traffic_convention, lateral_control_params,
                     prev_desired_curv (1,100,1), nav_features, nav_instructions, features_buffer (1,99,512) (20 Hz history: frame_skip 1)
  split_09           0.9.7-0.9.9 vision (input_imgs, big_input_imgs) + policy (desire (1,25,8), traffic_convention, lateral_control_params,
                     prev_desired_curv (1,25,1), features_buffer (1,25,512))
  split_010          0.10 vision (img, big_img) + policy (desire_pulse (1,25,8), traffic_convention, features_buffer (1,24,512))
  split_action       the same with action_t in the policy and features_buffer (1,25,512)
  supercombo_action  one ONNX: img, big_img, features_buffer (1,24,512), desire_pulse (1,25,8), traffic_convention, action_t
  multi_policy       vision + off-policy + on-policy (desire_pulse, traffic_convention, features_buffer (1,25,512) each)
  split_current      openpilot's current layout (compile_modeld.py @55cac784): vision (img, big_img) -> lanes, edges, meta, desire_pred, a
                     single-hypothesis lead (144) and hidden_state; policy (desire_pulse (1,25,8), traffic_convention, features_buffer
                     (1,25,512)) -> a single-hypothesis plan (990), desire_state and 2 floats of padding
Other models (compile_modeld tells them by their inputs; compile_onnx makes a plain bundle of any of them):
  dmonitoring        openpilot's driver-monitoring model: input_img (1, 1440*960) uint8 + calib (1, 3) -> outputs (1, 33 head values + 512
                     features), output_slices of the current layout (per driver side face_descs 12, face_prob, eyes_visible_prob,
                     eyes_closed_prob, using_phone_prob; wheel_on_right; features)
A generation of several models writes one file per model next to `--output` (split_09.onnx -> split_09_vision.onnx, split_09_policy.onnx)
and prints the compile_modeld command for them. Sizes: `tiny` (tests), `full` (a conv backbone of realistic depth, for benchmarks) and
`big` (800 MB of weights, the size of openpilot's big model, for the load benchmarks).
Recurrent cells are MatMul/Sigmoid/Tanh, as comma's are: tinygrad's ONNX runner has no GRU/LSTM.
"""
from __future__ import annotations

import base64
import os
import pickle
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import numpy.typing as npt

from sunnypilot.modeld_v2.common.cli import interruptible, non_negative_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
from sunnypilot.modeld_v2.model.constants import CURRENT_POLICY_SLICES, CURRENT_VISION_SLICES, FEATURE_LEN, POLICY_SLICES, VISION_SLICES, slices_of
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DM_LAYOUTS, DRIVER_SIDES, dm_heads

if TYPE_CHECKING:  # onnx is an optional extra, imported where a stand-in is built
  from onnx import ModelProto, NodeProto, TensorProto, ValueInfoProto

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; newer onnx writes newer IR versions that older onnxruntimes refuse
MODEL_H, MODEL_W = 128, 256  # the (6, H, W) planes of one warped camera frame
NATIVE_HISTORY = {"tiny": 4, "full": 24, "big": 24}
# per size: conv layers (out channels, kernel, stride) of each camera's backbone. `big` is for the load benchmarks alone: about 100 M
# weights per camera backbone, 805 MB for a vision + policy pair, the size of the big model whose 773 MB load stalled a device (openpilot
# issue 39001); its wide layers run at 4x8, so a frame stays a few GFLOPs
BACKBONES = {"tiny": [(8, 4, 4), (16, 3, 2)],
             "full": [(32, 3, 2), (32, 3, 1), (64, 3, 2), (64, 3, 1), (128, 3, 2), (128, 3, 1), (256, 3, 2), (256, 3, 1)],
             "big": [(64, 3, 2), (128, 3, 2), (256, 3, 2), (512, 3, 2), (1024, 3, 2), (2048, 3, 1), (2048, 3, 1), (2048, 3, 1)]}

class StandInError(ValueError):
  """A stand-in that cannot be made as asked, with the reason."""

class ModelSpec(NamedTuple):
  """One ONNX of a generation: openpilot's input names and shapes, the dtype of its float inputs, its output heads {name: size}."""
  heads: dict[str, int]
  images: tuple[str, str] | None = None  # road, wide: (1, 12, 128, 256) each
  image_dtype: npt.DTypeLike = np.uint8
  histories: dict[str, tuple[int, int, int]] = {}  # the queued inputs: desire history, features_buffer, prev_desired_curv
  host: Mapping[str, tuple[int, ...]] = {}
  dtype: npt.DTypeLike = np.float32  # of the float inputs but the fed-back ones (FED_BACK)

OLD_IMAGES, IMAGES = ("input_imgs", "big_input_imgs"), ("img", "big_img")
TRAFFIC, LATERAL, ACTION_T = {"traffic_convention": (1, 2)}, {"lateral_control_params": (1, 2)}, {"action_t": (1, 2)}
NAV = {"nav_features": (1, 256), "nav_instructions": (1, 150)}  # openpilot 0.9.x NAV_FEATURE_LEN, NAV_INSTRUCTION_LEN
NATIVE_HOST = {"desire": (1, 8)} | TRAFFIC | ACTION_T
# 0.9.x heads: desired_curvature (a mean and a std) instead of action, and the 48-entry meta of that era
HEADS_09 = {k: n for k, n in POLICY_SLICES.items() if k != "action"} | {"meta": 48, "desired_curvature": 2}
HEADS_010 = {k: n for k, n in POLICY_SLICES.items() if k != "action"}
OFF_POLICY_HEADS = {k: POLICY_SLICES[k] for k in ("lane_lines", "lane_lines_prob", "road_edges", "lead", "lead_prob", "meta", "desire_pred", "desire_state")}
ON_POLICY_HEADS = {k: POLICY_SLICES[k] for k in ("plan", "desire_state", "action")}  # desire_state in both: the bundle keeps them apart
POLICY_0X = {"desire_pulse": (1, 25, 8), "features_buffer": (1, 25, FEATURE_LEN)}
VISION = ModelSpec(VISION_SLICES, IMAGES)
GENERATIONS: dict[str, dict[str, ModelSpec]] = {
  "supercombo_20hz": {"onnx": ModelSpec(VISION_SLICES | HEADS_09, OLD_IMAGES, np.float16, host=TRAFFIC | LATERAL | NAV, dtype=np.float16,
                                    histories={"desire": (1, 100, 8), "prev_desired_curv": (1, 100, 1), "features_buffer": (1, 99, FEATURE_LEN)})},
  "split_09": {"vision": ModelSpec(VISION_SLICES, OLD_IMAGES),
               "policy": ModelSpec(HEADS_09, histories={"desire": (1, 25, 8), "prev_desired_curv": (1, 25, 1), "features_buffer": (1, 25, FEATURE_LEN)},
                              host=TRAFFIC | LATERAL)},
  "split_010": {"vision": VISION,
                "policy": ModelSpec(HEADS_010, histories={"desire_pulse": (1, 25, 8), "features_buffer": (1, 24, FEATURE_LEN)}, host=TRAFFIC)},
  "split_action": {"vision": VISION, "policy": ModelSpec(POLICY_SLICES, histories=POLICY_0X, host=TRAFFIC | ACTION_T)},
  "supercombo_action": {"onnx": ModelSpec(VISION_SLICES | POLICY_SLICES, IMAGES,
                                          histories={"desire_pulse": (1, 25, 8), "features_buffer": (1, 24, FEATURE_LEN)}, host=TRAFFIC | ACTION_T)},
  "multi_policy": {"vision": VISION, "off_policy": ModelSpec(OFF_POLICY_HEADS, histories=POLICY_0X, host=TRAFFIC),
                   "on_policy": ModelSpec(ON_POLICY_HEADS, histories=POLICY_0X, host=TRAFFIC)},
  "split_current": {"vision": ModelSpec(CURRENT_VISION_SLICES, IMAGES), "policy": ModelSpec(CURRENT_POLICY_SLICES, histories=POLICY_0X, host=TRAFFIC)},
}
NAMES = ("native", *GENERATIONS)
# openpilot's driver-monitoring model (selfdrive/modeld/dmonitoringmodeld.py @63cf2e70, common/transformations/model.py): the warped driver
# frame's Y plane, DM_INPUT_SIZE (width, height), as uint8 input_img (1, w*h); calib (1, 3) = liveCalibration.rpyCalib; outputs (1, heads +
# 512 features), the features last (openpilot's compile_dmonitoring_model.py @6a46ef14 finds them as the last input of the outputs' Concat)
DM_CALIB_LEN, DM_FEATURE_LEN = 3, 512
OTHER_MODELS = ("dmonitoring",)
# float32 in every stand-in: a float16 copy of a fed-back hidden state would round tinygrad's and onnxruntime's last-bit differences apart
FED_BACK = ("features_buffer", "prev_desired_curv")

class _Graph:
  """A small ONNX graph builder: named inputs/outputs, seeded weights, one-output nodes."""
  def __init__(self, name: str, seed: int):
    from onnx import TensorProto, helper, numpy_helper
    self.helper, self.numpy_helper, self.tp = helper, numpy_helper, TensorProto
    self.name, self.rng, self.count = name, np.random.default_rng(seed), 0
    self.nodes: list[NodeProto] = []
    self.inits: list[TensorProto] = []
    self.inputs: list[ValueInfoProto] = []
    self.outputs: list[ValueInfoProto] = []
    self.flops = self.params = 0

  def input(self, name: str, shape: tuple, dtype: npt.DTypeLike = np.float32) -> str:
    self.inputs.append(self.helper.make_tensor_value_info(name, self.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
    return name

  def floats(self, name: str, shape: tuple, dtype: npt.DTypeLike = np.float32) -> str:
    """A float input of `dtype`, as float32 inside the graph (comma's float16 models cast their inputs the same way)."""
    value = self.input(name, shape, dtype)
    return value if np.dtype(dtype) == np.float32 else self.op("Cast", value, to=self.tp.FLOAT)

  def output(self, value: str, name: str, shape: tuple) -> None:
    self.nodes.append(self.helper.make_node("Identity", [value], [name]))
    self.outputs.append(self.helper.make_tensor_value_info(name, self.tp.FLOAT, shape))

  def const(self, array: np.ndarray | np.generic, trainable: bool = False) -> str:
    self.count += 1
    name = f"{'w' if trainable else 'c'}{self.count}"
    self.inits.append(self.numpy_helper.from_array(np.asarray(array), name))
    self.params += np.asarray(array).size if trainable else 0
    return name

  def weight(self, shape: tuple, fan_in: int) -> str:
    return self.const((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), trainable=True)

  def op(self, op_type: str, *inputs: str, **attrs: Any) -> str:
    self.count += 1
    out = f"{op_type.lower()}{self.count}"
    self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
    return out

  def linear(self, x: str, n_in: int, n_out: int) -> str:
    self.flops += 2 * n_in * n_out
    return self.op("Add", self.op("MatMul", x, self.weight((n_in, n_out), n_in)), self.const(np.zeros(n_out, np.float32), trainable=True))

  def camera_features(self, img_u8: str, channels: int, size: str, hw: tuple[int, int] = (MODEL_H, MODEL_W)) -> tuple[str, int]:
    """uint8 planes (1, C, H, W) -> (1, F) features: normalise, conv+relu backbone, global average pool."""
    x = self.op("Sub", self.op("Mul", self.op("Cast", img_u8, to=self.tp.FLOAT), self.const(np.float32(1 / 128))), self.const(np.float32(1)))
    h, w = hw
    for out_c, k, s in BACKBONES[size]:
      pad = (k - 1) // 2 if s == 1 or k == 3 else 0
      x = self.op("Relu", self.op("Conv", x, self.weight((out_c, channels, k, k), channels * k * k), self.const(np.zeros(out_c, np.float32), True),
                                  kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4))
      h, w = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
      self.flops += 2 * out_c * channels * k * k * h * w
      channels = out_c
    return self.op("Flatten", self.op("GlobalAveragePool", x)), channels

  def model(self, metadata: dict[str, str]) -> ModelProto:
    graph = self.helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
    model = self.helper.make_model(graph, opset_imports=[self.helper.make_opsetid("", OPSET)], producer_name="sunnypilot-modeld-v2 stand-in",
                                   ir_version=IR_VERSION)
    for key, value in metadata.items(): model.metadata_props.add(key=key, value=value)
    return model

def output_layout(generation: str) -> dict[str, list[int]]:
  """A stand-in generation's heads as its fused bundle's output_slices: its parts' outputs one after another (no model is built)."""
  sizes = VISION_SLICES | POLICY_SLICES if generation == "native" else {}
  for spec in GENERATIONS.get(generation, {}).values(): sizes |= spec.heads
  return {name: [s.start, s.stop] for name, s in slices_of(sizes).items()}

def output_slices_prop(sizes: dict[str, int]) -> str:
  """comma's format: base64 of a pickled {name: slice}."""
  return base64.b64encode(pickle.dumps(slices_of(sizes))).decode()

def _ordered(sizes: dict[str, int]) -> dict[str, int]:
  """hidden_state last: the head is computed from it, then it is appended as itself."""
  return {k: n for k, n in sizes.items() if k != "hidden_state"} | ({"hidden_state": sizes["hidden_state"]} if "hidden_state" in sizes else {})

def _head(g: _Graph, hidden: str, sizes: dict[str, int]) -> str:
  """outputs (1, N): every slice but hidden_state from a linear head, hidden_state itself last (it feeds back)."""
  head = g.linear(hidden, FEATURE_LEN, sum(n for k, n in sizes.items() if k != "hidden_state"))
  return g.op("Concat", head, hidden, axis=1) if "hidden_state" in sizes else head

def _gru(g: _Graph, x: str, n_in: int, h: str, extra: str | None = None) -> str:
  """A GRU cell from MatMul/Sigmoid/Tanh (what comma's exports contain), optionally also fed a history summary."""
  gate = lambda inp: g.op("Add", g.linear(x, n_in, FEATURE_LEN), g.linear(inp, FEATURE_LEN, FEATURE_LEN))
  z, r = g.op("Sigmoid", gate(h)), g.op("Sigmoid", gate(h))
  cand = g.op("Add", g.linear(x, n_in, FEATURE_LEN), g.linear(g.op("Mul", r, h), FEATURE_LEN, FEATURE_LEN))
  if extra is not None: cand = g.op("Add", cand, g.linear(extra, FEATURE_LEN, FEATURE_LEN))
  n = g.op("Tanh", cand)
  return g.op("Add", g.op("Mul", g.op("Sub", g.const(np.float32(1)), z), n), g.op("Mul", z, h))

def _vision(g: _Graph, size: str, channels: int, *images: str) -> tuple[str, int]:
  feats = [g.camera_features(img, channels, size) for img in images]
  return (g.op("Concat", *(f for f, _ in feats), axis=1) if len(feats) > 1 else feats[0][0]), sum(n for _, n in feats)

def _context(g: _Graph, features_buffer: str, n_feat: int) -> tuple[str, str]:
  """(last, mean) of a (1, n, 512) features buffer."""
  last = g.op("Squeeze", g.op("Slice", features_buffer, g.const(np.array([n_feat - 1])), g.const(np.array([n_feat])), g.const(np.array([1]))),
              g.const(np.array([1])))
  return last, g.op("ReduceMean", features_buffer, axes=[1], keepdims=0)

def build_native(size: str = "tiny", seed: int = 0, host: Mapping[str, tuple[int, ...]] = NATIVE_HOST) -> tuple[ModelProto, dict]:
  """The native stand-in: new_img, the `host` inputs (float32) and state_feat_q -> outputs + next_state_feat_q. ModelProto and stats."""
  g, t = _Graph(f"native_{size}_stand_in", seed), NATIVE_HISTORY[size]
  img = g.input("new_img", (2, 6, MODEL_H, MODEL_W), np.uint8)
  values = [g.op("Flatten", g.input(name, shape)) for name, shape in host.items()]
  state = g.input("state_feat_q", (t, 1, FEATURE_LEN))
  vis, n_vis = _vision(g, size, 12, g.op("Reshape", img, g.const(np.array([1, 12, MODEL_H, MODEL_W]))))
  x = g.op("Concat", vis, *values, axis=1)
  prev = g.op("Squeeze", g.op("Slice", state, g.const(np.array([t - 1])), g.const(np.array([t])), g.const(np.array([0]))), g.const(np.array([0])))
  hidden = _gru(g, x, n_vis + sum(int(np.prod(s[1:])) for s in host.values()), prev, g.op("ReduceMean", state, axes=[0], keepdims=0))
  sizes = _ordered(VISION_SLICES | POLICY_SLICES)
  g.output(_head(g, hidden, sizes), "outputs", (1, sum(sizes.values())))
  nxt = g.op("Concat", g.op("Slice", state, g.const(np.array([1])), g.const(np.array([t])), g.const(np.array([0]))),
             g.op("Unsqueeze", hidden, g.const(np.array([0]))), axis=0)
  g.output(nxt, "next_state_feat_q", (t, 1, FEATURE_LEN))
  return g.model({"output_slices": output_slices_prop(sizes), "stand_in": "random weights: outputs mean nothing", "size": size, "generation": "native"}), \
    {"flops": g.flops, "params": g.params}

def build_model(spec: ModelSpec, name: str, size: str = "tiny", seed: int = 0) -> tuple[ModelProto, dict]:
  """One model of a queued generation: its images through a conv backbone, its histories and host inputs into a recurrent cell fed by the
  features_buffer (or one tanh layer where it has none), then the heads. ModelProto and stats."""
  g = _Graph(f"{name}_{size}_stand_in", seed)
  values, n_in = [], 0
  if spec.images:
    vis, n_in = _vision(g, size, 12, *(g.input(image, (1, 12, MODEL_H, MODEL_W), spec.image_dtype) for image in spec.images))
    values.append(vis)
  features = None
  for input_name, shape in {**spec.histories, **spec.host}.items():
    value = g.floats(input_name, shape, np.float32 if input_name in FED_BACK else spec.dtype)
    if input_name == "features_buffer": features = value
    else: values, n_in = values + [g.op("Flatten", value)], n_in + int(np.prod(shape[1:]))
  x = g.op("Concat", *values, axis=1) if len(values) > 1 else values[0]
  if features is None: hidden = g.op("Tanh", g.linear(x, n_in, FEATURE_LEN))
  else: hidden = _gru(g, x, n_in, *_context(g, features, spec.histories["features_buffer"][1]))
  sizes = _ordered(spec.heads)
  g.output(_head(g, hidden, sizes), "outputs", (1, sum(sizes.values())))
  return g.model({"output_slices": output_slices_prop(sizes), "stand_in": "random weights: outputs mean nothing", "size": size, "generation": name}), \
    {"flops": g.flops, "params": g.params}

def dm_output_sizes(layout: str = "current") -> dict[str, int]:
  """The stand-in's heads in output order: each driver side's (lhd, then rhd), wheel_on_right, then the features. The order is this
  stand-in's: a daemon reads the heads where the model's output_slices put them."""
  heads = dm_heads(layout)
  return {name: n for side in DRIVER_SIDES for name, n in heads.items() if name.endswith(f"_{side}")} | {"wheel_on_right": 1, "features": DM_FEATURE_LEN}

def build_dmonitoring(size: str = "tiny", seed: int = 0, layout: str = "current") -> tuple[ModelProto, dict]:
  """The driver-monitoring stand-in: input_img's Y plane through a conv backbone, with calib, into one tanh layer (the features), then the
  heads of `layout` (parse_dmonitoring_outputs.DM_LAYOUTS); outputs is the heads followed by the features, as openpilot's DM model lays
  them out, with output_slices. ModelProto and stats."""
  if layout not in DM_LAYOUTS: raise StandInError(f"the driver-monitoring layout must be one of {', '.join(DM_LAYOUTS)}, got {layout!r}")
  g, (w, h), sizes = _Graph(f"dmonitoring_{size}_stand_in", seed), DM_INPUT_SIZE, dm_output_sizes(layout)
  n_heads = sum(sizes.values()) - DM_FEATURE_LEN
  img = g.op("Reshape", g.input("input_img", (1, w * h), np.uint8), g.const(np.array([1, 1, h, w])))
  feats, n_feats = g.camera_features(img, 1, size, (h, w))
  features = g.op("Tanh", g.linear(g.op("Concat", feats, g.input("calib", (1, DM_CALIB_LEN)), axis=1), n_feats + DM_CALIB_LEN, DM_FEATURE_LEN))
  g.output(g.op("Concat", g.linear(features, DM_FEATURE_LEN, n_heads), features, axis=1), "outputs", (1, n_heads + DM_FEATURE_LEN))
  return g.model({"output_slices": output_slices_prop(sizes), "stand_in": "random weights: outputs mean nothing", "size": size,
                  "generation": "dmonitoring"}), {"flops": g.flops, "params": g.params}

def model_path(path: str, key: str) -> str:
  """Where one model of a generation goes: `path` itself for a one-model generation, else `<path stem>_<key>.onnx` (key: vision, policy, ...)."""
  return path if key == "onnx" else f"{os.path.splitext(path)[0]}_{key}.onnx"

def files(generation: str, path: str) -> dict[str, str]:
  """{compile_model keyword: path} of the files `write(generation, ..., path)` writes, without writing them."""
  return {key: model_path(path, key) for key in (GENERATIONS[generation] if generation in GENERATIONS else ("onnx",))}

def build(generation: str, size: str = "tiny", seed: int = 0) -> dict[str, tuple[ModelProto, dict]]:
  """{compile_model keyword ("onnx", "vision", "policy", "off_policy", "on_policy"): (ModelProto, stats)} of a generation's stand-in."""
  if generation not in NAMES + OTHER_MODELS or size not in BACKBONES:
    raise StandInError(f"generation must be one of {NAMES + OTHER_MODELS} and size {'|'.join(BACKBONES)}, got {generation!r}, {size!r}")
  if not isinstance(seed, int) or seed < 0: raise StandInError(f"the seed must be a non-negative integer, got {seed!r}")
  if generation == "native": return {"onnx": build_native(size, seed)}
  if generation == "dmonitoring": return {"onnx": build_dmonitoring(size, seed)}
  return {key: build_model(spec, f"{generation}_{key}", size, seed + i) for i, (key, spec) in enumerate(GENERATIONS[generation].items())}

def write(generation: str, size: str, path: str, seed: int = 0) -> dict:
  """Write a generation's stand-in (see model_path for where each model goes), all files or none: each is written to a temporary name and
  they are renamed into place together once all are complete. Returns {"files": {compile_model keyword: path}, "flops", "params"}."""
  import onnx

  from sunnypilot.modeld_v2.common.files import replaced_atomically
  models, written = build(generation, size, seed), files(generation, path)
  with replaced_atomically(*written.values()) as tmps:
    for key, tmp in zip(written, tmps):  # each model to its own file's temporary name
      model = models[key][0]
      onnx.checker.check_model(model)
      onnx.save(model, tmp)
  return {"files": written, "flops": sum(s["flops"] for _, s in models.values()), "params": sum(s["params"] for _, s in models.values())}

def next_command(generation: str, output: str, files: dict[str, str]) -> str:
  """The compile command for what was just written, its bundle named after the ONNX and beside it (`out/dm.onnx` -> `out/dm.bin`): a fixed
  name such as model.bin would, pasted, replace whatever bundle of that name is there (the driving model beside a dmonitoring stand-in)."""
  import shlex
  python = os.path.relpath(sys.executable) if not os.path.relpath(sys.executable).startswith("..") else sys.executable
  compiler = "compile_modeld"  # the driver-monitoring model too: its bundle is what dmonitoringmodeld runs
  flags = " ".join(f"--{k.replace('_', '-')} {shlex.quote(p)}" for k, p in files.items())
  bundle = os.path.splitext(output)[0] + ".bin"
  if bundle == output: bundle = os.path.splitext(output)[0] + "_compiled.bin"  # an ONNX written as x.bin: never the input itself
  return f"{shlex.quote(python)} -m sunnypilot.modeld_v2.{compiler} {flags} --output {shlex.quote(bundle)}"

@interruptible("stand_in_models")
def main(argv: list[str] | None = None) -> int:
  from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
  parser = cli_parser("stand_in_models", __doc__)
  parser.add_argument("--generation", choices=NAMES + OTHER_MODELS, required=True)
  parser.add_argument("--size", choices=tuple(BACKBONES), default="tiny")
  parser.add_argument("--seed", type=non_negative_int, default=0)
  parser.add_argument("--output", required=True, help="ONNX file to write (a generation of several models writes <stem>_<model>.onnx)")
  args = parser.parse_args(argv)
  try:
    for key in GENERATIONS.get(args.generation, {"onnx": None}): check_output_path(model_path(args.output, key))
    stats = write(args.generation, args.size, args.output, args.seed)
  except (StandInError, ArtifactError) as e:
    parser.exit(2, f"stand_in_models: error: {e}\n")
  except OSError as e:  # a full disk or a folder that went away: nothing was renamed into place
    parser.exit(2, f"stand_in_models: error: cannot write {args.output}: {e.strerror or e}\n")
  print(f"wrote {', '.join(stats['files'].values())}: {args.generation} {args.size} RANDOM-WEIGHT STAND-IN, {stats['params'] / 1e6:.2f} M parameters, "
        f"{stats['flops'] / 1e9:.3f} GFLOPs per step\ncompile with: {next_command(args.generation, args.output, stats['files'])}")
  return 0

if __name__ == "__main__":
  sys.exit(main())
