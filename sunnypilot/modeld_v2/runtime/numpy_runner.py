"""Run a bundle on numpy arrays: inputs by name in, outputs by name out (as compile_onnx's bundles take and return them).

  from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
  run = NumpyRunner("dmonitoring.bin")
  outputs = run(input_img=img, calib=calib)   # {output name: np.ndarray}
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sunnypilot.modeld_v2.runtime.kernel_replay import InputError, write_tensor
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.runtime.tinygrad_internals import copy_out, host_memory, host_visible, tensor_buffer

class NumpyRunner:
  """A bundle's `run` on numpy arrays. The input tensors are allocated once, from the bundle's input specs, and overwritten each call, so
  the bundle binds them once; outputs come back as numpy copies, safe to keep across calls."""
  def __init__(self, path: str, device: str | None = None, allow_device: bool = False):
    """`allow_device`: as for load_bundle (mock execution of a QCOM bundle on NULL)."""
    model = load_bundle(path, device=device, allow_device=allow_device)
    self.run, self.input_specs, self.output_specs, self.metadata = model.run, model.input_specs, model.output_specs, model.metadata
    self.inputs = {name: _allocated(self.run.device, spec.shape, spec.dtype) for name, spec in self.input_specs.items()}

  def __call__(self, **arrays: Any) -> dict[str, np.ndarray]:
    if sorted(arrays) != sorted(self.inputs): raise InputError(f"expected inputs {sorted(self.inputs)}, got {sorted(arrays)}")
    for name, value in arrays.items():
      spec, value = self.input_specs[name], np.asarray(value)
      if value.shape != spec.shape or value.dtype != np.dtype(spec.dtype):
        raise InputError(f"input {name}: expected shape {spec.shape} {np.dtype(spec.dtype).name}, got {value.shape} {value.dtype.name}")
      write_tensor(self.inputs[name], value)
    out = self.run(**self.inputs)
    return {name: _copied_out(t) for name, t in out.items()}

def _copied_out(t: Any) -> np.ndarray:
  """A numpy copy of a returned tensor's buffer, read directly into a new array, once (tinygrad's own copy-out schedules a COPY, and a
  bundle compiles nothing)."""
  buf = tensor_buffer(t)
  out = np.empty(t.shape, np.dtype(buf.dtype.fmt))
  if host_visible(buf): out.reshape(-1).view(np.uint8)[:] = np.frombuffer(host_memory(buf), np.uint8)
  else: copy_out(buf, memoryview(out.reshape(-1).view(np.uint8)))
  return out

def _allocated(device: str, shape: tuple[int, ...], dtype: str) -> Any:
  """A tensor over a new device buffer: allocated directly, so nothing is scheduled or compiled (a bundle's process compiles nothing)."""
  from tinygrad import Tensor
  from tinygrad.device import Buffer
  from tinygrad.dtype import to_dtype
  from tinygrad.uop.ops import UOp
  return Tensor(UOp.from_buffer(Buffer(device, int(np.prod(shape)), to_dtype(np.dtype(dtype).name)).allocate())).reshape(shape)
