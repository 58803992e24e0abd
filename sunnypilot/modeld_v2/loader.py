"""Loading bundles for the runtime: one bundle (`load_model`), or a model with a warp fused in front (`load_fused`), whose fused part is
cached on disk under an explicit key: both content hashes, the fusion version, the tinygrad version and the device.

The cache folder must belong to this user and be writable by no one else (its entries hold native code); otherwise it is skipped. An entry
is used only when it records the key it was built for; anything unreadable or mismatched is rebuilt. Every load, a cache hit included,
reads and checks the model and warp bundles whole, once each, and keys on the hash of exactly the bytes it read.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
from typing import Any

from sunnypilot.modeld_v2.bundle import FORMAT_VERSION, ArtifactError, read_parts, read_parts_hashed, tinygrad_version, write_bundle
from sunnypilot.modeld_v2.frame_fusion import FUSION_VERSION, frame_part, fuse
from sunnypilot.modeld_v2.replay import replay_part

MAX_CACHE_ENTRIES = 8  # fused parts of the last few model/warp combinations; older ones are removed
CACHE_SUFFIX = ".fused.bin"

log = logging.getLogger(__name__)

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

def cache_dir() -> str:
  """Where fused parts are cached: $MODELD_V2_CACHE, else ~/.cache/sunnypilot_modeld_v2."""
  return os.environ.get("MODELD_V2_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sunnypilot_modeld_v2")

def fused_key(model_hash: str, warp_hash: str, device: str) -> dict[str, Any]:
  """Everything a fused part depends on: the content hashes of the model and warp bundles as read, and what reads them."""
  return {"model": model_hash, "warp": warp_hash, "fusion": FUSION_VERSION, "format": FORMAT_VERSION, "tinygrad": tinygrad_version(), "device": device}

def cache_entry(folder: str, key: dict[str, Any]) -> str:
  """The one file name a key's fused part may have in the cache folder (nothing else there is ever read)."""
  return os.path.join(folder, hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32] + CACHE_SUFFIX)

def private_folder(folder: str) -> bool:
  """Create the cache folder for this user alone, or check an existing one: ours, and not writable by group or others."""
  try:
    os.makedirs(folder, mode=0o700, exist_ok=True)
    st = os.stat(folder)
  except OSError as e:
    log.warning(f"cannot use the load cache {folder} ({e.strerror or e}); loading without it")
    return False
  if st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    log.warning(f"not using the load cache {folder}: it must belong to this user and be writable by no one else (owner uid {st.st_uid}, "
        f"mode {stat.filemode(st.st_mode)}); loading without it")
    return False
  return True

def _cached(path: str, key: dict, device: str, allow_device: bool) -> tuple[dict, dict] | None:
  if not os.path.lexists(path): return None
  try: parts, extras = read_parts(path, device, allow_device)
  except ArtifactError as e:
    log.warning(f"ignoring a bad cache entry: {e}")
    return None
  if extras.get("metadata", {}).get("fused", {}).get("key") != key:
    log.warning(f"ignoring cache entry {path}: it was not built from these bundles")
    return None
  return parts, extras

def _store(folder: str, path: str, parts: dict, extras: dict) -> None:
  try:
    write_bundle(path, parts, extras)
    entries = sorted((e for e in os.scandir(folder) if e.name.endswith(CACHE_SUFFIX) and e.is_file()), key=lambda e: e.stat().st_mtime, reverse=True)
    for e in entries[MAX_CACHE_ENTRIES:]: os.remove(e.path)
  except OSError as e: log.warning(f"cannot write the load cache ({e.strerror or e}); continuing without it")
  except ArtifactError as e: log.warning(f"cannot write the load cache ({e}); continuing without it")

def load_fused(model_path: str, warp_path: str, device: str | None = None, cache: bool = True, allow_device: bool = False,
               mapped: tuple[str, ...] = ()) -> dict[str, Any]:
  """A model bundle with a warp bundle fused in front (see frame_fusion), read for `device`; cached on disk by content unless cache=False.
  `allow_device` loads bundles built for another device anyway: mock execution of QCOM bundles on NULL. `mapped`: see Replay."""
  dev = load_device(device)
  # each file is read and checked whole, once, on every load (a cache hit too): the key is the hash of the very bytes read, so a file
  # replaced or truncated at any moment is either what gets fused or an error, never a stale entry under a new key
  *model, model_hash = read_parts_hashed(model_path, dev, allow_device)
  *warp, warp_hash = read_parts_hashed(warp_path, dev, allow_device)
  key = fused_key(model_hash, warp_hash, dev)
  folder = cache_dir()
  entry = cache_entry(folder, key)
  use_cache = cache and private_folder(folder)
  if not use_cache or (hit := _cached(entry, key, dev, allow_device)) is None:
    parts, extras = fuse(tuple(model), tuple(warp), os.path.basename(warp_path))
    extras["metadata"]["fused"]["key"] = key
    if use_cache: _store(folder, entry, parts, extras)
  else:
    parts, extras = hit
    with contextlib.suppress(OSError): os.utime(entry)  # the cache keeps the most recently used entries
  return loaded(parts, extras, dev, mapped)

def load_model(path: str, cache: bool = True, extend: Any = None, device: str | None = None, allow_device: bool = False) -> dict[str, Any]:
  """Read a bundle for `device`: `{"run": Replay, "input_specs", "output_specs", "metadata"}`. The seed's spelling of a fused load,
  `extend=functools.partial(frame_part, warp_path)`, is `load_fused(path, warp_path, ...)`."""
  if extend is not None:
    if not (isinstance(extend, functools.partial) and extend.func is frame_part and len(extend.args) == 1 and not extend.keywords):
      raise TypeError("extend takes functools.partial(frame_part, warp_path): fusing a warp is the one extension")
    return load_fused(path, extend.args[0], device, cache, allow_device)
  dev = load_device(device)
  return loaded(*read_parts(path, dev, allow_device), dev)

def loaded(parts: dict, extras: dict, device: str, mapped: tuple[str, ...] = ()) -> dict[str, Any]:
  if "run" not in parts: raise ArtifactError(f"the bundle has no 'run' part (parts: {sorted(parts)})")
  return {"run": replay_part(*parts["run"], device=device, mapped=mapped, name="the bundle's 'run' part"), "input_specs": extras.get("input_specs", {}),
          "output_specs": extras.get("output_specs", {}), "metadata": extras.get("metadata", {})}
