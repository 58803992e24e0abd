"""Every name the seed's code calls that this package spells otherwise, in one place (the seed imports them from helpers.py):

- `_Jit`, `PlainJit`: the Replay class.
- `load_model(path, cache=True, extend=None)`: loader.load_bundle, or with `extend=functools.partial(frame_part, warp_path)` loader.load_fused;
  the result is a LoadedBundle, which the seed indexes as a dict (`bundle["run"]`: LoadedBundle.__getitem__).
- `SeedAdapterNames`: the seed adapter's `jits`, `run_model` and `input_queues` on NativeTinygradAdapter.
- Kept at the seed's own import paths, not here: `compile_modeld`'s POLICY_INPUTS, derive_frame_skip, make_split_input_queues and
  make_supercombo_input_queues (defined in input_queues), and `frame_fusion`'s pack_layout, SPLIT_FRAMES
  and frame_part (defined there).
"""
from __future__ import annotations

import functools
from typing import Any

from sunnypilot.modeld_v2.runtime.frame_fusion import frame_part
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
from sunnypilot.modeld_v2.runtime.loader import LoadedBundle, load_bundle, load_fused

_Jit = PlainJit = Replay

def load_model(path: str, cache: bool = True, extend: Any = None, device: str | None = None, allow_device: bool = False) -> LoadedBundle:
  """The seed's load. `cache` is accepted and has no effect: a fused load reads and fuses in memory (fusing costs less than reading a cached
  result would). `extend` takes the one extension the seed has: `functools.partial(frame_part, warp_path)`, a fused load."""
  if extend is None: return load_bundle(path, device, allow_device)
  if not (isinstance(extend, functools.partial) and extend.func is frame_part and len(extend.args) == 1 and not extend.keywords):
    raise TypeError("extend takes functools.partial(frame_part, warp_path): fusing a warp is the one extension")
  return load_fused(path, extend.args[0], device, allow_device)

class SeedAdapterNames:
  """The seed adapter's attribute names: `jits` the loaded bundle, `run_model` its Replay, `input_queues` the state tensors."""
  bundle: LoadedBundle
  replay: Replay
  states: dict

  @property
  def jits(self) -> LoadedBundle: return self.bundle
  @property
  def run_model(self) -> Replay: return self.replay
  @property
  def input_queues(self) -> dict: return self.states
