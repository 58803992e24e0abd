"""Serialize a frame's messages by writing its values into the bytes of a template Event, instead of through pycapnp's setters.

modeld publishes the same three messages every frame with the same fields and list lengths; only the numbers change. The first frame
(and any frame whose set of fields or list lengths differ) builds the Event with messaging.set_fields, copies it into one segment (so
there are no far pointers) and walks capnp's wire format with the schema's slot offsets to find the byte (bool: bit) of every leaf value.
Every later frame copies those bytes and writes the values with one numpy scatter per element type. Wire format: capnproto.org/encoding.

Fields held by the same objects frame after frame (fill_model_msg's `views` parts), whose arrays are views of one `source` buffer (an
OutputParser's, refilled in place every frame) or other arrays refilled in place, are `static`: the template gathers their floats from the
buffer with one fancy index (and copies the other arrays), and a frame's values are flattened and checked without them (the objects must
be the same ones). Their other values (numbers, strings, read-only arrays) are constants: the template's bytes hold them.
"""
from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.daemon.messaging import log, new_message, set_fields

SEGMENT_WORDS = 1 << 16  # 512 KiB: the template's one segment; modelV2 with raw predictions is ~25 KB
# capnp primitive type -> numpy dtype; enums are uint16
DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32, "int64": np.int64, "uint8": np.uint8, "uint16": np.uint16,
          "uint32": np.uint32, "uint64": np.uint64, "float32": np.float32, "float64": np.float64, "enum": np.uint16}
LIST_ELEMENT_BYTES = {2: 1, 3: 2, 4: 4, 5: 8}  # a list pointer's element size code -> bytes (0 void, 1 bit, 6 pointer, 7 composite)

SCALAR, SEQUENCE, ENUM = range(3)  # how a leaf's value goes into its dtype's values

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

SEQUENCES = (list, tuple, np.ndarray, bytes)  # a str is one value: an enum's name; so is a 0-d array

def _is_sequence(value: Any) -> bool: return type(value) in SEQUENCES and (type(value) is not np.ndarray or value.ndim > 0)

def _signature(values: dict[str, Any], sig: list, flat: list) -> None:
  """Depth-first: every key into `sig` (with its length for lists, bytes and arrays; a struct's between its key and None), every leaf
  value into `flat`. Two values with equal signatures have the same fields and list lengths."""
  for path, value in values.items():
    kind = type(value)
    if kind is dict:
      sig.append(path)
      _signature(value, sig, flat)
      sig.append(None)
    elif kind is list and value and type(value[0]) is dict:
      sig.append((path, len(value)))
      for item in value:
        _signature(item, sig, flat)
        sig.append(None)
    elif _is_sequence(value): sig.append((path, len(value))); flat.append(value)
    else: sig.append(path); flat.append(value)

def _count(value: Any) -> int:
  """How many flat values _signature gives for one value."""
  flat: list = []
  _signature({"": value}, [], flat)
  return len(flat)

def _view_indices(value: np.ndarray, source: np.ndarray) -> np.ndarray | None:
  """The indices into `source` (1-D float32) of a float32 view's elements in C order, or None when it is not a view of it."""
  base, at = source.__array_interface__["data"][0], value.__array_interface__["data"][0]
  if value.dtype != np.float32 or value.size == 0 or not base <= at < base + source.nbytes or (at - base) % 4 or any(st % 4 for st in value.strides):
    return None
  idx = np.arange(source.size)
  try: return np.ndarray(value.shape, idx.dtype, idx, (at - base) // 4 * idx.itemsize, tuple(st // 4 * idx.itemsize for st in value.strides)).ravel()
  except (TypeError, ValueError): return None  # reaches past the buffer's end

class EventTemplate:
  """One Event's bytes and where each leaf of values of this shape goes. Built from `values` (an Event-level {path: value}, the service
  struct as a dict under its name); `skipped`: the paths this schema lacks, as set_fields reports them. `static`: fields of the service
  struct held by the same objects every frame; those whose every writeable array is a float32 one the template can place are gathered
  from `source` or copied (the module's docstring says how), the others are written per frame like any field."""
  def __init__(self, service: str, values: dict[str, Any], static: Sequence[str] = (), source: np.ndarray | None = None):
    msg = new_message(service)
    self.skipped = set_fields(msg, values)
    with log.Event.from_bytes(msg.to_bytes()) as reader: event = reader.as_builder(num_first_segment_words=SEGMENT_WORDS)
    segments = event.to_segments()
    if len(segments) != 1: raise Unsupported(f"{len(segments)} segments")
    self.head, self.body = event.to_bytes()[:8], bytes(segments[0])
    flat: list = []
    _signature(values, [], flat)
    self.leaves: list[tuple[str, int, int] | None] = []  # per flat value: (dtype name, element index or bit, count), None if skipped
    self.enums: dict[int, dict[str, int]] = {}  # flat index of an enum leaf -> its enumerants (values may be names or numbers)
    _, root, dw, _pw = _pointer(self.body, 0)
    self._walk(event, values, root, dw, "")
    self.service, self.source, self.offered = service, source, tuple(static)
    gathered = self._gather(values, static, flat)
    self.static = {k: values[service][k] for k in gathered}  # field -> the object a frame's values must hold there
    self.static_keys, self.static_objects = tuple(self.static), tuple(self.static.values())
    parts = [[x for part in gathered.values() for x in part[i]] for i in range(3)]
    self.gather_dest = np.concatenate([np.zeros(0, np.int64), *parts[0]])  # float32 element indices in the body <- indices into source
    self.gather_src = np.concatenate([np.zeros(0, np.int64), *parts[1]])
    # float32 arrays refilled in place (each once, however many fields hold it), copied every frame: body[live_dest] = cat(live)[live_src]
    self.live = list({id(array): array for array, _ in parts[2]}.values())
    starts = dict(zip(map(id, self.live), np.cumsum([0] + [a.size for a in self.live])[:-1].tolist(), strict=True))
    self.live_dest = np.concatenate([np.zeros(0, np.int64), *(dest for _, dest in parts[2])])
    self.live_src = np.concatenate([np.zeros(0, np.int64), *(starts[id(array)] + np.arange(array.size) for array, _ in parts[2])])
    self.signature, _ = self.flatten(values)
    keep = [i for i in range(len(flat)) if not any(a <= i < b for a, b, *_ in self._ranges(values, gathered))]
    leaves, flat = [self.leaves[i] for i in keep], [flat[i] for i in keep]
    self.enums = enums = {j: self.enums[i] for j, i in enumerate(keep) if i in self.enums}  # now by the index in flatten's values
    # dtype -> (flat indices of array leaves, their element indices, [(flat index, SCALAR|SEQUENCE|ENUM)] of the others, their element indices):
    # arrays go through one concatenate, Python numbers through one conversion
    groups: dict[str, tuple[list, list, list, list]] = {}
    for i, leaf in enumerate(leaves):
      if leaf is None or leaf[0] in ("bool", "data"): continue
      arrays, array_dest, others, other_dest = groups.setdefault(leaf[0], ([], [], [], []))
      if type(flat[i]) is np.ndarray and flat[i].ndim and i not in enums: arrays.append(i); array_dest.extend(range(leaf[1], leaf[1] + leaf[2]))
      else:
        others.append((i, ENUM if i in enums else SEQUENCE if _is_sequence(flat[i]) else SCALAR))
        other_dest.extend(range(leaf[1], leaf[1] + leaf[2]))
    self.groups = {k: (a, np.asarray(ad, np.int64), o, np.asarray(od, np.int64)) for k, (a, ad, o, od) in groups.items()}
    self.bools = [(i, leaf[1]) for i, leaf in enumerate(leaves) if leaf is not None and leaf[0] == "bool"]
    self.data = [(i, leaf[1], leaf[2]) for i, leaf in enumerate(leaves) if leaf is not None and leaf[0] == "data"]

  def _ranges(self, values: dict[str, Any], fields: Sequence[str]) -> list[tuple[int, int, str]]:
    """(first, end, field) of the flat values of each of `fields` of the service struct."""
    out, at = [], 0
    for key, value in values.items():
      if key != self.service or type(value) is not dict:
        at += _count(value)
        continue
      for field, v in value.items():
        n = _count(v)
        if field in fields: out.append((at, at + n, field))
        at += n
    return out

  def _gather(self, values: dict[str, Any], static: Sequence[str], flat: list) -> dict[str, tuple[list, list, list]]:
    """{static field: (float32 element indices in the body, their indices into source, [(array, its body indices)] of the writeable
    arrays that are no view of it)} of the `static` fields whose every float32 array can be read so. Anything else in a static field is a
    constant the template's bytes already hold: a read-only array, a number, a string (the field's objects are the same every frame)."""
    out: dict[str, tuple[list, list, list]] = {}
    for first, end, field in self._ranges(values, static) if self.source is not None else ():
      dest, src, live = [], [], []
      for i in range(first, end):
        leaf, value = self.leaves[i], flat[i]
        if leaf is None or type(value) is not np.ndarray or not value.flags.writeable: continue  # not in this schema; a constant
        if leaf[0] != "float32" or value.dtype != np.float32 or value.size != leaf[2]: break
        if (at := _view_indices(value, self.source)) is not None: dest.append(np.arange(leaf[1], leaf[1] + leaf[2])); src.append(at)
        else: live.append((value, np.arange(leaf[1], leaf[1] + leaf[2])))
      else: out[field] = (dest, src, live)
    return out

  def holds(self, values: dict[str, Any]) -> bool:
    """Whether `values` hold this template's static objects: their floats can be gathered."""
    inner = values.get(self.service)
    return type(inner) is dict and all(map(operator.is_, map(inner.get, self.static_keys), self.static_objects))  # a C loop: ~25 fields per frame

  def flatten(self, values: dict[str, Any]) -> tuple[list, list]:
    """(signature, flat values) of `values` without the static fields: what serialize takes and what `signature` is compared with."""
    if self.static: values = {**values, self.service: {k: v for k, v in values[self.service].items() if k not in self.static}}
    sig: list = []
    flat: list = []
    _signature(values, sig, flat)
    return sig, flat

  @property
  def gathered(self) -> int:
    """How many floats come straight from the source buffer."""
    return len(self.gather_dest)

  @property
  def copied(self) -> int:
    """How many floats of static fields are copied from their own arrays each frame."""
    return len(self.live_dest)

  def _walk(self, struct: Any, values: dict[str, Any], word: int, data_words: int, prefix: str) -> None:
    """Record the leaves of `values` in `struct` (builder for the schema, its wire struct at `word` with `data_words`), in _signature's order."""
    for path, value in values.items():
      names = path.split(".")
      node, at, dw = self._parent(struct, word, data_words, names[:-1], prefix + path)
      if node is None or names[-1] not in node.schema.fieldnames: self._skip(value)
      else: self._leaf(node, names[-1], value, at, dw, prefix + path)

  def _parent(self, struct: Any, word: int, data_words: int, names: list[str], where: str) -> tuple[Any, int, int]:
    """The struct holding a dotted path's leaf, its wire word and data size, resolved as set_fields resolves paths (None: this schema lacks
    a struct on the way)."""
    node, at, dw = struct, word, data_words
    for name in names:
      if name not in node.schema.fieldnames: return None, at, dw
      f = node.schema.fields[name].proto
      if f.which() != "slot" or f.slot.type.which() != "struct": raise Unsupported(f"{where}: {name} is not a struct field")
      _, at, dw, _ = _pointer(self.body, at + dw + f.slot.offset)
      node = getattr(node, name)
    return node, at, dw

  def _leaf(self, node: Any, leaf: str, value: Any, at: int, dw: int, where: str) -> None:
    """One field of the struct `node` (wire word `at`, `dw` data words): a nested struct or struct list is walked, anything else recorded."""
    f = node.schema.fields[leaf]
    if f.proto.which() != "slot": raise Unsupported(f"{where} is a group")
    slot, pointer = f.proto.slot, at + dw + f.proto.slot.offset
    kind = slot.type.which()
    if isinstance(value, dict):
      _, target, cdw, _ = _pointer(self.body, pointer)
      self._walk(getattr(node, leaf), value, target, cdw, f"{where}.")
    elif isinstance(value, list) and value and isinstance(value[0], dict): self._struct_list(getattr(node, leaf), value, pointer, where)
    elif kind in ("list", "data", "text"): self._pointer_leaf(slot, kind, value, pointer, where)
    else: self._data_leaf(f, slot, kind, at, where)

  def _struct_list(self, items: Any, value: list[dict], pointer: int, where: str) -> None:
    _, target, size, _count = _pointer(self.body, pointer)
    tag = int.from_bytes(self.body[8 * target:8 * target + 8], "little")
    n, edw, epw = (tag >> 2) & 0x3FFFFFFF, (tag >> 32) & 0xFFFF, tag >> 48
    if size != 7 or n != len(value): raise Unsupported(f"{where}: not a struct list of {len(value)}")
    for i, item in enumerate(value): self._walk(items[i], item, target + 1 + i * (edw + epw), edw, f"{where}[].")

  def _pointer_leaf(self, slot: Any, kind: str, value: Any, pointer: int, where: str) -> None:
    """A list of numbers or a data field: where its elements lie."""
    _, target, size, count = _pointer(self.body, pointer)
    if kind == "list":
      elem = slot.type.list.elementType.which()
      if elem not in DTYPES or elem == "enum" or size not in LIST_ELEMENT_BYTES: raise Unsupported(f"{where}: a list of {elem}")
      width = LIST_ELEMENT_BYTES[size]
      if count != len(value) or (8 * target) % width: raise Unsupported(f"{where}: {count} elements for {len(value)} values")
      self.leaves.append((elem, 8 * target // width, count))
    elif kind == "data" and count == len(value): self.leaves.append(("data", 8 * target, count))
    else: raise Unsupported(f"{where}: {kind}")

  def _data_leaf(self, f: Any, slot: Any, kind: str, at: int, where: str) -> None:
    """A bool, number or enum in the struct's data section at wire word `at`."""
    if kind == "bool":
      if slot.defaultValue.bool: self.leaves.append(("bool", -(64 * at + slot.offset) - 1, 1))  # stored XORed with a true default
      else: self.leaves.append(("bool", 64 * at + slot.offset, 1))
    elif kind in DTYPES:
      if getattr(slot.defaultValue, kind): raise Unsupported(f"{where} has a default value")  # stored XORed with it
      if kind == "enum": self.enums[len(self.leaves)] = dict(f.schema.enumerants)
      width = np.dtype(DTYPES[kind]).itemsize
      self.leaves.append((kind, 8 * at // width + slot.offset, 1))
    else: raise Unsupported(f"{where}: {kind}")

  def _skip(self, value: Any) -> None:
    """A field this schema lacks: its flat values (one, or all of a dict's) are written nowhere."""
    flat: list = []
    _signature({"": value} if not isinstance(value, dict) else value, [], flat)
    self.leaves.extend([None] * len(flat))

  def serialize(self, flat: list[Any]) -> bytes:
    """The Event with the source's floats gathered and `flat` (flatten's values, of a frame whose signature is this template's) written in."""
    body = bytearray(self.body)
    if len(self.gather_dest): np.frombuffer(body, np.float32)[self.gather_dest] = self.source[self.gather_src]
    if self.live: np.frombuffer(body, np.float32)[self.live_dest] = (self.live[0] if len(self.live) == 1 else np.concatenate(self.live))[self.live_src]
    for dtype, (arrays, array_dest, others, other_dest) in self.groups.items():
      view = np.frombuffer(body, DTYPES[dtype])
      if arrays: view[array_dest] = np.concatenate([flat[i] for i in arrays])
      if others:
        values: list = []
        for i, kind in others:
          if kind == SEQUENCE: values.extend(flat[i])
          elif kind == SCALAR: values.append(flat[i])
          else: values.append(self.enums[i].get(flat[i], flat[i]))
        view[other_dest] = values
    for i, bit in self.bools:
      xor, bit = (True, -bit - 1) if bit < 0 else (False, bit)
      if bool(flat[i]) != xor: body[bit >> 3] |= 1 << (bit & 7)
      else: body[bit >> 3] &= ~(1 << (bit & 7)) & 0xFF
    for i, start, count in self.data: body[start:start + count] = flat[i]
    return self.head + bytes(body)

class Serializer:
  """Event bytes per service from Event-level values, through a template per service; a frame whose fields or list lengths differ from
  its template's builds a new one, and a message the template cannot place is built by pycapnp every frame."""
  def __init__(self):
    self.templates: dict[str, EventTemplate] = {}
    self.unsupported: dict[str, list] = {}  # service -> the signature no template could be built for

  def serialize(self, service: str, values: dict[str, Any], static: Sequence[str] = (), source: np.ndarray | None = None) -> tuple[bytes, list[str]]:
    """(bytes, paths this schema lacks: non-empty only on frames that built a template or went through pycapnp). `static`, `source`: the
    service struct's fields a new template may gather from the source buffer (EventTemplate)."""
    template = self.templates.get(service)
    if template is not None and template.offered == tuple(static) and template.holds(values):  # offered other static fields: rebuilt
      sig, flat = template.flatten(values)
      if template.signature == sig: return template.serialize(flat), []
    sig = []
    _signature(values, sig, [])
    if self.unsupported.get(service) != sig:
      try:
        self.templates[service] = template = EventTemplate(service, values, static, source)
        return template.serialize(template.flatten(values)[1]), template.skipped
      except Unsupported:
        self.unsupported[service] = sig
    msg = new_message(service)
    skipped = set_fields(msg, values)
    return msg.to_bytes(), skipped
