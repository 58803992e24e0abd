"""Run a bundle on numpy arrays: inputs by name in, outputs by name out (as compile_onnx's bundles take and return them).

  from sunnypilot.modeld_v2.numpy_runner import NumpyRunner
  run = NumpyRunner("dmonitoring.bin")
  outputs = run(input_img=img, calib=calib)   # {output name: np.ndarray}
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sunnypilot.modeld_v2.loader import load_model
from sunnypilot.modeld_v2.replay import InputError, write_tensor

class NumpyRunner:
  """A bundle's `run` on numpy arrays. The input tensors are allocated once, from the bundle's input specs, and overwritten each call, so
  the bundle binds them once; outputs come back as numpy copies, safe to keep across calls."""
  def __init__(self, path: str, device: str | None = None):
    from tinygrad import Tensor
    model = load_model(path, device=device)
    self.run, self.input_specs, self.output_specs, self.metadata = model["run"], model["input_specs"], model["output_specs"], model["metadata"]
    self.device = self.run.device
    self.inputs = {name: Tensor(np.zeros(spec.shape, spec.dtype), device=self.device).realize() for name, spec in self.input_specs.items()}

  def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
    if sorted(arrays) != sorted(self.inputs): raise InputError(f"expected inputs {sorted(self.inputs)}, got {sorted(arrays)}")
    for name, value in arrays.items():
      spec, value = self.input_specs[name], np.asarray(value)
      if value.shape != spec.shape or value.dtype != np.dtype(spec.dtype):
        raise InputError(f"input {name}: expected shape {spec.shape} {np.dtype(spec.dtype).name}, got {value.shape} {value.dtype.name}")
      write_tensor(self.inputs[name], value)
    out = self.run(**self.inputs)
    return {name: t.numpy() for name, t in out.items()}
