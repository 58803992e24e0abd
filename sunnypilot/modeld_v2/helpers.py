"""Loading bundles for the runtime, with an on-disk cache of fused parts."""
from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from sunnypilot.modeld_v2.artifact import MAGIC, PREAMBLE, ArtifactError, PlainJit, read_parts, tinygrad_version, write_bundle

MAX_CACHE_ENTRIES = 8  # fused parts of the last few model/warp combinations; older ones are removed

def cache_dir() -> str:
  """Where fused parts are cached: $MODELD_V2_CACHE, else ~/.cache/sunnypilot_modeld_v2."""
  return os.environ.get("MODELD_V2_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "sunnypilot_modeld_v2")

def content_hash(path: str) -> str:
  """A bundle's content hash is in its preamble (checked in full whenever the bundle is read); other files are hashed."""
  with open(path, "rb") as f: head = f.read(PREAMBLE.size)
  if len(head) == PREAMBLE.size and head[:len(MAGIC)] == MAGIC: return PREAMBLE.unpack(head)[3].hex()
  with open(path, "rb") as f: return hashlib.file_digest(f, "sha256").hexdigest()

def _cache_key(path: str, extend: Callable, device: str) -> str | None:
  """Content hashes of every file the load reads, the extension's identity and arguments, the tinygrad version and the device."""
  fn = extend.func if isinstance(extend, functools.partial) else extend
  args = list(extend.args) + sorted(extend.keywords.items()) if isinstance(extend, functools.partial) else []
  files = [a for a in args if isinstance(a, str) and os.path.isfile(a)]
  if any(not isinstance(a, (str, int, float, bool, tuple)) for a in args): return None  # arguments we cannot key on: no caching
  key = {"model": content_hash(path), "extend": f"{fn.__module__}.{fn.__qualname__}", "args": [content_hash(a) if a in files else a for a in args],
         "tinygrad": tinygrad_version(), "device": device}
  return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:32]

def _prune_cache(folder: str) -> None:
  entries = sorted((e for e in os.scandir(folder) if e.name.endswith(".bin")), key=lambda e: e.stat().st_mtime, reverse=True)
  for e in entries[MAX_CACHE_ENTRIES:]: os.remove(e.path)

def load_model(path: str, cache: bool = True, extend: Callable | None = None, device: str | None = None, allow_device: bool = False) -> dict[str, Any]:
  """Read a bundle, apply `extend` (e.g. `functools.partial(frame_part, warp_path)`), return `{"run", "input_specs", "output_specs", "metadata"}`.

  With `extend`, the result is cached on disk as a plain bundle keyed by content (never the input bindings); `cache=False` bypasses it.
  `allow_device` loads a bundle built for another device anyway: mock execution of QCOM bundles on NULL."""
  from tinygrad import Device
  dev = Device.canonicalize(device)
  cached = os.path.join(cache_dir(), f"{key}.bin") if cache and extend is not None and (key := _cache_key(path, extend, dev)) else None
  parts = None
  if cached and os.path.exists(cached):
    try: parts, extras = read_parts(cached, dev, allow_device)
    except ArtifactError as e: print(f"load_model: ignoring a bad cache entry {cached}: {e}", file=sys.stderr)
  if parts is None:
    parts, extras = read_parts(path, dev, allow_device)
    if extend is not None: parts, extras = extend(parts, extras)
    if cached:
      try:
        os.makedirs(os.path.dirname(cached), exist_ok=True)
        write_bundle(cached, {name: (h, bytes(b)) for name, (h, b) in parts.items()}, extras)
        _prune_cache(os.path.dirname(cached))
      except OSError as e: print(f"load_model: cannot write the load cache ({e}); continuing without it", file=sys.stderr)
  return {"run": PlainJit(*parts["run"], device=dev), "input_specs": extras.get("input_specs", {}), "output_specs": extras.get("output_specs", {}),
          "metadata": extras.get("metadata", {})}
