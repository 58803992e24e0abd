"""Capture: turn a TinyJit's compiled kernel list into a part, check it against the TinyJit replay bit for bit, and replay that check later.

`capture_part(fn, make_inputs)` is what the compilers use: TinyJit(prune=True), call 0 runs eagerly and compiles, call 1 captures inside
`record_kernel_linear` (and searches its kernels with BEAM), then `jit_part` makes the part, a format.part Part record. `capture` is the
same with the part's header as JSON, for tools and tests that edit a part as data.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.device import Buffer
from tinygrad.dtype import DType
from tinygrad.helpers import BEAM, Context, getenv
from tinygrad.uop.ops import UOp

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.fields import device_kind, dtype_name, parse_dtype
from sunnypilot.modeld_v2.format.part import (
  Arg,
  Blob,
  BufferSpec,
  BufferView,
  Call,
  Check,
  InputArg,
  InputSlot,
  Param,
  Part,
  PartJSON,
  Program,
  Returned,
  Returns,
  RuntimeVar,
  label,
)
from sunnypilot.modeld_v2.format.part_builder import PartBuilder
from sunnypilot.modeld_v2.runtime.kernel_replay import InputError, Replay, replay_part, write_tensor
from sunnypilot.modeld_v2.runtime.tinygrad_internals import (
  CapturedCall,
  Jit,
  KernelFields,
  Unsupported,
  captured_calls,
  host_backed_null,
  kernel_fields,
  program_binary,
  record_kernel_linear,
  watched_beam_search,
)

if TYPE_CHECKING:
  from tinygrad.device import MultiBuffer

JitInputs = Mapping[str, Tensor | Mapping[str, Tensor]]  # a capture's keyword inputs: Tensors, and dicts of Tensors such as output_buffers

logger = logging.getLogger(__name__)

@contextlib.contextmanager
def compile_session() -> Iterator[bool]:
  """Wrap a whole compile, weight loading included: on NULL (cross-compiling) NULL buffers are host-backed for its duration. Yields whether
  they are, for `capture(..., null_holds_data=...)`."""
  if device_kind(Device.DEFAULT) != "NULL":
    yield False
    return
  with host_backed_null(): yield True

def search_level(beam: int | None) -> int:
  """The BEAM level of a compile: `--beam` when given, else tinygrad's BEAM (environment). A search times candidate kernels on the device,
  so where nothing runs (NULL, cross-compiling for QCOM) it is refused: search on the target device instead."""
  level = BEAM.value if beam is None else beam
  if level < 0: raise ArtifactError(f"--beam is 0 (no search) or a beam width of 1 or more, got {level}")
  if (level or getenv("JITBEAM", 0)) and device_kind(Device.DEFAULT) == "NULL":
    raise ArtifactError(f"BEAM search needs the target device to time kernels, and {Device.DEFAULT} runs nothing: build searched bundles on the "
                        "device itself (comma devices: the self-hosted comma runner), or drop --beam/BEAM")
  return level

@contextlib.contextmanager
def beam_progress(level: int, log: Callable[[str], None]) -> Iterator[Callable[[int], None]]:
  """BEAM=level for the block (0: no search, whatever the environment says). A search logs a line when it learns how many kernels it
  will search (from the function this yields: record_kernel_linear's `on_kernels`), then a line per kernel: i of n, its best time,
  elapsed. A kernel found in tinygrad's search cache (its disk cache, ~/.cache/tinygrad/cache.db or $CACHEDB) shows no time: rebuilding a
  searched bundle is fast."""
  if not level:
    with Context(BEAM=0): yield lambda kernels: None
    return
  start, done, best, total = time.perf_counter(), [0], [math.inf], [0]
  def planned(kernels: int) -> None:
    total[0] = kernels
    log(f"searching {kernels} kernels with BEAM={level} on {Device.DEFAULT} ...")
  def timed(tms: list[float]) -> None: best[0] = min(best[0], *tms)
  def searched() -> None:
    done[0] += 1
    found = "from the search cache" if best[0] == math.inf else f"best {best[0] * 1e6:.1f} us"
    log(f"BEAM={level}: kernel {done[0]} of ~{total[0]}: {found}, elapsed {time.perf_counter() - start:.0f} s")
    best[0] = math.inf
  with watched_beam_search(timed, searched), Context(BEAM=level): yield planned

class Captured(NamedTuple):
  jit: Jit
  part: tuple[Part | PartJSON, bytes]  # capture_part: a Part record; capture: its JSON
  inputs: JitInputs  # the capture call's inputs, as the part lays them out

def capture_part(fn: Callable, make_inputs: Callable[[], JitInputs], prune: bool = True, seed: int = 0, null_holds_data: bool = False,
                 beam: int = 0, log: Callable[[str], None] = logger.info) -> Captured:
  """TinyJit-capture `fn` on fresh inputs from `make_inputs()` (call 0 runs eagerly and compiles, call 1 captures) into a part record,
  self-checked against the TinyJit replay. `null_holds_data`: inside `compile_session()` on NULL (see jit_part). `beam`: search each
  kernel's optimizations with BEAM=beam on this device (see search_level) while call 1 compiles the captured kernel list, whose size is
  the progress's total; call 0 compiles without a search."""
  jit = TinyJit(fn, prune=prune)
  with Context(BEAM=0):  # a search only while call 1 compiles, whatever the environment says
    jit(**make_inputs())
    inputs = make_inputs()
    with beam_progress(beam, log) as planned, record_kernel_linear(planned) as recorded: jit(**inputs)
    if len(recorded) != 1: raise ArtifactError(f"expected one captured kernel list, got {len(recorded)}")
    return Captured(jit, jit_part(jit, recorded[0], inputs, seed, recorded.onetime[0] if recorded.onetime else None, null_holds_data), inputs)

def capture(fn: Callable, make_inputs: Callable[[], JitInputs], prune: bool = True, seed: int = 0, null_holds_data: bool = False,
            beam: int = 0, log: Callable[[str], None] = logger.info) -> Captured:
  """capture_part with the part's header as JSON."""
  captured = capture_part(fn, make_inputs, prune, seed, null_holds_data, beam, log)
  assert isinstance(record := captured.part[0], Part), "capture_part makes a Part record"
  return captured._replace(part=(record.to_json(), captured.part[1]))

def input_layout(kwargs: JitInputs) -> list[tuple[str, str | None, Tensor]]:
  """(name, key, tensor) per JIT input slot, in tinygrad's `_prepare_jit_inputs` order: named tensors sorted, then dict entries not seen yet."""
  if not all(isinstance(v, (Tensor, dict)) for v in kwargs.values()):
    raise InputError(f"inputs must be Tensors or dicts of Tensors, got {sorted((k, type(v).__name__) for k, v in kwargs.items())}")
  layout: list[tuple[str, str | None, Tensor]] = [(name, None, t) for name, t in sorted(kwargs.items()) if isinstance(t, Tensor)]
  for name, value in kwargs.items():
    if isinstance(value, dict):
      layout += [(name, key, t) for key, t in value.items() if isinstance(t, Tensor) and not any(t is y for _, _, y in layout)]
  return layout

def _ret_tensors(ret: object) -> tuple[Returns, list[Tensor]]:
  """The kind of a JIT return (with a dict's keys) and its tensors in order; the Returns' tensors are filled in by the serializer."""
  if ret is None: return Returns("NoneType", ()), []
  if isinstance(ret, Tensor): return Returns("Tensor", ()), [ret]
  if isinstance(ret, (tuple, list)) and all(isinstance(t, Tensor) for t in ret): return Returns(type(ret).__name__, ()), list(ret)
  if isinstance(ret, dict) and all(isinstance(t, Tensor) for t in ret.values()): return Returns("dict", (), tuple(ret)), list(ret.values())
  raise ArtifactError(f"cannot serialize a JIT return of type {type(ret).__name__}: return a Tensor, a tuple/list/dict of Tensors, or None")

def part_device(calls: list[CapturedCall]) -> str:
  """The device a captured kernel list runs on: its first device buffer's (host buffers, NPY and PYTHON, are copied from), else the default."""
  return next((a.device for c in calls for a in c.args if isinstance(a, Buffer) and device_kind(a.device) not in ("NPY", "PYTHON")), Device.DEFAULT)

def program_record(kernel: KernelFields) -> Program:
  """A compiled kernel as a part's program (its binary's blob range is set when the builder stores it)."""
  return Program(kernel.name, (0, 0), kernel.target, kernel.global_size, kernel.local_size, kernel.globals, kernel.outs, kernel.ins,
                 tuple(Param(n, s, dtype_name(dt), shape) for n, s, dt, shape in kernel.params),
                 tuple(RuntimeVar(n, s, dtype_name(dt), lo, hi) for n, s, dt, lo, hi in kernel.runtime_vars), kernel.estimates)

class PartSerializer:
  """One capture's kernel list turned into a part: each tinygrad buffer base once (by identity), each program once (see below), and
  per buffer range what the replay does to it first, which decides the ranges whose bytes the bundle carries (read before written).
  A program is one per record and binary: tinygrad compiles one binary for kernels that differ only in the sizes of the buffers they are
  given, and each keeps its own signature, the extent the loader checks its arguments against."""
  def __init__(self, device: str, layout: list[tuple[str, str | None, Tensor]]):
    self.device, self.layout, self.builder = device, layout, PartBuilder()
    self.bases: dict[int, tuple[int, Buffer]] = {}  # id(buffer base) -> (buffer index, buffer)
    self.program_index: dict[tuple[str, bytes], int] = {}  # (the record's JSON, binary) -> program index
    self.ast_program: dict[UOp, int] = {}
    self.first_access: dict[tuple[int, int, int], str] = {}  # (buffer, offset, nbytes) -> "r" or "w"

  def buffer_view(self, buf: Buffer | MultiBuffer) -> BufferView:
    if isinstance(buf, list) or not isinstance(buf, Buffer): raise ArtifactError("multi-device buffers are not supported")
    base = buf.base
    if device_kind(base.device) != device_kind(self.device): raise ArtifactError(f"buffer on {base.device} in a part for {self.device}: one device per part")
    if id(base) not in self.bases: self.bases[id(base)] = (self.builder.add_buffer(BufferSpec(base.nbytes, base.device, dtype_name(base.dtype))), base)
    return BufferView(self.bases[id(base)][0], buf.offset, buf.nbytes, dtype_name(buf.dtype))

  def arg(self, a: int | Buffer) -> Arg:
    if not isinstance(a, int): return self.buffer_view(a)
    if a >= len(self.layout): raise ArtifactError(f"captured input slot {a} is not among the {len(self.layout)} check inputs")
    return InputArg(a)

  def access(self, a: Arg, mode: str) -> None:
    if isinstance(a, BufferView): self.first_access.setdefault((a.buffer, a.offset, a.nbytes), mode)

  def program(self, ast: UOp) -> int:
    if ast not in self.ast_program:
      record, lib = program_record(kernel_fields(ast)), program_binary(ast)
      key = (json.dumps(record.to_json(), sort_keys=True), lib)
      if key not in self.program_index: self.program_index[key] = self.builder.add_program(record, lib)
      self.ast_program[ast] = self.program_index[key]
    return self.ast_program[ast]

  def call(self, call: CapturedCall) -> Call:
    args = tuple(map(self.arg, call.args))
    for i in call.reads: self.access(args[i], "r")
    for i in call.writes: self.access(args[i], "w")
    return Call("copy", args) if call.program is None else Call("program", args, self.program(call.program))

  def onetime_call(self, call: CapturedCall) -> Call | None:
    """A one-time call, or None for a constant copied once from host memory (a Python list): it ran at capture, its result is stored."""
    if call.program is None and isinstance(src := call.args[1], Buffer) and device_kind(src.base.device) != device_kind(self.device):
      self.access(self.arg(call.args[0]), "r")
      return None
    c = self.call(call)
    if any(isinstance(a, InputArg) for a in c.args): raise ArtifactError("a one-time call reads a JIT input")
    return c

  def returned(self, t: Tensor) -> Returned:
    slot = next((i for i, (_, _, x) in enumerate(self.layout) if x.uop.base is t.uop.base), None)
    return Returned(InputArg(slot) if slot is not None else self.buffer_view(t.uop.buffer), tuple(int(d) for d in t.shape))

  def store_contents(self, returns: tuple[Returned, ...]) -> None:
    """Weights and constants: each buffer with a range the replay reads before writing carries its bytes (once). A returned buffer no call
    touches (a constant output) is read by the caller as it is, so it counts as read."""
    for r in returns:
      if isinstance(r.arg, BufferView) and not any(index == r.arg.buffer for index, _, _ in self.first_access): self.access(r.arg, "r")
    by_index = dict(self.bases.values())
    for index in dict.fromkeys(index for (index, _, _), mode in self.first_access.items() if mode == "r"):
      self.builder.set_init(index, bytes(by_index[index].as_memoryview()))

  def inputs(self, calls: list[Call]) -> list[InputSlot]:
    programs = tuple(self.builder.programs)
    written = {a.input for c in calls for i, a in enumerate(c.args) if isinstance(a, InputArg) and c.writes(i, programs)}
    return [InputSlot(i, name, key, dtype_name(t.dtype), tuple(int(d) for d in t.shape), str(t.device), i in written)
            for i, (name, key, t) in enumerate(self.layout)]

def jit_part(run: Jit, linear: UOp, check: JitInputs, seed: int = 0, onetime: UOp | None = None, null_holds_data: bool = False) \
    -> tuple[Part, bytes]:
  """Turn a captured TinyJit and its recorded kernel LINEAR into a part `(Part record, blob)`.

  `check` is the keyword inputs of the capture (Tensors and dicts of Tensors such as `output_buffers`): it fixes the input layout, and the
  self-check overwrites their contents with seeded values, replays `run` and the new part on them, and requires bit-identical results.
  `onetime` is the recorded one-time LINEAR of a prune=True capture: the loader runs those calls once, before the first replay.
  `null_holds_data`: captured on NULL inside `host_backed_null`, so what the host copied in (weights) is real and is stored.
  """
  if (captured := getattr(run, "captured", None)) is None: raise ArtifactError("the TinyJit has not captured yet: call it twice before serializing")
  layout = input_layout(check)
  try:
    calls, onetime_calls = captured_calls(linear), captured_calls(onetime) if onetime is not None else []
    s = PartSerializer(part_device(calls + onetime_calls), layout)
    header_onetime = [c for c in map(s.onetime_call, onetime_calls) if c is not None]  # first: what they write (prepared weights) needs no bytes
    header_calls = [s.call(c) for c in calls]
  except Unsupported as e: raise ArtifactError(str(e)) from None
  returns, ret_tensors = _ret_tensors(captured.ret)
  returns = dataclasses.replace(returns, tensors=tuple(s.returned(t) for t in ret_tensors))
  if device_kind(s.device) != "NULL" or null_holds_data: s.store_contents(returns.tensors)
  part, blob = s.builder.part(s.device, list(check), s.inputs(header_calls), header_calls, header_onetime, returns), bytes(s.builder.blob())
  return dataclasses.replace(part, check=_self_check(run, part, blob, check, layout, seed)), blob

# *** the self-check: seeded inputs, TinyJit replay vs plain replay, bit for bit ***

def check_values(inputs: tuple[InputSlot, ...], seed: int) -> list[np.ndarray]:
  """Deterministic input contents for a part's recorded check: uniform bytes for integer inputs, N(0, 8) for floats."""
  rng, out = np.random.default_rng(seed), []
  for spec in inputs:
    dt: DType = parse_dtype(spec.dtype)
    shape, np_dt = spec.shape, np.dtype(dt.fmt)
    if dtypes.is_float(dt): out.append((rng.standard_normal(shape) * 8).astype(np_dt))
    elif dt == dtypes.bool: out.append(rng.integers(0, 2, shape).astype(np.bool_))
    else: out.append(rng.integers(0, 256, shape).astype(np_dt))
  return out

def _outputs(ret: object, layout: list, written: list[int]) -> dict[str, np.ndarray]:
  _, tensors = _ret_tensors(ret)
  out = {f"return[{i}]": t.numpy() for i, t in enumerate(tensors)}
  return out | {label(*layout[slot][:2]): layout[slot][2].numpy() for slot in written}

def _digests(outputs: dict[str, np.ndarray]) -> dict[str, str]: return {name: hashlib.sha256(v.tobytes()).hexdigest() for name, v in outputs.items()}

def _written(part: Part) -> list[int]: return [s.slot for s in part.inputs if s.written]

def _self_check(run: Jit, part: Part, blob: bytes, check: JitInputs, layout: list, seed: int) -> Check | None:
  if device_kind(part.device) == "NULL": return None  # NULL buffers hold no data: nothing to compare
  values, results = check_values(part.inputs, seed), []
  for replay in (run, Replay(part, blob)):
    for (_, _, t), v in zip(layout, values): write_tensor(t, v)
    results.append(_outputs(replay(**check), layout, _written(part)))
  for name, expected in results[0].items():
    if expected.tobytes() != results[1][name].tobytes(): raise ArtifactError(f"self-check failed: plain replay differs from the TinyJit replay in {name}")
  return Check(seed, _digests(results[0]))

def verify_part(header: Part | PartJSON, blob: Blob, device: str | None = None) -> dict[str, bool]:
  """Replay a part on its recorded check's seeded inputs: {output label: digest matches what the capture recorded}."""
  part = (replay := replay_part(header, blob, device)).part
  if part.check is None: raise ArtifactError("this part has no recorded check (built on NULL, or fused at load time)")
  values = check_values(part.inputs, part.check.seed)
  layout = [(s.name, s.key, Tensor(v, device=replay.input_device(s)).realize()) for s, v in zip(part.inputs, values)]
  kwargs: dict[str, Tensor | dict[str, Tensor]] = {name: {} for name in part.kwargs}
  for name, key, t in layout:
    if key is None: kwargs[name] = t
    elif isinstance(entry := kwargs[name], dict): entry[key] = t
    else: raise ArtifactError(f"input {name} is both a tensor and a dict of tensors")
  try: outputs = replay(**kwargs)
  except InputError as e: raise ArtifactError(f"the part's recorded inputs do not fit it: {e}") from None
  got = _digests(_outputs(outputs, layout, _written(part)))
  return {name: got.get(name) == digest for name, digest in part.check.outputs.items()}
