"""Random-weight stand-ins for openpilot's driving models: openpilot's inputs, outputs and `output_slices`, seeded weights.

No real comma weights are reachable from here, so these exist to exercise the whole pipeline. Their outputs mean nothing.

  python -m sunnypilot.modeld_v2.stand_in_models --layout native --size tiny --output native_tiny.onnx

Layouts: `native` (new_img + state_feat_q -> outputs + next_state_feat_q), `supercombo` (img, big_img, features_buffer,
desire_pulse, ...), `vision` and `policy` (the split pair). Sizes: `tiny` (tests) and `full` (a conv backbone of realistic
depth, for benchmarks). Recurrent cells are MatMul/Sigmoid/Tanh, as comma's are: tinygrad's ONNX runner has no GRU/LSTM.
"""
from __future__ import annotations

import argparse
import base64
import os
import pickle
import sys

import numpy as np

from sunnypilot.modeld_v2.model_outputs import FEATURE_LEN, POLICY_SLICES, VISION_SLICES, slices_of

OPSET = 17
IR_VERSION = 8  # what opset 17 needs; newer onnx writes newer IR versions that older onnxruntimes refuse
MODEL_H, MODEL_W = 128, 256  # the (6, H, W) planes of one warped camera frame
NATIVE_HISTORY = {"tiny": 4, "full": 24}
# per size: conv layers (out channels, kernel, stride) of each camera's backbone
BACKBONES = {"tiny": [(8, 4, 4), (16, 3, 2)],
             "full": [(32, 3, 2), (32, 3, 1), (64, 3, 2), (64, 3, 1), (128, 3, 2), (128, 3, 1), (256, 3, 2), (256, 3, 1)]}
LAYOUTS = ("native", "supercombo", "vision", "policy")

class _Graph:
  """A small ONNX graph builder: named inputs/outputs, seeded weights, one-output nodes."""
  def __init__(self, name: str, seed: int):
    from onnx import TensorProto, helper, numpy_helper
    self.helper, self.numpy_helper, self.tp = helper, numpy_helper, TensorProto
    self.name, self.rng, self.nodes, self.inits, self.inputs, self.outputs, self.count = name, np.random.default_rng(seed), [], [], [], [], 0
    self.flops = self.params = 0

  def input(self, name: str, shape: tuple, dtype=np.float32) -> str:
    self.inputs.append(self.helper.make_tensor_value_info(name, self.helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), shape))
    return name

  def output(self, value: str, name: str, shape: tuple) -> None:
    self.nodes.append(self.helper.make_node("Identity", [value], [name]))
    self.outputs.append(self.helper.make_tensor_value_info(name, self.tp.FLOAT, shape))

  def const(self, array: np.ndarray, trainable: bool = False) -> str:
    self.count += 1
    name = f"{'w' if trainable else 'c'}{self.count}"
    self.inits.append(self.numpy_helper.from_array(np.asarray(array), name))
    self.params += np.asarray(array).size if trainable else 0
    return name

  def weight(self, shape: tuple, fan_in: int) -> str:
    return self.const((self.rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32), trainable=True)

  def op(self, op_type: str, *inputs: str, **attrs) -> str:
    self.count += 1
    out = f"{op_type.lower()}{self.count}"
    self.nodes.append(self.helper.make_node(op_type, list(inputs), [out], **attrs))
    return out

  def linear(self, x: str, n_in: int, n_out: int) -> str:
    self.flops += 2 * n_in * n_out
    return self.op("Add", self.op("MatMul", x, self.weight((n_in, n_out), n_in)), self.const(np.zeros(n_out, np.float32), trainable=True))

  def camera_features(self, img_u8: str, channels: int, size: str) -> tuple[str, int]:
    """uint8 planes (1, C, H, W) -> (1, F) features: normalise, conv+relu backbone, global average pool."""
    x = self.op("Sub", self.op("Mul", self.op("Cast", img_u8, to=self.tp.FLOAT), self.const(np.float32(1 / 128))), self.const(np.float32(1)))
    h, w = MODEL_H, MODEL_W
    for out_c, k, s in BACKBONES[size]:
      pad = (k - 1) // 2 if s == 1 or k == 3 else 0
      x = self.op("Relu", self.op("Conv", x, self.weight((out_c, channels, k, k), channels * k * k), self.const(np.zeros(out_c, np.float32), True),
                                  kernel_shape=[k, k], strides=[s, s], pads=[pad] * 4))
      h, w = (h + 2 * pad - k) // s + 1, (w + 2 * pad - k) // s + 1
      self.flops += 2 * out_c * channels * k * k * h * w
      channels = out_c
    return self.op("Flatten", self.op("GlobalAveragePool", x)), channels

  def model(self, metadata: dict[str, str]):
    graph = self.helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
    model = self.helper.make_model(graph, opset_imports=[self.helper.make_opsetid("", OPSET)], producer_name="sunnypilot-modeld-v2 stand-in",
                                   ir_version=IR_VERSION)
    for key, value in metadata.items(): model.metadata_props.add(key=key, value=value)
    return model

def output_slices_prop(sizes: dict[str, int]) -> str:
  """comma's format: base64 of a pickled {name: slice}."""
  return base64.b64encode(pickle.dumps(slices_of(sizes))).decode()

def _head(g: _Graph, hidden: str, sizes: dict[str, int]) -> str:
  """outputs (1, N): every slice but hidden_state from a linear head, hidden_state itself last (it feeds back)."""
  head = g.linear(hidden, FEATURE_LEN, sum(n for k, n in sizes.items() if k != "hidden_state"))
  return g.op("Concat", head, hidden, axis=1) if "hidden_state" in sizes else head

def _ordered(sizes: dict[str, int]) -> dict[str, int]:
  return {k: n for k, n in sizes.items() if k != "hidden_state"} | ({"hidden_state": sizes["hidden_state"]} if "hidden_state" in sizes else {})

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

def build(layout: str, size: str = "tiny", seed: int = 0):
  """The ONNX ModelProto of a stand-in driving model, plus {"flops", "params"}."""
  if layout not in LAYOUTS or size not in BACKBONES: raise ValueError(f"layout must be one of {LAYOUTS} and size tiny|full, got {layout!r}, {size!r}")
  g = _Graph(f"{layout}_{size}_stand_in", seed)
  host = lambda: (g.input("traffic_convention", (1, 2)), g.input("action_t", (1, 2)))
  if layout == "native":
    t = NATIVE_HISTORY[size]
    img, desire = g.input("new_img", (2, 6, MODEL_H, MODEL_W), np.uint8), g.input("desire", (1, 8))
    traffic, action_t = host()
    state = g.input("state_feat_q", (t, 1, FEATURE_LEN))
    vis, n_vis = _vision(g, size, 12, g.op("Reshape", img, g.const(np.array([1, 12, MODEL_H, MODEL_W]))))
    x = g.op("Concat", vis, desire, traffic, action_t, axis=1)
    prev = g.op("Squeeze", g.op("Slice", state, g.const(np.array([t - 1])), g.const(np.array([t])), g.const(np.array([0]))), g.const(np.array([0])))
    hidden = _gru(g, x, n_vis + 12, prev, g.op("ReduceMean", state, axes=[0], keepdims=0))
    sizes = _ordered(VISION_SLICES | POLICY_SLICES)
    g.output(_head(g, hidden, sizes), "outputs", (1, sum(sizes.values())))
    nxt = g.op("Concat", g.op("Slice", state, g.const(np.array([1])), g.const(np.array([t])), g.const(np.array([0]))),
               g.op("Unsqueeze", hidden, g.const(np.array([0]))), axis=0)
    g.output(nxt, "next_state_feat_q", (t, 1, FEATURE_LEN))
  elif layout in ("supercombo", "vision"):
    img, big = g.input("img", (1, 12, MODEL_H, MODEL_W), np.uint8), g.input("big_img", (1, 12, MODEL_H, MODEL_W), np.uint8)
    vis, n_vis = _vision(g, size, 12, img, big)
    if layout == "vision":
      sizes = _ordered(VISION_SLICES)
      hidden = g.op("Tanh", g.linear(vis, n_vis, FEATURE_LEN))
    else:
      fb, pulse = g.input("features_buffer", (1, 24, FEATURE_LEN)), g.input("desire_pulse", (1, 25, 8))
      traffic, action_t = host()
      last, mean = _context(g, fb, 24)
      x = g.op("Concat", vis, g.op("Flatten", pulse), traffic, action_t, axis=1)
      hidden = _gru(g, x, n_vis + 204, last, mean)
      sizes = _ordered(VISION_SLICES | POLICY_SLICES)
    g.output(_head(g, hidden, sizes), "outputs", (1, sum(sizes.values())))
  else:
    fb, pulse = g.input("features_buffer", (1, 24, FEATURE_LEN)), g.input("desire_pulse", (1, 25, 8))
    traffic, action_t = host()
    last, mean = _context(g, fb, 24)
    x = g.op("Concat", g.op("Flatten", pulse), traffic, action_t, axis=1)
    hidden = _gru(g, x, 204, last, mean)
    sizes = POLICY_SLICES
    g.output(_head(g, hidden, sizes), "outputs", (1, sum(sizes.values())))
  metadata = {"output_slices": output_slices_prop(sizes), "stand_in": "random weights: outputs mean nothing", "size": size, "layout": layout}
  return g.model(metadata), {"flops": g.flops, "params": g.params}

def write(layout: str, size: str, path: str, seed: int = 0) -> dict:
  import onnx
  model, stats = build(layout, size, seed)
  onnx.checker.check_model(model)
  tmp = f"{path}.tmp{os.getpid()}"
  onnx.save(model, tmp)
  os.replace(tmp, path)
  return stats

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layout", choices=LAYOUTS, required=True)
  parser.add_argument("--size", choices=tuple(BACKBONES), default="tiny")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--output", required=True, help="ONNX file to write")
  args = parser.parse_args(argv)
  stats = write(args.layout, args.size, args.output, args.seed)
  print(f"wrote {args.output}: {args.layout} {args.size} RANDOM-WEIGHT STAND-IN, {stats['params'] / 1e6:.2f} M parameters, "
        f"{stats['flops'] / 1e9:.3f} GFLOPs per step")
  return 0

if __name__ == "__main__":
  sys.exit(main())
