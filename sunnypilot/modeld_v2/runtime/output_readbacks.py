"""How a step's outputs (1, N) come back to the host as numpy, one class per way; each returns the same preallocated array every step,
valid until the next run: no scheduling, no allocation per frame."""
from __future__ import annotations

import numpy as np
from tinygrad import Device, Tensor

from sunnypilot.modeld_v2.format.bundle import TensorSpec
from sunnypilot.modeld_v2.runtime.cuda_host import CudaHostRegistration, host_pages
from sunnypilot.modeld_v2.runtime.tinygrad_internals import copy_out, host_memory, tensor_buffer

class OutputReadback:
  """`tensor`: the output buffer the part writes (passed as output_buffers["outputs"]); `read()`: its values after a run."""
  tensor: Tensor
  def read(self) -> np.ndarray: raise NotImplementedError
  def close(self) -> None: pass

class ViewedOutput(OutputReadback):
  """The direct CPU replay: the array is a view of the output buffer itself (the kernels have finished when run() returns)."""
  def __init__(self, spec: TensorSpec, device: str):
    self.tensor = Tensor(np.zeros(spec.shape, spec.dtype), device=device).realize()
    self.array = np.frombuffer(host_memory(tensor_buffer(self.tensor)), spec.dtype).reshape(spec.shape)
  def read(self) -> np.ndarray: return self.array

class CopiedOutput(OutputReadback):
  """A device buffer copied out into one preallocated array (the copy waits for the device)."""
  def __init__(self, spec: TensorSpec, device: str):
    self.tensor = Tensor(np.zeros(spec.shape, spec.dtype), device=device).realize()
    self.buffer, self.array = tensor_buffer(self.tensor), np.empty(spec.shape, spec.dtype)
  def read(self) -> np.ndarray:
    copy_out(self.buffer, self.array.data.cast("B"))
    return self.array

class PinnedOutput(OutputReadback):
  """CUDA: the graph writes registered host memory; the array is that memory, read once the device is done. Unregistered by close()."""
  def __init__(self, spec: TensorSpec, device: str):
    self.device, self.cuda = device, CudaHostRegistration(device)
    self.array = host_pages(int(np.prod(spec.shape)), spec.dtype).reshape(spec.shape)
    self.tensor = self.cuda.mapped_tensor(self.array.reshape(-1)).reshape(spec.shape)
  def read(self) -> np.ndarray:
    Device[self.device].synchronize()
    return self.array
  def close(self) -> None: self.cuda.unmap_all()
