"""The old way, kept only as the benchmarks' baseline: pickled TinyJits for the warp and the model, frames copied every step.

Nothing in the runtime uses this module. It unpickles TinyJits it pickled itself, which is exactly the cost and the risk
the plain bundles remove.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
from tinygrad import Device, Tensor, TinyJit

from sunnypilot.modeld_v2.format.bundle import next_name, state_names
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

def capture_legacy(onnx_paths: dict[str, str], frame_spec: str, device: str | None = None) -> tuple[bytes, bytes, dict]:
  """Capture the legacy warp and model TinyJits as old modeld shipped them (host inputs uploaded inside the JIT), pickled. `onnx_paths`:
  compile_model's keywords (onnx, or vision + policy)."""
  from tinygrad.nn.onnx import OnnxRunner

  from sunnypilot.modeld_v2.compile.input_queues import FRAME_PLANES
  from sunnypilot.modeld_v2.compile.model_plan import plan_model
  from sunnypilot.modeld_v2.compile.warp import make_frame_prepare
  from sunnypilot.modeld_v2.compile_modeld import make_step
  from sunnypilot.modeld_v2.model.camera_frame import parse_frame
  dev, frame = Device.canonicalize(device), parse_frame(frame_spec)
  warp = make_frame_prepare(frame, 512, 256)
  warp_jit = TinyJit(lambda input_frame, M_inv: Tensor.stack(*(warp(input_frame.to(dev)[i], M_inv.to(dev)[i]) for i in range(2))))
  plan = plan_model(**onnx_paths)
  step = make_step(plan, {k: OnnxRunner(p) for k, p in plan.paths.items()})
  states = {k: plan.specs[k] for k in state_names(plan.specs, plan.out_specs)}
  host = {k: v for k, v in plan.specs.items() if k not in states and k != "new_img"}
  n_out = plan.out_specs["outputs"][0]
  model_jit = TinyJit(lambda new_img, output_buffers, **kw: step(new_img=new_img, output_buffers=output_buffers,
                                                                 **{k: v.to(dev) if k in host else v for k, v in kw.items()}))
  specs = {"host": {k: (tuple(s), np.dtype(d).str) for k, (s, d) in host.items()}, "states": {k: (tuple(s), np.dtype(d).str) for k, (s, d) in states.items()},
           "outputs": tuple(n_out), "frame_size": frame.size, "planes": (2, FRAME_PLANES, 128, 256)}
  legacy = LegacyModelAdapter.__new__(LegacyModelAdapter)
  legacy.setup(warp_jit, model_jit, specs, dev)
  for _ in range(2):  # call 0 runs eagerly, call 1 captures
    legacy.copy_frames({k: np.zeros(frame.size, np.uint8) for k in CAMERA_BUFFERS})
    legacy.run()
  return pickle.dumps(warp_jit), pickle.dumps(model_jit), specs

class LegacyModelAdapter:
  """Old modeld: unpickle two TinyJits; each step copies both frames into a numpy buffer the warp JIT uploads, then runs the model JIT
  (tinygrad's `_prepare_jit_inputs` on every call)."""
  def __init__(self, warp_pickle: bytes, model_pickle: bytes, specs: dict, device: str | None = None):
    self.setup(pickle.loads(warp_pickle), pickle.loads(model_pickle), specs, Device.canonicalize(device))

  def setup(self, warp_jit, model_jit, specs: dict, device: str) -> None:
    self.warp_jit, self.model_jit, self.device = warp_jit, model_jit, device
    self.numpy_inputs = {HOST_TRANSFORM: np.zeros((2, 3, 3), np.float32)} | {k: np.zeros(s, np.dtype(d)) for k, (s, d) in specs["host"].items()}
    self.npy = {k: Tensor(v, device="NPY") for k, v in self.numpy_inputs.items()}  # NPY tensors read these arrays in place
    self.frames = np.zeros((2, specs["frame_size"]), np.uint8)
    self.npy_frames = Tensor(self.frames, device="NPY")
    self.states = {k: Tensor(np.zeros(s, np.dtype(d)), device=device).realize() for k, (s, d) in specs["states"].items()}
    self.outputs = {"outputs": Tensor(np.zeros(specs["outputs"], np.float32), device=device).realize()} | {next_name(k): v for k, v in self.states.items()}

  def copy_frames(self, bufs: dict[str, Any]) -> None:
    for i, key in enumerate(CAMERA_BUFFERS):
      if key in bufs:
        data = bufs[key].data if hasattr(bufs[key], "data") else bufs[key]
        np.copyto(self.frames[i], np.frombuffer(data, dtype=np.uint8, count=self.frames.shape[1]))

  def reset_warmup_buffers(self) -> None:
    for v in self.numpy_inputs.values(): v[:] = 0

  def run(self) -> Tensor:
    new_img = self.warp_jit(input_frame=self.npy_frames, M_inv=self.npy[HOST_TRANSFORM])
    self.model_jit(new_img=new_img, output_buffers=self.outputs, **{k: v for k, v in self.npy.items() if k != HOST_TRANSFORM}, **self.states)
    return self.outputs["outputs"]

  def output_array(self) -> np.ndarray: return self.outputs["outputs"].numpy()
