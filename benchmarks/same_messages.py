"""Whether two route_replay runs published the same messages, byte for byte: each model daemon's output log (modeld_rlog.zst) read
message by message, the fields that measure time on the machine (Event.logMonoTime, modelExecutionTime, gpuExecutionTime) zeroed, and the
rest compared as the bytes a subscriber receives. A refactor that must not change behaviour is checked so: the same segment replayed by
the tree before and the tree after.

  python -m benchmarks.same_messages OUT_BEFORE/<segment>/modeld_rlog.zst OUT_AFTER/<segment>/modeld_rlog.zst
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter

MEASURED = {"modelV2": ("modelExecutionTime",), "drivingModelData": ("modelExecutionTime",), "driverStateV2": ("modelExecutionTime", "gpuExecutionTime")}

def canonical(event) -> tuple[str, bytes]:
  """(service, the message's bytes with its measured times zeroed)."""
  builder = event.as_builder()
  builder.logMonoTime = 0
  service = builder.which()
  for field in MEASURED.get(service, ()): setattr(getattr(builder, service), field, 0)
  return service, builder.to_bytes()

def messages(path: str) -> list[tuple[str, bytes]]:
  from openpilot_logging.logreader import LogReader
  return [canonical(event) for event in LogReader(path)]

def compare(before: list[tuple[str, bytes]], after: list[tuple[str, bytes]]) -> list[str]:
  """Every difference, as lines; none when the two logs hold the same messages in the same order."""
  counts = Counter(s for s, _ in before), Counter(s for s, _ in after)
  if counts[0] != counts[1]: return [f"messages per service differ: {dict(counts[0])} vs {dict(counts[1])}"]
  return [f"message {i} ({a[0]}) differs" for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="benchmarks.same_messages", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("before")
  p.add_argument("after")
  args = p.parse_args(argv)
  before, after = messages(args.before), messages(args.after)
  diffs = compare(before, after)
  services = dict(Counter(s for s, _ in after))
  print(f"{len(after)} messages {services}: " + ("the same bytes, measured times aside" if not diffs else f"{len(diffs)} differ"))
  for line in diffs[:20]: print(f"  {line}")
  return 1 if diffs else 0

if __name__ == "__main__":
  sys.exit(main())
