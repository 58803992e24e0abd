"""How a replay launches a part's calls, behind `patch()` (a slot's tensor bound by pointer) and `run()`: direct ctypes calls on CPU
(`Direct`), and tinygrad's graph runner (one submission per frame) elsewhere (`Graph`). The replay that owns a back-end
(kernel_replay.Replay) binds the slots; a back-end reads of it only the `ReplayedPart` it is.
"""
from __future__ import annotations

import collections
import ctypes
import time
import weakref
from collections.abc import Callable
from typing import Any, Protocol, cast

import numpy as np
from tinygrad.device import Buffer
from tinygrad.uop.ops import Ops, UOp

from sunnypilot.modeld_v2.format.fields import parse_dtype
from sunnypilot.modeld_v2.format.part import Arg, BufferView, Call, InputArg, InputSlot, Part
from sunnypilot.modeld_v2.runtime.tinygrad_internals import (
  always_repointed,
  buffer_address,
  cpu_entry,
  graph_batches,
  graph_runner,
  is_graph_batch,
  repoint_only,
  repointable,
  run_calls,
  runner_slots,
)

MAX_GRAPH_INSTANCES = 36  # per graph batch: camerad's 18 buffer pairs, twice over; past it the oldest instance is re-pointed

class ReplayedPart(Protocol):
  """What a back-end reads of its replay: the part, the device it runs on, the input slots, the buffer views, where each input lives."""
  part: Part
  device: str
  inputs: tuple[InputSlot, ...]
  def view(self, a: BufferView) -> Buffer: ...
  def input_device(self, spec: InputSlot) -> str: ...

class Direct:
  """CPU: each call is a ctypes call prepared once. An input slot is one shared c_uint64 (c_void_p for copies) in every call that reads
  or writes it, so binding a slot is two integer stores."""
  def __init__(self, replay: ReplayedPart, programs: list[UOp]):
    self.replay = cast(ReplayedPart, weakref.proxy(replay))  # the Replay owns its back-end: no cycle, so a dropped model frees its buffers at once
    self.entries = [cpu_entry(p, replay.device) for p in programs]  # kept: each owns its loaded code
    self.ptrs = [ctypes.c_uint64(0) for _ in replay.inputs]
    self.void_ptrs = [ctypes.c_void_p(0) for _ in replay.inputs]
    self.holding = self.prepare(replay.part.calls)  # the frame thread's: each kernel call keeps the GIL
    self.releasing = self.prepare(replay.part.calls, release_gil=True)  # a thread beside the frames (a warm-up): each call lets it go
    self.steps = self.holding
    for fxn, args in self.prepare(replay.part.onetime_calls, release_gil=True): fxn(*args)  # weight preparation, once, at load

  def hold_gil(self, hold: bool) -> None: self.steps = self.holding if hold else self.releasing

  def prepare(self, calls: tuple[Call, ...], release_gil: bool = False) -> list[tuple[Callable[..., object], tuple]]:
    steps: list[tuple[Callable[..., object], tuple]] = []
    for call in calls:
      if call.kind == "copy":
        steps.append((ctypes.memmove, tuple(self.void_ptrs[a.input] if isinstance(a, InputArg) else buffer_address(self.replay.view(a)) for a in call.args) +
                      (self.replay.part.arg_nbytes(call.args[0]),)))
        continue
      assert call.program is not None, "a program call names its program"
      program, entry = self.replay.part.programs[call.program], self.entries[call.program]
      fxn, core_id = entry.releasing if release_gil else entry.fxn, entry.core_id
      args = [self.ptrs[a.input] if isinstance(a := call.args[i], InputArg) else ctypes.c_uint64(buffer_address(self.replay.view(a))) for i in program.globals]
      args += [ctypes.c_uint64(0)] * len(program.runtime_vars)
      for core in range(program.global_size[0] if core_id is not None else 1):  # as CPUProgram does: one call per core_id
        if core_id is not None: args[core_id] = ctypes.c_uint64(core)
        steps.append((fxn, tuple(args)))
    return steps

  def patch(self, slot: int, uop: UOp, buf: Buffer) -> None:
    self.ptrs[slot].value = self.void_ptrs[slot].value = buffer_address(buf)

  def forget(self, uops: set[UOp] | None) -> None: """Nothing kept per tensor: a slot's pointer is rewritten by its next patch."""

  def run(self, wait: bool = False) -> float:
    start = time.perf_counter()
    for fxn, args in self.steps: fxn(*args)
    return time.perf_counter() - start

class _Batch:
  """One graph batch's instances, keyed by the input tensors it reads (None for runners that re-point every input at each launch)."""
  def __init__(self, ast: UOp, inputs: tuple[UOp, ...]):
    self.ast = ast
    first = self.make(inputs)
    self.repointable = repointable(first)  # CUDAGraph: re-points the nodes it is told to, launch by launch
    self.nodes = runner_slots(first)
    self.slots = tuple(sorted(self.nodes))
    self.always = always_repointed(first) if self.repointable else set()
    # a runner is tinygrad's GraphRunner of the device (tinygrad_internals reads what it needs of one)
    self.instances: collections.OrderedDict[tuple[UOp, ...] | None, Any] = collections.OrderedDict({self.key(inputs): self.settled(first)})

  def make(self, inputs: tuple[UOp, ...]) -> Any: return graph_runner(self.ast, inputs)

  def key(self, inputs: tuple[UOp, ...]) -> tuple[UOp, ...] | None: return tuple(inputs[s] for s in self.slots) if self.repointable else None

  def settled(self, runner: Any, changed: tuple[int, ...] = ()) -> Any:
    """The runner, told to re-point only the nodes of `changed` slots at its next launch."""
    if self.repointable: repoint_only(runner, self.always.union(*(self.nodes[s] for s in changed)))
    return runner

  def instance(self, inputs: tuple[UOp, ...]) -> Any:
    key = self.key(inputs)
    if (runner := self.instances.get(key)) is not None:
      self.instances.move_to_end(key)
      return self.settled(runner)
    changed: tuple[int, ...] = ()
    if len(self.instances) < MAX_GRAPH_INSTANCES: runner = self.make(inputs)
    else:
      old, runner = self.instances.popitem(last=False)
      assert old is not None and key is not None, "only repointable runners have more than one instance, each keyed by its tensors"
      changed = tuple(s for s, a, b in zip(self.slots, old, key) if a is not b)
    self.instances[key] = runner
    return self.settled(runner, changed)

def linear_of(replay: ReplayedPart, programs: list[UOp], part_calls: tuple[Call, ...]) -> UOp:
  """The part's calls as a tinygrad LINEAR: input slots as PARAMs, everything else as the replay's buffer views."""
  def arg(a: Arg) -> UOp:
    if isinstance(a, InputArg):
      spec = replay.inputs[a.input]
      return UOp.param(a.input, parse_dtype(spec.dtype), (int(np.prod(spec.shape)),), replay.input_device(spec))
    return UOp.from_buffer(replay.view(a))
  calls = []
  for call in part_calls:
    args = [arg(a) for a in call.args]
    if call.kind == "copy": calls.append(UOp(Ops.COPY, args[1].dtype, src=(args[1],), arg=args[0].device).call(*args))
    else:
      assert call.program is not None, "a program call names its program"
      calls.append(programs[call.program].call(*args))
  return UOp(Ops.LINEAR, src=tuple(calls))

class Graph:
  """Other devices: a tinygrad LINEAR of the compiled PROGRAMs, batched by `graph_split_rewrite` into the device's graph runner.

  A CUDA graph bakes each kernel's pointers in, and re-pointing a node costs a driver call per node and launch. So a batch keeps one
  graph instance per combination of the tensors it reads (one per camerad buffer pair; host, states and outputs never change), and
  launches it as built. Past MAX_GRAPH_INSTANCES the oldest instance is re-pointed, only at the nodes whose tensors differ. Runners that
  re-point every input at each launch anyway (HCQ: QCOM, AMD) keep one instance."""
  def __init__(self, replay: ReplayedPart, programs: list[UOp]):
    self.replay, self.programs = cast(ReplayedPart, weakref.proxy(replay)), programs  # as Direct: no cycle with the owning Replay
    self.linear = graph_batches(self.build(replay.part.calls), replay.device)
    if onetime := replay.part.onetime_calls: run_calls(self.build(onetime))  # weight preparation, once
    self.input_uops: list[UOp | None] = [None] * len(replay.inputs)
    self.graphs: dict[UOp, _Batch] = {}
    # per top-level call: a graph batch (its ast) or a lone call, as the LINEAR run_linear takes
    self.steps: list[tuple[UOp | None, UOp | None]] = [(c.src[0], None) if is_graph_batch(c.src[0]) else (None, UOp(Ops.LINEAR, src=(c,)))
                                                       for c in self.linear.src]

  def build(self, part_calls: tuple[Call, ...]) -> UOp: return linear_of(self.replay, self.programs, part_calls)

  def hold_gil(self, hold: bool) -> None: """Launches release the GIL in the driver's calls already."""

  def patch(self, slot: int, uop: UOp, buf: Buffer) -> None: self.input_uops[slot] = uop

  def forget(self, uops: set[UOp] | None) -> None:
    """Drop the graph instances built on these tensors (all with None): their pointers are about to go stale. A runner that re-points
    every input at each launch (key None) still holds the buffers it was built with: it goes too, and is rebuilt on the next run."""
    for batch in self.graphs.values():
      for key in [k for k in batch.instances if uops is None or k is None or uops.intersection(k)]: del batch.instances[key]

  def run(self, wait: bool = False) -> float:
    inputs, start = cast(tuple[UOp, ...], tuple(self.input_uops)), time.perf_counter()  # every slot is bound before a run
    for ast, lone in self.steps:
      if lone is not None:
        run_calls(lone, inputs, wait)
        continue
      assert ast is not None, "a step is a graph batch or a lone call"
      if ast not in self.graphs: self.graphs[ast] = _Batch(ast, inputs)
      self.graphs[ast].instance(inputs)(inputs, {}, wait=wait)
    return time.perf_counter() - start

  @property
  def call_kinds(self) -> list[str]:
    return ["graph" if is_graph_batch(c.src[0]) else c.src[0].op.name for c in self.linear.src]
