"""What every benchmark script shares: percentiles of its timings, its markdown tables, its log lines on stderr, and its JSON (the path
checked before the run, the file written atomically after)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path, replaced_atomically

def percentiles(values: Sequence[float], qs: Sequence[int] = (10, 50, 95, 99), max_and_n: bool = True) -> dict[str, float]:
  """{"p10": ..., "p50": ..., ...} of `values` at each of `qs`, with their "max" and count "n" (`max_and_n`); {} for no values."""
  if not len(values): return {}
  a = np.asarray(values, np.float64)
  return {f"p{q}": float(np.percentile(a, q)) for q in qs} | ({"max": float(a.max()), "n": len(a)} if max_and_n else {})

def markdown_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
  """The header, its rule and a line per row, each cell as str() writes it."""
  line = lambda cells: "| " + " | ".join(str(c) for c in cells) + " |"
  return "\n".join([line(header), "|---" * len(header) + "|", *(line(row) for row in rows)])

def logger(prefix: str = "") -> Callable[[str], None]:
  """A benchmark's progress lines, each after `prefix`: on stderr at once, so stdout holds only its tables."""
  return lambda line: print(f"{prefix}{line}", file=sys.stderr, flush=True)

def check_outputs(parser: argparse.ArgumentParser, *paths: str | None) -> None:
  """Before a benchmark runs: each output asked for (JSON, PNG) can be written (folders made); otherwise one line and exit 2."""
  for path in filter(None, paths):
    try:
      os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
      check_output_path(path)
    except (ArtifactError, OSError) as e: parser.exit(2, f"{parser.prog}: error: {e}\n")

def write_json(path: str | None, data: Any) -> None:
  """Write a benchmark's results as JSON (if asked), atomically."""
  if not path: return
  with replaced_atomically(path) as (tmp,), open(tmp, "x") as f: json.dump(data, f, indent=2, default=str)
