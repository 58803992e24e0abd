"""Loading bundles for the runtime."""
from __future__ import annotations

from typing import Any

from sunnypilot.modeld_v2.artifact import PlainJit, read_parts

def load_model(path: str, device: str | None = None) -> dict[str, Any]:
  """Read a bundle and return `{"run": PlainJit, "input_specs", "output_specs", "metadata"}`."""
  parts, extras = read_parts(path, device)
  return {"run": PlainJit(*parts["run"], device=device), "input_specs": extras.get("input_specs", {}),
          "output_specs": extras.get("output_specs", {}), "metadata": extras.get("metadata", {})}
