"""Building a part: its buffer and program tables and its blob grow together, so every blob range and table index is assigned in one place.

Capture adds buffers, programs (binaries) and initial contents one at a time; fusion includes two whole parts and gets back where their
tables start, instead of shifting indices by hand.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.part import BufferSpec, Call, Check, InputSlot, Part, Program, Returns

class Blobs:
  """Several blobs as one address space, for a part whose ranges span them (a fused part: the model's and the warp's files)."""
  def __init__(self, *blobs: Segment):
    self.blobs, self.starts = blobs, np.cumsum([0] + [len(b) for b in blobs]).tolist()

  def __len__(self) -> int: return self.starts[-1]

  def __getitem__(self, span: slice) -> memoryview | bytes:
    start, stop, _ = span.indices(len(self))
    for blob, base, end in zip(self.blobs, self.starts, self.starts[1:]):
      if base <= start and stop <= end: return _view(blob)[start - base:stop - base]  # inside one blob: a view, no copy
    return b"".join(bytes(_view(blob)[max(start, base) - base:min(stop, end) - base])
                    for blob, base, end in zip(self.blobs, self.starts, self.starts[1:]) if start < end and stop > base)

  def __bytes__(self) -> bytes: return bytes(self[0:len(self)])

class KeptBlob:
  """A part's blob of which only some ranges were kept in memory: a streamed load keeps the kernel binaries and writes the weights
  straight into the device's buffers. A kept range (or a slice inside one) reads as bytes; anything else is an ArtifactError."""
  def __init__(self, size: int):
    self.size = size
    self.kept: dict[tuple[int, int], bytearray] = {}

  def __len__(self) -> int: return self.size

  def keep(self, start: int, end: int) -> Callable[[int, memoryview], None]:
    """Keep the range [start, end): returns the writer a streamed read fills it through (offset inside the range, bytes)."""
    view = memoryview(self.kept.setdefault((start, end), bytearray(end - start)))
    def write(offset: int, data: memoryview) -> None: view[offset:offset + len(data)] = data
    return write

  def __getitem__(self, span: slice) -> memoryview:
    start, stop, _ = span.indices(self.size)
    if (start, stop) in self.kept: return memoryview(self.kept[(start, stop)])
    for (a, b), data in self.kept.items():
      if a <= start and stop <= b: return memoryview(data)[start - a:stop - a]
    raise ArtifactError(f"blob bytes {start}..{stop} were not kept in memory by the streamed read")

Segment = bytes | memoryview | KeptBlob  # a piece of a built part's blob: bytes, or a whole part's blob as read or streamed

def _view(blob: Segment) -> memoryview | KeptBlob: return blob if isinstance(blob, KeptBlob) else memoryview(blob)

class PartBuilder:
  """A part's buffers, programs and blob under construction. `part(...)` and `blob()` are the result."""
  def __init__(self) -> None:
    self.segments: list[Segment] = []
    self.size = 0
    self.buffers: list[BufferSpec] = []
    self.programs: list[Program] = []
    self.libs: dict[bytes, tuple[int, int]] = {}  # each binary's blob range: stored once however many programs share it

  def add_bytes(self, data: Segment) -> tuple[int, int]:
    """Append bytes to the blob; returns their range."""
    start, self.size = self.size, self.size + len(data)
    self.segments.append(data)
    return start, self.size

  def add_buffer(self, spec: BufferSpec) -> int:
    self.buffers.append(spec)
    return len(self.buffers) - 1

  def add_program(self, program: Program, lib: bytes) -> int:
    """Append a program with its binary stored in the blob once (its `lib` is set here). Programs of one binary may still differ: the same
    code compiled against buffers of other sizes has other signatures, and each call is checked against its own."""
    if lib not in self.libs: self.libs[lib] = self.add_bytes(lib)
    self.programs.append(dataclasses.replace(program, lib=self.libs[lib]))
    return len(self.programs) - 1

  def set_init(self, index: int, data: bytes) -> None:
    """Store a buffer's initial contents in the blob."""
    self.buffers[index] = dataclasses.replace(self.buffers[index], init=self.add_bytes(data))

  def include(self, part: Part, blob: Segment) -> tuple[int, int]:
    """Append another part's buffers, programs and whole blob (their ranges moved along); returns where its buffer and program tables start."""
    shift, first = self.add_bytes(blob)[0], (len(self.buffers), len(self.programs))
    self.buffers += [b if b.init is None else dataclasses.replace(b, init=(b.init[0] + shift, b.init[1] + shift)) for b in part.buffers]
    self.programs += [dataclasses.replace(p, lib=(p.lib[0] + shift, p.lib[1] + shift)) for p in part.programs]
    return first

  def blob(self) -> Blobs: return Blobs(*self.segments)

  def part(self, device: str, kwargs: Iterable[str], inputs: list[InputSlot], calls: list[Call], onetime_calls: list[Call], returns: Returns,
           check: Check | None = None) -> Part:
    """The part of these tables, with the given inputs (slot i at index i), keywords (every one the caller passes), calls and returns."""
    return Part(device, tuple(sorted(s.name for s in inputs if s.key is None)), tuple(sorted(set(kwargs))), tuple(inputs), tuple(self.buffers),
                tuple(self.programs), tuple(calls), tuple(onetime_calls), returns, check)
