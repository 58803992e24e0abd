"""`to_bytes(service, fields, valid, log_mono_time)`: a frame's message as Event bytes, written into a template of that message's bytes
instead of through pycapnp's setters. The seam of modeld's output path: the fill functions give {dotted path: value}, this gives bytes,
and nothing else knows how. With the output parse in the model's graph, `block_writer` gives the same bytes from the graph's float block
and the daemon's fields (BlockWriter): one scatter of the block into the template instead of the fill functions' fields.

modeld publishes the same three messages every frame with the same fields and list lengths; only the numbers change. The first frame of
a layout (and any frame whose field paths or lengths differ) builds the Event with messaging.set_fields, copies it into one segment (no
far pointers) and walks capnp's wire format with the schema's slot offsets to find the bytes (bool: bit) of every field. Every later frame
compares its paths with the template's (one tuple compare), copies the bytes and writes the values with one numpy scatter per element
type. Wire format: capnproto.org/encoding.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.daemon.messaging import log, new_message, set_fields

SEGMENT_WORDS = 1 << 16  # 512 KiB: the template's one segment; modelV2 with raw predictions is ~25 KB
# capnp primitive type -> numpy dtype; enums are uint16
DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16,
          "uint32": np.uint32, "uint64": np.uint64, "float32": np.float32, "float64": np.float64, "enum": np.uint16}
LIST_ELEMENT_BYTES = {2: 1, 3: 2, 4: 4, 5: 8}  # a list pointer's element size code -> bytes (0 void, 1 bit, 6 pointer, 7 composite)
SCALAR, SEQUENCE, ENUM = range(3)  # how a field's value goes into its dtype's values

class Unsupported(ValueError):
  """A value the template cannot place (a group, a far pointer, a default to XOR, a list of bools): the message is built by pycapnp."""

def _pointer(seg: bytes, word: int) -> tuple[int, int, int, int]:
  """(kind, target word, a, b) of the pointer at `word`: a struct's (data words, pointer words), a list's (element size code, count)."""
  w = int.from_bytes(seg[8 * word:8 * word + 8], "little")
  kind, offset = w & 3, (w >> 2) & 0x3FFFFFFF
  if kind not in (0, 1): raise Unsupported(f"pointer kind {kind} at word {word}")
  offset -= (offset >> 29) << 30  # 30-bit two's complement
  target = word + 1 + offset
  return (kind, target, (w >> 32) & 0xFFFF, w >> 48) if kind == 0 else (kind, target, (w >> 32) & 7, w >> 35)

def _is_sequence(value: Any) -> bool: return type(value) in (list, tuple, np.ndarray) and (type(value) is not np.ndarray or value.ndim > 0)

class Template:
  """One service's Event bytes for fields of these paths, and where each field's value goes (`leaves`: (type, element index or bit,
  count) per field, None for one this schema lacks, listed in `skipped`)."""
  def __init__(self, service: str, fields: dict[str, Any]):
    msg = new_message(service)
    self.skipped = set_fields(getattr(msg, service), fields)
    with log.Event.from_bytes(msg.to_bytes()) as reader: event = reader.as_builder(num_first_segment_words=SEGMENT_WORDS)
    if len(segments := event.to_segments()) != 1: raise Unsupported(f"{len(segments)} segments")
    self.head, self.body, self.keys = event.to_bytes()[:8], bytes(segments[0]), tuple(fields)
    _, root, dw, _ = _pointer(self.body, 0)
    self.enums: dict[int, dict[str, int]] = {}  # field index of an enum -> its enumerants (values may be names or numbers)
    self.mono, self.valid = self._data(event, "logMonoTime", root, -1), self._data(event, "valid", root, -1)
    service_struct, at, sdw = self._struct(event, root, dw, [service])
    self.leaves = [self._field(service_struct, at, sdw, i, path, value) for i, (path, value) in enumerate(fields.items())]
    self.writer = FieldWriter(self, range(len(self.leaves)), list(fields.values()))

  def _struct(self, node: Any, word: int, data_words: int, names: list[str]) -> tuple[Any, int, int]:
    """The struct at a path of field names (a number: an element of a struct list), its wire word and data size; (None, ...) where this
    schema lacks one on the way, as set_fields skips it."""
    k = 0
    while k < len(names) and node is not None:
      name = names[k]
      if name not in node.schema.fieldnames: return None, word, data_words
      f = node.schema.fields[name].proto
      if f.which() != "slot": raise Unsupported(f"{'.'.join(names)}: {name} is a group")
      kind = f.slot.type.which()
      if kind == "struct":
        _, word, data_words, _ = _pointer(self.body, word + data_words + f.slot.offset)
        node, k = getattr(node, name), k + 1
      elif kind == "list" and k + 1 < len(names) and names[k + 1].isdigit():
        _, target, size, _ = _pointer(self.body, word + data_words + f.slot.offset)
        tag = int.from_bytes(self.body[8 * target:8 * target + 8], "little")
        n, edw, epw, i = (tag >> 2) & 0x3FFFFFFF, (tag >> 32) & 0xFFFF, tag >> 48, int(names[k + 1])
        if size != 7 or i >= n: raise Unsupported(f"{'.'.join(names)}: not a struct list with element {i}")
        word, data_words, node, k = target + 1 + i * (edw + epw), edw, getattr(node, name)[i], k + 2
      else: raise Unsupported(f"{'.'.join(names)}: {name} is no struct")
    return node, word, data_words

  def _field(self, struct: Any, word: int, data_words: int, i: int, path: str, value: Any) -> tuple[str, int, int] | None:
    """Where one field's value lies: a list of numbers or data (its pointer's target), or a number, enum or bool in the data section."""
    *names, leaf = path.split(".")
    node, at, dw = self._struct(struct, word, data_words, names) if struct is not None else (None, word, data_words)
    if node is None or leaf not in node.schema.fieldnames: return None
    f = node.schema.fields[leaf]
    if f.proto.which() != "slot": raise Unsupported(f"{path} is a group")
    slot, kind = f.proto.slot, f.proto.slot.type.which()
    if kind not in ("list", "data"): return self._data(node, leaf, at, i, dw)
    _, target, size, count = _pointer(self.body, at + dw + slot.offset)
    if kind == "data":
      if count != len(value): raise Unsupported(f"{path}: {count} bytes for {len(value)}")
      return "data", 8 * target, count
    elem = slot.type.list.elementType.which()
    if elem not in DTYPES or elem == "enum" or size not in LIST_ELEMENT_BYTES: raise Unsupported(f"{path}: a list of {elem}")
    width = LIST_ELEMENT_BYTES[size]
    if count != len(value) or (8 * target) % width: raise Unsupported(f"{path}: {count} elements for {len(value)} values")
    return elem, 8 * target // width, count

  def _data(self, node: Any, leaf: str, at: int, i: int, data_words: int = 0) -> tuple[str, int, int]:
    """A bool, number or enum in the data section of the struct at wire word `at` (`i`: its field's index, -1 for the Event's own)."""
    f = node.schema.fields[leaf]
    slot, kind = f.proto.slot, f.proto.slot.type.which()
    if kind == "bool":
      if slot.defaultValue.bool: return "bool", -(64 * at + slot.offset) - 1, 1  # stored XORed with a true default
      return "bool", 64 * at + slot.offset, 1
    if kind not in DTYPES: raise Unsupported(f"{leaf}: {kind}")
    if getattr(slot.defaultValue, kind): raise Unsupported(f"{leaf} has a default value")  # stored XORed with it
    if kind == "enum": self.enums[i] = dict(f.schema.enumerants)
    return kind, 8 * at // np.dtype(DTYPES[kind]).itemsize + slot.offset, 1

  def stamp(self, body: bytearray, valid: bool, log_mono_time: int) -> None:
    """The Event's own fields, logMonoTime and valid, into a copy of `body`."""
    np.frombuffer(body, np.uint64)[self.mono[1]] = log_mono_time
    _set_bit(body, self.valid[1], valid)

  def bytes_of(self, values: list[Any], valid: bool, log_mono_time: int) -> bytes:
    """The Event with `values` (the fields' values, in the template's order) written in; ValueError when their lengths differ."""
    body = bytearray(self.body)
    self.stamp(body, valid, log_mono_time)
    self.writer.write(body, values)
    return self.head + bytes(body)

class FieldWriter:
  """Writes the values of some of a template's fields (`indices` into its leaves, their first `values` telling arrays from Python numbers)
  into a copy of its bytes: per element type, arrays through one concatenate and Python numbers through one conversion, one scatter
  each; bools bit by bit, data by slice."""
  def __init__(self, template: Template, indices: Iterable[int], values: list[Any]):
    # dtype -> (a getter of its array fields, the buffer their one concatenate fills, their element indices, [(position, SCALAR|SEQUENCE|
    # ENUM)] of the other fields, their element indices); positions are in `values`
    groups: dict[str, tuple[list, list, list, list]] = {}
    leaves = [(j, template.leaves[i], template.enums.get(i)) for j, i in enumerate(indices)]
    self.enums = {j: enums for j, _, enums in leaves if enums is not None}  # position of an enum -> its enumerants (names or numbers)
    for j, leaf, _ in leaves:
      if leaf is None or leaf[0] in ("bool", "data"): continue
      arrays, array_dest, others, other_dest = groups.setdefault(leaf[0], ([], [], [], []))
      if type(values[j]) is np.ndarray and values[j].ndim and j not in self.enums: arrays.append(j); array_dest.extend(range(leaf[1], leaf[1] + leaf[2]))
      else:
        others.append((j, ENUM if j in self.enums else SEQUENCE if _is_sequence(values[j]) else SCALAR))
        other_dest.extend(range(leaf[1], leaf[1] + leaf[2]))
    self.groups = {k: (_getter(a), np.empty(len(ad), DTYPES[k]), np.asarray(ad, np.int64), o, np.asarray(od, np.int64)) for k, (a, ad, o, od) in groups.items()}
    self.bools = [(j, leaf[1]) for j, leaf, _ in leaves if leaf is not None and leaf[0] == "bool"]
    self.data = [(j, leaf[1], leaf[2]) for j, leaf, _ in leaves if leaf is not None and leaf[0] == "data"]

  def write(self, body: bytearray, values: list[Any]) -> None:
    """`values` (in this writer's order) into `body`; ValueError when their lengths differ from the template's."""
    for dtype, (arrays, joined, array_dest, others, other_dest) in self.groups.items():
      view = np.frombuffer(body, DTYPES[dtype])
      if arrays is not None: view[array_dest] = np.concatenate(arrays(values), out=joined, casting="same_kind")
      if others:
        flat: list = []
        for i, kind in others:
          if kind == SEQUENCE: flat.extend(values[i])
          elif kind == SCALAR: flat.append(values[i])
          else: flat.append(self.enums[i].get(values[i], values[i]))
        view[other_dest] = flat
    for i, bit in self.bools: _set_bit(body, bit, bool(values[i]))
    for i, start, count in self.data:
      if len(values[i]) != count: raise ValueError(f"{count} bytes of data, got {len(values[i])}")
      body[start:start + count] = values[i]

class BlockWriter:
  """One service's Event bytes from its template, with the model's floats from the in-graph parse's block (model/published_floats.py):
  those copied in one scatter (`floats`: their (path, count) in block order), the daemon's fields (`host`, the first frame's values) written
  as the template writes them, every other field (the constant axes) left as the template holds it. Unsupported when the template
  has not these fields as float32 lists of these lengths."""
  def __init__(self, template: Template, floats: Sequence[tuple[str, int]], host: dict[str, Any]):
    index = {path: i for i, path in enumerate(template.keys)}
    if absent := [p for p, _ in floats if p not in index] + [p for p in host if p not in index]:
      raise Unsupported(f"the template has no field {', '.join(absent[:3])}")
    dest, src, at = list[int](), list[int](), 0
    for path, n in floats:
      if (leaf := template.leaves[index[path]]) is not None:  # None: this schema lacks it, as the template skips it
        if leaf[0] != "float32" or leaf[2] != n: raise Unsupported(f"{path}: {leaf[2]} {leaf[0]} in the template, {n} floats in the block")
        dest.extend(range(leaf[1], leaf[1] + n))
        src.extend(range(at, at + n))
      at += n
    self.template, self.keys, self.size = template, tuple(host), at
    self.dest, self.src = np.asarray(dest, np.int64), None if src == list(range(at)) else np.asarray(src, np.int64)
    self.host = FieldWriter(template, [index[k] for k in host], list(host.values()))

  def bytes_of(self, host: list[Any], floats: np.ndarray, valid: bool, log_mono_time: int) -> bytes:
    """The Event with this frame's host values (in `keys` order) and block floats (this service's, float32) written in."""
    body = bytearray(self.template.body)
    np.frombuffer(body, np.float32)[self.dest] = floats if self.src is None else floats[self.src]
    self.template.stamp(body, valid, log_mono_time)
    self.host.write(body, host)
    return self.template.head + bytes(body)

def _getter(indices: list[int]) -> Callable[[list], tuple] | None:
  """The values at `indices` of a list, as a tuple, in one C call (None for none)."""
  if not indices: return None
  get = operator.itemgetter(*indices)
  return get if len(indices) > 1 else lambda values: (get(values),)

def _set_bit(body: bytearray, bit: int, value: bool) -> None:
  xor, bit = (True, -bit - 1) if bit < 0 else (False, bit)
  if value != xor: body[bit >> 3] |= 1 << (bit & 7)
  else: body[bit >> 3] &= ~(1 << (bit & 7)) & 0xFF

class MessageBytes:
  """Event bytes per service, through a template per service; a frame whose field paths or lengths differ from its template's builds
  a new one, and a message the template cannot place is built by pycapnp every frame. `report` is told, once per path, the fields this
  schema lacks (openpilot's cereal and the bundled one differ)."""
  def __init__(self, report: Callable[[str], None] = lambda line: None):
    self.report, self.templates, self.unsupported = report, dict[str, Template](), dict[str, tuple[str, ...]]()

  def block_writer(self, service: str, floats: Sequence[tuple[str, int]], host: dict[str, Any]) -> BlockWriter | None:
    """A writer of `service`'s messages from the in-graph parse's floats and these host fields, on the template the last to_bytes of it
    used; None without one, or when it cannot take them (then publish through to_bytes)."""
    if (template := self.templates.get(service)) is None: return None
    try: return BlockWriter(template, floats, host)
    except Unsupported as e:
      self.report(f"{service}: the in-graph parse's floats do not fit its byte template ({e}): its fields are filled on the host")
      return None

  def to_bytes(self, service: str, fields: dict[str, Any], valid: bool, log_mono_time: int) -> bytes:
    template = self.templates.get(service)
    if template is not None and template.keys == tuple(fields):
      try: return template.bytes_of(list(fields.values()), valid, log_mono_time)
      except ValueError: pass  # other lengths: a new template
    if self.unsupported.get(service) != tuple(fields):
      try:
        self.templates[service] = template = Template(service, fields)
        self.report_skipped(service, template.skipped)
        return template.bytes_of(list(fields.values()), valid, log_mono_time)
      except Unsupported: self.unsupported[service] = tuple(fields)
    msg = new_message(service, valid=valid)
    msg.logMonoTime = log_mono_time
    self.report_skipped(service, set_fields(getattr(msg, service), fields))
    return msg.to_bytes()

  def report_skipped(self, service: str, paths: Iterable[str]) -> None:
    """The fields of `service` this schema lacks, in one line (said once): an older cereal has fewer fields than the one filled."""
    if paths := sorted(paths): self.report(f"{service}: this cereal schema has no {', '.join(paths)}: not published")
