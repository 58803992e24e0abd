"""The seed's names, at the seed's import path (`from sunnypilot.modeld_v2.helpers import load_model`): each is one of the package's own
things under the spelling the seed's code calls, and nothing else in the package carries them.

- `_Jit`, `PlainJit`: the kernel replay (runtime/kernel_replay.Replay), bindings cached per input slot.
- `load_model(path, cache=True, extend=None)`: runtime/loader's load_bundle, or with `extend=functools.partial(frame_part, warp_path)` its
  load_fused; the result is indexed as a dict (`bundle["run"]`, "input_specs", "output_specs", "metadata").
- `NativeTinygradAdapter`: runtime/model_runner.ModelRunner with the seed adapter's `jits`, `run_model` and `input_queues`; `copy_frames`
  is the runner's own.
- `frame_part`, `pack_layout`, `SPLIT_FRAMES` (runtime/frame_fusion), `serialize_jit` (a captured TinyJit as `(header JSON, blob)`).
- compile_modeld keeps the queue names the seed's adapter imports from it: POLICY_INPUTS, derive_frame_skip, make_split_input_queues,
  make_supercombo_input_queues.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

from tinygrad.uop.ops import UOp

from sunnypilot.modeld_v2.compile.capture import JitInputs, jit_part
from sunnypilot.modeld_v2.runtime.frame_fusion import SPLIT_FRAMES, frame_part, pack_layout
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
from sunnypilot.modeld_v2.runtime.loader import LoadedBundle, load_bundle, load_fused
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
from sunnypilot.modeld_v2.runtime.tinygrad_internals import Jit

__all__ = ["SPLIT_FRAMES", "NativeTinygradAdapter", "PlainJit", "SeedBundle", "_Jit", "frame_part", "load_model", "pack_layout", "serialize_jit"]

_Jit = PlainJit = Replay
SEED_KEYS = ("run", "input_specs", "output_specs", "metadata")  # the seed's load_model returned a dict of these

@dataclasses.dataclass(frozen=True)
class SeedBundle(LoadedBundle):
  """A loaded bundle that code written against the seed's dict indexes: `bundle["run"]`, `in`, `.get`."""
  def __getitem__(self, key: str) -> Any:
    if key not in SEED_KEYS: raise KeyError(key)
    return getattr(self, key)

  def __contains__(self, key: object) -> bool: return key in SEED_KEYS

  def get(self, key: str, default: Any = None) -> Any: return self[key] if key in SEED_KEYS else default

def load_model(path: str, cache: bool = True, extend: object = None, device: str | None = None, allow_device: bool = False) -> SeedBundle:
  """The seed's load. `cache` is accepted and has no effect: a fused load reads and fuses in memory (fusing costs less than reading a cached
  result would). `extend` takes the one extension the seed has: `functools.partial(frame_part, warp_path)`, a fused load."""
  if extend is None: loaded = load_bundle(path, device, allow_device)
  elif isinstance(extend, functools.partial) and extend.func is frame_part and len(extend.args) == 1 and not extend.keywords:
    loaded = load_fused(path, extend.args[0], device, allow_device)
  else: raise TypeError("extend takes functools.partial(frame_part, warp_path): fusing a warp is the one extension")
  return SeedBundle(**{f.name: getattr(loaded, f.name) for f in dataclasses.fields(loaded)})

class NativeTinygradAdapter(ModelRunner):
  """The seed adapter's attribute names: `jits` the loaded bundle, `run_model` its Replay, `input_queues` the state tensors."""
  @property
  def jits(self) -> LoadedBundle: return self.bundle
  @property
  def run_model(self) -> Replay: return self.replay
  @property
  def input_queues(self) -> dict: return self.states

def serialize_jit(run: Jit, linear: UOp, check: JitInputs, seed: int = 0, onetime: UOp | None = None, null_holds_data: bool = False) \
    -> tuple[dict, bytes]:
  """compile/capture's jit_part with the part's header as JSON: `(header, blob)`, the seed's form."""
  part, blob = jit_part(run, linear, check, seed, onetime, null_holds_data)
  return part.to_json(), blob
