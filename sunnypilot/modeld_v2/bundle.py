"""The bundle file: named parts and extras as JSON + bytes, with provenance and a content hash. Reading one never unpickles.

A part is `(header, blob)`: `header` is JSON-able plain data (inputs, buffers, programs, calls, returns, check), `blob` the bytes it points
into (kernel binaries once per (name, binary), initial buffer contents). `docs/FORMAT.md` lists every field.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import stat
import struct
from collections.abc import Iterable, Iterator
from importlib.metadata import version as package_version
from typing import Any, BinaryIO, NamedTuple

import numpy as np
from tinygrad import Device, dtypes, helpers
from tinygrad.dtype import DType
from tinygrad.helpers import getenv

from sunnypilot.modeld_v2.kernel_binary import BinaryError, check_kernel_binary
from sunnypilot.modeld_v2.model_outputs import check_output_slices
from sunnypilot.modeld_v2.warp import parse_frame, parse_size

FORMAT_VERSION = 1
MAGIC = b"SPMV2ART"
PREAMBLE = struct.Struct("<8sIQ32s")  # magic, format version, header bytes, sha256(header + blob)
BUILD_FLAGS = ("IMAGE", "FLOAT16", "NOLOCALS", "JIT_BATCH_SIZE", "JIT", "BEAM", "JITBEAM")
CALL_KINDS = ("program", "copy")
# what a part may make the replay allocate or iterate: far above any openpilot model, far below what would exhaust a device
MAX_BUFFER_BYTES = 16 << 30  # all buffers of a part together
MAX_CALLS = 1 << 20  # calls and one-time calls, each
MAX_TABLE = 1 << 16  # programs, buffers, inputs, arguments of a call
MAX_LAUNCH = (1 << 31) - 1  # each global size (CUDA's grid limit)
MAX_LOCAL = 1024  # threads of a workgroup (CUDA, AMD, Adreno)
MAX_CPU_CORES = 1024  # a CPU program with core_id is called once per core

class ArtifactError(ValueError):
  """A bundle or part that cannot be used here: corrupt, for another device/arch/tinygrad, or an unsupported capture."""

# *** dtypes, devices, specs ***

def dtype_name(dt: DType) -> str:
  """How a part names a dtype: tinygrad's repr ("dtypes.float"), for dtypes that round-trip through it."""
  if getattr(dtypes, repr(dt).removeprefix("dtypes."), None) != dt: raise ArtifactError(f"dtype {dt!r} cannot be stored in a plain artifact")
  return repr(dt)

def parse_dtype(name: Any) -> DType:
  if not isinstance(name, str) or not (m := re.fullmatch(r"dtypes\.([a-z0-9_]+)", name)) or not isinstance(dt := getattr(dtypes, m[1], None), DType):
    raise ArtifactError(f"unknown dtype {name!r} in bundle")
  return dt

def np_dtype(name: str) -> np.dtype:
  """The numpy dtype of a part's dtype name ("dtypes.uchar" -> uint8)."""
  if (dt := parse_dtype(name)).fmt is None: raise ArtifactError(f"dtype {dt!r} has no numpy equivalent")
  return np.dtype(dt.fmt)

def device_kind(device: str) -> str: return device.split(":")[0].upper()

class TensorSpec(NamedTuple):
  """What a bundle's caller passes or gets for one name: shape, numpy dtype string ("<f4", "|u1") and device. Stored as a JSON list."""
  shape: tuple[int, ...]
  dtype: str
  device: str

  @staticmethod
  def of(value: Any) -> TensorSpec:
    shape, dtype, device = value
    return TensorSpec(tuple(int(d) for d in shape), np.dtype(dtype).str, str(device))

  @property
  def nbytes(self) -> int: return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

STATE_PREFIX = "next_"  # the one rule of a state: an input X whose next value the model returns as the output next_X

def next_name(state: str) -> str:
  """The output that carries a state's next value."""
  return STATE_PREFIX + state

def state_names(input_names: Any, output_names: Any) -> list[str]:
  """The states of a model: each input X with an output next_X (the caller may pass X's own buffer as next_X)."""
  outputs = set(output_names)
  return sorted(name for name in input_names if next_name(name) in outputs)

def unpaired_state_outputs(input_names: Any, output_names: Any) -> dict[str, str]:
  """Outputs named as a state's next value whose state is no input, {next_X: X}: half a state pair."""
  inputs = set(input_names)
  return {n: n.removeprefix(STATE_PREFIX) for n in sorted(output_names) if n.startswith(STATE_PREFIX) and n.removeprefix(STATE_PREFIX) not in inputs}

@functools.cache
def tinygrad_version() -> str: return package_version("tinygrad")

# *** writing ***

def provenance(device: str, flags: dict[str, int] | None = None) -> dict:
  """Where a bundle's kernels run, with the build flags of this process (`flags` overrides: e.g. the BEAM a compile searched with)."""
  target = Device[Device.canonicalize(device)].renderer.target
  if target.device == "NULL" and target.renderer == "IR3": target = dataclasses.replace(target, device="QCOM")  # cross-compiled for Adreno
  return {"format": FORMAT_VERSION, "tinygrad": tinygrad_version(), "device": target.device or device_kind(device), "target": repr(target),
          "flags": {flag: var.value if (var := getattr(helpers, flag, None)) is not None else getenv(flag, 0) for flag in BUILD_FLAGS} | (flags or {})}

# *** files: outputs replace only regular files and never an input; reads refuse what is not a regular file ***

def file_kind(mode: int) -> str:
  kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
           (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))
  return next((what for test, what in kinds if test(mode)), "not a regular file")

def temporary_path(path: str) -> str:
  """Where a file is written before it is renamed into place: next to it, named for this process."""
  return f"{path}.tmp{os.getpid()}"

def _process_alive(pid: int) -> bool:
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except (PermissionError, OverflowError): pass  # another user's process, or no process id at all: leave its file
  return True

def remove_stale_temporaries(path: str) -> None:
  """Remove `path`'s temporary files left by writers that were killed (their process is gone, or had this process's id before it: this
  one is not writing `path` yet); a live writer's is kept. Writers then create theirs exclusively, never through something planted."""
  folder, base = os.path.split(os.path.abspath(path))
  prefix = f"{base}.tmp"
  try: names = os.listdir(folder)
  except OSError: return
  for name in names:
    pid = name[len(prefix):] if name.startswith(prefix) else ""
    if pid.isdigit() and (int(pid) == os.getpid() or not _process_alive(int(pid))):
      with contextlib.suppress(OSError): os.remove(os.path.join(folder, name))

def _refuse_replacing(path: str) -> None:
  try: st = os.stat(path)
  except FileNotFoundError: return
  except OSError as e: raise ArtifactError(f"cannot use {path}: {e.strerror or e}") from None
  if stat.S_ISDIR(st.st_mode): raise ArtifactError(f"{path} is a folder: give a file name")
  if not stat.S_ISREG(st.st_mode): raise ArtifactError(f"{path} is {file_kind(st.st_mode)}, not a regular file: refusing to replace it")

def check_output_path(path: str, inputs: Iterable[str | None] = ()) -> None:
  """Fail before any work when `path` cannot become a new file: empty, a folder, a device node, FIFO or anything but a regular file, the
  same file as one of `inputs` (under any name), a missing folder, or a place this user cannot create a file in. Removes temporary
  files of `path` left by killed runs."""
  if not path: raise ArtifactError("the output path is empty: give a file name")
  _refuse_replacing(path)
  for source in filter(None, inputs):
    with contextlib.suppress(OSError):
      if os.path.samefile(path, source): raise ArtifactError(f"the output {path} is the input {source}: writing it would destroy the input")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder): raise ArtifactError(f"the output folder {folder} does not exist")
  if os.path.exists(path) and not os.access(path, os.W_OK): raise ArtifactError(f"cannot write {path}: permission denied")
  remove_stale_temporaries(path)
  try: os.close(os.open(tmp := temporary_path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # can a file be created there?
  except OSError as e: raise ArtifactError(f"cannot write {path}: {e.strerror or e}") from None
  os.remove(tmp)

@contextlib.contextmanager
def replaced_atomically(*paths: str) -> Iterator[list[str]]:
  """Temporary names for `paths`, next to them. When the block ends they are renamed over `paths`, all after every one is complete, so
  readers see the old files or the new ones, never half a file; on any failure (an exception, Ctrl-C) the temporary files are removed
  and `paths` are left as they were. Nothing but a regular file is ever replaced."""
  for path in paths: remove_stale_temporaries(path)
  tmps = [temporary_path(path) for path in paths]
  try:
    yield tmps
    for path in paths: _refuse_replacing(path)  # again: something may have appeared there during the work
    for tmp, path in zip(tmps, paths): os.replace(tmp, path)
  except BaseException:
    for tmp in tmps:
      with contextlib.suppress(OSError): os.remove(tmp)
    raise

def open_regular(path: str) -> BinaryIO:
  """`path` opened for reading, refused before a byte is read unless it is a regular file (a FIFO would block, a device never end)."""
  try: fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError as e: raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None
  if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
    os.close(fd)
    raise ArtifactError(f"{path} is {file_kind(mode)}, not a regular file")
  os.set_blocking(fd, True)
  return os.fdopen(fd, "rb")

def write_bundle(path: str, parts: dict[str, tuple[dict, Any]], extras: dict, flags: dict[str, int] | None = None) -> int:
  """Write named parts and extras (`input_specs`, `output_specs`, `metadata`) as one bundle file, atomically: a temporary file renamed into
  place, removed on any failure. `flags` override the build flags provenance records. Returns the size in bytes."""
  if not parts: raise ArtifactError("a bundle needs at least one part")
  devices = {device_kind(h["device"]) for h, _ in parts.values()}
  if len(devices) != 1: raise ArtifactError(f"all parts of a bundle must be for one device, got {sorted(devices)}")
  blob, index = bytearray(), {}
  for name, (header, part_blob) in parts.items():
    index[name] = {"header": header, "blob": [len(blob), len(blob) + len(part_blob)]}
    blob += bytes(part_blob)
  head = {"provenance": provenance(next(iter(parts.values()))[0]["device"], flags), "parts": index, "extras": extras}
  data = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
  digest = hashlib.sha256(data + blob).digest()
  with replaced_atomically(path) as (tmp,), open(tmp, "xb") as f: f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(data), digest) + data + blob)
  return PREAMBLE.size + len(data) + len(blob)

# *** reading ***

def read_bundle(path: str) -> tuple[dict, memoryview]:
  """The verified header and blob of a bundle file, with no device check. Never unpickles: a bundle is data."""
  head, blob, _ = read_verified(path)
  return head, blob

def read_verified(path: str) -> tuple[dict, memoryview, str]:
  """`read_bundle`, with the content hash the bytes were checked against (hex): what a cache may key on, read in the same pass."""
  try:
    with open_regular(path) as f:  # into a writable, uninitialised buffer: weights are copied to the device straight from it
      data = memoryview(np.empty(os.fstat(f.fileno()).st_size, np.uint8))
      got = f.readinto(data)
  except OSError as e: raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None
  if got != len(data): raise ArtifactError(f"{path}: the file shrank while it was read (being rewritten?)")
  if len(data) < PREAMBLE.size: raise ArtifactError(f"{path}: {len(data)} bytes is too short to be a bundle (truncated?)")
  magic, version, head_len, digest = PREAMBLE.unpack_from(data)
  if (magic := bytes(magic)) != MAGIC: raise ArtifactError(f"{path}: not a modeld_v2 bundle (magic {magic!r}, expected {MAGIC!r})")
  if version != FORMAT_VERSION: raise ArtifactError(f"{path}: bundle format version {version}, this loader reads version {FORMAT_VERSION}")
  if PREAMBLE.size + head_len > len(data): raise ArtifactError(f"{path}: header runs past the end of the file (truncated?)")
  body = data[PREAMBLE.size:]
  if hashlib.sha256(body).digest() != digest:
    raise ArtifactError(f"{path}: content hash mismatch: file says {digest.hex()[:16]}, content is {hashlib.sha256(body).hexdigest()[:16]} "
                        "(truncated or edited)")
  try: head = json.loads(bytes(body[:head_len]))
  except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also integers too long to convert
    raise ArtifactError(f"{path}: header is not valid JSON: {str(e)[:120]}") from None
  try: _check_head(head)
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed header: {e}") from None
  return head, body[head_len:], digest.hex()

def check_provenance(prov: dict, device: str | None = None, path: str = "bundle", allow_device: bool = False) -> str:
  """Raise unless a bundle with provenance `prov` runs here; returns the device to load on."""
  here = Device.canonicalize(device)
  if prov.get("format") != FORMAT_VERSION: raise ArtifactError(f"{path}: format {prov.get('format')}, this loader reads {FORMAT_VERSION}")
  if prov.get("tinygrad") != tinygrad_version():
    raise ArtifactError(f"{path}: built with tinygrad {prov.get('tinygrad')}, this is tinygrad {tinygrad_version()}: rebuild the bundle")
  if allow_device: return here
  if prov.get("device") != device_kind(here): raise ArtifactError(f"{path}: built for device {prov.get('device')}, this process runs on {device_kind(here)}")
  if prov.get("target") != (target := repr(Device[here].renderer.target)):
    raise ArtifactError(f"{path}: kernels built for {prov.get('target')}, this device compiles for {target}")
  return here

def read_parts(path: str, device: str | None = None, allow_device: bool = False) -> tuple[dict[str, tuple[dict, memoryview]], dict]:
  """`(parts, extras)` of a bundle, after checking its hash, its structure, and that it was built for this tinygrad, device and arch.
  The extras' `input_specs` and `output_specs` come back as {name: TensorSpec}."""
  head, blob, _ = read_verified(path)
  check_provenance(head["provenance"], device, path, allow_device)
  check_parts(head, blob, path)
  parts = {name: (p["header"], blob[p["blob"][0]:p["blob"][1]]) for name, p in head["parts"].items()}
  extras = head["extras"] | {k: {n: TensorSpec.of(s) for n, s in head["extras"].get(k, {}).items()} for k in ("input_specs", "output_specs")}
  return parts, extras

def check_parts(head: dict, blob: Any, path: str = "bundle") -> None:
  """Validate every part of a read bundle (see validate_part) and the model metadata the runtime reads."""
  for name, p in head["parts"].items():
    try:
      _within(p["blob"], len(blob), "blob")
      validate_part(p["header"], blob[p["blob"][0]:p["blob"][1]])
    except ArtifactError as e: raise ArtifactError(f"{path}: malformed part {name!r}: {e}") from None
  try: check_metadata(head["extras"])
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed metadata: {e}") from None

# *** structure: every reference stays inside its own tables and blob, so a malformed header is an error, not a wild pointer ***

def _expect(value: Any, kind: type | tuple, what: str) -> Any:
  if not isinstance(value, kind) or isinstance(value, bool) and kind is int: raise ArtifactError(f"{what} is {type(value).__name__} {value!r:.60}")
  return value

def _ints(value: Any, what: str) -> list[int]:
  return [_expect(x, int, what) for x in _expect(value, list, what)]

def _within(r: Any, end: int, what: str) -> None:
  if len(_ints(r, what)) != 2 or not 0 <= r[0] <= r[1] <= end: raise ArtifactError(f"{what} range {r!r} is outside 0..{end}")

def _check_head(head: Any) -> None:
  _expect(head, dict, "the header")
  _expect(head.get("provenance"), dict, "provenance")
  if not _expect(head.get("parts"), dict, "parts"): raise ArtifactError("the bundle has no parts")
  for name, p in head["parts"].items():
    _expect(p, dict, f"part {name!r}")
    _expect(p.get("header"), dict, f"part {name!r} header")
    _ints(p.get("blob"), f"part {name!r} blob range")
  extras = _expect(head.setdefault("extras", {}), dict, "extras")
  for kind in ("input_specs", "output_specs"):
    for n, spec in _expect(extras.get(kind, {}), dict, kind).items():
      if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[2], str)): raise ArtifactError(f"{kind}[{n}] is not [shape, dtype, device]")
      _ints(spec[0], f"{kind}[{n}] shape")
      try: np.dtype(spec[1])
      except TypeError: raise ArtifactError(f"{kind}[{n}] has an unknown dtype {spec[1]!r}") from None
  _expect(extras.get("metadata", {}), dict, "metadata")

def arg_nbytes(a: dict, inputs: list[dict]) -> int:
  """Bytes an argument spans: a buffer view's own length, or a whole input."""
  if "input" in a:
    spec = inputs[a["input"]]
    return int(np.prod(spec["shape"])) * parse_dtype(spec["dtype"]).itemsize
  return a["nbytes"]

def _shape(value: Any, what: str) -> list[int]:
  shape = _ints(value, what)
  if len(shape) > 8 or any(not 0 <= d <= MAX_BUFFER_BYTES for d in shape) or int(np.prod(shape, dtype=object)) > MAX_BUFFER_BYTES:
    raise ArtifactError(f"{what} {shape!r:.80} is not a shape of at most {MAX_BUFFER_BYTES} elements")
  return shape

def _table(header: dict, key: str, limit: int = MAX_TABLE) -> list:
  if key not in header: raise ArtifactError(f"missing field {key!r}")
  if len(table := _expect(header[key], list, key)) > limit: raise ArtifactError(f"{key} has {len(table)} entries, more than {limit}")
  return table

def validate_part(header: Any, blob: Any) -> None:
  """Check a part against its blob (bytes or a memoryview): field types, ranges inside the blob and buffers, indices inside their tables,
  what the replay will allocate and iterate (MAX_* bounds), each program's binary (kernel_binary) and argument counts against its
  signature, arguments at least as large as the kernel's view of them, copies that fit both ends. Raises ArtifactError."""
  _expect(header, dict, "part header")
  _expect(header.get("device"), str, "device")
  for k in ("input_names", "kwargs"):
    for n in _table(header, k): _expect(n, str, k)
  buffers, programs, inputs = _table(header, "buffers"), _table(header, "programs"), _table(header, "inputs")
  calls = _table(header, "calls", MAX_CALLS) + (_table(header, "onetime_calls", MAX_CALLS) if "onetime_calls" in header else [])
  _check_buffers(buffers, len(blob))
  for p in programs: _check_program(p, blob)
  _check_inputs(inputs, header["device"], header["kwargs"])
  for c in calls: _check_call(c, inputs, buffers, programs)
  _check_returns(_expect(header.get("returns"), dict, "returns"), inputs, buffers)
  if header.get("check") is not None:
    check = _expect(header["check"], dict, "check")
    if not 0 <= _expect(check.get("seed"), int, "check seed") < 1 << 63: raise ArtifactError(f"check seed {check['seed']} is not a 63-bit seed")
    for label, digest in _expect(check.get("outputs"), dict, "check outputs").items():
      if not isinstance(digest, str): raise ArtifactError(f"check output {label!r} has no sha256 digest")

def _check_buffers(buffers: list, blob_len: int) -> None:
  total = 0
  for b in buffers:
    total += (nbytes := _expect(_expect(b, dict, "buffer").get("nbytes"), int, "buffer nbytes"))
    if not 0 <= nbytes <= MAX_BUFFER_BYTES: raise ArtifactError(f"a buffer of {nbytes} bytes")
    parse_dtype(b.get("dtype"))
    _expect(b.get("device"), str, "buffer device")
    if "init" in b:
      _within(b["init"], blob_len, "buffer init")
      _within([0, b["init"][1] - b["init"][0]], nbytes, "buffer init size")
  if total > MAX_BUFFER_BYTES: raise ArtifactError(f"the buffers hold {total:,} bytes together, more than {MAX_BUFFER_BYTES:,}")

def _check_program(p: Any, blob: Any) -> None:
  _expect(p, dict, "program")
  name, target = _expect(p.get("name"), str, "program name"), _expect(p.get("target"), str, "program target")
  _within(p.get("lib"), len(blob), f"program {name} binary")
  global_size = _ints(p.get("global_size"), f"program {name} global_size")
  local_size = [1] if p.get("local_size") is None else _ints(p["local_size"], f"program {name} local_size")
  if not 1 <= len(global_size) <= 3 or any(not 1 <= g <= MAX_LAUNCH for g in global_size):
    raise ArtifactError(f"program {name} global_size {global_size!r:.60} is not 1 to 3 sizes of 1..{MAX_LAUNCH}")
  if not 1 <= len(local_size) <= 3 or any(g < 1 for g in local_size) or int(np.prod(local_size, dtype=object)) > MAX_LOCAL:
    raise ArtifactError(f"program {name} local_size {local_size!r:.60} is not 1 to 3 sizes of at most {MAX_LOCAL} threads together")
  signature = _expect(p.get("signature"), list, f"program {name} signature")
  for sig in signature:
    if len(_expect(sig, list, "signature entry")) != 4: raise ArtifactError(f"program {name}: a signature entry is not [name, slot, dtype, shape]")
    _expect(sig[0], (str, type(None)), "signature name")
    _expect(sig[1], int, "signature slot")
    parse_dtype(sig[2])
    _shape(sig[3], f"program {name} signature shape")
  globals_ = _ints(p.get("globals"), f"program {name} globals")
  if len(globals_) != len(signature):
    raise ArtifactError(f"program {name} passes {len(globals_)} buffers to a kernel whose signature takes {len(signature)}")
  for field in ("outs", "ins"):
    if any(i not in globals_ for i in _ints(p.get(field), f"program {name} {field}")): raise ArtifactError(f"program {name} {field} are not among its globals")
  runtime_vars = _expect(p.get("runtime_vars"), list, f"program {name} runtime_vars")
  for i, v in enumerate(runtime_vars):
    if not (isinstance(v, list) and len(v) == 5 and isinstance(v[0], str)) or v[1] != len(signature) + i:
      raise ArtifactError(f"program {name}: runtime variable {i} is not [name, slot after the buffers, dtype, min, max]")
    parse_dtype(v[2])
    if v[0] != "core_id": raise ArtifactError(f"program {name} has a runtime variable {v[0]!r:.40}: only core_id is set at replay")
    if _expect(v[3], int, "core_id min") != 0 or _expect(v[4], int, "core_id max") + 1 != global_size[0] or global_size[0] > MAX_CPU_CORES:
      raise ArtifactError(f"program {name}: core_id {v[3]}..{v[4]} does not cover global size {global_size[0]} of at most {MAX_CPU_CORES} cores")
  try: check_kernel_binary(bytes(blob[p["lib"][0]:p["lib"][1]]), name, target.split(":")[0].upper())
  except BinaryError as e: raise ArtifactError(f"program {name}: {e}") from None

def _check_inputs(inputs: list, device: str, kwargs: list) -> None:
  for i, spec in enumerate(inputs):
    _expect(spec, dict, "input")
    if spec.get("slot") != i: raise ArtifactError("input slots are not 0..n-1 in order")
    name = _expect(spec.get("name"), str, "input name")
    if name not in kwargs: raise ArtifactError(f"input {name!r:.40} is not among the part's keyword inputs")
    nbytes = int(np.prod(_shape(spec.get("shape"), f"input {name} shape"), dtype=object)) * parse_dtype(spec.get("dtype")).itemsize
    if nbytes > MAX_BUFFER_BYTES: raise ArtifactError(f"input {name} of {nbytes:,} bytes")
    if device_kind(_expect(spec.get("device"), str, "input device")) not in (device_kind(device), "NPY"):
      raise ArtifactError(f"input {name} on {spec['device']!r:.40}, in a part for {device!r:.40}: inputs live on the part's device or the host")
    _expect(spec.get("key"), (str, type(None)), "input key")
    _expect(spec.get("written", False), bool, "input written")

def _check_arg(a: Any, inputs: list, buffers: list) -> None:
  if "input" in _expect(a, dict, "argument"):
    if not 0 <= _expect(a["input"], int, "input slot") < len(inputs): raise ArtifactError(f"argument refers to input slot {a['input']} of {len(inputs)}")
    return
  if not 0 <= _expect(a.get("buffer"), int, "buffer index") < len(buffers): raise ArtifactError(f"argument refers to buffer {a['buffer']} of {len(buffers)}")
  offset, nbytes = _expect(a.get("offset"), int, "argument offset"), _expect(a.get("nbytes"), int, "argument nbytes")
  _within([offset, offset + nbytes], buffers[a["buffer"]]["nbytes"], "argument")
  if nbytes % parse_dtype(a.get("dtype")).itemsize: raise ArtifactError(f"an argument of {nbytes} bytes is not whole {a['dtype']} elements")

def _check_call(c: Any, inputs: list, buffers: list, programs: list) -> None:
  args = _expect(_expect(c, dict, "call").get("args"), list, "call args")
  if len(args) > MAX_TABLE: raise ArtifactError(f"a call with {len(args)} arguments")
  for a in args: _check_arg(a, inputs, buffers)
  if c.get("kind") not in CALL_KINDS: raise ArtifactError(f"unknown call kind {c.get('kind')!r:.40}")
  if c["kind"] == "copy":
    if len(args) != 2 or len({arg_nbytes(a, inputs) for a in args}) != 1:
      raise ArtifactError(f"a copy must move equal lengths between its two ends, got {[arg_nbytes(a, inputs) for a in args]} bytes")
    return
  if not 0 <= _expect(c.get("program"), int, "program index") < len(programs): raise ArtifactError(f"call of program {c['program']} of {len(programs)}")
  program = programs[c["program"]]
  if any(not 0 <= i < len(args) for i in program["globals"]):
    raise ArtifactError(f"program {program['name']} takes arguments the call does not give")
  for i, (_, _, dtype, shape) in zip(program["globals"], program["signature"]):
    if arg_nbytes(args[i], inputs) < (need := int(np.prod(shape, dtype=object)) * parse_dtype(dtype).itemsize):
      raise ArtifactError(f"program {program['name']} reads or writes {need} bytes of argument {i}, which has {arg_nbytes(args[i], inputs)}")

def _check_returns(returns: dict, inputs: list, buffers: list) -> None:
  kind, tensors = returns.get("kind"), _expect(returns.get("tensors"), list, "returns")
  if kind not in ("NoneType", "Tensor", "tuple", "list", "dict"): raise ArtifactError(f"unknown return kind {kind!r:.40}")
  if len(tensors) != {"NoneType": 0, "Tensor": 1}.get(kind, len(tensors)): raise ArtifactError(f"a {kind} return of {len(tensors)} tensors")
  if kind == "dict" and len(_expect(returns.get("keys"), list, "return keys")) != len(tensors): raise ArtifactError("a dict return needs one key per tensor")
  for r in tensors:
    _check_arg(r, inputs, buffers)
    shape = _shape(r.get("shape"), "return shape")
    if "input" not in r and int(np.prod(shape, dtype=object)) * parse_dtype(r["dtype"]).itemsize != r["nbytes"]:
      raise ArtifactError(f"a returned tensor of shape {shape} {r['dtype']} is not its {r['nbytes']}-byte buffer view")

def _check_strings(value: Any, what: str, depth: int = 1) -> None:
  """A {str: str} dict (depth 1) or {str: {str: str}} (depth 2)."""
  for k, v in _expect(value, dict, what).items():
    if depth > 1: _check_strings(v, f"{what}[{k!r:.40}]", depth - 1)
    else: _expect(v, str, f"{what}[{k!r:.40}]")

def check_metadata(extras: dict) -> None:
  """The metadata the runtime and inspect read: a warp's frame geometry, model size and split flag; a model's layout, roles and
  `output_slices` (model_outputs.check_output_slices)."""
  meta = extras.get("metadata", {})
  if meta.get("kind") == "warp":
    frame, size = _expect(meta.get("frame"), str, "warp frame"), _ints(meta.get("model_size"), "warp model_size")
    _expect(meta.get("split_frames"), bool, "warp split_frames")
    try:
      parse_frame(frame)
      parse_size("x".join(map(str, size)))
    except ValueError as e: raise ArtifactError(f"warp metadata: {e}") from None
  if meta.get("kind") != "model": return
  if "layout" in meta: _expect(meta["layout"], str, "layout")
  if "input_roles" in meta: _check_strings(meta["input_roles"], "input_roles")
  if "onnx_roles" in meta: _check_strings(meta["onnx_roles"], "onnx_roles", depth=2)
  if "output_slices" not in meta: return
  outputs = extras.get("output_specs", {}).get("outputs")
  if outputs is None or not outputs[0]: raise ArtifactError("a model bundle with output_slices needs an `outputs` output spec")
  try: check_output_slices(meta["output_slices"], int(np.prod(outputs[0], dtype=object)))
  except ValueError as e: raise ArtifactError(f"output_slices: {e}") from None

def call_writes(call: dict, programs: list[dict], i: int) -> bool:
  """Whether a call writes its i-th argument: a copy its destination, a program its `outs`."""
  return i == 0 if call["kind"] == "copy" else i in programs[call["program"]]["outs"]
