"""A manifest: the bundles of one model set, each by file name, role, content hash and size, as one JSON file in the set's folder.

  {"format": "spmv2-model-set", "version": 1, "name": "my-model-v2",
   "bundles": [{"file": "model.bin", "role": "driving_model", "sha256": "<the bundle's content hash>", "size": 16723642}, ...]}

`sha256` is the content hash the bundle's preamble declares (sha256 of header + blob), so a bundle is matched to its manifest from its
first bytes, before its blob is read, and its full read checks the rest. A set's folder holds its manifest (`manifest.json`, signed as
`manifest.json.sig`) and exactly the bundles it names: a bundle it does not name is a lie of the folder, refused as one. Names are plain
file names: no folder, no `..`, nothing hidden. Roles are plain words the daemons agree on (format/ knows none of them).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass

from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular, replaced_atomically
from sunnypilot.modeld_v2.format.bundle import PREAMBLE, check_content

MANIFEST_FORMAT, MANIFEST_VERSION = "spmv2-model-set", 1
MANIFEST_NAME = "manifest.json"
MAX_MANIFEST_BYTES = 1 << 20
MAX_BUNDLES = 1024  # a set is a handful of bundles (a driving model, its warps, a DM model and its warps): more is not a model set
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a set's name and a bundle's file name: one path component, nothing hidden
ROLE = re.compile(r"[a-z][a-z0-9_]{0,63}")
SHA256 = re.compile(r"[0-9a-f]{64}")

def plain_name(name: object, what: str, where: str) -> str:
  """`name` if it is one plain path component (no '/', no '..', not hidden); else one line naming `where`."""
  if not isinstance(name, str) or not NAME.fullmatch(name) or ".." in name:
    raise ArtifactError(f"{where}: {what} {name!r:.80} is not a plain name (letters, digits, '.', '_', '-'; no folder, no '..')")
  return name

@dataclass(frozen=True)
class Entry:
  file: str
  role: str
  sha256: str  # the bundle's content hash (its preamble's)
  size: int  # bytes of the file

  def to_json(self) -> dict: return {"file": self.file, "role": self.role, "sha256": self.sha256, "size": self.size}

@dataclass(frozen=True)
class Manifest:
  name: str
  bundles: tuple[Entry, ...]

  def to_json(self) -> dict:
    return {"format": MANIFEST_FORMAT, "version": MANIFEST_VERSION, "name": self.name, "bundles": [e.to_json() for e in self.bundles]}

  def entry(self, file: str) -> Entry | None: return next((e for e in self.bundles if e.file == file), None)

  def files(self, role: str) -> list[str]:
    """The files of one role, in the manifest's order."""
    return [e.file for e in self.bundles if e.role == role]

  @staticmethod
  def from_json(doc: object, where: str) -> Manifest:
    """A manifest from its JSON, every field checked; one line naming `where` for the first fault."""
    if not isinstance(doc, dict) or doc.get("format") != MANIFEST_FORMAT or doc.get("version") != MANIFEST_VERSION:
      raise ArtifactError(f"{where}: not a {MANIFEST_FORMAT} version {MANIFEST_VERSION} manifest")
    name = plain_name(doc.get("name"), "the set name", where)
    if not isinstance(items := doc.get("bundles"), list) or not items: raise ArtifactError(f"{where}: names no bundles")
    if len(items) > MAX_BUNDLES: raise ArtifactError(f"{where}: names {len(items):,} bundles, more than the {MAX_BUNDLES:,} a manifest may name")
    entries, seen = [], set()
    for e in items:
      if not isinstance(e, dict): raise ArtifactError(f"{where}: a bundle entry is {type(e).__name__}, not an object")
      file = plain_name(e.get("file"), "the bundle file", where)
      if file in seen or file == MANIFEST_NAME: raise ArtifactError(f"{where}: names {file} twice" if file in seen else f"{where}: names itself")
      if not isinstance(role := e.get("role"), str) or not ROLE.fullmatch(role): raise ArtifactError(f"{where}: {file}: role {role!r:.40} is not a plain word")
      if not isinstance(digest := e.get("sha256"), str) or not SHA256.fullmatch(digest): raise ArtifactError(f"{where}: {file}: sha256 is not 64 hex digits")
      if not isinstance(size := e.get("size"), int) or isinstance(size, bool) or size < 0:
        raise ArtifactError(f"{where}: {file}: size {size!r:.40} is not a size")
      if size < PREAMBLE.size: raise ArtifactError(f"{where}: {file}: size {size:,} is less than a bundle's {PREAMBLE.size}-byte preamble: not a bundle")
      seen.add(file)
      entries.append(Entry(file, role, digest, size))
    return Manifest(name, tuple(entries))

def read_manifest(path: str) -> tuple[Manifest, str, int]:
  """(manifest, sha256 of its bytes, its size): what a signature of it signs. One line naming `path` when it is not a manifest."""
  with open_regular(path) as f: data = f.read(MAX_MANIFEST_BYTES + 1)
  return parse_manifest(data, path), hashlib.sha256(data).hexdigest(), len(data)

def parse_manifest(data: bytes, where: str) -> Manifest:
  """A manifest's bytes (from a file or a download) checked and parsed; one line naming `where` when they are not a manifest."""
  if len(data) > MAX_MANIFEST_BYTES: raise ArtifactError(f"{where}: more than {MAX_MANIFEST_BYTES:,} bytes: not a manifest")
  try: doc = json.loads(data)
  except (UnicodeDecodeError, ValueError, RecursionError): raise ArtifactError(f"{where}: not valid JSON (truncated?)") from None
  return Manifest.from_json(doc, where)

def check_folder(manifest: Manifest, folder: str) -> None:
  """Raise (one line) unless `folder` holds exactly the manifest's bundles as regular files of the sizes it names: a bundle missing, of
  another size, or one it does not name (a planted warp would be picked up by warp discovery) is refused."""
  for e in manifest.bundles:
    path = os.path.join(folder, e.file)
    if not os.path.isfile(path): raise ArtifactError(f"{path}: named by the manifest, {'not a regular file' if os.path.lexists(path) else 'missing'}")
    if (size := os.path.getsize(path)) != e.size: raise ArtifactError(f"{path}: {size:,} bytes, the manifest says {e.size:,}")
  named = {e.file for e in manifest.bundles}
  if stray := sorted(n for n in os.listdir(folder) if n.endswith(".bin") and n not in named):
    raise ArtifactError(f"{os.path.join(folder, stray[0])}: a bundle the manifest of {manifest.name} does not name")

def entry_of(path: str, role: str) -> Entry:
  """A bundle's manifest entry, after reading it whole (in bounded memory) and matching its content to its hash: only intact bundles are
  named."""
  digest, size = check_content(path)
  return Entry(os.path.basename(path), role, digest, size)

def write_manifest(path: str, name: str, entries: list[Entry]) -> Manifest:
  """Write a manifest atomically; returns it."""
  manifest = Manifest.from_json(Manifest(name, tuple(entries)).to_json(), path)
  with replaced_atomically(path) as (tmp,), open(tmp, "x") as f: json.dump(manifest.to_json(), f, indent=1)
  return manifest
