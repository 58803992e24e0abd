"""Run a bundle on numpy arrays: inputs by name in, outputs by name out (as compile_onnx's bundles take and return them; a bundle whose run
returns one tensor, a warp's, or a tuple gives its outputs the names of its output specs, in their order).

  from sunnypilot.modeld_v2.runtime.numpy_runner import NumpyRunner
  run = NumpyRunner("dmonitoring.bin")
  outputs = run(input_img=img, calib=calib)   # {output name: np.ndarray}
  warped = NumpyRunner("dm_warp_1928x1208.bin")(frame=buf, M_inv=m_inv)["warped"]
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
from tinygrad import Tensor

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

  def __call__(self, **arrays: npt.ArrayLike) -> dict[str, np.ndarray]:
    if sorted(arrays) != sorted(self.inputs): raise InputError(f"expected inputs {sorted(self.inputs)}, got {sorted(arrays)}")
    for name, value in arrays.items():
      spec, value = self.input_specs[name], np.asarray(value)
      if value.shape != spec.shape or value.dtype != np.dtype(spec.dtype):
        raise InputError(f"input {name}: expected shape {spec.shape} {np.dtype(spec.dtype).name}, got {value.shape} {value.dtype.name}")
      write_tensor(self.inputs[name], value)
    return {name: _copied_out(t) for name, t in named_outputs(self.run(**self.inputs), list(self.output_specs)).items()}

def named_outputs(out: Tensor | tuple[Tensor, ...] | list[Tensor] | dict[str, Tensor] | None, names: list[str]) -> dict[str, Tensor]:
  """A bundle's `run` result by output name: a dict as it is; one tensor (a warp's `warped`), a tuple or a list named by the output specs'
  order; nothing: no outputs."""
  if isinstance(out, dict): return out
  tensors = [] if out is None else list(out) if isinstance(out, (tuple, list)) else [out]
  if len(tensors) != len(names): raise InputError(f"the bundle returned {len(tensors)} tensors for the {len(names)} outputs its specs name {names}")
  return dict(zip(names, tensors))

def _copied_out(t: Tensor) -> np.ndarray:
  """A numpy copy of a returned tensor's buffer, read directly into a new array, once (tinygrad's own copy-out schedules a COPY, and a
  bundle compiles nothing)."""
  buf = tensor_buffer(t)
  out = np.empty(t.shape, np.dtype(buf.dtype.fmt))
  if host_visible(buf): out.reshape(-1).view(np.uint8)[:] = np.frombuffer(host_memory(buf), np.uint8)
  else: copy_out(buf, out.reshape(-1).view(np.uint8).data)
  return out

def _allocated(device: str, shape: tuple[int, ...], dtype: str) -> Tensor:
  """A tensor over a new device buffer: allocated directly, so nothing is scheduled or compiled (a bundle's process compiles nothing)."""
  from tinygrad.device import Buffer
  from tinygrad.dtype import to_dtype
  from tinygrad.uop.ops import UOp
  return Tensor(UOp.from_buffer(Buffer(device, int(np.prod(shape)), to_dtype(np.dtype(dtype).name)).allocate())).reshape(shape)
