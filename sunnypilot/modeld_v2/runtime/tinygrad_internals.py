"""Every use of tinygrad internals (private attributes, functions patched at run time), for the two tinygrads this project supports: PyPI's
0.14.0 and openpilot's 138fb4a (openpilot selfdrive @084747c pins it; it states version 0.13.0). format/tinygrad_identity tells which one
was imported (this module imports nothing of the project: runtime/__init__.py hands it that identity), and refuses any other at load.

Everything else in the package uses tinygrad's public API (Tensor, TinyJit, Device, Buffer, UOp) plus this module. Each function names
the contract it relies on; tests/runtime/test_tinygrad_internals.py exercises each one (`.ci/run` runs it against both tinygrads), so a
tinygrad bump that breaks one fails there. Where the two differ, the function branches on the identified version (`on_138fb4a`):
- `time_call`: 0.14.0's `exec_kernel` returns a list of seconds (one per device of the call), 138fb4a's one float.
- `program_binary`, `program_uop`: 0.14.0's CPU compilers return an ELF object, which its CPU runtime links (`jit_loader`) when it loads
  it; 138fb4a's link it at compile, into raw code its runtime copies and jumps to, so an ELF object given to it is executed as code
  (SIGSEGV). A bundle stores CPU kernels as ELF objects with either (the one form format/kernel_binary can check); with 138fb4a the object
  is compiled again from the kernel's source and must link to the very code tinygrad ran, and is linked back when the kernel is rebuilt
  to run on the CPU. Compiling again costs about what compiling once does (a tiny stand-in's 17 kernels: 3.6 s on two busy cores).

- `record_kernel_linear`: `tinygrad.engine.jit` calls its module globals `jit_lower(linear, held_bufs, input_buf_uops)` (returns the
  compiled, memory planned, graph split LINEAR) once per TinyJit capture, and `prune_linear(...)` -> `(kept, onetime)` with prune=True
  before it, both on LINEARs of CALLs whose kernels are not compiled yet (a SINK first src, one per kernel); `tinygrad.engine.realize.
  compile_linear(linear)` compiles a LINEAR's kernels (searched when BEAM is set then).
- `host_backed_null`: `tinygrad.runtime.ops_null.NullAllocator` allocates, copies and offsets through `_alloc(size, options)`,
  `_copyin(dest, src)`, `_copyout(dest, src)` and `_offset(buf, size, offset)`.
- `watched_beam_search`: `tinygrad.codegen.opt.search` calls its globals `beam_search(s, rawbufs, var_vals, amt, ...)` per kernel and
  `_time_program(prg, var_vals, rawbufs, ...)` -> a list of seconds per candidate.
- `onnx_ops` / `patched_onnx_ops`: `tinygrad.nn.onnx.onnx_ops` is the {ONNX op type: function} table OnnxRunner looks ops up in at run time.
- `kernel_fields`, `program_binary`, `program_uop`: a compiled kernel is a PROGRAM uop whose `arg` is a `ProgramInfo` (name, global and
  local size, `globals`/`outs`/`ins` argument indices, `vars`, `target`; `runtimevars` maps the variables the runtime sets itself, core_id,
  to their argument index), whose first src is a SINK with a `KernelInfo` arg (its `estimates`: ops, lds, mem, or None), second a LINEAR of
  the parameter PARAMs, and whose last src is a BINARY holding the compiled code (a PROGRAM with one is never compiled again).
  `to_elf().signature` lists (name, argument index, dtype, shape) per parameter, buffers first; runtime variables are PARAMs in the ALU
  address space with vmin_vmax; `Target.parse(repr(target))` round-trips a target.
- `is_graph_batch`, `unbatched_calls`, `captured_calls`: a LINEAR holds CALLs whose first src is the ast (a PROGRAM, a
  COPY, or a graph batch: a CUSTOM_FUNCTION with arg "graph" whose first src is the LINEAR of the calls it batches) and whose other srcs
  are its arguments: a PARAM (`arg.slot`: the JIT input slot) or a uop whose `.buffer` is the Buffer, and bound variables; a PROGRAM's
  `ProgramInfo` lists the argument indices it reads (`ins`) and writes (`outs`), a COPY's are (destination, source).
- `graph_batches`, `run_calls`, `graph_runner`, `runner_slots`, `repointable`, `always_repointed`, `repoint_only`: the replay's graph
  back-end runs tinygrad's own JIT path on a LINEAR of CALLs. `tinygrad.engine.jit.graph_split_rewrite(linear, max_batch_size)` batches
  calls into CUSTOM_FUNCTION "graph" calls; `tinygrad.engine.realize.run_linear(linear, var_vals, input_uops, jit=, wait=)` runs them;
  `Device[d].graph(batch, input_uops=)` builds a runner (a `GraphRunner`) whose `uop_replace[node]` lists (argument, input slot) pairs,
  whose `var_vals_replace` / `launch_dims_replace` nodes are re-pointed at every launch, and, on CUDA (`CUDAGraph`), whose `updatable`
  lists the nodes the next launch re-points (only CUDA's runner has one: `repoint_only` is exercised on a GPU by
  tests/runtime/test_tinygrad_internals.py, and on NULL only as far as its runner allows).
- `time_call`: `tinygrad.engine.realize.ExecContext(input_uops=, update_stats=, wait=)`, `exec_copy(ctx, call, ast)` and
  `exec_kernel(ctx, call, ast)` -> device seconds per launch (see above).
- `program_binary`, `program_uop` on CPU with 138fb4a: the renderer's compiler `compile_to_obj(source)` is the ELF object its `compile`
  links with `tinygrad.runtime.support.elf.jit_loader(obj)`; a PROGRAM's third src is its SOURCE.
- `cpu_entry`: `Device["CPU"].runtime(program.to_elf())` is a `CPUProgram` whose code starts at `addr` and takes each buffer as a
  c_uint64 pointer, then its runtime variables (its own `fxn` calls it so, releasing the GIL); `runtimevars` maps "core_id" to its
  argument index (CPUProgram calls once per core).
- `tensor_buffer`, `host_memory`: a realized Tensor's `uop.base.buffer` is its Buffer; `Buffer.as_memoryview(force_zero_copy=True)` its memory.
- `host_visible`, `buffer_address`, `host_array`, `copy_in`, `stages_copies`, `copy_out`: a `Buffer`'s device handle is `Buffer._buf` (a numpy array on
  NPY, an object with `va_addr` on CPU, CUDA and HCQ devices); allocators with `_as_buffer` map it into host memory; every
  allocator copies with `_copyin(handle, src)` and `_copyout(dest, handle)`; CUDA's `_copyin` stages `src` in pinned memory it lists in
  its device's `pending_copyin`, freed by the device's next `synchronize()` (copy_in uses the driver's synchronous `cuMemcpyHtoD_v2` on
  the device's `context` instead: a copy on the model switch's thread raced the frame thread's synchronize).
- `cuda_driver`: `tinygrad.runtime.autogen.cuda` is ctypes bindings of the CUDA driver API, and a CUDA device's `context` its CUcontext
  (exercised on a GPU by tests/runtime/test_cuda.py).
"""
from __future__ import annotations

import contextlib
import ctypes
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, cast

import numpy as np
from tinygrad import Device, Tensor
from tinygrad.device import Buffer
from tinygrad.dtype import DType
from tinygrad.helpers import JIT, JIT_BATCH_SIZE, Target
from tinygrad.runtime.support.elf import jit_loader
from tinygrad.uop.ops import AddrSpace, KernelInfo, Ops, ProgramInfo, UOp

if TYPE_CHECKING:
  from tinygrad.engine.jit import CapturedJit
  from tinygrad.runtime.ops_cpu import CPUProgram

class Jit(Protocol):
  """What TinyJit(fn) makes, as the capture reads it (0.14.0's TinyJit is a function returning a class of its own): called as `fn` is,
  `captured` holds the capture once it has run twice."""
  captured: CapturedJit | None
  def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

_identified: list[Callable[[], str]] = []  # how to learn the imported tinygrad's version: told once, by runtime/__init__.py

def identify(version: Callable[[], str]) -> None:
  """Tell this module how to learn the imported tinygrad's version (format/tinygrad_identity's, read once, when first needed)."""
  _identified[:] = [version]

def on_138fb4a() -> bool:
  """Whether the imported tinygrad is openpilot's 138fb4a (the supported tinygrad that states 0.13.0), whose internals differ where noted."""
  if not _identified: raise RuntimeError("tinygrad_internals was not told which tinygrad is imported (runtime/__init__.py tells it)")
  return _identified[0]() == "0.13.0"

class Recording(list):
  """The kernel LINEARs of the captures in a `record_kernel_linear` block, and the one-time LINEARs `TinyJit(prune=True)` split off."""
  def __init__(self) -> None:
    super().__init__()
    self.onetime: list[UOp] = []

def _kernels(*linears: UOp) -> int:
  """How many distinct kernels LINEARs of uncompiled calls compile."""
  return len({c.src[0] for linear in linears for c in linear.src if c.src[0].op is Ops.SINK})

@contextlib.contextmanager
def record_kernel_linear(on_kernels: Callable[[int], None] | None = None) -> Iterator[Recording]:
  """Record the kernel LINEAR (compiled, memory planned, graph split) of each TinyJit capture that happens inside the block, and with
  prune=True the one-time calls (weight preparation, e.g. IMAGE relayouts) that run once at capture instead of every call.
  `on_kernels`: told, per capture, how many distinct kernels it is about to compile (one-time ones included), before any compiles."""
  import tinygrad.engine.jit as jit
  from tinygrad.engine.realize import compile_linear
  recorded, counted = Recording(), [False]  # counted: this capture's kernels were counted at prune_linear, which runs first
  lower, prune = jit.jit_lower, jit.prune_linear
  def recording_lower(linear: UOp, *args: Any, **kwargs: Any) -> UOp:
    if on_kernels is not None and not counted[0]: on_kernels(_kernels(linear))
    counted[0] = False
    recorded.append(lowered := lower(linear, *args, **kwargs))
    return lowered
  def recording_prune(*args: Any, **kwargs: Any) -> tuple[UOp, UOp]:
    kept, onetime = prune(*args, **kwargs)
    if on_kernels is not None: on_kernels(_kernels(kept, onetime))
    counted[0] = True
    if onetime.src: recorded.onetime.append(compile_linear(onetime))  # the capture compiles the same kernels: served from the cache
    return kept, onetime
  jit.jit_lower, jit.prune_linear = recording_lower, recording_prune
  try: yield recorded
  finally: jit.jit_lower, jit.prune_linear = lower, prune

@contextlib.contextmanager
def host_backed_null() -> Iterator[None]:
  """While capturing on NULL (cross-compiling), keep what is copied into NULL buffers in host memory, so ONNX constants can be read and
  weights land in the bundle. Kernels still do not run: only data copied in from the host is real."""
  from tinygrad.runtime.ops_null import NullAllocator
  saved = {k: NullAllocator.__dict__[k] for k in ("_alloc", "_copyin", "_copyout", "_offset")}
  def copyin(self: object, dest: memoryview, src: memoryview) -> None: dest[:len(src)] = src.cast("B")
  def copyout(self: object, dest: memoryview, src: memoryview) -> None: dest.cast("B")[:] = src[:dest.nbytes]
  patched = {"_alloc": lambda self, size, options: memoryview(bytearray(size)), "_copyin": copyin, "_copyout": copyout,
             "_offset": lambda self, buf, size, offset: buf[offset:offset + size]}
  for k, v in patched.items(): setattr(NullAllocator, k, v)
  try: yield
  finally:
    for k, v in saved.items(): setattr(NullAllocator, k, v)

@contextlib.contextmanager
def watched_beam_search(on_times: Callable[[list[float]], None], on_kernel: Callable[[], None]) -> Iterator[None]:
  """Inside the block, tinygrad's BEAM search reports each timed candidate's seconds to `on_times` and each searched kernel to `on_kernel`
  (after its search). A kernel served from the search's disk cache times nothing."""
  import tinygrad.codegen.opt.search as search
  search_kernel, time_program = search.beam_search, search._time_program
  def timed(*args: Any, **kwargs: Any) -> list[float]:
    on_times(tms := time_program(*args, **kwargs))
    return tms
  def searched(*args: Any, **kwargs: Any) -> Any:
    out = search_kernel(*args, **kwargs)
    on_kernel()
    return out
  search.beam_search, search._time_program = searched, timed
  try: yield
  finally: search.beam_search, search._time_program = search_kernel, time_program

def onnx_ops() -> dict[str, Any]:
  """The table of ONNX op types tinygrad's OnnxRunner implements (the live table, looked up at run time): a function per op type, or
  {opset: function}."""
  from tinygrad.nn.onnx import onnx_ops as table
  return table

@contextlib.contextmanager
def patched_onnx_ops(replacements: dict[str, Callable]) -> Iterator[None]:
  """OnnxRunner runs `replacements` instead of its own ops of those types inside the block."""
  table = onnx_ops()
  saved = {op: table[op] for op in replacements}
  table.update(replacements)
  try: yield
  finally: table.update(saved)

def _estimates(est: Any) -> dict[str, int]:
  """tinygrad's estimates of one kernel as plain ints: ops (FLOPs), lds (bytes its loads and stores move), mem (bytes touched, each once).
  Shapes are fixed at capture, so each is a number; a symbolic one (never seen) is recorded as -1."""
  return {k: int(v) if isinstance(v, int) else -1 for k, v in (("ops", est.ops), ("lds", est.lds), ("mem", est.mem))}

class Unsupported(ValueError):
  """A capture this module cannot turn into plain calls: a call that is neither a kernel nor a copy, a kernel with symbolic shapes."""

class KernelFields(NamedTuple):
  """A compiled kernel as plain values: what a part's program records of it, and all `program_uop` needs to rebuild it."""
  name: str
  target: str  # repr of tinygrad's Target
  global_size: tuple[int, ...]
  local_size: tuple[int, ...] | None
  globals: tuple[int, ...]  # the call's argument indices the kernel's buffer parameters take, in order
  outs: tuple[int, ...]  # the argument indices it writes and reads
  ins: tuple[int, ...]
  params: tuple[tuple[str | None, int, DType, tuple[int, ...]], ...]  # per buffer parameter: name, slot, dtype, the kernel's view shape
  runtime_vars: tuple[tuple[str, int, DType, int, int], ...]  # what the runtime sets per launch (core_id): name, slot, dtype, min, max
  estimates: dict[str, int] | None

def kernel_fields(ast: UOp) -> KernelFields:
  """A compiled PROGRAM uop's fields; Unsupported when it has variables the runtime does not set (symbolic shapes)."""
  info: ProgramInfo = ast.arg
  if any(v.arg.name not in info.runtimevars for v in info.vars):
    raise Unsupported(f"kernel {info.function_name} uses symbolic variables {info.vars}: capture with fixed shapes")
  signature = ast.to_elf().signature
  est = ast.src[0].arg.estimates
  global_size = tuple(int(g) for g in info.global_size)  # fixed at capture: no variable but core_id is allowed
  return KernelFields(info.function_name, repr(info.target), global_size, None if info.local_size is None else tuple(info.local_size),
                      tuple(info.globals), tuple(info.outs), tuple(info.ins),
                      tuple((n, s, dt, tuple(shape)) for n, s, dt, shape in signature[:len(signature) - len(info.vars)]),
                      tuple((v.arg.name, v.arg.slot, v.dtype, *v.arg.vmin_vmax) for v in info.vars), _estimates(est) if est is not None else None)

def program_binary(ast: UOp) -> bytes:
  """A compiled PROGRAM uop's code as a bundle stores it: as the device loads it; a CPU kernel as an ELF object (see the module's docstring).
  Unsupported for a 138fb4a CPU kernel whose object, compiled again, does not link to the code tinygrad ran (its compile cache holds the
  output of another compiler) or that has no source (a PROGRAM rebuilt by program_uop)."""
  code, target = ast.src[-1].arg, ast.arg.target
  if not on_138fb4a() or target.device != "CPU" or not hasattr(compiler := Device["CPU"].renderer.compiler, "compile_to_obj"): return code
  if repr(Device["CPU"].renderer.target) != repr(target) or not ast.src[2].arg:
    raise Unsupported(f"kernel {ast.arg.function_name}: no source for its {target!r} ELF object (rebuilt, or captured for another CPU target)")
  if jit_loader(obj := compiler.compile_to_obj(ast.src[2].arg)) != code:
    raise Unsupported(f"kernel {ast.arg.function_name}: its ELF object, compiled again, links to other code than tinygrad ran (a compile "
                      "cached by another compiler?): build again with CCACHE=0")
  return obj

def program_uop(kernel: KernelFields, lib: bytes, device: str) -> UOp:
  """A compiled PROGRAM uop rebuilt from a kernel's fields and its binary, to run on `device`: its last src is a BINARY, so tinygrad never
  compiles it again. With 138fb4a, a kernel that runs on CPU is linked here (the device decides which runtime runs it, not its record)."""
  params = tuple(UOp.param(slot, dt, shape, name=name) for name, slot, dt, shape in kernel.params)
  runtime_vars = tuple(UOp.param(slot, dt, (), vmin_vmax=(lo, hi), multiple_of=1, name=name, addrspace=AddrSpace.ALU)
                       for name, slot, dt, lo, hi in kernel.runtime_vars)  # core_id: the CPU runtime sets it per core
  if on_138fb4a() and Device.canonicalize(device).split(":")[0] == "CPU": lib = jit_loader(lib)  # runs raw code: link as its compile does
  info = ProgramInfo(name=kernel.name, global_size=kernel.global_size, vars=runtime_vars, local_size=kernel.local_size, globals=kernel.globals,
                     outs=kernel.outs, ins=kernel.ins, target=Target.parse(kernel.target))
  return UOp(Ops.PROGRAM, src=(UOp(Ops.SINK, arg=KernelInfo(kernel.name)), UOp(Ops.LINEAR, src=params), UOp(Ops.SOURCE, arg=""),
                               UOp(Ops.BINARY, arg=lib)), arg=info)

class CapturedCall(NamedTuple):
  """One call of a captured kernel list: its compiled PROGRAM (None for a copy), per argument (bound variables left out) the JIT input
  slot it is bound to or its Buffer, and the argument indices it reads and writes (a copy reads its source, 1, and writes 0)."""
  program: UOp | None
  args: tuple[int | Buffer, ...]
  reads: tuple[int, ...]
  writes: tuple[int, ...]

def captured_calls(linear: UOp) -> list[CapturedCall]:
  """A captured LINEAR's calls in order, graph batches unbatched; Unsupported for a call that is neither a kernel nor a copy."""
  calls = unbatched_calls(linear)
  if (ast := next((c.src[0] for c in calls if c.src[0].op not in (Ops.PROGRAM, Ops.COPY)), None)) is not None:
    raise Unsupported(f"cannot serialize a {ast.op} call ({ast.arg}) in the captured kernel list")
  def call(c: UOp) -> CapturedCall:
    ast = c.src[0]  # a capture is on one device: each buffer argument is a Buffer, never a MultiBuffer
    args = tuple(u.arg.slot if u.op is Ops.PARAM else cast(Buffer, u.buffer) for u in c.src[1:] if not u.is_bound_var)
    return CapturedCall(None, args, (1,), (0,)) if ast.op is Ops.COPY else CapturedCall(ast, args, tuple(ast.arg.ins), tuple(ast.arg.outs))
  return [call(c) for c in calls]

def is_graph_batch(ast: UOp) -> bool:
  """Whether a call's ast is a batch of calls for the device's graph runner (what `graph_batches` makes)."""
  return ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph"

def unbatched_calls(linear: UOp) -> list[UOp]:
  """A LINEAR's calls in order, each graph batch replaced by the calls it batches."""
  return [c for call in linear.src for c in (unbatched_calls(call.src[0].src[0]) if is_graph_batch(call.src[0]) else [call])]

def graph_batches(linear: UOp, device: str) -> UOp:
  """`linear` with its calls batched into the device's graph runner as TinyJit batches them; unchanged without one (or with JIT=2)."""
  from tinygrad.engine.jit import graph_split_rewrite
  if Device[device].graph is None or JIT >= 2: return linear
  return graph_split_rewrite(linear, max_batch_size=JIT_BATCH_SIZE.value)

def run_calls(linear: UOp, input_uops: tuple[UOp, ...] = (), wait: bool = False) -> None:
  """Run a LINEAR of calls (and graph batches) as a TinyJit replay does, input slots bound to `input_uops`."""
  from tinygrad.engine.realize import run_linear
  run_linear(linear, {}, input_uops=input_uops, jit=True, wait=wait)

def graph_runner(batch: UOp, input_uops: tuple[UOp, ...]) -> Any:
  """A graph runner for one graph batch (a CUSTOM_FUNCTION "graph" uop), built on the buffers of `input_uops`; call it as
  `runner(input_uops, {}, wait=...)`."""
  return Device[batch.device if isinstance(batch.device, str) else batch.device[0]].graph(batch, input_uops=input_uops)

def runner_slots(runner: Any) -> dict[int, set[int]]:
  """Per input slot, the runner's nodes that take it as an argument."""
  nodes: dict[int, set[int]] = {}
  for node, replace in enumerate(runner.uop_replace):
    for _, slot in replace: nodes.setdefault(slot, set()).add(node)
  return nodes

def repointable(runner: Any) -> bool:
  """Whether a runner re-points only the nodes it is told to (CUDAGraph); others (HCQ: QCOM, AMD) re-point every input at each launch."""
  return hasattr(runner, "updatable")

def always_repointed(runner: Any) -> set[int]:
  """Nodes a runner updates at every launch anyway (symbolic variables or launch sizes)."""
  return set(runner.var_vals_replace) | set(runner.launch_dims_replace)

def repoint_only(runner: Any, nodes: set[int]) -> None:
  """Tell a repointable runner to re-point exactly these nodes at its next launch."""
  runner.updatable = sorted(nodes)

def time_call(call: UOp, input_uops: tuple[UOp, ...], device: str) -> float:
  """Seconds one call takes alone: a kernel timed by the device (CUDA events; on CPU the call itself), a copy by the host clock around
  it and a synchronize."""
  from tinygrad.engine.realize import ExecContext, exec_copy, exec_kernel
  ctx, dev = ExecContext(input_uops=input_uops, update_stats=False, wait=True), Device[device]
  dev.synchronize()
  if call.src[0].op is not Ops.COPY:
    seconds: Any = exec_kernel(ctx, call, call.src[0])  # see the module's docstring: a list (0.14.0) or a float (138fb4a)
    return float(seconds if on_138fb4a() else sum(seconds))
  start = time.perf_counter()
  exec_copy(ctx, call, call.src[0])
  dev.synchronize()
  return time.perf_counter() - start

class CpuEntry(NamedTuple):
  """A compiled PROGRAM loaded on CPU: the same code as two ctypes functions of c_uint64 pointers, `fxn` keeping the GIL and `releasing`
  letting it go for the call, and the argument index of its core_id, if it has one. `runtime` owns the loaded code: both are valid while
  this is kept."""
  runtime: CPUProgram
  fxn: Callable[..., None]
  core_id: int | None
  releasing: Callable[..., None]

def cpu_entry(program: UOp, device: str) -> CpuEntry:
  """Load a compiled PROGRAM on CPU for direct ctypes calls. CPUProgram's `fxn` is a CFUNCTYPE at `addr`, which releases the GIL on every
  call. The frame thread calls the same code as a PYFUNCTYPE, which keeps it: a frame's kernels then run back to back while another
  thread (the model switch loading the next set) runs Python, instead of each kernel's return waiting for the GIL to come back. A
  thread beside the frames (warming up the next set) calls the CFUNCTYPE: the frame thread runs during each of its kernels."""
  runtime = cast("CPUProgram", Device[device].runtime(program.to_elf()))
  return CpuEntry(runtime, ctypes.PYFUNCTYPE(None)(runtime.addr), runtime.runtimevars.get("core_id"), ctypes.CFUNCTYPE(None)(runtime.addr))

def cuda_driver(device: str) -> tuple[Any, Any]:
  """tinygrad's bindings of the CUDA driver API and `device`'s CUcontext, for registering host memory with the driver."""
  from tinygrad.runtime.autogen import cuda
  return cuda, cast(Any, Device[device]).context  # a CUDADevice's (importing ops_cuda needs CUDA)

def tensor_buffer(t: Tensor) -> Buffer:
  """The Buffer a realized Tensor's base holds (its uop's base is a BUFFER; one device: never a MultiBuffer)."""
  return cast(Buffer, t.uop.base.buffer)

def host_memory(buf: Buffer) -> memoryview:
  """A host-visible buffer's bytes in place (no copy): written, the buffer changes."""
  return buf.as_memoryview(force_zero_copy=True)

def host_visible(buf: Buffer) -> bool:
  """Whether a buffer's memory is mapped into this process (CPU, NPY, QCOM): read and written in place through `as_memoryview`."""
  return hasattr(buf.allocator, "_as_buffer")

def buffer_address(buf: Buffer) -> int:
  """Where an allocated buffer's bytes live: host memory on NPY and CPU, the device address elsewhere (CUDA, QCOM, AMD)."""
  return buf._buf.ctypes.data if isinstance(buf._buf, np.ndarray) else int(buf._buf.va_addr)

def host_array(buf: Buffer) -> np.ndarray:
  """An NPY buffer's numpy array itself (its contents, shaped as the tensor that made it)."""
  return buf._buf

def copy_in(buf: Buffer, data: memoryview) -> None:
  """Copy host bytes into an allocated buffer (`data` a writable, byte-castable view); when it returns, `data` may change or go. CUDA's
  allocator copies through pinned memory it allocates per copy and frees at the device's next synchronize, from whichever thread calls it:
  a load on the model switch's thread then raced the frame thread's readback synchronize, which freed a staging buffer the load was still
  filling or had not yet queued the copy from. On CUDA this is therefore the driver's synchronous copy straight from `data` (the driver
  stages pageable memory in buffers of its own): nothing goes on tinygrad's list of pending copies, and no other thread's synchronize can
  free what it reads. A lock around tinygrad's copy would have made the frame thread's synchronize wait on a load."""
  if is_cuda(buf):
    from tinygrad.helpers import mv_address
    from tinygrad.runtime.ops_cuda import check, cuda
    check(cuda.cuCtxSetCurrent(buf.allocator.dev.context))
    check(cuda.cuMemcpyHtoD_v2(buf._buf, mv_address(data), len(data)))
  else: buf.allocator._copyin(buf._buf, data)

def is_cuda(buf: Buffer) -> bool:
  """Whether `buf` is on a CUDA device: its allocator is tinygrad's CUDAAllocator (checked by class name: importing ops_cuda needs CUDA)."""
  return type(buf.allocator).__name__ == "CUDAAllocator"

def stages_copies(buf: Buffer) -> bool:
  """Whether copy_in into `buf` leaves host memory held until the device synchronizes (a loader then waits every so often to bound it):
  not for memory mapped into this process, nor on CUDA (copy_in is synchronous there)."""
  return not host_visible(buf) and not is_cuda(buf)

def copy_out(buf: Buffer, dest: memoryview) -> None:
  """Copy an allocated buffer's bytes into host memory through its allocator; waits for the device to finish writing it."""
  buf.allocator._copyout(dest, buf._buf)
