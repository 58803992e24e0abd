"""Loading bundles for the runtime: one bundle (`load_bundle`), or a model with a warp fused in front (`load_fused`), each as a
`LoadedBundle`: the 'run' part as a Replay, typed specs and the metadata (with the fused part's host layout as a `FusedLayout`).

Every load reads and checks each bundle whole, and fuses in memory: fusing is a pure data transform that costs well under a millisecond,
less than reading any file that could hold its result, so nothing is cached on disk (benchmarks/bench_artifact.py measures both).
"""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import TensorSpec, read_parts, state_names
from sunnypilot.modeld_v2.runtime.frame_fusion import FusedLayout, frame_part
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay, replay_part

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class LoadedBundle:
  """A bundle read for a device: the 'run' part as a Replay, its typed specs and metadata."""
  run: Replay
  input_specs: dict[str, TensorSpec]
  output_specs: dict[str, TensorSpec]
  metadata: dict[str, Any]
  fused: FusedLayout | None  # a fused part's host layout; None for a bundle that is not one

  @property
  def state_names(self) -> list[str]: return state_names(self.input_specs, self.output_specs)


def load_device(device: str | None = None) -> str:
  """The device to load on, opened. Opening it may compile tinygrad's own helper kernels, which tinygrad caches under ~/.cache: with a
  HOME this user cannot write, that disk cache is switched off for the process (the loader itself compiles nothing)."""
  from tinygrad import Device, helpers
  folder = os.path.dirname(helpers.CACHEDB)
  try:
    os.makedirs(folder, exist_ok=True)
    writable = os.access(folder, os.W_OK)
  except OSError: writable = False
  if not writable and helpers.CACHELEVEL.value > 0:
    log.warning(f"tinygrad's cache folder {folder} is not writable: its disk cache is off for this process")
    helpers.CACHELEVEL.value = 0
  return Device.canonicalize(device)

def load_fused(model_path: str, warp_path: str, device: str | None = None, allow_device: bool = False, mapped: tuple[str, ...] = ()) -> LoadedBundle:
  """A model bundle with a warp bundle fused in front (see frame_fusion), both read for `device`. `allow_device` loads bundles built for
  another device anyway: mock execution of QCOM bundles on NULL. `mapped`: see Replay."""
  dev = load_device(device)
  return loaded(*frame_part(warp_path, *read_parts(model_path, dev, allow_device), dev, allow_device), dev, mapped)

def load_bundle(path: str, device: str | None = None, allow_device: bool = False) -> LoadedBundle:
  """Read a bundle for `device` (`allow_device`: as for load_fused)."""
  dev = load_device(device)
  return loaded(*read_parts(path, dev, allow_device), dev)

def loaded(parts: dict, extras: dict, device: str, mapped: tuple[str, ...] = ()) -> LoadedBundle:
  """A read (or fused) bundle's parts and extras as a LoadedBundle for `device`."""
  if "run" not in parts: raise ArtifactError(f"the bundle has no 'run' part (parts: {sorted(parts)})")
  meta = extras.get("metadata", {})
  return LoadedBundle(replay_part(*parts["run"], device=device, mapped=mapped, name="the bundle's 'run' part"), extras.get("input_specs", {}),
                      extras.get("output_specs", {}), meta, FusedLayout.from_json(meta["fused"]) if "fused" in meta else None)
