"""A part's header as typed records: what capture writes, fusion combines, replay runs and inspect prints. `Part.from_json(header, blob)`
is the one reader (it checks every field against its tables and the blob, so a malformed header is an ArtifactError, not a wild pointer);
`Part.to_json()` the one writer. The JSON is the bundle's on-disk form, field for field (`docs/FORMAT.md` lists every field).

Part: device, input_names, kwargs, inputs (InputSlot), buffers (BufferSpec), programs (Program), calls and onetime_calls (Call),
returns (Returns), check (Check or None). A call's argument is an input slot (InputArg) or a view of one of the part's buffers (BufferView).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.fields import device_kind, expect, ints, parse_dtype, within
from sunnypilot.modeld_v2.format.kernel_binary import BinaryError, check_kernel_binary

PartJSON = dict[str, Any]  # a part header as stored: JSON that Part.from_json reads and checks field by field into a Part

class Blob(Protocol):
  """A part's blob: bytes, a memoryview, or a view of several (part_builder.Blobs) or of the ranges a streamed load kept (KeptBlob)."""
  def __len__(self) -> int: ...
  def __getitem__(self, span: slice, /) -> bytes | memoryview: ...

CALL_KINDS = ("program", "copy")
RETURN_KINDS = ("NoneType", "Tensor", "tuple", "list", "dict")
# what a part may make the replay allocate or iterate: far above any openpilot model, far below what would exhaust a device
MAX_BUFFER_BYTES = 16 << 30  # all buffers of a part together
MAX_CALLS = 1 << 20  # calls and one-time calls, each
MAX_TABLE = 1 << 16  # programs, buffers, inputs, arguments of a call
MAX_LAUNCH = (1 << 31) - 1  # each global size (CUDA's grid limit)
MAX_LOCAL = 1024  # threads of a workgroup (CUDA, AMD, Adreno)
MAX_CPU_CORES = 1024  # a CPU program with core_id is called once per core

# *** a part's fields: inputs' labels, shapes and tables within the bounds above (checks in fields.py) ***

def label(name: str, key: str | None) -> str:
  """How errors and check digests name an input: `x`, or `output_buffers[outputs]` for one entry of a dict keyword."""
  return name if key is None else f"{name}[{key}]"

def _shape(value: object, what: str) -> tuple[int, ...]:
  shape = ints(value, what)
  if len(shape) > 8 or any(not 0 <= d <= MAX_BUFFER_BYTES for d in shape) or math.prod(shape) > MAX_BUFFER_BYTES:
    raise ArtifactError(f"{what} {list(shape)!r:.80} is not a shape of at most {MAX_BUFFER_BYTES} elements")
  return shape

def _table(header: PartJSON, key: str, limit: int = MAX_TABLE) -> list:
  if key not in header: raise ArtifactError(f"missing field {key!r}")
  if len(table := expect(header[key], list, key)) > limit: raise ArtifactError(f"{key} has {len(table)} entries, more than {limit}")
  return table

def _dtype(value: object) -> str:
  parse_dtype(value)
  return str(value)

def nbytes_of(shape: tuple[int, ...], dtype: str) -> int: return math.prod(shape) * parse_dtype(dtype).itemsize

# *** records ***

@dataclass(frozen=True)
class InputSlot:
  """One tensor the caller passes: a keyword (`key` None) or one entry of a dict keyword (`output_buffers[outputs]`)."""
  slot: int
  name: str
  key: str | None
  dtype: str
  shape: tuple[int, ...]
  device: str
  written: bool  # the part writes it (an output buffer, a state's next value)

  @property
  def nbytes(self) -> int: return nbytes_of(self.shape, self.dtype)

  @property
  def label(self) -> str: return label(self.name, self.key)

  @staticmethod
  def from_json(spec: Any, slot: int, device: str, kwargs: tuple[str, ...]) -> InputSlot:
    expect(spec, dict, "input")
    if spec.get("slot") != slot: raise ArtifactError("input slots are not 0..n-1 in order")
    name = expect(spec.get("name"), str, "input name")
    if name not in kwargs: raise ArtifactError(f"input {name!r:.40} is not among the part's keyword inputs")
    shape, dtype = _shape(spec.get("shape"), f"input {name} shape"), _dtype(spec.get("dtype"))
    if (nbytes := nbytes_of(shape, dtype)) > MAX_BUFFER_BYTES: raise ArtifactError(f"input {name} of {nbytes:,} bytes")
    if device_kind(expect(spec.get("device"), str, "input device")) not in (device_kind(device), "NPY"):
      raise ArtifactError(f"input {name} on {spec['device']!r:.40}, in a part for {device!r:.40}: inputs live on the part's device or the host")
    key, written = expect(spec.get("key"), (str, type(None)), "input key"), expect(spec.get("written", False), bool, "input written")
    return InputSlot(slot, name, key, dtype, shape, spec["device"], written)

  def to_json(self) -> dict:
    return {"slot": self.slot, "name": self.name, "key": self.key, "dtype": self.dtype, "shape": list(self.shape), "device": self.device,
            "written": self.written}

@dataclass(frozen=True)
class BufferSpec:
  """One device buffer the replay allocates; `init` is the blob range of its initial contents (weights, constants), if it has any."""
  nbytes: int
  device: str
  dtype: str
  init: tuple[int, int] | None = None

  @staticmethod
  def from_json(b: Any, blob_len: int) -> BufferSpec:
    nbytes = expect(expect(b, dict, "buffer").get("nbytes"), int, "buffer nbytes")
    if not 0 <= nbytes <= MAX_BUFFER_BYTES: raise ArtifactError(f"a buffer of {nbytes} bytes")
    dtype, device = _dtype(b.get("dtype")), expect(b.get("device"), str, "buffer device")
    if "init" not in b: return BufferSpec(nbytes, device, dtype)
    init = within(b["init"], blob_len, "buffer init")
    within([0, init[1] - init[0]], nbytes, "buffer init size")
    return BufferSpec(nbytes, device, dtype, init)

  def to_json(self) -> dict:
    return {"nbytes": self.nbytes, "device": self.device, "dtype": self.dtype} | ({"init": list(self.init)} if self.init is not None else {})

@dataclass(frozen=True)
class InputArg:
  """An argument bound to an input slot at each call."""
  input: int

  def to_json(self) -> dict: return {"input": self.input}

@dataclass(frozen=True)
class BufferView:
  """An argument that is `nbytes` of one of the part's buffers from `offset`, seen as `dtype`."""
  buffer: int
  offset: int
  nbytes: int
  dtype: str

  def to_json(self) -> dict: return {"buffer": self.buffer, "offset": self.offset, "nbytes": self.nbytes, "dtype": self.dtype}

Arg = InputArg | BufferView

def arg_from_json(a: Any, inputs: tuple[InputSlot, ...], buffers: tuple[BufferSpec, ...]) -> Arg:
  if "input" in expect(a, dict, "argument"):
    if not 0 <= expect(a["input"], int, "input slot") < len(inputs): raise ArtifactError(f"argument refers to input slot {a['input']} of {len(inputs)}")
    return InputArg(a["input"])
  if not 0 <= expect(a.get("buffer"), int, "buffer index") < len(buffers): raise ArtifactError(f"argument refers to buffer {a['buffer']} of {len(buffers)}")
  offset, nbytes = expect(a.get("offset"), int, "argument offset"), expect(a.get("nbytes"), int, "argument nbytes")
  within([offset, offset + nbytes], buffers[a["buffer"]].nbytes, "argument")
  if nbytes % parse_dtype(a.get("dtype")).itemsize: raise ArtifactError(f"an argument of {nbytes} bytes is not whole {a['dtype']} elements")
  return BufferView(a["buffer"], offset, nbytes, a["dtype"])

def arg_nbytes(a: Arg, inputs: tuple[InputSlot, ...]) -> int:
  """Bytes an argument spans: a buffer view's own length, or a whole input."""
  return inputs[a.input].nbytes if isinstance(a, InputArg) else a.nbytes

class Param(NamedTuple):
  """A kernel parameter as its signature declares it: the shape is the kernel's view, checked against what each call passes."""
  name: str | None
  slot: int
  dtype: str
  shape: tuple[int, ...]

class RuntimeVar(NamedTuple):
  """A variable the runtime sets per launch, after the buffers: only `core_id` (the CPU runtime's core index) exists."""
  name: str
  slot: int
  dtype: str
  vmin: int
  vmax: int

@dataclass(frozen=True)
class Program:
  """A compiled kernel: its binary (`lib`, a blob range; programs of one binary share it), launch sizes, and which of the call's arguments
  are its buffers (`globals`), written (`outs`) and read (`ins`). `estimates`: tinygrad's ops/lds/mem for the profile, if recorded."""
  name: str
  lib: tuple[int, int]
  target: str
  global_size: tuple[int, ...]
  local_size: tuple[int, ...] | None
  globals: tuple[int, ...]
  outs: tuple[int, ...]
  ins: tuple[int, ...]
  signature: tuple[Param, ...]
  runtime_vars: tuple[RuntimeVar, ...]
  estimates: dict[str, int] | None = None

  @staticmethod
  def from_json(p: Any, blob: Blob, device: str) -> Program:
    """A program of a part for `device`: its binary is checked as a CPU binary when it is compiled for the CPU or runs there (the part's
    device picks the runtime that loads it, whatever target the program records)."""
    expect(p, dict, "program")
    name, target = expect(p.get("name"), str, "program name"), expect(p.get("target"), str, "program target")
    lib = within(p.get("lib"), len(blob), f"program {name} binary")
    global_size = ints(p.get("global_size"), f"program {name} global_size")
    local_size = None if p.get("local_size") is None else ints(p["local_size"], f"program {name} local_size")
    if not 1 <= len(global_size) <= 3 or any(not 1 <= g <= MAX_LAUNCH for g in global_size):
      raise ArtifactError(f"program {name} global_size {list(global_size)!r:.60} is not 1 to 3 sizes of 1..{MAX_LAUNCH}")
    if not 1 <= len(local := (1,) if local_size is None else local_size) <= 3 or any(g < 1 for g in local) or math.prod(local) > MAX_LOCAL:
      raise ArtifactError(f"program {name} local_size {list(local)!r:.60} is not 1 to 3 sizes of at most {MAX_LOCAL} threads together")
    signature = tuple(Program.param(sig, name) for sig in expect(p.get("signature"), list, f"program {name} signature"))
    globals_ = ints(p.get("globals"), f"program {name} globals")
    if len(globals_) != len(signature):
      raise ArtifactError(f"program {name} passes {len(globals_)} buffers to a kernel whose signature takes {len(signature)}")
    outs, ins = ints(p.get("outs"), f"program {name} outs"), ints(p.get("ins"), f"program {name} ins")
    if any(i not in globals_ for i in outs): raise ArtifactError(f"program {name} outs are not among its globals")
    if any(i not in globals_ for i in ins): raise ArtifactError(f"program {name} ins are not among its globals")
    runtime_vars = tuple(Program.runtime_var(v, i, name, signature, global_size)
                         for i, v in enumerate(expect(p.get("runtime_vars"), list, f"program {name} runtime_vars")))
    estimates = None if "estimates" not in p else {k: expect(v, int, f"program {name} estimate {k}")
                                                     for k, v in expect(p["estimates"], dict, f"program {name} estimates").items()}
    try: check_kernel_binary(bytes(blob[lib[0]:lib[1]]), name, "CPU" if "CPU" in (device_kind(device), device_kind(target)) else device_kind(target))
    except BinaryError as e: raise ArtifactError(f"program {name}: {e}") from None
    return Program(name, lib, target, global_size, local_size, globals_, outs, ins, signature, runtime_vars, estimates)

  @staticmethod
  def param(sig: Any, program: str) -> Param:
    if len(expect(sig, list, "signature entry")) != 4: raise ArtifactError(f"program {program}: a signature entry is not [name, slot, dtype, shape]")
    name, slot = expect(sig[0], (str, type(None)), "signature name"), expect(sig[1], int, "signature slot")
    return Param(name, slot, _dtype(sig[2]), _shape(sig[3], f"program {program} signature shape"))

  @staticmethod
  def runtime_var(v: Any, i: int, program: str, signature: tuple, global_size: tuple[int, ...]) -> RuntimeVar:
    if not (isinstance(v, list) and len(v) == 5 and isinstance(v[0], str)) or v[1] != len(signature) + i:
      raise ArtifactError(f"program {program}: runtime variable {i} is not [name, slot after the buffers, dtype, min, max]")
    _dtype(v[2])
    if v[0] != "core_id": raise ArtifactError(f"program {program} has a runtime variable {v[0]!r:.40}: only core_id is set at replay")
    if expect(v[3], int, "core_id min") != 0 or expect(v[4], int, "core_id max") + 1 != global_size[0] or global_size[0] > MAX_CPU_CORES:
      raise ArtifactError(f"program {program}: core_id {v[3]}..{v[4]} does not cover global size {global_size[0]} of at most {MAX_CPU_CORES} cores")
    return RuntimeVar(*v)

  def to_json(self) -> dict:
    return {"name": self.name, "lib": list(self.lib), "target": self.target, "global_size": list(self.global_size),
            "local_size": None if self.local_size is None else list(self.local_size), "globals": list(self.globals), "outs": list(self.outs),
            "ins": list(self.ins), "signature": [[n, s, dt, list(shape)] for n, s, dt, shape in self.signature],
            "runtime_vars": [list(v) for v in self.runtime_vars]} | ({"estimates": dict(self.estimates)} if self.estimates is not None else {})

@dataclass(frozen=True)
class Call:
  """One step of the replay: a program launch on `args`, or a copy from `args[1]` to `args[0]`."""
  kind: str
  args: tuple[Arg, ...]
  program: int | None = None

  def writes(self, i: int, programs: tuple[Program, ...]) -> bool:
    """Whether this call writes its i-th argument: a copy its destination, a program its `outs`."""
    if self.kind == "copy": return i == 0
    assert self.program is not None, "a program call names its program"
    return i in programs[self.program].outs

  def relocated(self, buffers: int, programs: int, slots: dict[int, Arg]) -> Call:
    """This call inside a part that holds its buffers from index `buffers` and its programs from `programs` on, input slot i passed as
    `slots[i]`."""
    args = tuple(slots[a.input] if isinstance(a, InputArg) else dataclasses.replace(a, buffer=a.buffer + buffers) for a in self.args)
    return Call(self.kind, args, None if self.program is None else self.program + programs)

  @staticmethod
  def from_json(c: Any, inputs: tuple[InputSlot, ...], buffers: tuple[BufferSpec, ...], programs: tuple[Program, ...]) -> Call:
    args = expect(expect(c, dict, "call").get("args"), list, "call args")
    if len(args) > MAX_TABLE: raise ArtifactError(f"a call with {len(args)} arguments")
    call_args = tuple(arg_from_json(a, inputs, buffers) for a in args)
    if c.get("kind") not in CALL_KINDS: raise ArtifactError(f"unknown call kind {c.get('kind')!r:.40}")
    if c["kind"] == "copy":
      if len(args) != 2 or len({arg_nbytes(a, inputs) for a in call_args}) != 1:
        raise ArtifactError(f"a copy must move equal lengths between its two ends, got {[arg_nbytes(a, inputs) for a in call_args]} bytes")
      return Call("copy", call_args)
    if not 0 <= expect(c.get("program"), int, "program index") < len(programs): raise ArtifactError(f"call of program {c['program']} of {len(programs)}")
    program = programs[c["program"]]
    if any(not 0 <= i < len(args) for i in program.globals): raise ArtifactError(f"program {program.name} takes arguments the call does not give")
    for i, param in zip(program.globals, program.signature):
      if (have := arg_nbytes(call_args[i], inputs)) < (need := nbytes_of(param.shape, param.dtype)):
        raise ArtifactError(f"program {program.name} reads or writes {need} bytes of argument {i}, which has {have}")
    return Call("program", call_args, c["program"])

  def to_json(self) -> dict:
    return {"kind": self.kind, "args": [a.to_json() for a in self.args]} | ({"program": self.program} if self.program is not None else {})

@dataclass(frozen=True)
class Returned:
  """One returned tensor: an input slot or a buffer view, and its shape."""
  arg: Arg
  shape: tuple[int, ...]

  def to_json(self) -> dict: return self.arg.to_json() | {"shape": list(self.shape)}

@dataclass(frozen=True)
class Returns:
  """What the captured function returned: None, a Tensor, a tuple/list of Tensors or a dict of them (`keys`, in order)."""
  kind: str
  tensors: tuple[Returned, ...]
  keys: tuple[str, ...] | None = None

  @staticmethod
  def from_json(returns: Any, inputs: tuple[InputSlot, ...], buffers: tuple[BufferSpec, ...]) -> Returns:
    kind, tensors = expect(returns, dict, "returns").get("kind"), expect(returns.get("tensors"), list, "returns")
    if kind not in RETURN_KINDS: raise ArtifactError(f"unknown return kind {kind!r:.40}")
    if len(tensors) != {"NoneType": 0, "Tensor": 1}.get(kind, len(tensors)): raise ArtifactError(f"a {kind} return of {len(tensors)} tensors")
    keys = None if "keys" not in returns else tuple(expect(k, str, "return key") for k in expect(returns["keys"], list, "return keys"))
    if kind == "dict" and (keys is None or len(keys) != len(tensors)): raise ArtifactError("a dict return needs one key per tensor")
    return Returns(kind, tuple(Returns.tensor(r, inputs, buffers) for r in tensors), keys)

  @staticmethod
  def tensor(r: Any, inputs: tuple[InputSlot, ...], buffers: tuple[BufferSpec, ...]) -> Returned:
    arg, shape = arg_from_json(r, inputs, buffers), _shape(r.get("shape"), "return shape")
    if isinstance(arg, BufferView) and nbytes_of(shape, arg.dtype) != arg.nbytes:
      raise ArtifactError(f"a returned tensor of shape {list(shape)} {arg.dtype} is not its {arg.nbytes}-byte buffer view")
    return Returned(arg, shape)

  def to_json(self) -> dict:
    return {"kind": self.kind, "tensors": [t.to_json() for t in self.tensors]} | ({"keys": list(self.keys)} if self.keys is not None else {})

@dataclass(frozen=True)
class Check:
  """The capture's self-check: the seed of its inputs and the sha256 of each output (`return[i]`, written inputs by label)."""
  seed: int
  outputs: dict[str, str]

  @staticmethod
  def from_json(check: Any) -> Check:
    seed = expect(expect(check, dict, "check").get("seed"), int, "check seed")
    if not 0 <= seed < 1 << 63: raise ArtifactError(f"check seed {seed} is not a 63-bit seed")
    outputs = expect(check.get("outputs"), dict, "check outputs")
    for label, digest in outputs.items():
      if not isinstance(digest, str): raise ArtifactError(f"check output {label!r} has no sha256 digest")
    return Check(seed, dict(outputs))

  def to_json(self) -> dict: return {"seed": self.seed, "outputs": dict(self.outputs)}

@dataclass(frozen=True)
class Part:
  """A part's header. Its blob (bytes or a memoryview) travels next to it: programs' `lib` and buffers' `init` are ranges into it."""
  device: str
  input_names: tuple[str, ...]  # keywords passed as one tensor
  kwargs: tuple[str, ...]  # every keyword, dicts of tensors included
  inputs: tuple[InputSlot, ...]
  buffers: tuple[BufferSpec, ...]
  programs: tuple[Program, ...]
  calls: tuple[Call, ...]
  onetime_calls: tuple[Call, ...]  # weight preparation, run once before the first call
  returns: Returns
  check: Check | None

  def arg_nbytes(self, a: Arg) -> int: return arg_nbytes(a, self.inputs)

  @staticmethod
  def of(header: Part | PartJSON, blob: Blob) -> Part:
    """A part given as a record (read and checked already) or as its JSON (read and checked here)."""
    return header if isinstance(header, Part) else Part.from_json(header, blob)

  @staticmethod
  def from_json(header: Any, blob: Blob) -> Part:
    """Read and check a part header against its blob: field types, ranges inside the blob and buffers, indices inside their tables, what
    the replay will allocate and iterate (MAX_* bounds), each program's binary (kernel_binary) and argument counts against its signature,
    arguments at least as large as the kernel's view of them, copies that fit both ends. Raises ArtifactError."""
    device = expect(expect(header, dict, "part header").get("device"), str, "device")
    input_names = tuple(expect(n, str, "input_names") for n in _table(header, "input_names"))
    kwargs = tuple(expect(n, str, "kwargs") for n in _table(header, "kwargs"))
    buffers = Part.buffer_table(header, len(blob))
    program_table, input_table = _table(header, "programs"), _table(header, "inputs")
    call_table = _table(header, "calls", MAX_CALLS)
    onetime_table = _table(header, "onetime_calls", MAX_CALLS) if "onetime_calls" in header else []
    programs = tuple(Program.from_json(p, blob, device) for p in program_table)
    inputs = tuple(InputSlot.from_json(s, i, device, kwargs) for i, s in enumerate(input_table))
    calls = tuple(Call.from_json(c, inputs, buffers, programs) for c in call_table)
    onetime = tuple(Call.from_json(c, inputs, buffers, programs) for c in onetime_table)
    returns = Returns.from_json(header.get("returns"), inputs, buffers)
    check = None if header.get("check") is None else Check.from_json(header["check"])
    return Part(device, input_names, kwargs, inputs, buffers, programs, calls, onetime, returns, check)

  @staticmethod
  def buffer_table(header: PartJSON, blob_len: int) -> tuple[BufferSpec, ...]:
    """A part header's buffers, each and all together bounded: what a streamed load allocates before it reads the blob into them."""
    buffers = tuple(BufferSpec.from_json(b, blob_len) for b in _table(expect(header, dict, "part header"), "buffers"))
    if (total := sum(b.nbytes for b in buffers)) > MAX_BUFFER_BYTES:
      raise ArtifactError(f"the buffers hold {total:,} bytes together, more than {MAX_BUFFER_BYTES:,}")
    return buffers

  @staticmethod
  def lib_ranges(header: PartJSON, blob_len: int) -> set[tuple[int, int]]:
    """The blob ranges of a part header's kernel binaries: what a streamed load keeps in memory (Part.from_json then checks them)."""
    return {within(expect(p, dict, "program").get("lib"), blob_len, "program binary") for p in _table(expect(header, dict, "part header"), "programs")}

  def to_json(self) -> PartJSON:
    return {"device": self.device, "input_names": list(self.input_names), "kwargs": list(self.kwargs), "inputs": [s.to_json() for s in self.inputs],
            "buffers": [b.to_json() for b in self.buffers], "programs": [p.to_json() for p in self.programs],
            "onetime_calls": [c.to_json() for c in self.onetime_calls], "calls": [c.to_json() for c in self.calls],
            "returns": self.returns.to_json(), "check": None if self.check is None else self.check.to_json()}
