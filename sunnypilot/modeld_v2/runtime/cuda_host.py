"""Host memory a CUDA kernel reads or writes in place: CUDA reaches host memory only through a device pointer of registered pages."""
from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from collections import deque
from typing import Any

import numpy as np
import numpy.typing as npt
from tinygrad import Device, Tensor
from tinygrad.device import Compiled

from sunnypilot.modeld_v2.runtime.tinygrad_internals import cuda_driver

CU_MEMHOSTREGISTER_DEVICEMAP, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED = 0x02, 712

class HostRegistrations:
  """The driver's registrations of host memory, counted: a registration is the process's, not an owner's (registering pages twice fails
  with 712), so two owners of the same camera buffer (the running model and the next one loaded beside it, or the one kept for a fallback)
  share one, and it is unregistered when the last of them lets go. One per CUDA context.
  `orphans`: what owners collected without unmap_all() held, queued by their finalizers (which run inside a garbage collection, possibly
  on a thread holding `lock`: they take no lock and call no driver) and released by the next acquire or release, before it looks up an
  address: memory freed and allocated again at the same address is registered anew, never handed the old registration."""
  def __init__(self, cuda: Any, context: Any):  # tinygrad's CUDA driver bindings and a CUcontext (tinygrad_internals.cuda_driver)
    self.cuda, self.context, self.lock = cuda, context, threading.Lock()
    self.counts: dict[int, list[int]] = {}  # ptr -> [length, owners]
    self.orphans: deque[tuple[Compiled, list[int], list[np.ndarray]]] = deque()  # (device, pointers, arrays kept alive until released)

  def release_orphans(self) -> None:
    while self.orphans:
      try: dev, registered, held = self.orphans.popleft()
      except IndexError: return  # another thread took the last one
      if registered: dev.synchronize()  # no kernel of the collected owner may still be reading them
      with self.lock:
        for ptr in registered: self._release(ptr)
      registered.clear()
      held.clear()

  def _check(self, status: int, what: str) -> None:
    if status != 0: raise RuntimeError(f"{what} failed with CUDA error {status}")

  def acquire(self, ptr: int, length: int) -> int:
    """The device pointer of host memory [ptr, ptr+length), registered by the first owner."""
    self.release_orphans()
    with self.lock:
      self._check(self.cuda.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
      if (entry := self.counts.get(ptr)) is not None and entry[0] != length:  # memory that went away and came back in another size (camerad
        self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))                 # restarted while a second owner still held it): registered anew
        del self.counts[ptr]
        entry = None if entry[1] == 0 else [length, entry[1]]
        if entry is not None:
          self._check(self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP), "cuMemHostRegister")
          self.counts[ptr] = entry
      if entry is None:
        status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
        if status == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:  # registered outside this process' counts (not by this project): take it over
          self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))
          status = self.cuda.cuMemHostRegister_v2(ctypes.c_void_p(ptr), length, CU_MEMHOSTREGISTER_DEVICEMAP)
        self._check(status, "cuMemHostRegister")
        entry = self.counts[ptr] = [length, 0]
      entry[1] += 1
      dptr = self.cuda.CUdeviceptr_v2()
      self._check(self.cuda.cuMemHostGetDevicePointer_v2(ctypes.byref(dptr), ctypes.c_void_p(ptr), 0), "cuMemHostGetDevicePointer")
      return dptr.value

  def release(self, ptr: int) -> None:
    """One owner lets go of `ptr`; the last one unregisters it."""
    self.release_orphans()
    with self.lock: self._release(ptr)

  def _release(self, ptr: int) -> None:
    entry = self.counts[ptr]
    entry[1] -= 1
    if entry[1] == 0:
      del self.counts[ptr]
      self.cuda.cuMemHostUnregister(ctypes.c_void_p(ptr))

_REGISTRATIONS: dict[Any, HostRegistrations] = {}  # per CUDA context: the driver's registrations are per process

def host_registrations(device: str) -> HostRegistrations:
  cuda, context = cuda_driver(device)
  key = ctypes.cast(context, ctypes.c_void_p).value
  if key not in _REGISTRATIONS: _REGISTRATIONS[key] = HostRegistrations(cuda, context)
  return _REGISTRATIONS[key]

class CudaHostRegistration:
  """Host ranges one owner (camera buffers, the host inputs, the outputs) has registered with the CUDA driver: each mapped once, all let
  go together by unmap_all(), or when the owner is collected without it; memory another owner also maps stays registered until that one
  lets go too. Arrays it maps itself (mapped_tensor) live as long as their registration: pages freed while registered would leave a device
  pointer to pages the driver still pins, which the next allocation at that address would be handed (the counts are keyed by address)."""
  def __init__(self, device: str, registrations: HostRegistrations | None = None):
    self.dev = Device[device]
    self.registered: list[int] = []
    self.held: list[np.ndarray] = []
    self.registrations = registrations or host_registrations(device)
    # collected without unmap_all: queued, released by the next registration call (see HostRegistrations.orphans)
    self._finalizer = weakref.finalize(self, self.registrations.orphans.append, (self.dev, self.registered, self.held))
    self._finalizer.atexit = False  # at exit the process' registrations go with its CUDA context

  def map(self, ptr: int, length: int) -> int:
    """The device pointer of host memory [ptr, ptr+length), which stays valid until unmap_all()."""
    dptr = self.registrations.acquire(ptr, length)
    self.registered.append(ptr)
    return dptr

  def unmap_all(self) -> None:
    if self.registered: self.dev.synchronize()  # no kernel of this owner may still be reading them
    for ptr in self.registered: self.registrations.release(ptr)
    self.registered.clear()
    self.held.clear()

  def mapped_tensor(self, array: np.ndarray) -> Tensor:
    """A device tensor over a page-aligned host array (registered here, and kept alive with its registration): kernels read and write the
    array itself."""
    self.held.append(array)
    return Tensor.from_blob(self.map(array.ctypes.data, array.nbytes), (array.size,), dtype=array.dtype.name, device=self.dev.device)

def host_pages(count: int, dtype: npt.DTypeLike = np.uint8) -> np.ndarray:
  """A zeroed, page-aligned host array of `count` elements (an anonymous mapping), as the driver registers whole pages."""
  return np.frombuffer(mmap.mmap(-1, max(count * np.dtype(dtype).itemsize, 1)), dtype, count=count)
