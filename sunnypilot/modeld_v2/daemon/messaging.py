"""cereal messaging: the device's own (openpilot's cereal.messaging, of the schema daemon/schema.py found), else a thin PubMaster/SubMaster
over msgq with the schema openpilot-logging bundles.

Same topic names and message fields as openpilot. On a PC, OPENPILOT_PREFIX selects a private namespace (/dev/shm/msgq_<prefix>).
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.daemon.schema import SCHEMA, log
from sunnypilot.modeld_v2.daemon.topics import TOPICS

_openpilot_messaging = SCHEMA.messaging if SCHEMA is not None else None

NO_TRAVERSAL_LIMIT = 2**64 - 1

def ensure_prefix_dir() -> None:
  """msgq needs /dev/shm/msgq_<prefix> to exist before the first socket (openpilot's OpenpilotPrefix makes it)."""
  if prefix := os.environ.get("OPENPILOT_PREFIX"): os.makedirs(f"/dev/shm/msgq_{prefix}", exist_ok=True)

SCHEMA_SERVICES = frozenset(SCHEMA.services if SCHEMA is not None else ())

def has_service(name: str) -> bool: return name in SCHEMA_SERVICES

def _struct_at(nodes: dict[str, tuple[Any, frozenset[str]] | None], lengths: dict[str, int], key: str) -> tuple[Any, frozenset[str]] | None:
  """The struct at dotted path `key` (a number picks an element of a struct list, which is made `lengths[list path]` long where it is
  first met) and its field names, None where this schema lacks one on the way; `nodes` caches them per call. A module function, not a
  closure: a closure calling itself is a reference cycle, and modeld runs with the garbage collector off."""
  if key not in nodes:
    head, _, name = key.rpartition(".")
    if name.isdigit():
      listed = head.rpartition(".")
      up = _struct_at(nodes, lengths, listed[0])
      if up is None or listed[2] not in up[1]: nodes[key] = None
      else:
        if (items := nodes.get(head)) is None: items = nodes[head] = (up[0].init(listed[2], lengths[head]), frozenset())
        node = items[0][int(name)]
        nodes[key] = (node, frozenset(node.schema.fieldnames))
    else:
      up = _struct_at(nodes, lengths, head)
      node = getattr(up[0], name) if up is not None and name in up[1] else None
      nodes[key] = None if node is None else (node, frozenset(node.schema.fieldnames))
  return nodes[key]

def list_lengths(paths: Any) -> dict[str, int]:
  """{struct list path: its length} of flat field paths ("laneLines.3.x": laneLines is at least 4 long)."""
  lengths: dict[str, int] = {}
  for path in paths:
    names = path.split(".")
    for k, name in enumerate(names):
      if name.isdigit(): lengths[".".join(names[:k])] = max(lengths.get(".".join(names[:k]), 0), int(name) + 1)
  return lengths

def set_fields(builder: Any, fields: dict[str, Any]) -> list[str]:
  """Write {dotted field path: value} into a capnp struct builder ("laneLines.2.x": one element of a struct list; an array or a list fills
  a list), setting only fields this schema has: openpilot's cereal and the bundled one differ. Returns the paths it skipped. Each struct
  on the way is looked up, and its field names read, once per call."""
  skipped, lengths = [], list_lengths(fields)
  nodes: dict[str, tuple[Any, frozenset[str]] | None] = {"": (builder, frozenset(builder.schema.fieldnames))}  # parent path -> struct, names
  for path, value in fields.items():
    head, _, leaf = path.rpartition(".")
    if (up := _struct_at(nodes, lengths, head)) is None or leaf not in up[1]: skipped.append(path)
    else: setattr(up[0], leaf, value.tolist() if isinstance(value, np.ndarray) else value)
  return skipped

def lateral_delay(sm: Any, fallback: float) -> float:
  """openpilot's modeld steers with the lateral delay topic's lateralDelay (lateralDelay today, liveDelay before); the bundled schema has
  none, and before the first message there is no estimate: then `fallback` (the configured delay)."""
  topic = TOPICS.lateral_delay
  return float(sm[topic].lateralDelay) if topic is not None and sm.seen.get(topic) else fallback

def new_message(service: str, valid: bool = True) -> Any:
  if _openpilot_messaging is not None: return _openpilot_messaging.new_message(service, valid=valid)
  msg = log.Event.new_message(logMonoTime=time.monotonic_ns(), valid=valid)
  msg.init(service)
  return msg

class PubMaster:
  def __init__(self, services: list[str]):
    import msgq
    ensure_prefix_dir()
    self.socks = {s: msgq.pub_sock(s) for s in services}

  def send(self, service: str, msg: Any) -> None:
    self.socks[service].send(msg.to_bytes() if hasattr(msg, "to_bytes") else msg)

class SubMaster:
  """Latest message per service; `updated` says which arrived in the last update(). Unknown services in this schema are skipped.
  A message that is not an Event of its service (bytes that are not capnp, another event type, a root or struct pointer past its end) is
  dropped: `dropped` counts them per service in the last update(), as `updated` says which arrived, and `drop_reason` says why the last
  one was. A message is kept as capnp's reader of its bytes, as openpilot's SubMaster keeps it: a list inside is bounds-checked only when
  it is read (KjException then; BusInputs reads lists so). (A zero-length message still aborts in msgq's receive, before Python.)"""
  def __init__(self, services: list[str]):
    import msgq
    ensure_prefix_dir()
    self.services = [s for s in services if has_service(s)]
    self.socks = {s: msgq.sub_sock(s, conflate=True, timeout=0) for s in self.services}
    self.data: dict[str, Any] = {s: getattr(new_message(s), s) for s in self.services}
    self.updated = dict.fromkeys(self.services, False)
    self.seen = dict.fromkeys(self.services, False)
    self.valid = dict.fromkeys(self.services, False)  # the last message's Event.valid, as openpilot's SubMaster keeps it
    self.logMonoTime = dict.fromkeys(self.services, 0)  # and its Event.logMonoTime
    self.recv_frame = dict.fromkeys(self.services, 0)
    self.dropped = dict.fromkeys(self.services, 0)
    self.drop_reason: dict[str, str] = {}
    self.frame = 0

  def update(self, timeout_ms: int = 0) -> None:
    self.frame += 1
    deadline = time.monotonic() + timeout_ms / 1000
    self.updated = dict.fromkeys(self.services, False)
    self.dropped = dict.fromkeys(self.services, 0)
    while True:
      for s, sock in self.socks.items():
        if (raw := sock.receive(non_blocking=True)) is not None and self._read(s, raw):
          self.updated[s] = self.seen[s] = True
          self.recv_frame[s] = self.frame
      if any(self.updated.values()) or time.monotonic() >= deadline: return
      time.sleep(0.001)

  def _read(self, service: str, raw: bytes) -> bool:
    """Keep `raw` as the latest `service` message if it is one; else count it as dropped."""
    import capnp
    raw = raw if type(raw) is bytes else bytes(raw)  # the reader pins bytes; the view of any other buffer is released when the block ends
    try:
      # kept past the block and read frame after frame, without capnp's traversal limit: openpilot's log_from_bytes (cereal/messaging @e4439232)
      with log.Event.from_bytes(raw, traversal_limit_in_words=NO_TRAVERSAL_LIMIT) as event:
        if (kind := str(event.which())) != service: raise ValueError(f"an Event of type {kind}")
      self.data[service], self.valid[service], self.logMonoTime[service] = getattr(event, service), event.valid, event.logMonoTime
      return True
    except (capnp.KjException, ValueError) as e:
      self.dropped[service] += 1
      self.drop_reason[service] = str(e).splitlines()[0][:120] if str(e) else type(e).__name__
      return False

  def __getitem__(self, service: str) -> Any: return self.data[service]

def pub_master(services: list[str]) -> Any:
  return _openpilot_messaging.PubMaster(services) if _openpilot_messaging is not None else PubMaster(services)

def sub_master(services: list[str]) -> Any:
  return _openpilot_messaging.SubMaster([s for s in services if has_service(s)]) if _openpilot_messaging is not None else SubMaster(services)

def claim_bus(daemon: str = "modeld") -> socket.socket | None:
  """One `daemon` (modeld, dmonitoringmodeld) per bus: an abstract unix socket named for it and OPENPILOT_PREFIX, held while this process
  lives (the kernel drops it on any exit, so nothing is left behind). None if another holds it: msgq would let the newcomer take the topics
  and kill the first."""
  sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  try: sock.bind(f"\0sunnypilot_modeld_v2:{daemon}:{os.environ.get('OPENPILOT_PREFIX', '')}")
  except OSError:
    sock.close()
    return None
  return sock
