"""What modeld's SubMaster holds while a segment is replayed: the latest logged struct per input service, which were seen, and which the
events sent since the previous frame updated. The replay's reference checks read it as modeld reads its SubMaster."""
from __future__ import annotations

from typing import Any

from sunnypilot.modeld_v2.daemon.messaging import has_service, new_message
from sunnypilot.modeld_v2.replay.route_segment import INPUT_SERVICES

class LogState:
  """What modeld's SubMaster holds after the events published so far: the latest struct per service, which were seen, and which were
  updated by the events sent since the previous frame (modeld reads them all at once when the frame arrives)."""
  def __init__(self):
    services = [s for s in INPUT_SERVICES if has_service(s)]
    self.data = {s: getattr(new_message(s), s) for s in services}
    self.seen = dict.fromkeys(services, False)
    self.updated = dict.fromkeys(services, False)

  def update(self, service: str, data: Any) -> None: self.data[service], self.seen[service], self.updated[service] = data, True, True

  def next_frame(self) -> None:
    """The events sent from now on reach modeld with the next frame."""
    self.updated = dict.fromkeys(self.updated, False)

  def snapshot(self) -> LogState:
    """This state as it is now (update replaces entries, never changes them: a shallow copy is enough)."""
    copy = LogState.__new__(LogState)
    copy.data, copy.seen, copy.updated = dict(self.data), dict(self.seen), dict(self.updated)
    return copy

  def __getitem__(self, service: str) -> Any: return self.data[service]
