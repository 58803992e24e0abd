"""The bundle file: named parts and extras as JSON + bytes, with provenance and a content hash. Reading one never unpickles.

A part is `(header, blob)`: `header` is the JSON of a part_format.Part (inputs, buffers, programs, calls, returns, check), `blob` the bytes it points
into (each kernel binary once, initial buffer contents). `docs/FORMAT.md` lists every field.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from io import BufferedReader
from typing import Any, NamedTuple, NotRequired, TypedDict

import numpy as np
from tinygrad import Device, helpers
from tinygrad.helpers import getenv

from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular, replaced_atomically
from sunnypilot.modeld_v2.format.fields import device_kind, expect, ints, within
from sunnypilot.modeld_v2.format.part import Blob, Part, PartJSON
from sunnypilot.modeld_v2.format.part_builder import Blobs, Segment
from sunnypilot.modeld_v2.format.tinygrad_identity import describe, imported_tinygrad, replays, unsupported

FORMAT_VERSION = 1
MAGIC = b"SPMV2ART"
PREAMBLE = struct.Struct("<8sIQ32s")  # magic, format version, header bytes, sha256(header + blob)
MAX_HEADER_BYTES = 64 << 20  # a full model's header is a few MB: a larger one is a stray or crafted file, refused before it is read
BUILD_FLAGS = ("IMAGE", "FLOAT16", "NOLOCALS", "JIT_BATCH_SIZE", "JIT", "BEAM", "JITBEAM")
# a model's arithmetic: float32, or float16 (weights and activations in half, sums accumulated in float32; compile/precision.py). A bundle
# records `precision` in its metadata only when it is not float32, so a float32 bundle is what it was before precisions existed
PRECISIONS = ("float32", "float16")

# *** the header: {"provenance": ..., "parts": {name: {"header": part JSON, "blob": [start, end]}}, "extras": ...} ***

class Provenance(TypedDict):
  """Where a bundle's kernels run and what built them (`provenance` writes it, `check_provenance` reads it)."""
  format: int
  tinygrad: str  # the version tinygrad states, and a digest of its source (format/tinygrad_identity)
  tinygrad_source: str
  device: str  # the device kind ("CPU", "CUDA", "QCOM")
  target: str  # repr of the renderer's Target: the arch the kernels were compiled for
  flags: dict[str, int]  # BUILD_FLAGS as the build set them

class PartEntry(TypedDict):
  header: PartJSON
  blob: list[int]  # [start, end) of the part's bytes in the bundle's blob

# a bundle's metadata: plain JSON by key, which keys depending on its `kind` (docs/FORMAT.md lists them); _check_model and the checks
# registered per kind (bundle_rules.py) hold what each reader reads of it, so its values stay JSON until a reader takes them
Metadata = dict[str, Any]
SpecJSON = Sequence[Any]  # one input or output spec as stored, [shape, dtype, device] (a TensorSpec is one too)

class ExtrasJSON(TypedDict, total=False):
  """A bundle's extras as stored (and as write_bundle takes them)."""
  input_specs: Mapping[str, SpecJSON]
  output_specs: Mapping[str, SpecJSON]
  metadata: Metadata

class Extras(TypedDict):
  """A read bundle's extras (typed_extras): every spec a TensorSpec."""
  input_specs: dict[str, TensorSpec]
  output_specs: dict[str, TensorSpec]
  metadata: NotRequired[Metadata]

# a bundle's parts as a reader holds them, {name: (Part record or its JSON, blob)}: read_parts' (whole blobs), a streamed load's (KeptBlobs)
Parts = Mapping[str, tuple[Part | PartJSON, Segment]]

class BundleHead(TypedDict):
  """A bundle's header, its structure checked (`_check_head`): what BundleFile.head, read_bundle and read_header return."""
  provenance: Provenance
  parts: dict[str, PartEntry]
  extras: ExtrasJSON

def precision_of(metadata: Metadata) -> str:
  """The precision a bundle's model computes in (a warp's, uint8 in and out with float32 coordinates: float32)."""
  return metadata.get("precision", PRECISIONS[0])

class TensorSpec(NamedTuple):
  """What a bundle's caller passes or gets for one name: shape, numpy dtype string ("<f4", "|u1") and device. Stored as a JSON list."""
  shape: tuple[int, ...]
  dtype: str
  device: str

  @staticmethod
  def of(value: SpecJSON) -> TensorSpec:
    shape, dtype, device = value
    return TensorSpec(tuple(int(d) for d in shape), np.dtype(dtype).str, str(device))

  @property
  def nbytes(self) -> int: return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

STATE_PREFIX = "next_"  # the one rule of a state: an input X whose next value the model returns as the output next_X

def next_name(state: str) -> str:
  """The output that carries a state's next value."""
  return STATE_PREFIX + state

def state_names(input_names: Iterable[str], output_names: Iterable[str]) -> list[str]:
  """The states of a model: each input X with an output next_X (the caller may pass X's own buffer as next_X)."""
  outputs = set(output_names)
  return sorted(name for name in input_names if next_name(name) in outputs)

def unpaired_state_outputs(input_names: Iterable[str], output_names: Iterable[str]) -> dict[str, str]:
  """Outputs named as a state's next value whose state is no input, {next_X: X}: half a state pair."""
  inputs = set(input_names)
  return {n: n.removeprefix(STATE_PREFIX) for n in sorted(output_names) if n.startswith(STATE_PREFIX) and n.removeprefix(STATE_PREFIX) not in inputs}

# *** writing ***

def provenance(device: str, flags: dict[str, int] | None = None) -> Provenance:
  """Where a bundle's kernels run, with the tinygrad that built them (format/tinygrad_identity) and the build flags of this process (`flags`
  overrides: e.g. the BEAM a compile searched with)."""
  target = Device[Device.canonicalize(device)].renderer.target
  if target.device == "NULL" and target.renderer == "IR3": target = dataclasses.replace(target, device="QCOM")  # cross-compiled for Adreno
  tinygrad = imported_tinygrad()
  build_flags = {flag: var.value if (var := getattr(helpers, flag, None)) is not None else getenv(flag, 0) for flag in BUILD_FLAGS} | (flags or {})
  return {"format": FORMAT_VERSION, "tinygrad": tinygrad.version, "tinygrad_source": tinygrad.source, "device": target.device or device_kind(device),
          "target": repr(target), "flags": build_flags}

def write_bundle(path: str, parts: dict[str, tuple[Part | PartJSON, bytes | memoryview | Blobs]], extras: ExtrasJSON | Extras,
                 flags: dict[str, int] | None = None, check: bool = True) -> int:
  """Write named parts (a Part record or its JSON, and its blob) and extras (`input_specs`, `output_specs`, `metadata`) as one bundle file,
  atomically: a temporary file renamed into place, removed on any failure (an OSError, such as a full disk, raised as an ArtifactError).
  `flags` override the build flags provenance records. The written file is read back through the loader's checks before it takes its name
  (`check=False` only crafts a hostile file, for the tests of those checks). Returns the size in bytes."""
  if not parts: raise ArtifactError("a bundle needs at least one part")
  headers = {name: header.to_json() if isinstance(header, Part) else header for name, (header, _) in parts.items()}
  devices = {device_kind(h["device"]) for h in headers.values()}
  if len(devices) != 1: raise ArtifactError(f"all parts of a bundle must be for one device, got {sorted(devices)}")
  blob, index = bytearray(), dict[str, PartEntry]()
  for name, (_, part_blob) in parts.items():
    index[name] = {"header": headers[name], "blob": [len(blob), len(blob) + len(part_blob)]}
    blob += bytes(part_blob)
  head = {"provenance": provenance(next(iter(headers.values()))["device"], flags), "parts": index, "extras": extras}
  data = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
  digest = hashlib.sha256(data + blob).digest()
  try:
    with replaced_atomically(path) as (tmp,):
      with open(tmp, "xb") as f: f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, len(data), digest) + data + blob)
      # the loader's own checks on a fresh read of the written bytes, before the file takes its name: what a compiler writes, the loader takes
      if check:
        try: read_parts(tmp, allow_device=True, name=path)
        except ArtifactError as e: raise ArtifactError(f"the bundle as written would be refused at load, so it was not written: {e}") from None
  except OSError as e: raise ArtifactError(f"cannot write {path}: {e.strerror or e}") from None  # a full disk: one line from every compiler
  return PREAMBLE.size + len(data) + len(blob)

# *** reading ***

def _read_head(f: BufferedReader, path: str) -> tuple[BundleHead, bytes, bytes, int]:
  """The header of an open bundle file, read as far as it reaches and no further: (header, its bytes, the preamble's digest, the blob's
  length). The magic, version and sizes the header declares are checked against the file's size first, so a stray large file costs eight
  bytes, not a read of the whole."""
  size = os.fstat(f.fileno()).st_size
  if len(preamble := f.read(PREAMBLE.size)) < PREAMBLE.size: raise ArtifactError(f"{path}: {size} bytes is too short to be a bundle (truncated?)")
  magic, version, head_len, digest = PREAMBLE.unpack(preamble)
  if magic != MAGIC: raise ArtifactError(f"{path}: not a modeld_v2 bundle (magic {magic!r}, expected {MAGIC!r})")
  if version != FORMAT_VERSION: raise ArtifactError(f"{path}: bundle format version {version}, this loader reads version {FORMAT_VERSION}")
  if PREAMBLE.size + head_len > size: raise ArtifactError(f"{path}: header runs past the end of the file (truncated?)")
  if head_len > MAX_HEADER_BYTES: raise ArtifactError(f"{path}: a {head_len:,} byte header, more than {MAX_HEADER_BYTES:,}: not a bundle this loader reads")
  if len(data := f.read(head_len)) < head_len: raise ArtifactError(f"{path}: the file shrank while it was read (being rewritten?)")
  try: head = json.loads(data)
  except (UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also integers too long to convert
    raise ArtifactError(f"{path}: header is not valid JSON: {str(e)[:120]}") from None
  try: _check_head(head)
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed header: {e}") from None
  blob_len = max(p["blob"][-1] for p in head["parts"].values()) if all(p["blob"] for p in head["parts"].values()) else -1
  if PREAMBLE.size + head_len + blob_len != size:
    raise ArtifactError(f"{path}: the header declares a {PREAMBLE.size + head_len + blob_len:,} byte bundle, the file has {size:,} bytes (truncated, "
                        "or not one bundle)")
  return head, data, digest, blob_len

# a read holds this much of a bundle's blob at a time, besides what it keeps (hundreds of MB never sit in memory twice): at most CHUNK_BYTES
# and a 64th of the blob (a 20 MB model adds 2%, not 20%), at least MIN_CHUNK_BYTES (each chunk is a read and, on CUDA, a staged copy)
CHUNK_BYTES, MIN_CHUNK_BYTES, CHUNK_FRACTION = 4 << 20, 64 << 10, 64
Sink = tuple[int, int, Callable[[int, memoryview], None]]  # a blob range [start, end) and write(offset inside the range, bytes)

class BundleFile:
  """An open bundle file: its preamble and header read and checked against the file's size (a stray large file costs its first bytes),
  its blob not read yet. `digest` is the content hash the preamble declares (and `size` the file's): what a signature signs and a manifest
  names, known before a byte of the blob is read. `stream(sinks)` then reads the blob once, in order, in chunks (CHUNK_BYTES at most),
  hands each sink the bytes of its range and hashes everything on the way; the hash is checked before it returns. Errors name the file
  as `name` (default: `path`)."""
  def __init__(self, path: str, name: str | None = None):
    self.path, self.name = path, name or path
    self.file = open_regular(path)
    try: self.head, self.header_bytes, self.digest, self.blob_len = _read_head(self.file, self.name)
    except OSError as e:
      self.close()
      raise ArtifactError(f"{self.name}: cannot read: {e.strerror or e}") from None
    except BaseException:
      self.close()
      raise

  @property
  def size(self) -> int: return PREAMBLE.size + len(self.header_bytes) + self.blob_len  # the file's: _read_head checked they agree

  def __enter__(self) -> BundleFile: return self
  def __exit__(self, *exc: object) -> None: self.close()
  def close(self) -> None: self.file.close()

  def stream(self, sinks: Iterable[Sink] = ()) -> None:
    """Read the whole blob once; each sink (start, end, write) gets write(offset, bytes) for every piece of [start, end), in order. Raises
    an ArtifactError when the file is shorter or longer than its header says or its content is not what the preamble's hash says: what
    the sinks were given must then not be used."""
    order = sorted((s for s in sinks if s[0] < s[1]), key=lambda s: s[0])
    size = max(1, min(CHUNK_BYTES, self.blob_len, max(MIN_CHUNK_BYTES, self.blob_len // CHUNK_FRACTION)))
    content, chunk = hashlib.sha256(self.header_bytes), memoryview(bytearray(size))
    pos, upcoming, active = 0, 0, []
    try:
      while pos < self.blob_len:
        if not (got := self.file.readinto(chunk[:min(len(chunk), self.blob_len - pos)])):
          raise ArtifactError(f"{self.name}: the file shrank while it was read (being rewritten?)")
        piece, end = chunk[:got], pos + got
        content.update(piece)
        while upcoming < len(order) and order[upcoming][0] < end:
          active.append(order[upcoming])
          upcoming += 1
        for start, stop, write in active:
          if (lo := max(start, pos)) < (hi := min(stop, end)): write(lo - start, piece[lo - pos:hi - pos])
        active, pos = [s for s in active if s[1] > end], end
      if self.file.read(1): raise ArtifactError(f"{self.name}: the file grew while it was read (being rewritten?)")
    except OSError as e: raise ArtifactError(f"{self.name}: cannot read: {e.strerror or e}") from None
    if content.digest() != self.digest:
      raise ArtifactError(f"{self.name}: content hash mismatch: file says {self.digest.hex()[:16]}, content is {content.hexdigest()[:16]} "
                          "(truncated or edited)")

def read_bundle(path: str, name: str | None = None) -> tuple[BundleHead, memoryview]:
  """The verified header and blob of a bundle file, with no device check. Never unpickles: a bundle is data. Errors name the file as
  `name` (default: `path`). The blob is read whole into memory: loads stream it into the device's buffers instead (runtime/loader)."""
  with BundleFile(path, name) as f:
    blob = np.empty(f.blob_len, np.uint8).data  # writable and uninitialised: weights are copied to the device straight from it
    def write(offset: int, data: memoryview) -> None: blob[offset:offset + len(data)] = data
    f.stream([(0, f.blob_len, write)])
  return f.head, blob

def read_header(path: str) -> BundleHead:
  """A bundle's header alone, its sizes checked against the file's and nothing past it read (no hash: `read_bundle` checks that): what
  looking through a folder of bundles needs to know which is which."""
  with BundleFile(path) as f: return f.head

def content_digest(path: str) -> str:
  """The content hash (hex) a bundle's preamble declares, read with its header and nothing past it: what signatures sign and manifests
  name. Only a full read (read_bundle, BundleFile.stream) shows that the content matches it."""
  with BundleFile(path) as f: return f.digest.hex()

def check_content(path: str) -> tuple[str, int]:
  """(content hash hex, file size) of a bundle whose whole content was read, in bounded memory, and matched the hash its preamble declares:
  what is signed, named in a manifest or installed."""
  with BundleFile(path) as f:
    f.stream()
    return f.digest.hex(), f.size

def check_provenance(prov: Provenance, device: str | None = None, path: str = "bundle", allow_device: bool = False) -> str:
  """Raise unless a bundle with provenance `prov` runs here; returns the device to load on."""
  here = Device.canonicalize(device)
  if prov.get("format") != FORMAT_VERSION: raise ArtifactError(f"{path}: format {prov.get('format')}, this loader reads {FORMAT_VERSION}")
  if (why := unsupported(tinygrad := imported_tinygrad())) is not None: raise ArtifactError(f"{path}: not replayed: {why}")
  if not replays(prov, tinygrad):
    raise ArtifactError(f"{path}: built with {describe(prov.get('tinygrad'), prov.get('tinygrad_source'))}, this is {tinygrad}: rebuild the bundle")
  if allow_device: return here
  if prov.get("device") != device_kind(here): raise ArtifactError(f"{path}: built for device {prov.get('device')}, this process runs on {device_kind(here)}")
  if prov.get("target") != (target := repr(Device[here].renderer.target)):
    raise ArtifactError(f"{path}: kernels built for {prov.get('target')}, this device compiles for {target}")
  return here

def read_parts(path: str, device: str | None = None, allow_device: bool = False, name: str | None = None) \
    -> tuple[dict[str, tuple[Part, memoryview]], Extras]:
  """`(parts, extras)` of a bundle, after checking its hash, its structure, and that it was built for this tinygrad, device and arch.
  Each part is `(Part record, blob)`; the extras' `input_specs` and `output_specs` come back as {name: TensorSpec}. Errors name the file
  as `name` (default: `path`). The blobs are in memory: a load streams them into the device's buffers instead (runtime/loader)."""
  head, blob = read_bundle(path, name)
  check_provenance(head["provenance"], device, name or path, allow_device)
  records = check_parts(head, blob, name or path)
  return {name: (records[name], blob[p["blob"][0]:p["blob"][1]]) for name, p in head["parts"].items()}, typed_extras(head)

def typed_extras(head: BundleHead) -> Extras:
  """A checked header's extras with `input_specs` and `output_specs` as {name: TensorSpec}."""
  raw = head["extras"]
  return {**raw, "input_specs": {n: TensorSpec.of(s) for n, s in raw.get("input_specs", {}).items()},
          "output_specs": {n: TensorSpec.of(s) for n, s in raw.get("output_specs", {}).items()}}

def part_range(head: BundleHead, name: str, blob_len: int) -> tuple[int, int]:
  """Where part `name`'s blob lies in the bundle's blob."""
  try: return within(head["parts"][name]["blob"], blob_len, "blob")
  except ArtifactError as e: raise ArtifactError(f"malformed part {name!r}: {e}") from None

def check_parts(head: BundleHead, blob: Blob, path: str = "bundle") -> dict[str, Part]:
  """Validate every part of a read bundle (see Part.from_json) and the model metadata the runtime reads; returns the parts as records."""
  try: blobs = {name: blob[slice(*part_range(head, name, len(blob)))] for name in head["parts"]}
  except ArtifactError as e: raise ArtifactError(f"{path}: {e}") from None
  return check_part_blobs(head, blobs, path)

def check_part_blobs(head: BundleHead, blobs: Mapping[str, Blob], path: str = "bundle") -> dict[str, Part]:
  """check_parts with each part's blob given apart: all of it, or what a streamed load kept of it (format/part_builder.KeptBlob)."""
  parts = {}
  for name, p in head["parts"].items():
    try: parts[name] = Part.from_json(p["header"], blobs[name])
    except ArtifactError as e: raise ArtifactError(f"{path}: malformed part {name!r}: {e}") from None
  check_metadata(head["extras"], path)
  return parts

# *** structure: every reference stays inside its own tables and blob, so a malformed header is an error, not a wild pointer ***

def _check_head(head: Any) -> None:
  expect(head, dict, "the header")
  expect(head.get("provenance"), dict, "provenance")
  if not expect(head.get("parts"), dict, "parts"): raise ArtifactError("the bundle has no parts")
  for name, p in head["parts"].items():
    expect(p, dict, f"part {name!r}")
    expect(p.get("header"), dict, f"part {name!r} header")
    ints(p.get("blob"), f"part {name!r} blob range")
  extras = expect(head.setdefault("extras", {}), dict, "extras")
  for kind in ("input_specs", "output_specs"):
    for n, spec in expect(extras.get(kind, {}), dict, kind).items():
      if not (isinstance(spec, list) and len(spec) == 3 and isinstance(spec[2], str)): raise ArtifactError(f"{kind}[{n}] is not [shape, dtype, device]")
      ints(spec[0], f"{kind}[{n}] shape")
      try: np.dtype(spec[1])
      except TypeError: raise ArtifactError(f"{kind}[{n}] has an unknown dtype {spec[1]!r}") from None
  expect(extras.get("metadata", {}), dict, "metadata")

def _check_strings(value: Any, what: str, depth: int = 1) -> None:
  """A {str: str} dict (depth 1) or {str: {str: str}} (depth 2)."""
  for k, v in expect(value, dict, what).items():
    if depth > 1: _check_strings(v, f"{what}[{k!r:.40}]", depth - 1)
    else: expect(v, str, f"{what}[{k!r:.40}]")

MetadataCheck = Callable[[ExtrasJSON], None]
METADATA_CHECKS: dict[str, list[MetadataCheck]] = {}  # metadata kind -> checks of a bundle's extras (ValueError), by the layers above

def register_metadata_check(kind: str, check: MetadataCheck) -> None:
  """Run `check(extras)` on every bundle of metadata `kind` read or written: the rules of layers this one knows nothing of (openpilot's
  head sizes, camera frame layouts) join the reader's own (bundle_rules.py registers them)."""
  if check not in (checks := METADATA_CHECKS.setdefault(kind, [])): checks.append(check)

def check_output_slices(slices: object, n: int) -> None:
  """Raise ValueError unless `slices` is {name: [start, stop]} of integers with 0 <= start < stop <= n."""
  if not isinstance(slices, dict): raise ValueError(f"expected {{name: [start, stop]}}, got {type(slices).__name__}")
  for name, span in slices.items():
    if not (isinstance(span, list | tuple) and len(span) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in span)):
      raise ValueError(f"{name!r:.40} is {span!r:.40}, not [start, stop]")
    if not 0 <= span[0] < span[1] <= n: raise ValueError(f"{name!r:.40} [{span[0]}, {span[1]}] falls outside the {n} outputs")

def check_metadata(extras: ExtrasJSON, path: str = "bundle") -> None:
  """Raise an ArtifactError naming `path` unless a read bundle's metadata is what the runtime, inspect and modeld's warp discovery read:
  a model's layout, roles and `output_slices`, and what METADATA_CHECKS require of each kind (a warp's frame geometry and inputs)."""
  try: _check_metadata(extras)
  except ArtifactError as e: raise ArtifactError(f"{path}: malformed metadata: {e}") from None

def _check_metadata(extras: ExtrasJSON) -> None:
  meta = extras.get("metadata", {})
  if meta.get("precision", PRECISIONS[0]) not in PRECISIONS: raise ArtifactError(f"precision {meta['precision']!r:.40} is none of {PRECISIONS}")
  if meta.get("kind") == "model": _check_model(extras)
  try:  # after the reader's own: a registered check may take the structure they check as given
    for check in METADATA_CHECKS.get(kind, ()) if isinstance(kind := meta.get("kind"), str) else (): check(extras)
  except ValueError as e: raise ArtifactError(str(e)) from None

def _check_model(extras: ExtrasJSON) -> None:
  meta = extras["metadata"]
  if "layout" in meta: expect(meta["layout"], str, "layout")
  if "input_roles" in meta: _check_strings(meta["input_roles"], "input_roles")
  if "onnx_roles" in meta: _check_strings(meta["onnx_roles"], "onnx_roles", depth=2)
  if "output_slices" not in meta: return
  outputs = extras.get("output_specs", {}).get("outputs")
  if outputs is None or not outputs[0]: raise ArtifactError("a model bundle with output_slices needs an `outputs` output spec")
  try: check_output_slices(meta["output_slices"], int(np.prod(outputs[0], dtype=object)))
  except ValueError as e: raise ArtifactError(f"output_slices: {e}") from None
