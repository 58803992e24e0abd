"""Loading bundles for the runtime: one bundle (`load_bundle`), or a model with a warp fused in front (`load_fused`), each as a
`LoadedBundle`: the 'run' part as a Replay, typed specs and the metadata (with the fused part's host layout as a `FusedLayout`).

A load streams each file (`stream_parts`): the header is read and checked (provenance, then the caller's `verify`, such as a signature
check, with the content hash the preamble declares), the part's buffers are allocated, and the blob is read once in bounded chunks,
hashed on the way, its weights written straight into the device's buffers and its kernel binaries kept; only when the hash matches are
the binaries checked and loaded. So no whole-file copy ever sits beside the device buffers (a big model is hundreds of MB), and no kernel
is mapped before its bytes were verified. Fusing is a pure data transform in memory that costs well under a millisecond, less than
reading any file that could hold its result, so nothing is cached on disk (benchmarks/bench_artifact.py measures both).
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tinygrad.device import Buffer

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import (
  BundleFile,
  BundleHead,
  Extras,
  Metadata,
  Sink,
  TensorSpec,
  check_part_blobs,
  check_provenance,
  part_range,
  state_names,
  typed_extras,
)
from sunnypilot.modeld_v2.format.part import Blob, Part, PartJSON
from sunnypilot.modeld_v2.format.part_builder import KeptBlob
from sunnypilot.modeld_v2.runtime.frame_fusion import FusedLayout, fuse
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay, allocate, copy_into, replay_part
from sunnypilot.modeld_v2.runtime.tinygrad_internals import stages_copies

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoadedBundle:
  """A bundle read for a device: the 'run' part as a Replay, its typed specs and metadata."""
  run: Replay
  input_specs: dict[str, TensorSpec]
  output_specs: dict[str, TensorSpec]
  metadata: Metadata
  fused: FusedLayout | None  # a fused part's host layout; None for a bundle that is not one

  @property
  def state_names(self) -> list[str]: return state_names(self.input_specs, self.output_specs)


def load_device(device: str | None = None) -> str:
  """The device to load on, opened. Opening it may compile tinygrad's own helper kernels, which tinygrad caches under ~/.cache: with a
  HOME this user cannot write, that disk cache is switched off for the process (the loader itself compiles nothing)."""
  from tinygrad import Device, helpers
  folder = os.path.dirname(helpers.CACHEDB)
  try:
    os.makedirs(folder, exist_ok=True)
    writable = os.access(folder, os.W_OK)
  except OSError: writable = False
  if not writable and helpers.CACHELEVEL.value > 0:
    log.warning(f"tinygrad's cache folder {folder} is not writable: its disk cache is off for this process")
    helpers.CACHELEVEL.value = 0
  return Device.canonicalize(device)

Verify = Callable[[str, str, int], object]  # verify(path, content hash hex, file size) before a byte of the blob is read; ArtifactError refuses
SYNC_BYTES = 64 << 20  # on a device that stages each host copy in memory of its own until it completes (stages_copies), wait for it this often

def stream_parts(path: str, device: str, allow_device: bool = False, verify: Verify | None = None, wanted: tuple[str, ...] = ("run",)) \
    -> tuple[dict[str, tuple[Part, KeptBlob]], Extras, dict[str, list[Buffer]]]:
  """`(parts, extras, bases)` of the `wanted` parts of a bundle file, streamed (see the module's docstring): each part's record and the
  blob of its kernel binaries, the typed extras, and per part its buffers on `device` holding their initial contents (Replay's `bases`).
  Every check of read_parts, in its order; `verify(path, digest, size)` between the provenance and the first byte of the blob."""
  with BundleFile(path) as f:
    check_provenance(f.head["provenance"], device, path, allow_device)
    if verify is not None: verify(path, f.digest.hex(), f.size)
    if missing := [n for n in wanted if n not in f.head["parts"]]: raise ArtifactError(f"{path}: no part {missing[0]!r} (parts: {sorted(f.head['parts'])})")
    fill, blobs, bases, sinks = Fill(device), dict[str, KeptBlob](), dict[str, list[Buffer]](), list[Sink]()
    for name in wanted:
      try:
        start, end = part_range(f.head, name, f.blob_len)
        header = f.head["parts"][name]["header"]
        specs, libs = Part.buffer_table(header, end - start), Part.lib_ranges(header, end - start)
      except ArtifactError as e: raise ArtifactError(f"{path}: malformed part {name!r}: {e}") from None
      blobs[name], bases[name] = KeptBlob(end - start), [allocate(device, spec.nbytes) for spec in specs]
      sinks += [(start + s.init[0], start + s.init[1], fill.into(base)) for s, base in zip(specs, bases[name]) if s.init is not None]
      sinks += [(start + a, start + b, blobs[name].keep(a, b)) for a, b in libs]
    f.stream(sinks)
    fill.done()
  head: BundleHead = {**f.head, "parts": {n: p for n, p in f.head["parts"].items() if n in wanted}}
  records = check_part_blobs(head, blobs, path)
  return {n: (records[n], blobs[n]) for n in wanted}, typed_extras(f.head), bases

class Fill:
  """Writes streamed bytes into device buffers; where the device stages copies in host memory until they complete, waits every SYNC_BYTES
  so that staging stays bounded."""
  def __init__(self, device: str):
    self.device, self.pending = device, 0

  def into(self, base: Buffer) -> Callable[[int, memoryview], None]:
    staged = stages_copies(base)
    def write(offset: int, data: memoryview) -> None:
      copy_into(base, data, offset)
      if staged and (pending := self.pending + len(data)) >= SYNC_BYTES: self.done()
      elif staged: self.pending = pending
    return write

  def done(self) -> None:
    if self.pending:
      from tinygrad import Device
      Device[self.device].synchronize()
    self.pending = 0

def load_fused(model_path: str, warp_path: str, device: str | None = None, allow_device: bool = False, mapped: tuple[str, ...] = (),
               verify: Verify | None = None) -> LoadedBundle:
  """A model bundle with a warp bundle fused in front (see frame_fusion), both streamed for `device`. `allow_device` loads bundles built
  for another device anyway: mock execution of QCOM bundles on NULL. `mapped`: see Replay; `verify`: see stream_parts."""
  dev = load_device(device)
  model_parts, model_extras, model_bases = stream_parts(model_path, dev, allow_device, verify)
  warp_parts, warp_extras, warp_bases = stream_parts(warp_path, dev, allow_device, verify)
  parts, extras = fuse((model_parts, model_extras), (warp_parts, warp_extras), os.path.basename(warp_path))
  return loaded(parts, extras, dev, mapped, model_bases["run"] + warp_bases["run"])  # fuse keeps the model's buffers, then the warp's

def load_bundle(path: str, device: str | None = None, allow_device: bool = False, verify: Verify | None = None) -> LoadedBundle:
  """Stream a bundle for `device` (`allow_device`, `verify`: as for load_fused)."""
  dev = load_device(device)
  parts, extras, bases = stream_parts(path, dev, allow_device, verify)
  return loaded(parts, extras, dev, bases=bases["run"])

def loaded(parts: Mapping[str, tuple[Part | PartJSON, Blob]], extras: Extras, device: str, mapped: tuple[str, ...] = (), bases: Sequence[Buffer] = ()) \
    -> LoadedBundle:
  """A read (or fused) bundle's parts and extras as a LoadedBundle for `device`; `bases`: see Replay."""
  if "run" not in parts: raise ArtifactError(f"the bundle has no 'run' part (parts: {sorted(parts)})")
  meta = extras.get("metadata", {})
  return LoadedBundle(replay_part(*parts["run"], device=device, mapped=mapped, name="the bundle's 'run' part", bases=bases),
                      extras.get("input_specs", {}), extras.get("output_specs", {}), meta, FusedLayout.from_json(meta["fused"]) if "fused" in meta else None)
