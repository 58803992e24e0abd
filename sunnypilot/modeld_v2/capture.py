"""Capture: turn a TinyJit's compiled kernel list into a part, check it against the TinyJit replay bit for bit, and replay that check later.

`capture(fn, make_inputs)` is what every compiler, test and benchmark uses: TinyJit(prune=True), two calls inside `record_kernel_linear`
(call 0 runs eagerly and compiles, call 1 captures), then `serialize_jit`.
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import numpy as np
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.device import Buffer
from tinygrad.dtype import DType
from tinygrad.helpers import BEAM, Context, getenv
from tinygrad.uop.ops import Ops, ProgramInfo, UOp

from sunnypilot.modeld_v2.bundle import ArtifactError, call_writes, device_kind, dtype_name, parse_dtype
from sunnypilot.modeld_v2.replay import InputError, Replay, label, replay_part, write_tensor
from sunnypilot.modeld_v2.tinygrad_internals import host_backed_null, record_kernel_linear, watched_beam_search

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
def beam_progress(level: int, kernels: int, log: Callable[[str], None]) -> Iterator[None]:
  """BEAM=level for the block, with a line per kernel searched: i of n, its best time, elapsed. A kernel found in tinygrad's search cache
  (its disk cache, ~/.cache/tinygrad/cache.db or $CACHEDB) shows no time: rebuilding a searched bundle is fast."""
  start, done, best = time.perf_counter(), [0], [math.inf]
  def timed(tms: list[float]) -> None: best[0] = min(best[0], *tms)
  def searched() -> None:
    done[0] += 1
    found = "from the search cache" if best[0] == math.inf else f"best {best[0] * 1e6:.1f} us"
    log(f"BEAM={level}: kernel {done[0]} of ~{kernels}: {found}, elapsed {time.perf_counter() - start:.0f} s")
    best[0] = math.inf
  with watched_beam_search(timed, searched), Context(BEAM=level): yield

class Captured(NamedTuple):
  jit: TinyJit
  part: tuple[dict, bytes]
  inputs: dict[str, Any]  # the capture call's inputs, as serialize_jit laid them out

def capture(fn: Callable, make_inputs: Callable[[], dict[str, Any]], prune: bool = True, seed: int = 0, null_holds_data: bool = False,
            beam: int = 0, log: Callable[[str], None] = print) -> Captured:
  """TinyJit-capture `fn` on fresh inputs from `make_inputs()` (call 0 runs eagerly and compiles, call 1 captures) and serialize it,
  self-checked against the TinyJit replay. `null_holds_data`: inside `compile_session()` on NULL (see serialize_jit). `beam`: search each
  kernel's optimizations with BEAM=beam on this device (see search_level); an unsearched capture first counts the kernels for the progress."""
  if beam:
    kernels = len(capture(fn, make_inputs, prune, seed, null_holds_data).part[0]["programs"])
    log(f"searching {kernels} kernels with BEAM={beam} on {Device.DEFAULT} ...")
    with beam_progress(beam, kernels, log): return _capture(fn, make_inputs, prune, seed, null_holds_data)
  with Context(BEAM=0): return _capture(fn, make_inputs, prune, seed, null_holds_data)  # no search, whatever the environment says

def _capture(fn: Callable, make_inputs: Callable[[], dict[str, Any]], prune: bool, seed: int, null_holds_data: bool) -> Captured:
  jit = TinyJit(fn, prune=prune)
  with record_kernel_linear() as recorded:
    for _ in range(2): inputs = make_inputs(); jit(**inputs)
  if len(recorded) != 1: raise ArtifactError(f"expected one captured kernel list, got {len(recorded)}")
  return Captured(jit, serialize_jit(jit, recorded[0], inputs, seed, recorded.onetime[0] if recorded.onetime else None, null_holds_data), inputs)

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

def estimates(est: Any) -> dict[str, int]:
  """tinygrad's estimates of one kernel as plain ints: ops (FLOPs), lds (bytes its loads and stores move), mem (bytes touched, each once).
  Shapes are fixed at capture, so each is a number; a symbolic one (never seen) is recorded as -1."""
  return {k: int(v) if isinstance(v, int) else -1 for k, v in (("ops", est.ops), ("lds", est.lds), ("mem", est.mem))}

def serialize_jit(run: TinyJit, linear: UOp, check: dict[str, Any], seed: int = 0, onetime: UOp | None = None, null_holds_data: bool = False) \
    -> tuple[dict, bytes]:
  """Turn a captured TinyJit and its recorded kernel LINEAR into a part `(header, blob)`.

  `check` is the keyword inputs of the capture (Tensors and dicts of Tensors such as `output_buffers`): it fixes the input layout, and the
  self-check overwrites their contents with seeded values, replays `run` and the new part on them, and requires bit-identical results.
  `onetime` is the recorded one-time LINEAR of a prune=True capture: the loader runs those calls once, before the first replay.
  `null_holds_data`: captured on NULL inside `host_backed_null`, so what the host copied in (weights) is real and is stored.
  """
  if getattr(run, "captured", None) is None: raise ArtifactError("the TinyJit has not captured yet: call it twice before serializing")
  layout = input_layout(check)
  calls, onetime_calls = _flat_calls(linear), _flat_calls(onetime) if onetime is not None else []
  device = next((a.device for c in calls + onetime_calls for a in c.src[1:]
                 if a.op is Ops.BUFFER and isinstance(a.device, str) and device_kind(a.device) not in ("NPY", "PYTHON")), Device.DEFAULT)
  blob, buffers, base_index, programs, program_index = bytearray(), [], {}, [], {}
  first_access: dict[tuple, str] = {}  # (buffer, offset, nbytes) -> "r" or "w": what the replay does to it first

  def buffer_arg(buf: Buffer) -> dict:
    if isinstance(buf, list) or not isinstance(buf, Buffer): raise ArtifactError("multi-device buffers are not supported")
    base = buf.base
    if device_kind(base.device) != device_kind(device): raise ArtifactError(f"buffer on {base.device} in a part for {device}: one device per part")
    if id(base) not in base_index:
      base_index[id(base)] = (len(buffers), base)
      buffers.append({"nbytes": base.nbytes, "device": base.device, "dtype": dtype_name(base.dtype)})
    return {"buffer": base_index[id(base)][0], "offset": buf.offset, "nbytes": buf.nbytes, "dtype": dtype_name(buf.dtype)}

  def arg(u: UOp) -> dict:
    if u.op is Ops.PARAM:
      if u.arg.slot >= len(layout): raise ArtifactError(f"captured input slot {u.arg.slot} is not among the {len(layout)} check inputs")
      return {"input": u.arg.slot}
    return buffer_arg(u.buffer)

  def access(a: dict, mode: str) -> None:
    if "buffer" in a: first_access.setdefault((a["buffer"], a["offset"], a["nbytes"]), mode)

  def serialize_calls(calls: list[UOp], onetime: bool = False) -> list[dict]:
    out = []
    for call in calls:
      if onetime and call.src[0].op is Ops.COPY and device_kind(call.src[2].buffer.base.device) != device_kind(device):
        access(arg(call.src[1]), "r")  # a constant copied once from host memory (a Python list): ran at capture, its result is stored
        continue
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
                         "signature": [[n, s, dtype_name(dt), list(shape)] for n, s, dt, shape in params],
                         "runtime_vars": [[v.arg.name, v.arg.slot, dtype_name(v.dtype), *v.arg.vmin_vmax] for v in info.vars]}
                        | ({"estimates": estimates(est)} if (est := ast.src[0].arg.estimates) is not None else {}))
        blob.extend(lib)
      for i in info.ins: access(args[i], "r")
      for i in info.outs: access(args[i], "w")
      out.append({"kind": "program", "program": program_index[key], "args": args})
    return out

  header_onetime = serialize_calls(onetime_calls, onetime=True)  # first: what they write (prepared weights) needs no bytes in the bundle
  if any("input" in a for c in header_onetime for a in c["args"]): raise ArtifactError("a one-time call reads a JIT input")
  header_calls = serialize_calls(calls)

  ret_kind, ret_tensors = _ret_tensors(run.captured.ret)
  returns = []
  for t in ret_tensors:
    slot = next((i for i, (_, _, x) in enumerate(layout) if x.uop.base is t.uop.base), None)
    returns.append({"input": slot} if slot is not None else buffer_arg(t.uop.buffer))
    returns[-1]["shape"] = list(t.shape)
  for r in returns:  # a returned buffer no call touches (a constant output) is read by the caller as it is: it carries its bytes
    if "buffer" in r and not any(index == r["buffer"] for index, _, _ in first_access): access(r, "r")
  # weights and constants: any buffer range the replay reads before writing it carries its bytes (once per buffer)
  for (index, _, _), mode in first_access.items():
    if mode == "r" and "init" not in buffers[index] and (device_kind(device) != "NULL" or null_holds_data):
      data = bytes(next(b for i, b in base_index.values() if i == index).as_memoryview())
      buffers[index]["init"] = [len(blob), len(blob) + len(data)]
      blob += data
  written = {a["input"] for c in header_calls for i, a in enumerate(c["args"]) if "input" in a and call_writes(c, programs, i)}
  header = {"device": device, "input_names": sorted(name for name, key, _ in layout if key is None), "kwargs": sorted(check),
            "inputs": [{"slot": i, "name": name, "key": key, "dtype": dtype_name(t.dtype), "shape": list(t.shape), "device": t.device,
                        "written": i in written} for i, (name, key, t) in enumerate(layout)],
            "buffers": buffers, "programs": programs, "onetime_calls": header_onetime, "calls": header_calls,
            "returns": ret_kind | {"tensors": returns}, "check": None}
  header["check"] = _self_check(run, header, bytes(blob), check, layout, seed)
  return header, bytes(blob)

# *** the self-check: seeded inputs, TinyJit replay vs plain replay, bit for bit ***

def check_values(inputs: list[dict], seed: int) -> list[np.ndarray]:
  """Deterministic input contents for a part's recorded check: uniform bytes for integer inputs, N(0, 8) for floats."""
  rng, out = np.random.default_rng(seed), []
  for spec in inputs:
    dt: DType = parse_dtype(spec["dtype"])
    shape, np_dt = tuple(spec["shape"]), np.dtype(dt.fmt)
    if dtypes.is_float(dt): out.append((rng.standard_normal(shape) * 8).astype(np_dt))
    elif dt == dtypes.bool: out.append(rng.integers(0, 2, shape).astype(np.bool_))
    else: out.append(rng.integers(0, 256, shape).astype(np_dt))
  return out

def _outputs(ret: Any, layout: list, written: list[int]) -> dict[str, np.ndarray]:
  _, tensors = _ret_tensors(ret)
  out = {f"return[{i}]": t.numpy() for i, t in enumerate(tensors)}
  return out | {label(*layout[slot][:2]): layout[slot][2].numpy() for slot in written}

def _digests(outputs: dict[str, np.ndarray]) -> dict[str, str]: return {name: hashlib.sha256(v.tobytes()).hexdigest() for name, v in outputs.items()}

def _self_check(run, header: dict, blob: bytes, check: dict, layout: list, seed: int) -> dict | None:
  if device_kind(header["device"]) == "NULL": return None  # NULL buffers hold no data: nothing to compare
  values, written = check_values(header["inputs"], seed), [s["slot"] for s in header["inputs"] if s["written"]]
  results = []
  for replay in (run, Replay(header, blob)):
    for (_, _, t), v in zip(layout, values): write_tensor(t, v)
    results.append(_outputs(replay(**check), layout, written))
  for name, expected in results[0].items():
    if expected.tobytes() != results[1][name].tobytes(): raise ArtifactError(f"self-check failed: plain replay differs from the TinyJit replay in {name}")
  return {"seed": seed, "outputs": _digests(results[0])}

def verify_part(header: dict, blob: Any, device: str | None = None) -> dict[str, bool]:
  """Replay a part on its recorded check's seeded inputs: {output label: digest matches what the capture recorded}."""
  if header.get("check") is None: raise ArtifactError("this part has no recorded check (built on NULL, or fused at load time)")
  replay = replay_part(header, blob, device)
  values = check_values(header["inputs"], header["check"]["seed"])
  layout = [(s["name"], s["key"], Tensor(v, device=replay.input_device(s)).realize()) for s, v in zip(header["inputs"], values)]
  kwargs: dict[str, Any] = {name: {} for name in header["kwargs"]}
  for name, key, t in layout:
    if key is None: kwargs[name] = t
    elif isinstance(kwargs[name], dict): kwargs[name][key] = t
    else: raise ArtifactError(f"input {name} is both a tensor and a dict of tensors")
  try: outputs = replay(**kwargs)
  except InputError as e: raise ArtifactError(f"the part's recorded inputs do not fit it: {e}") from None
  got = _digests(_outputs(outputs, layout, [s["slot"] for s in header["inputs"] if s["written"]]))
  return {name: got.get(name) == digest for name, digest in header["check"]["outputs"].items()}
