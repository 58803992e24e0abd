"""Replay a part: programs rebuilt from their binaries, buffers allocated and filled from the blob, inputs bound per slot.

Bindings are per input slot: a slot's tensor is validated and bound once when first seen, then patched in by pointer whenever the
caller passes it again. modeld passes the same host, state and output tensors every frame and cycles camerad's 18 buffers per camera:
each is bound once, and a frame costs one identity check per slot. Two back-ends sit behind `patch()` and `run()`: direct ctypes
calls on CPU, and tinygrad's graph runner (one submission per frame) elsewhere (runtime/replay_backends).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
from tinygrad import Device, Tensor, dtypes
from tinygrad.device import Buffer
from tinygrad.helpers import getenv
from tinygrad.uop.ops import Ops, UOp

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.fields import device_kind, dtype_name, parse_dtype
from sunnypilot.modeld_v2.format.part import (
  Blob,
  BufferSpec,
  BufferView,
  InputArg,
  InputSlot,
  Part,
  PartJSON,
  Program,
)
from sunnypilot.modeld_v2.runtime.replay_backends import Direct, Graph, linear_of
from sunnypilot.modeld_v2.runtime.tinygrad_internals import (
  KernelFields,
  buffer_address,
  copy_in,
  host_array,
  host_memory,
  host_visible,
  program_uop,
  tensor_buffer,
  time_call,
)

ALIGNMENT = 16  # vectorised CPU kernels fault on float pointers that are not 16-byte aligned
MAX_BINDINGS_PER_SLOT = 64  # camerad's 18 buffers per camera fit many times over; a caller allocating per call evicts its oldest

class InputError(ValueError):
  """Inputs that do not match what the part was captured with."""

def copy_into(buf: Buffer, data: bytes | memoryview, offset: int = 0) -> None:
  """Copy bytes into a buffer at `offset`: host-visible memory directly, other devices through the allocator (ctypes wants a writable
  view)."""
  if host_visible(buf): np.frombuffer(host_memory(buf), np.uint8)[offset:offset + len(data)] = np.frombuffer(data, np.uint8)
  else:
    dest = buf if offset == 0 and len(data) == buf.nbytes else buf.view(len(data), dtypes.uint8, offset).ensure_allocated()
    copy_in(dest, data if isinstance(data, memoryview) and not data.readonly else memoryview(bytearray(data)))

def allocate(device: str, nbytes: int) -> Buffer:
  """A part's buffer on `device`, uninitialised."""
  return Buffer(device, nbytes, dtypes.uint8).allocate()

def write_tensor(t: Tensor, value: np.ndarray) -> None:
  """Overwrite a realized tensor's buffer in place (NPY buffers are numpy arrays: copied into directly)."""
  buf, data = tensor_buffer(t), np.ascontiguousarray(value).reshape(-1).view(np.uint8)
  if device_kind(buf.device) == "NPY": np.copyto(host_array(buf).reshape(-1).view(np.uint8)[:value.nbytes], data)
  else: copy_into(buf, data.data)

def slot_value(kwargs: dict[str, Any], name: str, key: str | None) -> Any:
  """The tensor a call passes for one input slot: a keyword, or one entry of a dict keyword (`output_buffers[outputs]`); None if absent."""
  return kwargs.get(name) if key is None else value.get(key) if isinstance(value := kwargs.get(name), dict) else None

def kernel_of(p: Program) -> KernelFields:
  """A part's program as the fields tinygrad's PROGRAM uop is rebuilt from."""
  return KernelFields(p.name, p.target, p.global_size, p.local_size, p.globals, p.outs, p.ins,
                      tuple((n, s, parse_dtype(dt), shape) for n, s, dt, shape in p.signature),
                      tuple((n, s, parse_dtype(dt), lo, hi) for n, s, dt, lo, hi in p.runtime_vars), p.estimates)

class Replay:
  """Replays a part. Called with the keyword inputs of the captured function (Tensors and dicts of Tensors such as `output_buffers`);
  returns what it returned. `_Jit` and `PlainJit` (compat.py) are this class under the seed's names.

  `mapped`: names of host (NPY) inputs the caller passes as tensors on the device, over host memory it mapped into the device (CUDA: pinned
  and registered): their upload becomes a device copy inside the device's graph, so a frame is one submission.

  `bases`: buffers already allocated and filled with their initial contents, by buffer index (a streamed load wrote the weights into
  them as it read the file: runtime/loader); the part's other buffers are allocated, and filled from the blob, here."""
  def __init__(self, header: Part | PartJSON, blob: Blob, device: str | None = None, mapped: tuple[str, ...] = (), bases: Sequence[Buffer] = ()):
    self.part = part = Part.of(header, blob)
    self.blob, self.mapped = blob, mapped
    self.device = Device.canonicalize(device or part.device)
    if len(bases) > len(part.buffers) or any(b.nbytes != spec.nbytes for b, spec in zip(bases, part.buffers)):
      raise ArtifactError("the buffers given to the replay are not the part's")
    self.input_names: list[str] = list(part.input_names)
    self.kwargs: list[str] = list(part.kwargs)
    self.inputs: tuple[InputSlot, ...] = part.inputs
    self.replay_s = 0.0  # the last call's kernels (CPU) or submission (elsewhere: the device runs on)
    self.bindings_made = 0  # tensors validated and bound, over this replay's life
    self.bases = list(bases) + [self.allocate(b) for b in part.buffers[len(bases):]]
    self.views: dict[BufferView, Buffer] = {}
    self.slots = [(s.name, s.key) for s in self.inputs]
    self.current: list[UOp | None] = [None] * len(self.inputs)  # the tensor each slot is bound to now
    self.buffers: list[Buffer | None] = [None] * len(self.inputs)
    self.known: list[dict[UOp, Buffer]] = [{} for _ in self.inputs]  # per slot: every tensor validated for it, in first-seen order
    self.conflicts = self.sharing_conflicts()
    self.programs = programs = [program_uop(kernel_of(p), bytes(blob[p.lib[0]:p.lib[1]]), self.device) for p in part.programs]
    self.backend = Direct(self, programs) if device_kind(self.device) == "CPU" and not getenv("PLAIN_JIT_LINEAR") else Graph(self, programs)
    self.ret = [None if isinstance(r.arg, InputArg) else Tensor(UOp.from_buffer(self.view(r.arg))).reshape(r.shape) for r in part.returns.tensors]
    self.same_ret = None if any(t is None for t in self.ret) else self.returned({})  # nothing returned is an input: the same objects every call

  @property
  def outputs_in_place(self) -> bool:
    """Whether buffers the part writes can be read as host memory the moment a call returns (the direct CPU replay: kernels have run)."""
    return isinstance(self.backend, Direct)

  @property
  def bindings(self) -> int:
    """Tensors bound now, over all slots."""
    return sum(len(known) for known in self.known)

  @property
  def graph_instances(self) -> int:
    """Device graph instances held now (one per combination of input tensors a batch reads; 0 on the direct CPU replay)."""
    return sum(len(b.instances) for b in self.backend.graphs.values()) if isinstance(self.backend, Graph) else 0

  @property
  def call_kinds(self) -> list[str]:
    """What one call submits, in order: COPY, PROGRAM, or `graph` for a batch the device's graph runner replays (graph back-end only)."""
    return self.backend.call_kinds if isinstance(self.backend, Graph) else [c.kind.upper() for c in self.part.calls]

  def allocate(self, spec: BufferSpec) -> Buffer:
    base = allocate(self.device, spec.nbytes)
    if spec.init is not None: copy_into(base, self.blob[spec.init[0]:spec.init[1]])
    return base

  def view(self, a: BufferView) -> Buffer:
    if a not in self.views:
      dt = parse_dtype(a.dtype)
      self.views[a] = self.bases[a.buffer].view(a.nbytes // dt.itemsize, dt, a.offset).ensure_allocated()
    return self.views[a]

  def sharing_conflicts(self) -> list[set[int]]:
    """Per slot, the slots it may not share a buffer with. Sharing is fine when neither is written, or when one is write-only, the other
    read-only, and every read comes before the first write: that is how next_X is written into X."""
    access: list[tuple[list[int], list[int]]] = [([], []) for _ in self.inputs]
    for j, call in enumerate(self.part.calls):
      for i, a in enumerate(call.args):
        if isinstance(a, InputArg): access[a.input][1 if call.writes(i, self.part.programs) else 0].append(j)
    def may_share(w: int, r: int) -> bool:
      (w_reads, w_writes), (r_reads, r_writes) = access[w], access[r]
      return not w_writes and not r_writes or not w_reads and bool(w_writes) and not r_writes and max(r_reads, default=-1) < min(w_writes)
    return [{o for o in range(len(self.inputs)) if o != s and not may_share(s, o) and not may_share(o, s)} for s in range(len(self.inputs))]

  def __call__(self, **kwargs: Any) -> Any:
    if len(kwargs) != len(self.kwargs): raise InputError(f"expected inputs {self.kwargs}, got {sorted(kwargs)}")
    changed = []
    try:
      for slot, (name, key) in enumerate(self.slots):
        t = slot_value(kwargs, name, key)
        if t.__class__ is Tensor and t.uop is self.current[slot]: continue
        changed.append(slot)
        self.bind(slot, t, kwargs)
      if changed: self.check_sharing(changed)
    except InputError:
      for s in changed: self.current[s] = self.buffers[s] = None  # a rejected call binds nothing: check these slots again next time
      raise
    self.replay_s = self.backend.run()
    return self.same_ret if self.same_ret is not None else self.returned(kwargs)

  def run_bound(self, wait: bool = True) -> float:
    """Run the kernels on the tensors bound by the last call, with no Python per input: the kernel-only floor. Seconds it took."""
    if any(b is None for b in self.buffers): raise InputError("run_bound() replays the last call's bindings: call the part once first")
    return self.backend.run(wait)

  def time_calls(self, rounds: int = 20) -> list[dict]:
    """Each call of the part alone on the tensors bound by the last call, `rounds` times: per call its index, kind, program index (None for
    a copy), bytes copied, and the median seconds. Kernels are timed by the device (CUDA events; on CPU the call itself); a copy by the
    host clock around it and a synchronize. For profiling: the replay itself runs its calls batched."""
    if any(u is None for u in self.current): raise InputError("time_calls() times the last call's bindings: call the part once first")
    inputs, rows = tuple(u.base for u in self.current if u is not None), []
    for j, call in enumerate(linear_of(self, self.programs, self.part.calls).src):
      spec, times = self.part.calls[j], [time_call(call, inputs, self.device) for _ in range(rounds)]
      rows.append({"call": j, "kind": spec.kind, "program": spec.program, "s": float(np.median(times)),
                   "copy_bytes": self.part.arg_nbytes(spec.args[0]) if spec.kind == "copy" else None})
    return rows

  def bind(self, slot: int, t: object, kwargs: dict[str, Any]) -> None:
    spec = self.inputs[slot]
    if not isinstance(t, Tensor):
      if sorted(kwargs) != self.kwargs: raise InputError(f"expected inputs {self.kwargs}, got {sorted(kwargs)}")
      raise InputError(f"input {spec.label} is missing or not a Tensor (got {type(t).__name__})")
    known = self.known[slot]
    if (buf := known.get(t.uop)) is None:
      buf = known[t.uop] = self.validated(spec, t)
      self.bindings_made += 1
      if len(known) > MAX_BINDINGS_PER_SLOT: del known[next(iter(known))]
    self.current[slot], self.buffers[slot] = t.uop, buf
    self.backend.patch(slot, t.uop.base, buf)

  def check_sharing(self, changed: list[int]) -> None:
    for slot in changed:
      if (other := next((o for o in self.conflicts[slot] if self.buffers[o] is self.buffers[slot]), None)) is not None:
        a, b = sorted((slot, other))
        raise InputError(f"inputs {self.inputs[a].label} and {self.inputs[b].label} share a buffer, and the part reads one after writing the other")

  def validated(self, spec: InputSlot, t: Tensor) -> Buffer:
    name = spec.label
    if not t.uop.is_realized or t.uop.base.op is not Ops.BUFFER: raise InputError(f"input {name} is not realized: realize it before the call")
    if tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
      raise InputError(f"input {name}: expected shape {spec.shape} {spec.dtype}, got {t.shape} {t.dtype!r}")
    if (expected := device_kind(self.input_device(spec))) != device_kind(str(t.device)):  # a sharded tensor's tuple of devices: never one
      raise InputError(f"input {name}: expected a {expected} tensor, got one on {t.device}")
    buf = tensor_buffer(t)
    if buf.nbytes != t.nbytes(): raise InputError(f"input {name} is a view of a larger buffer: pass a whole buffer")
    if not t.uop.has_buffer_identity():  # a permute, flip or other reordering would be read in raw memory order
      raise InputError(f"input {name} is a reordered view of its buffer ({t.uop.op.name}): pass a contiguous tensor (.contiguous().realize())")
    if self.outputs_in_place and (ptr := buffer_address(buf.ensure_allocated())) % ALIGNMENT:
      raise InputError(f"input {name}: pointer {ptr:#x} is not {ALIGNMENT}-byte aligned")
    return buf

  def input_device(self, spec: InputSlot) -> str:
    """Where an input lives: inputs captured on the part's device live on this replay's (the same, or the one allow_device chose), and so
    do mapped host inputs."""
    return self.device if device_kind(spec.device) == device_kind(self.part.device) or spec.name in self.mapped else spec.device

  def hold_gil(self, hold: bool) -> None:
    """CPU: whether each kernel call keeps the GIL (the default: the frame thread runs a frame's kernels back to back) or lets it go (a
    thread running the replay beside the frames, such as a warm-up on the model switch's: the frame thread runs during each call)."""
    self.backend.hold_gil(hold)

  def forget(self, tensors: list[Tensor]) -> None:
    """Drop the bindings of these tensors (camera buffers that went away), so neither they nor their memory are kept."""
    gone = {t.uop for t in tensors}
    self.backend.forget({t.uop.base for t in tensors})
    for slot, known in enumerate(self.known):
      for uop in gone & known.keys(): del known[uop]
      if self.current[slot] in gone: self.current[slot] = self.buffers[slot] = None

  def reset(self) -> None:
    """Drop every binding (warmup reset, camera reconnect)."""
    for known in self.known: known.clear()
    self.backend.forget(None)
    self.current, self.buffers = [None] * len(self.inputs), [None] * len(self.inputs)

  def returned(self, kwargs: dict[str, Any]) -> Any:
    """What the captured function returned: None, a Tensor, or a tuple, list or dict of them (the part's `returns`)."""
    returns = self.part.returns
    tensors = [t if t is not None else slot_value(kwargs, *self.slots[cast(InputArg, r.arg).input]) for t, r in zip(self.ret, returns.tensors)]
    kind = returns.kind
    if kind == "NoneType": return None
    if kind == "Tensor": return tensors[0]
    if kind == "dict": return dict(zip(returns.keys or (), tensors))
    return tuple(tensors) if kind == "tuple" else tensors

def replay_part(header: Part | PartJSON, blob: Blob, device: str | None = None, mapped: tuple[str, ...] = (), name: str = "the part",
                bases: Sequence[Buffer] = ()) -> Replay:
  """A Replay of a part read from a file. Part.from_json bounds and cross-checks every field the replay reads; whatever tinygrad still
  rejects while building it (an ELF it cannot relocate, a device it does not know) is an ArtifactError, like every other bad bundle."""
  try: return Replay(header, blob, device, mapped, bases)
  except (ArtifactError, InputError): raise
  except (AssertionError, LookupError, MemoryError, NotImplementedError, OverflowError, RuntimeError, TypeError, ValueError) as e:
    raise ArtifactError(f"{name} cannot be replayed here: {type(e).__name__}: {str(e)[:200]}") from None
