"""Host memory registered with the CUDA driver, counted per process: the running model and the one loaded beside it share a camera buffer's
registration, and the first to let go must not unregister what the other still reads (on the H200 that was CUDA error 700 after a switch).
The driver is a stand-in that keeps the driver's own rule: registering pages twice is error 712, unregistering unknown pages an error."""
import ctypes

import pytest

from sunnypilot.modeld_v2.runtime.cuda_host import CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, HostRegistrations

class Driver:
  """cuMemHostRegister / Unregister / GetDevicePointer over a set of registered ranges, as the CUDA driver API documents them."""
  CUdeviceptr_v2 = ctypes.c_uint64
  def __init__(self): self.ranges, self.calls = {}, []
  def cuCtxSetCurrent(self, context): return 0
  def cuMemHostRegister_v2(self, ptr, length, flags):
    self.calls.append(("register", ptr.value))
    if ptr.value in self.ranges: return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
    self.ranges[ptr.value] = length
    return 0
  def cuMemHostUnregister(self, ptr):
    self.calls.append(("unregister", ptr.value))
    return 0 if self.ranges.pop(ptr.value, None) is not None else 713  # CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
  def cuMemHostGetDevicePointer_v2(self, dptr, ptr, flags):
    if ptr.value not in self.ranges: return 713
    dptr._obj.value = ptr.value  # unified addressing: the device sees the host address
    return 0

def test_two_owners_share_one_registration_until_the_last_lets_go():
  driver = Driver()
  regs = HostRegistrations(driver, None)
  assert regs.acquire(0x10000, 4096) == 0x10000 and regs.acquire(0x10000, 4096) == 0x10000  # running set, then the next one
  assert driver.calls == [("register", 0x10000)], "registered once"
  regs.release(0x10000)  # the previous set closes after the changeover
  assert 0x10000 in driver.ranges, "still registered: the new set's graph reads it"
  regs.release(0x10000)
  assert driver.ranges == {} and driver.calls[-1] == ("unregister", 0x10000)

def test_a_registration_made_elsewhere_is_taken_over_and_a_new_size_registered_anew():
  driver = Driver()
  driver.ranges[0x20000] = 4096  # left by someone else
  regs = HostRegistrations(driver, None)
  assert regs.acquire(0x20000, 4096) == 0x20000 and driver.ranges == {0x20000: 4096}
  assert regs.acquire(0x20000, 8192) == 0x20000 and driver.ranges == {0x20000: 8192}, "camerad came back with larger buffers"
  regs.release(0x20000)
  regs.release(0x20000)
  assert driver.ranges == {}
  with pytest.raises(KeyError): regs.release(0x20000)

def test_an_owner_collected_without_unmap_all_lets_go_and_keeps_its_arrays_until_then(monkeypatch):
  """A runner dropped without close() (a failed load, a test's leftover) must not leave registrations of pages that are freed: the next
  allocation at that address would be handed the stale device pointer (on the H200: a later runner's outputs read back as zeros)."""
  import gc
  import weakref

  from sunnypilot.modeld_v2.runtime import cuda_host
  from sunnypilot.modeld_v2.runtime.cuda_host import CudaHostRegistration, host_pages
  monkeypatch.setattr(cuda_host.Tensor, "from_blob", staticmethod(lambda *args, **kwargs: None))  # the registration's lifetime, not tinygrad's tensor
  driver = Driver()
  regs = HostRegistrations(driver, None)
  owner = CudaHostRegistration("CPU", regs)
  array = host_pages(4096)
  alive = weakref.ref(array)
  owner.mapped_tensor(array)
  owner.map(0x40000, 4096)  # a camera buffer someone else owns
  del array
  gc.collect()
  assert alive() is not None, "a registered array lives as long as its registration"
  del owner
  gc.collect()
  assert alive() is not None and 0x40000 in driver.ranges, "queued, not released inside the collection"
  assert regs.acquire(0x50000, 4096) == 0x50000  # the next registration call releases the collected owner's first
  assert driver.ranges == {0x50000: 4096} and alive() is None, "every registration of the collected owner released, then its array freed"

def test_an_owner_collected_while_its_thread_holds_the_lock_does_not_deadlock(monkeypatch):
  """A collection can run at any allocation, also inside acquire/release with the lock held: the finalizer then runs on that thread.
  It must take no lock (a plain Lock taken twice by one thread never returns)."""
  import gc
  import threading

  from sunnypilot.modeld_v2.runtime import cuda_host
  monkeypatch.setattr(cuda_host.Tensor, "from_blob", staticmethod(lambda *args, **kwargs: None))
  regs = HostRegistrations(Driver(), None)
  owner = cuda_host.CudaHostRegistration("CPU", regs)
  owner.map(0x60000, 4096)
  owner.cycle = owner  # freed only by the cyclic collector, as a runner in a reference cycle is
  def collect_under_the_lock():
    with regs.lock: gc.collect()
  del owner
  thread = threading.Thread(target=collect_under_the_lock, daemon=True)
  thread.start()
  thread.join(timeout=10)
  assert not thread.is_alive(), "the finalizer waited for the lock its own thread holds"
  regs.release_orphans()
  assert regs.counts == {}
