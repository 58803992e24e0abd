"""Compile an openpilot driving model (ONNX) into a plain bundle that takes the warp's output.

  python -m sunnypilot.modeld_v2.compile_modeld --onnx driving.onnx --output driving.bin              # native or supercombo
  python -m sunnypilot.modeld_v2.compile_modeld --vision vision.onnx --policy policy.onnx --output driving.bin

Every bundle runs as `run(new_img=..., desire=..., traffic_convention=..., action_t=..., <states>..., output_buffers={...})`:
`new_img` is uint8 (2, 6, 128, 256) (road, wide), each state X has an output `next_X` the caller may alias to X, and `outputs`
(1, N) is the model's output vector. Supercombo and split models get their input queues compiled in, as openpilot's modeld
keeps them: rolling uint8 frame queues sampled every `frame_skip` frames, a feature queue fed back from `hidden_state`, and a
desire queue max-pooled into pulses. Queues are states too.
"""
from __future__ import annotations

import argparse
import io
import os
import pickle
import sys
import time
from typing import Any

import numpy as np

NATIVE_INPUTS = ("new_img", "desire", "traffic_convention", "action_t")
POLICY_INPUTS = ("features_buffer", "desire_pulse", "traffic_convention", "action_t")
VISION_INPUTS = ("img", "big_img")
FRAME_PLANES = 6  # uint8 planes of one warped camera frame
RUN_HZ, CONTEXT_HZ = 20, 5  # modeld runs at 20 Hz; the models' temporal context is sampled at 5 Hz

class ModelError(ValueError):
  """An ONNX model this compiler cannot turn into a bundle, with the reason."""

class _SliceUnpickler(pickle.Unpickler):
  """output_slices is comma's base64 pickled {name: slice}: admit dicts and slices, nothing else."""
  def find_class(self, module: str, name: str):
    if (module, name) == ("builtins", "slice"): return slice
    raise ModelError(f"output_slices may only hold dicts and slices, found {module}.{name}")

def read_output_slices(encoded: str) -> dict[str, list[int]]:
  import base64
  try:
    slices = _SliceUnpickler(io.BytesIO(base64.b64decode(encoded, validate=True))).load()
  except ModelError: raise
  except Exception as e: raise ModelError(f"output_slices metadata is not comma's base64 pickled dict of slices: {e}") from None
  if not isinstance(slices, dict) or not all(isinstance(k, str) and isinstance(v, slice) for k, v in slices.items()):
    raise ModelError("output_slices must map names to slices")
  return {k: [v.start or 0, v.stop] for k, v in slices.items()}

def derive_frame_skip(metadata: dict[str, str], run_hz: int = RUN_HZ) -> int:
  """Frames between the model's temporal samples: the ONNX's own `frame_skip` if it says, else run rate / 5 Hz context (4 at 20 Hz)."""
  value = metadata.get("frame_skip", run_hz // CONTEXT_HZ)
  try: frame_skip = int(value)
  except ValueError: raise ModelError(f"frame_skip metadata must be an integer, got {value!r}") from None
  if frame_skip < 1: raise ModelError(f"frame_skip must be at least 1, got {frame_skip}")
  return frame_skip

def make_supercombo_input_queues(input_shapes: dict[str, tuple], frame_skip: int) -> dict[str, tuple[tuple, Any]]:
  """The queue states of a supercombo: uint8 frame queues for img/big_img, past hidden states, past desires. name -> (shape, dtype)."""
  n_frames = input_shapes["img"][1] // FRAME_PLANES
  plane = tuple(input_shapes["img"][2:])
  _, n_feat, feat_len = input_shapes["features_buffer"]
  _, n_desire, desire_len = input_shapes["desire_pulse"]
  return {"img_q": ((frame_skip * (n_frames - 1) + 1, FRAME_PLANES, *plane), np.uint8),
          "big_img_q": ((frame_skip * (n_frames - 1) + 1, FRAME_PLANES, *plane), np.uint8),
          "feat_q": ((frame_skip * (n_feat - 1) + 1, feat_len), np.float32),
          "desire_q": ((frame_skip * n_desire, desire_len), np.float32)}

def make_split_input_queues(vision_shapes: dict[str, tuple], policy_shapes: dict[str, tuple], frame_skip: int) -> dict[str, tuple[tuple, Any]]:
  """A split pair keeps the same queues; the policy reads the feature queue after the vision model's hidden_state joins it."""
  return make_supercombo_input_queues(vision_shapes | policy_shapes, frame_skip)

# *** reading ONNX ***

def load_onnx(path: str) -> dict:
  """{"model", "inputs": {name: (shape, np dtype)}, "outputs": {...}, "metadata": {...}}; clear errors for what tinygrad cannot run."""
  import onnx
  from onnx import helper
  from tinygrad.nn.onnx import onnx_ops
  if not os.path.isfile(path): raise ModelError(f"{path}: no such ONNX file")
  try: model = onnx.load(path, load_external_data=False)
  except Exception as e: raise ModelError(f"{path}: not a readable ONNX model ({type(e).__name__}: {e})") from None
  if not model.graph.node: raise ModelError(f"{path}: the ONNX graph is empty (corrupt or not a model)")
  unsupported = sorted({n.op_type for n in model.graph.node if n.op_type not in onnx_ops})
  if unsupported:
    hint = " (write recurrent cells with MatMul/Sigmoid/Tanh, as comma's models do)" if {"GRU", "LSTM", "RNN"} & set(unsupported) else ""
    raise ModelError(f"{path}: ops not supported by tinygrad's ONNX runner: {', '.join(unsupported)}{hint}")
  inits = {i.name for i in model.graph.initializer}
  def spec(v) -> tuple[tuple, Any]:
    t = v.type.tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
    if any(d <= 0 for d in shape): raise ModelError(f"{path}: {v.name} has a dynamic shape {shape}: export with fixed shapes")
    return shape, np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type))
  return {"model": model, "inputs": {v.name: spec(v) for v in model.graph.input if v.name not in inits},
          "outputs": {v.name: spec(v) for v in model.graph.output}, "metadata": {p.key: p.value for p in model.metadata_props}}

def _require(path: str, have: dict, names: tuple, what: str) -> None:
  if missing := [n for n in names if n not in have]: raise ModelError(f"{path}: missing input(s) {', '.join(missing)} for a {what} model")

def _slices(path: str, info: dict) -> dict[str, list[int]]:
  if "output_slices" not in info["metadata"]: raise ModelError(f"{path}: no output_slices in the ONNX metadata_props")
  slices = read_output_slices(info["metadata"]["output_slices"])
  n = info["outputs"]["outputs"][0][-1]
  if bad := [k for k, (a, b) in slices.items() if not 0 <= a < b <= n]: raise ModelError(f"{path}: output_slices {bad} fall outside outputs (1, {n})")
  return slices

def detect_layout(path: str, info: dict) -> str:
  """native (new_img + state pairs) or supercombo (img, big_img, features_buffer, desire_pulse, ...)."""
  inputs, outputs = info["inputs"], info["outputs"]
  if "outputs" not in outputs: raise ModelError(f"{path}: the model has no 'outputs' output (has {sorted(outputs)})")
  if "new_img" in inputs:
    _require(path, inputs, NATIVE_INPUTS, "native")
    return "native"
  if "img" in inputs or "features_buffer" in inputs:
    _require(path, inputs, VISION_INPUTS + POLICY_INPUTS, "supercombo")
    return "supercombo"
  raise ModelError(f"{path}: unknown layout: a native model takes new_img (uint8 (2, 6, 128, 256)), a supercombo img/big_img/features_buffer/"
                   f"desire_pulse; this one takes {sorted(inputs)}")

def native_states(path: str, info: dict) -> list[str]:
  """Inputs X with an output next_X of the same shape; any half pair is an error."""
  inputs, outputs = info["inputs"], info["outputs"]
  states = sorted(n for n in inputs if n not in NATIVE_INPUTS)
  for name in states:
    if f"next_{name}" not in outputs: raise ModelError(f"{path}: state input {name} has no next_{name} output")
    if outputs[f"next_{name}"][0] != inputs[name][0]:
      raise ModelError(f"{path}: state {name} {inputs[name][0]} and next_{name} {outputs[f'next_{name}'][0]} differ in shape")
  if orphans := [n for n in outputs if n.startswith("next_") and n[5:] not in inputs]: raise ModelError(f"{path}: outputs {orphans} have no state input")
  return states

# *** the compiled step ***

def _push(queue, item):
  """Drop the oldest entry, append the newest."""
  from tinygrad import Tensor
  return Tensor.cat(queue[1:], item, dim=0)

def _write(output_buffers: dict, values: dict) -> None:
  """Compute every value before writing any buffer, so a caller may alias next_X to X (the part reads X before it writes next_X)."""
  from tinygrad import Tensor
  temps = {k: v.contiguous() for k, v in values.items()}
  Tensor.realize(*temps.values())
  Tensor.realize(*(output_buffers[k].assign(t) for k, t in temps.items()))

def _planes(queue, frame_skip: int):
  """Frames every frame_skip from a uint8 queue, stacked on channels: (L, 6, H, W) -> (1, n*6, H, W)."""
  frames = queue[::frame_skip]
  return frames.reshape(1, frames.shape[0] * frames.shape[1], *frames.shape[2:])

def _pulses(desire_q, n_desire: int, frame_skip: int):
  """Max-pool the desire queue per frame_skip window, so a one-frame pulse survives the 5 Hz sampling."""
  return desire_q.reshape(n_desire, frame_skip, -1).max(axis=1).reshape(1, n_desire, -1)

def make_step(layout: str, runners: dict, shapes: dict, slices: dict, frame_skip: int):
  """The function TinyJit captures for a layout."""
  if layout == "native":
    runner = runners["model"]
    def native(output_buffers, **inputs):
      out = runner({k: v for k, v in inputs.items()})
      _write(output_buffers, {k: out[k] for k in output_buffers})
    return native
  n_desire = shapes["desire_pulse"][1]
  hidden = slice(*slices["hidden_state"])
  def queued(new_img, desire, traffic_convention, action_t, img_q, big_img_q, feat_q, desire_q, output_buffers):
    img_q2, big_img_q2 = _push(img_q, new_img[0:1]), _push(big_img_q, new_img[1:2])
    desire_q2 = _push(desire_q, desire.reshape(1, -1))
    common = {"desire_pulse": _pulses(desire_q2, n_desire, frame_skip), "traffic_convention": traffic_convention, "action_t": action_t}
    images = {"img": _planes(img_q2, frame_skip), "big_img": _planes(big_img_q2, frame_skip)}
    if layout == "supercombo":  # the features of past frames; this frame's hidden_state joins them after the run (contiguous: computed once)
      out = runners["model"](images | common | {"features_buffer": feat_q[::frame_skip].unsqueeze(0)})["outputs"].contiguous()
      feat_q2 = _push(feat_q, out[:, hidden])
    else:  # split: the vision model's hidden_state is the newest entry the policy sees
      vision = runners["vision"](images)["outputs"].contiguous()  # computed once, read by the queue and by outputs
      feat_q2 = _push(feat_q, vision[:, hidden])
      policy = runners["policy"](common | {"features_buffer": feat_q2[::frame_skip].unsqueeze(0)})["outputs"]
      out = vision.cat(policy, dim=1)
    _write(output_buffers, {"outputs": out, "next_img_q": img_q2, "next_big_img_q": big_img_q2, "next_feat_q": feat_q2, "next_desire_q": desire_q2})
  return queued

# *** compile ***

def _np_str(dtype) -> str: return np.dtype(dtype).str

def plan_model(onnx: str | None, vision: str | None, policy: str | None, frame_skip: int | None = None) -> dict:
  """Read and check the ONNX (one, or a vision+policy pair): layout, output slices, input shapes, frame_skip, and the compiled step's
  input and output specs {name: (shape, dtype)} (states X with outputs next_X)."""
  if onnx is not None and (vision or policy): raise ModelError("give --onnx, or --vision with --policy, not both")
  if onnx is None and not (vision and policy): raise ModelError("a split model needs both --vision and --policy")
  paths = {"model": onnx} if onnx else {"vision": vision, "policy": policy}
  infos = {k: load_onnx(p) for k, p in paths.items()}
  if onnx:
    layout = detect_layout(onnx, infos["model"])
    slices, shapes, meta = _slices(onnx, infos["model"]), {k: s for k, (s, _) in infos["model"]["inputs"].items()}, infos["model"]["metadata"]
  else:
    layout = "split"
    _require(vision, infos["vision"]["inputs"], VISION_INPUTS, "vision")
    _require(policy, infos["policy"]["inputs"], POLICY_INPUTS, "policy")
    v_slices, p_slices = _slices(vision, infos["vision"]), _slices(policy, infos["policy"])
    n_vision = infos["vision"]["outputs"]["outputs"][0][-1]
    slices = v_slices | {k: [a + n_vision, b + n_vision] for k, (a, b) in p_slices.items()}
    shapes = {k: s for info in infos.values() for k, (s, _) in info["inputs"].items()}
    meta = infos["policy"]["metadata"] | infos["vision"]["metadata"]
  if layout != "native" and "hidden_state" not in slices: raise ModelError("output_slices has no hidden_state: the feature queue needs it")
  frame_skip = frame_skip or derive_frame_skip(meta)
  if layout == "native":
    model_in = infos["model"]["inputs"]
    states = native_states(onnx, infos["model"])
    specs = {k: model_in[k] for k in NATIVE_INPUTS + tuple(states)}
    out_specs = {"outputs": infos["model"]["outputs"]["outputs"]} | {f"next_{s}": model_in[s] for s in states}
  else:
    queues = make_supercombo_input_queues(shapes, frame_skip)
    specs = {"new_img": ((2, FRAME_PLANES, *shapes["img"][2:]), np.uint8), "desire": ((1, shapes["desire_pulse"][2]), np.float32),
             "traffic_convention": (shapes["traffic_convention"], np.float32), "action_t": (shapes["action_t"], np.float32)} | queues
    n_out = max(b for _, b in slices.values()) if layout == "split" else infos["model"]["outputs"]["outputs"][0][-1]
    out_specs = {"outputs": ((1, n_out), np.float32)} | {f"next_{q}": queues[q] for q in queues}
  return {"paths": paths, "layout": layout, "slices": slices, "shapes": shapes, "meta": meta, "frame_skip": frame_skip,
          "specs": specs, "out_specs": out_specs}

def compile_model(output: str, onnx: str | None = None, vision: str | None = None, policy: str | None = None, frame_skip: int | None = None,
                  log=print) -> dict:
  """Compile one ONNX (native or supercombo) or a vision+policy pair into a bundle at `output`. Returns a summary."""
  from tinygrad import Device, Tensor
  from tinygrad.nn.onnx import OnnxRunner

  from sunnypilot.modeld_v2.bundle import write_bundle
  from sunnypilot.modeld_v2.capture import capture, compile_session
  t0, dev = time.perf_counter(), Device.DEFAULT
  plan = plan_model(onnx, vision, policy, frame_skip)
  paths, layout, slices, shapes, meta, frame_skip = (plan[k] for k in ("paths", "layout", "slices", "shapes", "meta", "frame_skip"))
  specs, out_specs = plan["specs"], plan["out_specs"]
  log(f"{layout} model{'s' if layout == 'split' else ''} ({', '.join(paths.values())}), frame_skip {frame_skip}, on {dev}")
  rng = np.random.default_rng(0)
  def make(shape, dtype) -> Tensor:
    value = rng.integers(0, 256, shape, dtype=np.uint8) if np.dtype(dtype) == np.uint8 else rng.standard_normal(shape).astype(dtype)
    return Tensor(value, device=dev).realize()
  make_inputs = lambda: {k: make(*s) for k, s in specs.items()} | {"output_buffers": {k: make(*s) for k, s in out_specs.items()}}
  with compile_session() as null_holds_data:  # the ONNX weights load into device buffers: on NULL they must be host-backed too
    step = make_step(layout, {k: OnnxRunner(p) for k, p in paths.items()}, shapes, slices, frame_skip)
    log("capturing (call 0 runs eagerly and compiles the kernels, call 1 captures), then self-checking against the TinyJit replay ...")
    jit, part, inputs = capture(step, make_inputs, null_holds_data=null_holds_data)
  metadata = {"kind": "model", "layout": layout, "frame_skip": frame_skip, "output_slices": slices,
              "input_shapes": {k: list(s) for k, s in shapes.items()}, "output_shapes": {k: list(s) for k, (s, _) in out_specs.items()},
              "stand_in": meta.get("stand_in"), "sources": {k: os.path.basename(p) for k, p in paths.items()}}
  extras = {"input_specs": {k: (list(s), _np_str(d), dev) for k, (s, d) in specs.items()},
            "output_specs": {k: (list(s), _np_str(d), dev) for k, (s, d) in out_specs.items()}, "metadata": metadata}
  size = write_bundle(output, {"run": part}, extras)
  header = part[0]
  weights = sum(b["init"][1] - b["init"][0] for b in header["buffers"] if "init" in b)
  summary = {"output": output, "layout": layout, "kernels": sum(c["kind"] == "program" for c in header["calls"]), "calls": len(header["calls"]),
             "programs": len(header["programs"]), "weight_bytes": weights, "bytes": size, "compile_s": time.perf_counter() - t0,
             "jit": jit, "part": part, "inputs": inputs}
  log(f"wrote {output}: {summary['kernels']} kernels ({summary['programs']} distinct), {weights / 1e6:.1f} MB weights, {size / 1e6:.1f} MB bundle, "
      f"{summary['compile_s']:.1f} s" + (f"  [{meta['stand_in']}]" if meta.get("stand_in") else ""))
  return summary

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--onnx", help="a native (new_img + states) or supercombo driving model")
  parser.add_argument("--vision", help="the vision half of a split model")
  parser.add_argument("--policy", help="the policy half of a split model")
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--frame-skip", type=int, help="override the frames between temporal samples (default: the ONNX's, else 4)")
  args = parser.parse_args(argv)
  try:
    compile_model(args.output, args.onnx, args.vision, args.policy, args.frame_skip, log=lambda s: print(s, file=sys.stderr, flush=True))
  except ModelError as e:
    parser.exit(2, f"compile_modeld: error: {e}\n")
  return 0

if __name__ == "__main__":
  sys.exit(main())
