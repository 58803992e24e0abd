"""Plain tinygrad artifacts: capture a TinyJit's kernel list, store it as JSON + bytes, load and replay it with no pickle and no compiler.

A part is `(header, blob)`: `header` is JSON-able plain data (inputs, buffers, programs, calls, returns, check), `blob` holds the bytes
(kernel binaries once per (name, binary), initial buffer contents). A bundle file holds named parts plus extras, with provenance and a hash.
"""
from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import json
import os
import re
import struct
import time
from collections.abc import Iterator
from importlib.metadata import version as package_version
from typing import Any

import numpy as np
from tinygrad import Device, Tensor, dtypes, helpers
from tinygrad.device import Buffer
from tinygrad.dtype import DType
from tinygrad.helpers import JIT, JIT_BATCH_SIZE, Target, getenv
from tinygrad.uop.ops import AddrSpace, KernelInfo, Ops, ProgramInfo, UOp

FORMAT_VERSION = 1
MAGIC = b"SPMV2ART"
PREAMBLE = struct.Struct("<8sIQ32s")  # magic, format version, header bytes, sha256(header + blob)
BUILD_FLAGS = ("IMAGE", "FLOAT16", "NOLOCALS", "JIT_BATCH_SIZE", "JIT", "BEAM", "JITBEAM")
MAX_BINDINGS = 16  # camera buffers cycle through a few; more distinct sets than this means the caller allocates per frame
ALIGNMENT = 16  # vectorised CPU kernels fault on float pointers that are not 16-byte aligned

class ArtifactError(ValueError):
  """A bundle or part that cannot be used here: corrupt, for another device/arch/tinygrad, or an unsupported capture."""

class InputError(ValueError):
  """Inputs that do not match what the part was captured with."""

# *** dtypes and devices ***

def _dtype_name(dt: DType) -> str:
  if getattr(dtypes, repr(dt).removeprefix("dtypes."), None) != dt:
    raise ArtifactError(f"dtype {dt!r} cannot be stored in a plain artifact")
  return repr(dt)

def _dtype(name: str) -> DType:
  if not isinstance(name, str) or not (m := re.fullmatch(r"dtypes\.([a-z0-9_]+)", name)) or not isinstance(dt := getattr(dtypes, m[1], None), DType):
    raise ArtifactError(f"unknown dtype {name!r} in bundle")
  return dt

def _device_kind(device: str) -> str: return device.split(":")[0].upper()

@functools.cache
def tinygrad_version() -> str: return package_version("tinygrad")

# *** capture ***

class Recording(list):
  """The kernel LINEARs of the captures in a `record_kernel_linear` block, and the one-time LINEARs `TinyJit(prune=True)` split off."""
  def __init__(self):
    super().__init__()
    self.onetime: list[UOp] = []

@contextlib.contextmanager
def record_kernel_linear() -> Iterator[Recording]:
  """Record the kernel LINEAR (compiled, memory planned, graph split) of each TinyJit capture that happens inside the block, and with
  prune=True the one-time calls (weight preparation, e.g. IMAGE relayouts) that run once at capture instead of every call."""
  import tinygrad.engine.jit as jit
  from tinygrad.engine.realize import compile_linear
  recorded = Recording()
  lower, prune = jit.jit_lower, jit.prune_linear
  def recording_lower(*args, **kwargs):
    recorded.append(linear := lower(*args, **kwargs))
    return linear
  def recording_prune(*args, **kwargs):
    kept, onetime = prune(*args, **kwargs)
    if onetime.src: recorded.onetime.append(compile_linear(onetime))  # the capture compiles the same kernels: served from the cache
    return kept, onetime
  jit.jit_lower, jit.prune_linear = recording_lower, recording_prune
  try:
    yield recorded
  finally:
    jit.jit_lower, jit.prune_linear = lower, prune

@contextlib.contextmanager
def host_backed_null() -> Iterator[None]:
  """While capturing on NULL (cross-compiling), keep what is copied into NULL buffers in host memory, so ONNX constants can be read and
  weights land in the bundle. Kernels still do not run: only data copied in from the host is real."""
  from tinygrad.runtime.ops_null import NullAllocator
  saved = {k: NullAllocator.__dict__[k] for k in ("_alloc", "_copyin", "_copyout", "_offset")}
  def copyin(self, dest, src: memoryview): dest[:len(src)] = src.cast("B")
  def copyout(self, dest: memoryview, src): dest.cast("B")[:] = src[:dest.nbytes]
  NullAllocator._alloc = lambda self, size, options: memoryview(bytearray(size))
  NullAllocator._copyin, NullAllocator._copyout = copyin, copyout
  NullAllocator._offset = lambda self, buf, size, offset: buf[offset:offset + size]
  global _null_holds_data
  _null_holds_data = True
  try: yield
  finally:
    for k, v in saved.items(): setattr(NullAllocator, k, v)
    _null_holds_data = False
_null_holds_data = False

def capture_context():
  """What a capture on this process's device needs: host-backed NULL buffers when cross-compiling, else nothing."""
  return host_backed_null() if _device_kind(Device.DEFAULT) == "NULL" else contextlib.nullcontext()

def input_layout(kwargs: dict[str, Any]) -> list[tuple[str, str | None, Tensor]]:
  """(name, key, tensor) per JIT input slot, in tinygrad's `_prepare_jit_inputs` order: named tensors sorted, then dict entries not seen yet."""
  if not all(isinstance(v, (Tensor, dict)) for v in kwargs.values()):
    raise InputError(f"inputs must be Tensors or dicts of Tensors, got {sorted((k, type(v).__name__) for k, v in kwargs.items())}")
  layout = [(name, None, t) for name, t in sorted(kwargs.items()) if isinstance(t, Tensor)]
  for name, value in kwargs.items():
    if isinstance(value, dict):
      layout += [(name, key, t) for key, t in value.items() if isinstance(t, Tensor) and not any(t is y for _, _, y in layout)]
  return layout

def _flat_calls(linear: UOp) -> list[UOp]:
  calls = []
  for call in linear.src:
    ast = call.src[0]
    if ast.op is Ops.CUSTOM_FUNCTION and ast.arg == "graph": calls += _flat_calls(ast.src[0])
    elif ast.op in (Ops.PROGRAM, Ops.COPY): calls.append(call)
    else: raise ArtifactError(f"cannot serialize a {ast.op} call ({ast.arg}) in the captured kernel list")
  return calls

def _ret_tensors(ret: Any) -> tuple[dict, list[Tensor]]:
  if ret is None: return {"kind": "NoneType"}, []
  if isinstance(ret, Tensor): return {"kind": "Tensor"}, [ret]
  if isinstance(ret, (tuple, list)) and all(isinstance(t, Tensor) for t in ret): return {"kind": type(ret).__name__}, list(ret)
  if isinstance(ret, dict) and all(isinstance(t, Tensor) for t in ret.values()): return {"kind": "dict", "keys": list(ret)}, list(ret.values())
  raise ArtifactError(f"cannot serialize a JIT return of type {type(ret).__name__}: return a Tensor, a tuple/list/dict of Tensors, or None")

def _read_bytes(buf: Buffer) -> bytes: return bytes(buf.as_memoryview())

def _copyin(buf: Buffer, data: bytes | memoryview) -> None:
  """Copy bytes into a buffer once: host-visible memory directly, other devices through the allocator (ctypes wants a writable view)."""
  if hasattr(buf.allocator, "_as_buffer"): np.frombuffer(buf.as_memoryview(force_zero_copy=True), np.uint8)[:len(data)] = np.frombuffer(data, np.uint8)
  else: buf.allocator._copyin(buf._buf, data if isinstance(data, memoryview) and not data.readonly else memoryview(bytearray(data)))

def serialize_jit(run, linear: UOp, check: dict[str, Any], seed: int = 0, onetime: UOp | None = None) -> tuple[dict, bytes]:
  """Turn a captured TinyJit and its recorded kernel LINEAR into a part `(header, blob)`.

  `check` is the keyword inputs of the capture (Tensors and dicts of Tensors such as `output_buffers`): it fixes the input layout, and the
  self-check overwrites their contents with seeded values, replays `run` and the new part on them, and requires bit-identical results.
  `onetime` is the recorded one-time LINEAR of a prune=True capture: the loader runs those calls once, before the first replay.
  """
  if getattr(run, "captured", None) is None: raise ArtifactError("the TinyJit has not captured yet: call it twice before serializing")
  layout = input_layout(check)
  calls, onetime_calls = _flat_calls(linear), _flat_calls(onetime) if onetime is not None else []
  if not calls: raise ArtifactError("the captured kernel list is empty")
  device = next((a.device for c in calls for a in c.src[1:] if a.op is Ops.BUFFER and isinstance(a.device, str) and _device_kind(a.device) != "NPY"),
                Device.DEFAULT)
  blob, buffers, base_index, programs, program_index = bytearray(), [], {}, [], {}
  first_access: dict[tuple, str] = {}  # (buffer, offset, nbytes) -> "r" or "w": what the replay does to it first

  def buffer_arg(buf: Buffer) -> dict:
    if isinstance(buf, list) or not isinstance(buf, Buffer): raise ArtifactError("multi-device buffers are not supported")
    base = buf.base
    if _device_kind(base.device) != _device_kind(device): raise ArtifactError(f"buffer on {base.device} in a part for {device}: one device per part")
    if id(base) not in base_index:
      base_index[id(base)] = (len(buffers), base)
      buffers.append({"nbytes": base.nbytes, "device": base.device, "dtype": _dtype_name(base.dtype)})
    return {"buffer": base_index[id(base)][0], "offset": buf.offset, "nbytes": buf.nbytes, "dtype": _dtype_name(buf.dtype)}

  def arg(u: UOp) -> dict:
    if u.op is Ops.PARAM:
      if u.arg.slot >= len(layout): raise ArtifactError(f"captured input slot {u.arg.slot} is not among the {len(layout)} check inputs")
      return {"input": u.arg.slot}
    return buffer_arg(u.buffer)

  def access(a: dict, mode: str) -> None:
    if "buffer" in a: first_access.setdefault((a["buffer"], a["offset"], a["nbytes"]), mode)

  def serialize_calls(calls: list[UOp]) -> list[dict]:
    out = []
    for call in calls:
      ast, args = call.src[0], [arg(u) for u in call.src[1:] if not u.is_bound_var]
      if ast.op is Ops.COPY:
        access(args[1], "r")
        access(args[0], "w")
        out.append({"kind": "copy", "args": args})
        continue
      info: ProgramInfo = ast.arg
      if any(v.arg.name not in info.runtimevars for v in info.vars):
        raise ArtifactError(f"kernel {info.function_name} uses symbolic variables {info.vars}: capture with fixed shapes")
      lib = ast.src[-1].arg
      if (key := (info.name, lib)) not in program_index:
        program_index[key] = len(programs)
        signature = ast.to_elf().signature
        params = signature[:len(signature) - len(info.vars)]
        programs.append({"name": info.function_name, "lib": [len(blob), len(blob) + len(lib)], "target": repr(info.target),
                         "global_size": list(info.global_size), "local_size": None if info.local_size is None else list(info.local_size),
                         "globals": list(info.globals), "outs": list(info.outs), "ins": list(info.ins),
                         "signature": [[n, s, _dtype_name(dt), list(shape)] for n, s, dt, shape in params],
                         "runtime_vars": [[v.arg.name, v.arg.slot, _dtype_name(v.dtype), *v.arg.vmin_vmax] for v in info.vars]})
        blob.extend(lib)
      for i in info.ins: access(args[i], "r")
      for i in info.outs: access(args[i], "w")
      out.append({"kind": "program", "program": program_index[key], "args": args})
    return out

  header_onetime = serialize_calls(onetime_calls)  # first: what they write (prepared weights) needs no bytes in the bundle
  if any("input" in a for c in header_onetime for a in c["args"]): raise ArtifactError("a one-time call reads a JIT input")
  header_calls = serialize_calls(calls)

  ret_kind, ret_tensors = _ret_tensors(run.captured.ret)
  returns = []
  for t in ret_tensors:
    slot = next((i for i, (_, _, x) in enumerate(layout) if x.uop.base is t.uop.base), None)
    returns.append({"input": slot} if slot is not None else buffer_arg(t.uop.buffer))
    returns[-1]["shape"] = list(t.shape)
  # weights and constants: any buffer range the replay reads before writing it carries its bytes (once per buffer)
  for (index, _, _), mode in first_access.items():
    if mode == "r" and "init" not in buffers[index] and (_device_kind(device) != "NULL" or _null_holds_data):
      data = _read_bytes(next(b for i, b in base_index.values() if i == index))
      buffers[index]["init"] = [len(blob), len(blob) + len(data)]
      blob += data
  written = {a["input"] for c in header_calls for i, a in enumerate(c["args"]) if "input" in a and _writes(c, programs, i)}
  header = {"device": device, "input_names": sorted(name for name, key, _ in layout if key is None), "kwargs": sorted(check),
            "inputs": [{"slot": i, "name": name, "key": key, "dtype": _dtype_name(t.dtype), "shape": list(t.shape), "device": t.device,
                        "written": i in written} for i, (name, key, t) in enumerate(layout)],
            "buffers": buffers, "programs": programs, "onetime_calls": header_onetime, "calls": header_calls,
            "returns": ret_kind | {"tensors": returns}, "check": None}
  header["check"] = _self_check(run, header, bytes(blob), check, layout, seed)
  return header, bytes(blob)

def _writes(call: dict, programs: list[dict], i: int) -> bool:
  return i == 0 if call["kind"] == "copy" else i in programs[call["program"]]["outs"]

# *** the self-check: seeded inputs, TinyJit replay vs plain replay, bit for bit ***

def check_values(inputs: list[dict], seed: int) -> list[np.ndarray]:
  """Deterministic input contents for a part's recorded check: uniform bytes for integer inputs, N(0, 8) for floats."""
  rng, out = np.random.default_rng(seed), []
  for spec in inputs:
    dt = _dtype(spec["dtype"])
    shape = tuple(spec["shape"])
    if dtypes.is_float(dt): out.append((rng.standard_normal(shape) * 8).astype(_np_dtype(dt)))
    elif dt == dtypes.bool: out.append(rng.integers(0, 2, shape).astype(np.bool_))
    else: out.append(rng.integers(0, 256, shape).astype(_np_dtype(dt)))
  return out

def _np_dtype(dt: DType) -> np.dtype:
  if dt.fmt is None: raise ArtifactError(f"dtype {dt!r} has no numpy equivalent")
  return np.dtype(dt.fmt)

def np_dtype(name: str) -> np.dtype:
  """The numpy dtype of a part's dtype name ("dtypes.uchar" -> uint8)."""
  return _np_dtype(_dtype(name))

def write_tensor(t: Tensor, value: np.ndarray) -> None:
  """Overwrite a realized tensor's buffer in place (NPY buffers are numpy arrays: copied into directly)."""
  buf = t.uop.base.buffer
  if _device_kind(buf.device) == "NPY": np.copyto(buf._buf.reshape(-1).view(np.uint8)[:value.nbytes], np.ascontiguousarray(value).reshape(-1).view(np.uint8))
  else: _copyin(buf, np.ascontiguousarray(value).reshape(-1).view(np.uint8).data)

def _outputs(ret: Any, layout: list, written: list[int]) -> dict[str, np.ndarray]:
  _, tensors = _ret_tensors(ret)
  out = {f"return[{i}]": t.numpy() for i, t in enumerate(tensors)}
  return out | {_label(*layout[slot][:2]): layout[slot][2].numpy() for slot in written}

def _label(name: str, key: str | None) -> str: return name if key is None else f"{name}[{key}]"

def _digests(outputs: dict[str, np.ndarray]) -> dict[str, str]: return {label: hashlib.sha256(v.tobytes()).hexdigest() for label, v in outputs.items()}

def _self_check(run, header: dict, blob: bytes, check: dict, layout: list, seed: int) -> dict | None:
  if _device_kind(header["device"]) == "NULL": return None  # NULL buffers hold no data: nothing to compare
  values, written = check_values(header["inputs"], seed), [s["slot"] for s in header["inputs"] if s["written"]]
  results = []
  for replay in (run, PlainJit(header, blob)):
    for (_, _, t), v in zip(layout, values): write_tensor(t, v)
    results.append(_outputs(replay(**check), layout, written))
  for label, expected in results[0].items():
    if expected.tobytes() != results[1][label].tobytes(): raise ArtifactError(f"self-check failed: plain replay differs from the TinyJit replay in {label}")
  return {"seed": seed, "outputs": _digests(results[0])}

def verify_part(header: dict, blob: Any, device: str | None = None) -> dict[str, bool]:
  """Replay a part on its recorded check's seeded inputs: {output label: digest matches what the capture recorded}."""
  if header.get("check") is None: raise ArtifactError("this part has no recorded check (built on NULL, or fused at load time)")
  values = check_values(header["inputs"], header["check"]["seed"])
  layout = [(s["name"], s["key"], Tensor(v, device=s["device"]).realize()) for s, v in zip(header["inputs"], values)]
  kwargs: dict[str, Any] = {name: {} for name in header["kwargs"]}
  for name, key, t in layout:
    if key is None: kwargs[name] = t
    else: kwargs[name][key] = t
  got = _digests(_outputs(PlainJit(header, blob, device)(**kwargs), layout, [s["slot"] for s in header["inputs"] if s["written"]]))
  return {label: got.get(label) == digest for label, digest in header["check"]["outputs"].items()}

# *** replay ***

def _program_uop(program: dict, lib: bytes) -> UOp:
  """A compiled PROGRAM uop rebuilt from plain data: its last src is a BINARY, so tinygrad never compiles it again."""
  params = tuple(UOp.param(slot, _dtype(dt), tuple(shape), name=name) for name, slot, dt, shape in program["signature"])
  runtime_vars = tuple(UOp.param(slot, _dtype(dt), (), vmin_vmax=(lo, hi), multiple_of=1, name=name, addrspace=AddrSpace.ALU)
                       for name, slot, dt, lo, hi in program["runtime_vars"])  # core_id: the CPU runtime sets it per core
  info = ProgramInfo(name=program["name"], global_size=tuple(program["global_size"]), vars=runtime_vars,
                     local_size=None if program["local_size"] is None else tuple(program["local_size"]), globals=tuple(program["globals"]),
                     outs=tuple(program["outs"]), ins=tuple(program["ins"]), target=Target.parse(program["target"]))
  return UOp(Ops.PROGRAM, src=(UOp(Ops.SINK, arg=KernelInfo(program["name"])), UOp(Ops.LINEAR, src=params), UOp(Ops.SOURCE, arg=""),
                               UOp(Ops.BINARY, arg=lib)), arg=info)

def _tensor_of(kwargs: dict, spec: dict) -> Any:
  value = kwargs.get(spec["name"])
  return value if spec["key"] is None else value.get(spec["key"]) if isinstance(value, dict) else None

class _Jit:
  """Replays a part. Called with the keyword inputs of the captured function; returns what it returned.

  Each set of realized input buffers is validated and bound once (`_input_key`), then reused: modeld passes the same buffers every frame.
  """
  def __init__(self, header: dict, blob: Any, device: str | None = None):
    self.header, self.blob = header, blob
    self.device = Device.canonicalize(device or header["device"])
    self.input_names: list[str] = header["input_names"]
    self.kwargs: list[str] = header["kwargs"]
    self.inputs: list[dict] = header["inputs"]
    self._bound: dict[tuple, Any] = {}
    self.replay_s = 0.0
    self._direct = _device_kind(self.device) == "CPU" and not getenv("PLAIN_JIT_LINEAR")
    self._bases = [self._allocate(b) for b in header["buffers"]]
    self._views: dict[tuple, Buffer] = {}
    self._programs = [_program_uop(p, bytes(blob[p["lib"][0]:p["lib"][1]])) for p in header["programs"]]
    self._access = self._slot_access()
    self._checked: dict[tuple[int, UOp], Buffer] = {}
    if self._direct:
      self._runtimes = [Device[self.device].runtime(p.to_elf()) for p in self._programs]
      self._templates = self._step_templates(header["calls"])
      for fxn, args, _ in self._step_templates(header.get("onetime_calls", [])): fxn(*args)  # weight preparation, once
    else:
      from tinygrad.engine.realize import run_linear
      self._linear = self._build_linear(header["calls"])
      if onetime := header.get("onetime_calls"): run_linear(self._build_linear(onetime, graph=False), {}, jit=True)  # weight preparation, once
    self._ret = [None if "input" in r else Tensor(UOp.from_buffer(self._view(r))).reshape(tuple(r["shape"])) for r in header["returns"]["tensors"]]
    self._same_ret = None if any(t is None for t in self._ret) else self._returned({})  # nothing returned is an input: the same objects every call

  def _allocate(self, spec: dict) -> Buffer:
    base = Buffer(self.device, spec["nbytes"], dtypes.uint8).allocate()
    if "init" in spec: _copyin(base, self.blob[spec["init"][0]:spec["init"][1]])
    return base

  def _view(self, a: dict) -> Buffer:
    if (key := (a["buffer"], a["offset"], a["nbytes"], a["dtype"])) not in self._views:
      dt = _dtype(a["dtype"])
      self._views[key] = self._bases[a["buffer"]].view(a["nbytes"] // dt.itemsize, dt, a["offset"]).ensure_allocated()
    return self._views[key]

  def _slot_access(self) -> dict[int, tuple[list[int], list[int]]]:
    """Per input slot, the call indices that read it and those that write it."""
    access: dict[int, tuple[list[int], list[int]]] = {s["slot"]: ([], []) for s in self.inputs}
    for j, call in enumerate(self.header["calls"]):
      for i, a in enumerate(call["args"]):
        if "input" in a: access[a["input"]][1 if _writes(call, self.header["programs"], i) else 0].append(j)
    return access

  def _build_linear(self, header_calls: list[dict], graph: bool = True) -> UOp:
    from tinygrad.engine.jit import graph_split_rewrite
    def arg(a: dict) -> UOp:
      if "input" in a:
        spec = self.inputs[a["input"]]
        return UOp.param(a["input"], _dtype(spec["dtype"]), (int(np.prod(spec["shape"])),), spec["device"])
      return UOp.from_buffer(self._view(a))
    calls = []
    for call in header_calls:
      args = [arg(a) for a in call["args"]]
      if call["kind"] == "copy": calls.append(UOp(Ops.COPY, args[1].dtype, src=(args[1],), arg=args[0].device).call(*args))
      else: calls.append(self._programs[call["program"]].call(*args))
    linear = UOp(Ops.LINEAR, src=tuple(calls))
    use_graph = graph and JIT < 2 and Device[self.device].graph is not None
    return graph_split_rewrite(linear, max_batch_size=JIT_BATCH_SIZE.value) if use_graph else linear

  def _returned(self, kwargs: dict) -> Any:
    specs, kind = self.header["returns"]["tensors"], self.header["returns"]["kind"]
    tensors = [t if t is not None else _tensor_of(kwargs, self.inputs[r["input"]]) for t, r in zip(self._ret, specs)]
    if kind == "NoneType": return None
    if kind == "Tensor": return tensors[0]
    if kind == "dict": return dict(zip(self.header["returns"]["keys"], tensors))
    return tuple(tensors) if kind == "tuple" else tensors

  def __getstate__(self) -> dict:  # bindings point at live buffers: never pickled
    return {"header": self.header, "blob": bytes(self.blob), "device": self.device}

  def __setstate__(self, state: dict) -> None: self.__init__(state["header"], state["blob"], state["device"])

  def reset(self) -> None:
    """Drop every cached input binding (warmup reset, camera reconnect)."""
    self._bound.clear()
    self._checked.clear()

  def _input_key(self, kwargs: dict) -> tuple | None:
    key = []
    for spec in self.inputs:
      if not isinstance(t := _tensor_of(kwargs, spec), Tensor): return None
      key.append(t.uop)
    return tuple(key)

  def __call__(self, **kwargs) -> Any:
    if len(kwargs) != len(self.kwargs) or (key := self._input_key(kwargs)) is None or (bound := self._bound.get(key)) is None:
      bound = self._bind(kwargs)
      if len(self._bound) >= MAX_BINDINGS: self._bound.clear()
      self._bound[self._input_key(kwargs)] = bound
    start = time.perf_counter()
    if self._direct:
      for fxn, args in bound: fxn(*args)
    else:
      from tinygrad.engine.realize import run_linear
      run_linear(self._linear, {}, input_uops=bound, jit=True)
    self.replay_s = time.perf_counter() - start  # CPU: the kernels themselves; elsewhere: the submission (the device runs on)
    return self._same_ret if self._same_ret is not None else self._returned(kwargs)

  def _validated_buffer(self, spec: dict, t: Any) -> Buffer:
    label = _label(spec["name"], spec["key"])
    if not isinstance(t, Tensor): raise InputError(f"input {label} is missing or not a Tensor (got {type(t).__name__})")
    if (known := self._checked.get((spec["slot"], t.uop))) is not None: return known
    if not t.uop.is_realized or t.uop.base.op is not Ops.BUFFER: raise InputError(f"input {label} is not realized: realize it before the call")
    if list(t.shape) != spec["shape"] or _dtype_name(t.dtype) != spec["dtype"]:
      raise InputError(f"input {label}: expected shape {tuple(spec['shape'])} {spec['dtype']}, got {t.shape} {t.dtype!r}")
    if _device_kind(spec["device"]) != _device_kind(t.device):
      raise InputError(f"input {label}: expected a {_device_kind(spec['device'])} tensor, got one on {t.device}")
    buf = t.uop.base.buffer
    if buf.nbytes != t.nbytes(): raise InputError(f"input {label} is a view of a larger buffer: pass a whole buffer")
    if self._direct and (ptr := _address(buf.ensure_allocated())) % ALIGNMENT:
      raise InputError(f"input {label}: pointer {ptr:#x} is not {ALIGNMENT}-byte aligned")
    if len(self._checked) >= 4 * MAX_BINDINGS: self._checked.clear()
    self._checked[(spec["slot"], t.uop)] = buf  # camera buffers cycle through more sets than bindings are kept: check each tensor once
    return buf

  def _validated_buffers(self, kwargs: dict) -> list[Buffer]:
    if sorted(kwargs) != self.kwargs: raise InputError(f"expected inputs {self.kwargs}, got {sorted(kwargs)}")
    bufs = [self._validated_buffer(spec, _tensor_of(kwargs, spec)) for spec in self.inputs]
    self._check_aliasing(bufs)
    return bufs

  def _check_aliasing(self, bufs: list[Buffer]) -> None:
    """Two slots may share a buffer if neither is written, or one is write-only and its first write follows every access of the other (next_X into X)."""
    seen: dict[int, int] = {}
    for slot, buf in enumerate(bufs):
      if (other := seen.setdefault(id(buf), slot)) == slot: continue
      for w, r in ((slot, other), (other, slot)):
        (w_reads, w_writes), (r_reads, r_writes) = self._access[w], self._access[r]
        if not w_writes and not r_writes or not w_reads and w_writes and max(r_reads + r_writes, default=-1) < min(w_writes): break
      else:
        raise InputError(f"inputs {_label(self.inputs[other]['name'], self.inputs[other]['key'])} and "
                         f"{_label(self.inputs[slot]['name'], self.inputs[slot]['key'])} share a buffer, and the part reads one after writing the other")

  def _step_templates(self, header_calls: list[dict]) -> list[tuple[Any, tuple, bool]]:
    """Per CPU call: the function, its arguments with fixed buffers resolved once (input slots stay `_Slot`s until bound), and whether
    it has any slot: most calls touch only weights and arenas, so binding rebuilds just the few that read or write inputs."""
    templates = []
    for call in header_calls:
      arg = lambda a, as_int: _Slot(a["input"], as_int) if "input" in a else _address(self._view(a)) if as_int else ctypes.c_uint64(_address(self._view(a)))
      if call["kind"] == "copy":
        dst, src = call["args"]
        templates.append((ctypes.memmove, (arg(dst, True), arg(src, True), dst["nbytes"]), "input" in dst or "input" in src))
        continue
      program, runtime = self.header["programs"][call["program"]], self._runtimes[call["program"]]
      args = [arg(call["args"][i], False) for i in program["globals"]] + [ctypes.c_uint64(0)] * len(program["runtime_vars"])
      for core in range(int(program["global_size"][0]) if runtime.runtimevars else 1):  # as CPUProgram does: one call per core_id
        if runtime.runtimevars: args[runtime.runtimevars["core_id"]] = ctypes.c_uint64(core)
        templates.append((runtime.fxn, tuple(args), any(isinstance(a, _Slot) for a in args)))
    return templates

  def _bind(self, kwargs: dict) -> Any:
    bufs = self._validated_buffers(kwargs)
    if not self._direct: return tuple(_tensor_of(kwargs, spec).uop.base for spec in self.inputs)
    addresses = [_address(b) for b in bufs]
    values = {(slot, as_int): addr if as_int else ctypes.c_uint64(addr) for slot, addr in enumerate(addresses) for as_int in (True, False)}
    return [(fxn, tuple(values[(a.slot, a.as_int)] if isinstance(a, _Slot) else a for a in args) if slots else args)
            for fxn, args, slots in self._templates]

@dataclasses.dataclass(frozen=True)
class _Slot:
  slot: int
  as_int: bool  # memmove takes ints, programs c_uint64

def _address(buf: Buffer) -> int:
  return buf._buf.ctypes.data if isinstance(buf._buf, np.ndarray) else int(buf._buf.va_addr)

class PlainJit(_Jit):
  """A part loaded from plain data: programs rebuilt from their binaries, buffers allocated and filled from the blob."""

# *** bundle files ***

def provenance(device: str) -> dict:
  target = Device[Device.canonicalize(device)].renderer.target
  if target.device == "NULL" and target.renderer == "IR3": target = dataclasses.replace(target, device="QCOM")  # cross-compiled for Adreno
  return {"format": FORMAT_VERSION, "tinygrad": tinygrad_version(), "device": target.device or _device_kind(device), "target": repr(target),
          "flags": {flag: var.value if (var := getattr(helpers, flag, None)) is not None else getenv(flag, 0) for flag in BUILD_FLAGS}}

def write_bundle(path: str, parts: dict[str, tuple[dict, bytes]], extras: dict) -> int:
  """Write named parts and extras (`input_specs`, `output_specs`, `metadata`) as one bundle file, atomically. Returns its size in bytes."""
  if not parts: raise ArtifactError("a bundle needs at least one part")
  devices = {_device_kind(h["device"]) for h, _ in parts.values()}
  if len(devices) != 1: raise ArtifactError(f"all parts of a bundle must be for one device, got {sorted(devices)}")
  blob, index = bytearray(), {}
  for name, (header, part_blob) in parts.items():
    index[name] = {"header": header, "blob": [len(blob), len(blob) + len(part_blob)]}
    blob += part_blob
  head = {"provenance": provenance(next(iter(parts.values()))[0]["device"]), "parts": index, "extras": extras}
  data = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
  digest = hashlib.sha256(data + blob).digest()
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "wb") as f:
    f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(data), digest) + data + blob)
  os.replace(tmp, path)
  return PREAMBLE.size + len(data) + len(blob)

def read_bundle(path: str) -> tuple[dict, memoryview]:
  """The verified header and blob of a bundle file, with no device check. Never unpickles: a bundle is data."""
  with open(path, "rb") as f:  # into a writable, uninitialised buffer: weights are copied to the device straight from it
    data = memoryview(np.empty(os.fstat(f.fileno()).st_size, np.uint8))
    f.readinto(data)
  if len(data) < PREAMBLE.size: raise ArtifactError(f"{path}: {len(data)} bytes is too short to be a bundle (truncated?)")
  magic, version, head_len, digest = PREAMBLE.unpack_from(data)
  magic = bytes(magic)
  if magic != MAGIC: raise ArtifactError(f"{path}: not a modeld_v2 bundle (magic {magic!r}, expected {MAGIC!r})")
  if version != FORMAT_VERSION: raise ArtifactError(f"{path}: bundle format version {version}, this loader reads version {FORMAT_VERSION}")
  if PREAMBLE.size + head_len > len(data): raise ArtifactError(f"{path}: header runs past the end of the file (truncated?)")
  body = memoryview(data)[PREAMBLE.size:]
  if hashlib.sha256(body).digest() != digest:
    raise ArtifactError(f"{path}: content hash mismatch: file says {digest.hex()[:16]}, content is {hashlib.sha256(body).hexdigest()[:16]} "
                        "(truncated or edited)")
  try: head = json.loads(bytes(body[:head_len]))
  except (UnicodeDecodeError, json.JSONDecodeError) as e: raise ArtifactError(f"{path}: header is not valid JSON: {e}") from None
  return head, body[head_len:]

def check_provenance(prov: dict, device: str | None = None, path: str = "bundle", allow_device: bool = False) -> str:
  """Raise unless a bundle with provenance `prov` runs here; returns the device to load on."""
  here = Device.canonicalize(device)
  if prov.get("format") != FORMAT_VERSION: raise ArtifactError(f"{path}: format {prov.get('format')}, this loader reads {FORMAT_VERSION}")
  if prov.get("tinygrad") != tinygrad_version():
    raise ArtifactError(f"{path}: built with tinygrad {prov.get('tinygrad')}, this is tinygrad {tinygrad_version()}: rebuild the bundle")
  if allow_device: return here
  if prov.get("device") != _device_kind(here): raise ArtifactError(f"{path}: built for device {prov.get('device')}, this process runs on {_device_kind(here)}")
  if prov.get("target") != (target := repr(Device[here].renderer.target)):
    raise ArtifactError(f"{path}: kernels built for {prov.get('target')}, this device compiles for {target}")
  return here

def validate_part(header: dict, blob_len: int) -> None:
  """Check that a part's references stay inside its own tables and blob, so a malformed header is an error, not a wild pointer."""
  def within(r: list, end: int, what: str) -> None:
    if not (isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) and 0 <= r[0] <= r[1] <= end):
      raise ArtifactError(f"{what} range {r!r} is outside 0..{end}")
  buffers, programs, inputs = header["buffers"], header["programs"], header["inputs"]
  for b in buffers:
    if "init" in b: within(b["init"], blob_len, "buffer init"); within([0, b["init"][1] - b["init"][0]], b["nbytes"], "buffer init size")
  for p in programs:
    within(p["lib"], blob_len, "program binary")
    for sig in p["signature"]: _dtype(sig[2])
  if [s["slot"] for s in inputs] != list(range(len(inputs))): raise ArtifactError("input slots are not 0..n-1 in order")
  for spec in inputs: _dtype(spec["dtype"])
  calls = header["calls"] + header.get("onetime_calls", [])
  for a in [a for c in calls for a in c["args"]] + header["returns"]["tensors"]:
    if "input" in a:
      if not 0 <= a["input"] < len(inputs): raise ArtifactError(f"argument refers to input slot {a['input']} of {len(inputs)}")
    elif not 0 <= a["buffer"] < len(buffers): raise ArtifactError(f"argument refers to buffer {a['buffer']} of {len(buffers)}")
    else: within([a["offset"], a["offset"] + a["nbytes"]], buffers[a["buffer"]]["nbytes"], "argument"); _dtype(a["dtype"])
  for c in calls:
    if c["kind"] not in ("program", "copy") or (c["kind"] == "program" and not 0 <= c["program"] < len(programs)):
      raise ArtifactError(f"unknown call {c.get('kind')!r}/{c.get('program')!r}")

def read_parts(path: str, device: str | None = None, allow_device: bool = False) -> tuple[dict[str, tuple[dict, memoryview]], dict]:
  """`(parts, extras)` of a bundle, after checking its hash, its structure, and that it was built for this tinygrad, device and arch."""
  head, blob = read_bundle(path)
  check_provenance(head.get("provenance", {}), device, path, allow_device)
  try:
    parts = {name: (p["header"], blob[p["blob"][0]:p["blob"][1]]) for name, p in head["parts"].items()}
    for header, part_blob in parts.values(): validate_part(header, len(part_blob))
  except (KeyError, TypeError, IndexError, AttributeError) as e: raise ArtifactError(f"{path}: malformed part table: {e!r}") from None
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed part: {e}") from None
  return parts, head.get("extras", {})
