"""Which tinygrad this process imported, read from the imported package itself, never from pip's metadata, and which bundles it replays.

A comma device imports openpilot's own tinygrad checkout (a symlinked git checkout with no pip metadata: openpilot selfdrive @084747c pins
tinygrad 138fb4a, which states version 0.13.0); a PC imports PyPI's 0.14.0. pip's metadata is found by name on sys.path, so it may
belong to other code than the package imported (a checkout in front of a stale dist-info), or be absent. So the identity is the package's:
- `version`: what the imported code states. tinygrad has no `__version__`; `helpers.fetch` sends the release's version as its User-Agent
  ("tinygrad 0.14.0"; 138fb4a's says 0.13.0).
- `source`: sha256 over the package's .py files (their paths and bytes), so code under a wrong version, or a patched release, is told apart.

Supported are the two sources in SUPPORTED (the seam runtime/tinygrad_internals knows both's internals). A bundle records the identity of
the tinygrad that built it, and a runtime replays it only with exactly that source (`replays`): its CPU binaries, launch records and the
internals its replay leans on are that tinygrad's, and two sources of one version can differ in any of them (138fb4a states 0.13.0 like
PyPI's 0.13.0, months apart; 0.14.0's ELF kernels run by 138fb4a's CPU runtime are a SIGSEGV). No two supported sources share a version,
so there is no same-version, known-compatible pair to allow. A bundle that records a version alone (written before sources were recorded)
is replayed where the imported tinygrad states that version.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
from collections.abc import Mapping
from typing import NamedTuple

import tinygrad

# sha256 (`source_digest`) of each supported tinygrad's package -> (the version it states, what it is). Supporting another one takes its
# internals in runtime/tinygrad_internals (its contract tests green) and its digest here (`imported_tinygrad().source` with it imported)
SUPPORTED: dict[str, tuple[str, str]] = {
  "3bfb950af0ef3ec9c04f4a43fed6e2ff7f838f0daa63d350be94c17badb0f6cf": ("0.14.0", "PyPI's 0.14.0"),
  "18caea9d7fd7149c97d6a1df036da4e51051f1374a1e2411210127d23a99693b": ("0.13.0", "openpilot's 138fb4a"),
}
STATED_VERSION = re.compile(rb'"User-Agent": "tinygrad ([0-9][^"\s]*)"')  # in helpers.py's fetch

class TinygradIdentity(NamedTuple):
  """A tinygrad package: the version its code states, sha256 over its .py files (hex), and its folder."""
  version: str
  source: str
  folder: str

  @property
  def release(self) -> str | None:
    """What the package is when it is a supported tinygrad ("PyPI's 0.14.0", "openpilot's 138fb4a"), else None."""
    return SUPPORTED[self.source][1] if self.source in SUPPORTED else None

  def __str__(self) -> str: return describe(self.version, self.source)

def source_digest(folder: str) -> str:
  """sha256 over every .py file under `folder` (not in __pycache__), in order of their relative paths (with "/"), each as its path, a NUL,
  its size as 8 bytes little endian, and its bytes. What pip installs and what git checks out of one commit hash alike."""
  paths = sorted(os.path.relpath(os.path.join(d, f), folder).replace(os.sep, "/") for d, _, files in os.walk(folder)
                 if "__pycache__" not in os.path.relpath(d, folder).split(os.sep) for f in files if f.endswith(".py"))
  h = hashlib.sha256()
  for rel in paths:
    with open(os.path.join(folder, rel), "rb") as f: data = f.read()
    h.update(rel.encode() + b"\0" + len(data).to_bytes(8, "little") + data)
  return h.hexdigest()

def stated_version(folder: str) -> str:
  """The version a tinygrad package's code states ("unknown" where its helpers.py states none)."""
  try:
    with open(os.path.join(folder, "helpers.py"), "rb") as f: found = STATED_VERSION.search(f.read())
  except OSError: found = None
  return found.group(1).decode() if found else "unknown"

def identify(folder: str) -> TinygradIdentity:
  """The identity of the tinygrad package in `folder`."""
  return TinygradIdentity(stated_version(folder), source_digest(folder), folder)

@functools.cache
def imported_tinygrad() -> TinygradIdentity:
  """The identity of the tinygrad this process imported (its folder with symlinks resolved: openpilot links its checkout in), read once."""
  return identify(os.path.dirname(os.path.realpath(tinygrad.__file__)))

def describe(version: object, source: object = None) -> str:
  """A tinygrad in words: "tinygrad 0.13.0 (openpilot's 138fb4a)", "tinygrad 0.14.0 (source 1a2b3c4d5e6f)", or the version alone."""
  name = f"tinygrad {version!s:.40}"  # a crafted header's field: bounded
  if not isinstance(source, str): return name
  release = SUPPORTED.get(source)
  return f"{name} ({release[1]})" if release is not None and release[0] == version else f"{name} (source {source[:12]})"

def unsupported(here: TinygradIdentity) -> str | None:
  """Why no bundle is replayed with `here`, in one line; None for a supported tinygrad."""
  if here.release is not None: return None
  known = ", ".join(f"{version} ({what})" for version, what in SUPPORTED.values())
  return f"{here} at {here.folder} is not a tinygrad this runtime supports ({known}): install tinygrad==0.14.0 or run openpilot's checkout"

def replays(provenance: Mapping[str, object], here: TinygradIdentity) -> bool:
  """Whether a bundle of this provenance is replayed with `here`: exactly the source that built it; for a bundle that records no source,
  the version (see the module's docstring)."""
  if "tinygrad_source" in provenance: return provenance["tinygrad_source"] == here.source
  return provenance.get("tinygrad") == here.version
