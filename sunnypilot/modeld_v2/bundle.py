"""The bundle file: named parts and extras as JSON + bytes, with provenance and a content hash. Reading one never unpickles.

A part is `(header, blob)`: `header` is JSON-able plain data (inputs, buffers, programs, calls, returns, check), `blob` the bytes it points
into (kernel binaries once per (name, binary), initial buffer contents). `docs/FORMAT.md` lists every field.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import re
import struct
from importlib.metadata import version as package_version
from typing import Any, NamedTuple

import numpy as np
from tinygrad import Device, dtypes, helpers
from tinygrad.dtype import DType
from tinygrad.helpers import getenv

FORMAT_VERSION = 1
MAGIC = b"SPMV2ART"
PREAMBLE = struct.Struct("<8sIQ32s")  # magic, format version, header bytes, sha256(header + blob)
BUILD_FLAGS = ("IMAGE", "FLOAT16", "NOLOCALS", "JIT_BATCH_SIZE", "JIT", "BEAM", "JITBEAM")
CALL_KINDS = ("program", "copy")

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

def state_names(input_names: Any, output_names: Any) -> list[str]:
  """The states of a model: each input X with an output next_X (the caller may pass X's own buffer as next_X)."""
  outputs = set(output_names)
  return sorted(name for name in input_names if f"next_{name}" in outputs)

@functools.cache
def tinygrad_version() -> str: return package_version("tinygrad")

# *** writing ***

def provenance(device: str, flags: dict[str, int] | None = None) -> dict:
  """Where a bundle's kernels run, with the build flags of this process (`flags` overrides: e.g. the BEAM a compile searched with)."""
  target = Device[Device.canonicalize(device)].renderer.target
  if target.device == "NULL" and target.renderer == "IR3": target = dataclasses.replace(target, device="QCOM")  # cross-compiled for Adreno
  return {"format": FORMAT_VERSION, "tinygrad": tinygrad_version(), "device": target.device or device_kind(device), "target": repr(target),
          "flags": {flag: var.value if (var := getattr(helpers, flag, None)) is not None else getenv(flag, 0) for flag in BUILD_FLAGS} | (flags or {})}

def check_output_path(path: str) -> None:
  """Fail before any work when `path` cannot become a new file: a folder, a missing folder, or a place this user cannot write."""
  folder = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path): raise ArtifactError(f"{path} is a folder: give a file name")
  if not os.path.isdir(folder): raise ArtifactError(f"the output folder {folder} does not exist")
  if not os.access(folder, os.W_OK | os.X_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise ArtifactError(f"cannot write {path}: permission denied")

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
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, "wb") as f: f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(data), digest) + data + blob)
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp): os.remove(tmp)
    raise
  return PREAMBLE.size + len(data) + len(blob)

# *** reading ***

def read_bundle(path: str) -> tuple[dict, memoryview]:
  """The verified header and blob of a bundle file, with no device check. Never unpickles: a bundle is data."""
  try:
    with open(path, "rb") as f:  # into a writable, uninitialised buffer: weights are copied to the device straight from it
      data = memoryview(np.empty(os.fstat(f.fileno()).st_size, np.uint8))
      f.readinto(data)
  except OSError as e: raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None
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
  except (UnicodeDecodeError, json.JSONDecodeError) as e: raise ArtifactError(f"{path}: header is not valid JSON: {e}") from None
  try: _check_head(head)
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed header: {e}") from None
  return head, body[head_len:]

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
  head, blob = read_bundle(path)
  check_provenance(head["provenance"], device, path, allow_device)
  parts = {name: (p["header"], blob[p["blob"][0]:p["blob"][1]]) for name, p in head["parts"].items()}
  for name, (header, part_blob) in parts.items():
    try: validate_part(header, len(part_blob))
    except ArtifactError as e: raise ArtifactError(f"{path}: malformed part {name!r}: {e}") from None
  extras = head["extras"] | {k: {n: TensorSpec.of(s) for n, s in head["extras"].get(k, {}).items()} for k in ("input_specs", "output_specs")}
  return parts, extras

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

def validate_part(header: Any, blob_len: int) -> None:
  """Check a part's structure: types, ranges inside the blob and buffers, indices inside their tables, copies that fit both ends."""
  _expect(header, dict, "part header")
  try:
    buffers, programs, inputs = (_expect(header[k], list, k) for k in ("buffers", "programs", "inputs"))
    calls = _expect(header["calls"], list, "calls") + _expect(header.get("onetime_calls", []), list, "onetime_calls")
    returns = _expect(_expect(header["returns"], dict, "returns")["tensors"], list, "returns")
    _expect(header["device"], str, "device")
    for k in ("input_names", "kwargs"): [_expect(n, str, k) for n in _expect(header[k], list, k)]
  except KeyError as e: raise ArtifactError(f"missing field {e}") from None
  for b in buffers:
    if _expect(_expect(b, dict, "buffer").get("nbytes"), int, "buffer nbytes") < 0: raise ArtifactError(f"buffer of {b['nbytes']} bytes")
    parse_dtype(b.get("dtype")), _expect(b.get("device"), str, "buffer device")
    if "init" in b: _within(b["init"], blob_len, "buffer init"), _within([0, b["init"][1] - b["init"][0]], b["nbytes"], "buffer init size")
  for p in programs:
    _expect(p, dict, "program")
    _within(p.get("lib"), blob_len, "program binary")
    for field in ("global_size", "globals", "outs", "ins"): _ints(p.get(field), f"program {field}")
    if p.get("local_size") is not None: _ints(p["local_size"], "program local_size")
    for sig in _expect(p.get("signature"), list, "program signature"): parse_dtype(_expect(sig, list, "signature entry")[2])
    _expect(p.get("runtime_vars"), list, "program runtime_vars"), _expect(p.get("name"), str, "program name"), _expect(p.get("target"), str, "program target")
  for i, spec in enumerate(inputs):
    _expect(spec, dict, "input")
    if spec.get("slot") != i: raise ArtifactError("input slots are not 0..n-1 in order")
    parse_dtype(spec.get("dtype")), _ints(spec.get("shape"), "input shape"), _expect(spec.get("name"), str, "input name")
    _expect(spec.get("device"), str, "input device"), _expect(spec.get("key"), (str, type(None)), "input key")
  for a in [a for c in calls for a in _expect(_expect(c, dict, "call").get("args"), list, "call args")] + returns:
    if "input" in _expect(a, dict, "argument"):
      if not 0 <= _expect(a["input"], int, "input slot") < len(inputs): raise ArtifactError(f"argument refers to input slot {a['input']} of {len(inputs)}")
    elif not 0 <= _expect(a.get("buffer"), int, "buffer index") < len(buffers):
      raise ArtifactError(f"argument refers to buffer {a['buffer']} of {len(buffers)}")
    else:
      offset, nbytes = _expect(a.get("offset"), int, "argument offset"), _expect(a.get("nbytes"), int, "argument nbytes")
      _within([offset, offset + nbytes], buffers[a["buffer"]]["nbytes"], "argument"), parse_dtype(a.get("dtype"))
  for c in calls:
    if c.get("kind") not in CALL_KINDS: raise ArtifactError(f"unknown call kind {c.get('kind')!r}")
    if c["kind"] == "copy":
      if len(c["args"]) != 2 or len({arg_nbytes(a, inputs) for a in c["args"]}) != 1:
        raise ArtifactError(f"a copy must move equal lengths between its two ends, got {[arg_nbytes(a, inputs) for a in c['args']]} bytes")
    elif not 0 <= _expect(c.get("program"), int, "program index") < len(programs): raise ArtifactError(f"call of program {c['program']} of {len(programs)}")
    elif any(not 0 <= i < len(c["args"]) for f in ("globals", "outs", "ins") for i in programs[c["program"]][f]):
      raise ArtifactError(f"program {programs[c['program']]['name']} takes arguments the call does not give")

def call_writes(call: dict, programs: list[dict], i: int) -> bool:
  """Whether a call writes its i-th argument: a copy its destination, a program its `outs`."""
  return i == 0 if call["kind"] == "copy" else i in programs[call["program"]]["outs"]
