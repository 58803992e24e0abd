"""The kernel-only floor of a fused frame on a GPU: its calls on the last frame's bindings, with no Python per input."""
from __future__ import annotations

from typing import Any

from tinygrad import Device

def device_floor_ms(adapter: Any, rounds: int = 200) -> list[float]:
  """GPU floor: the fused part's calls on the last frame's bindings (one graph) launched and waited for, back to back, no Python per input."""
  times = []
  for _ in range(rounds):
    Device[adapter.replay.device].synchronize()
    times.append(adapter.replay.run_bound(wait=True) * 1e3)
  return times
