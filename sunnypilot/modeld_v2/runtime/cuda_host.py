"""Host memory a CUDA kernel reads or writes in place: CUDA reaches host memory only through a device pointer of registered pages."""
from __future__ import annotations

import ctypes
import mmap
from typing import Any

import numpy as np
from tinygrad import Device, Tensor

from sunnypilot.modeld_v2.runtime.tinygrad_internals import cuda_driver

CU_MEMHOSTREGISTER_DEVICEMAP, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 0x02, 712

class CudaHostRegistration:
  """Host ranges registered with the CUDA driver by one owner (camera buffers, the host inputs, the outputs): each mapped once, all
  unregistered together by unmap_all()."""
  def __init__(self, device: str):
    (self.cuda, self.context), self.dev, self.registered = cuda_driver(device), Device[device], []

  def _check(self, status, what: str) -> None:
    if status != 0: raise RuntimeError(f"{what} failed with CUDA error {status}")

  def map(self, ptr: int, length: int) -> int:
    """The device pointer of host memory [ptr, ptr+length), which stays valid until unmap_all()."""
    self._check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
    status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
    if status == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:  # a stale registration of memory that went away and came back at this address
      self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))
      status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
    self._check(status, "cuMemHostRegister")
    self.registered.append(ptr)
    dptr = self.cuda.CUdeviceptr_v2()
    self._check(self.cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(ptr), 0), "cuMemHostGetDevicePointer")
    return dptr.value

  def unmap_all(self) -> None:
    self.dev.synchronize()  # no kernel may still be reading them
    for ptr in self.registered: self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))
    self.registered.clear()

  def mapped_tensor(self, array: np.ndarray) -> Tensor:
    """A device tensor over a page-aligned host array (registered here): kernels read and write the array itself."""
    return Tensor.from_blob(self.map(array.ctypes.data, array.nbytes), (array.size,), dtype=array.dtype.name, device=self.dev.device)

def host_pages(count: int, dtype: Any = np.uint8) -> np.ndarray:
  """A zeroed, page-aligned host array of `count` elements (an anonymous mapping), as the driver registers whole pages."""
  return np.frombuffer(mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1)), dtype, count=count)
