"""Install a model set as a model manager would: its manifest from a URL or a file, every bundle it names downloaded with resume and checked
against the manifest's content hash, the manifest's signature checked with the trusted keys, the set written into the model sets folder
at once (a folder renamed into place), the sets already there kept for the fallback.

  python -m sunnypilot.modeld_v2.tools.install_models https://example.com/sets/my-set/manifest.json --model-sets /data/models/modeld_v2 \\
      --trusted-keys /data/openpilot/sunnypilot/modeld_v2/trusted_keys --activate
  python -m sunnypilot.modeld_v2.tools.install_models out/first/manifest.json --model-sets out/sets --activate    # from a folder (a USB stick)

The bundles are fetched beside the manifest (its URL's folder, or its folder), the signature from <manifest>.sig. Downloads go to
ROOT/.partial/<set>/ and resume there after an interruption (HTTP Range); a bundle whose content does not match the manifest is removed,
and the install stops with one line. Only when every bundle matched does the folder become ROOT/<set> (one rename): a running modeld
never sees half a set. `--activate` then writes ROOT/active, which a running modeld on a PC switches to (on a comma device the model
manager's parameter asks instead). A second install waits for none: it is refused while one runs. What a killed install left (partial
downloads of other sets, temporary files) is removed by the next one. A set may not take one of the folder's own names (default, active,
last_ran), and nothing in the folder is followed if it is a symbolic link: one line, remove it.
"""
from __future__ import annotations

import fcntl
import logging
import os
import shutil
import stat
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, file_kind
from sunnypilot.modeld_v2.format.manifest import MAX_MANIFEST_BYTES
from sunnypilot.modeld_v2.format.signature import sig_path

log = logging.getLogger(__name__)

PARTIAL, LOCK = ".partial", ".install.lock"
PIECE_BYTES = 8 << 20  # read and written in pieces of this size (sunnypilot's model fetcher downloads in 8 MiB pieces too)
TIMEOUT_S = 30
PROGRESS_EVERY_S = 2.0

def is_url(source: str) -> bool: return urllib.parse.urlparse(source).scheme in ("http", "https")

def beside(source: str, name: str) -> str:
  """Where `name` is, beside the manifest at `source` (a URL or a path). Names are plain file names (the manifest checks it): they cannot
  leave that folder."""
  return urllib.parse.urljoin(source, name) if is_url(source) else os.path.join(os.path.dirname(os.path.abspath(source)), name)

def sig_source(source: str) -> str:
  """Where the manifest's signature is: <manifest>.sig, beside it."""
  if not is_url(source): return sig_path(source)
  url = urllib.parse.urlparse(source)
  return urllib.parse.urlunparse(url._replace(path=sig_path(url.path)))

def open_source(source: str, offset: int = 0) -> tuple[BinaryIO, int | None, bool]:
  """(stream from `offset`, total bytes if known, whether it resumes at `offset`): a file, or an HTTP GET with a Range header (a server
  that ignores it sends the whole file: not resumed). FileNotFoundError when there is nothing at `source`."""
  if not is_url(source):
    f = open(source, "rb")
    f.seek(offset)
    return f, os.fstat(f.fileno()).st_size, True
  request = urllib.request.Request(source, headers={"Range": f"bytes={offset}-"} if offset else {})
  try: response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
  except urllib.error.HTTPError as e:
    if e.code == 404: raise FileNotFoundError(source) from None
    if e.code == 416 and offset: return open_source(source, 0)  # the partial file is longer than the file: start again
    raise ArtifactError(f"{source}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e: raise ArtifactError(f"{source}: {getattr(e, 'reason', e)}") from None
  resumed = response.status == 206
  length = response.headers.get("Content-Length")
  return response, (int(length) + (offset if resumed else 0)) if length is not None else None, resumed

def fetch_small(source: str, limit: int = MAX_MANIFEST_BYTES) -> bytes | None:
  """A small file's bytes (the manifest, its signature), or None when there is none."""
  try: stream, _, _ = open_source(source)
  except FileNotFoundError: return None
  with stream: data = stream.read(limit + 1)
  if len(data) > limit: raise ArtifactError(f"{source}: more than {limit:,} bytes: not a manifest or signature")
  return data

def own_entry(path: str, folder: bool = False) -> os.stat_result | None:
  """What is at `path` in the model sets folder, not followed (lstat), or None when nothing is: one line for a symbolic link or another
  kind of file than expected (install_models writes and reads only regular files and folders it made; a link planted there could make it
  write or install a file elsewhere)."""
  try: st = os.lstat(path)
  except FileNotFoundError: return None
  if stat.S_ISLNK(st.st_mode): raise ArtifactError(f"{path} is a symbolic link: install_models follows none in the model sets folder (remove it)")
  if (stat.S_ISDIR if folder else stat.S_ISREG)(st.st_mode): return st
  raise ArtifactError(f"{path} is {file_kind(st.st_mode)}, not {'a folder' if folder else 'a regular file'} (remove it)")

def holds(path: str, data: bytes) -> bool:
  """Whether the regular file at `path` (never followed if a link) holds exactly `data`: at most len(data) + 1 bytes are read."""
  try: fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError: return False
  with os.fdopen(fd, "rb") as f: return stat.S_ISREG(os.fstat(fd).st_mode) and f.read(len(data) + 1) == data

def download(source: str, dest: str, size: int) -> None:
  """`source` into `dest`, `size` bytes, resuming a partial `dest`; a line every PROGRESS_EVERY_S. One line for more bytes than `size`."""
  have = st.st_size if (st := own_entry(dest)) is not None else 0
  if have >= size: return
  stream, total, resumed = open_source(source, have)
  if not resumed: have = 0
  if total is not None and total != size: raise ArtifactError(f"{source}: {total:,} bytes, the manifest says {size:,}")
  log.info(f"{'downloading' if is_url(source) else 'copying'} {source}: {size:,} bytes" + (f", resuming at {have:,}" if have else ""))
  start, last = time.monotonic(), time.monotonic()
  if not have and st is not None: os.remove(dest)  # starting over: the new file is made, never opened through whatever is there
  mode = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if have else os.O_CREAT | os.O_EXCL)
  with stream, os.fdopen(os.open(dest, mode, 0o644), "ab" if have else "wb") as out:
    while piece := stream.read(min(PIECE_BYTES, size - have + 1)):
      if (have := have + len(piece)) > size: raise ArtifactError(f"{source}: more than the {size:,} bytes the manifest says")
      out.write(piece)
      if time.monotonic() - last >= PROGRESS_EVERY_S:
        last = time.monotonic()
        log.info(f"  {os.path.basename(dest)}: {have / size:.0%} ({have / (last - start) / 1e6:.1f} MB/s)")
      if have == size: break
  if have != size: raise ArtifactError(f"{source}: the download ended at {have:,} of {size:,} bytes: run again to resume")

def clean_leftovers(root: str, keep: str) -> None:
  """Remove what killed installs left: partial downloads of every set but `keep` (which resumes)."""
  folder = os.path.join(root, PARTIAL)
  for name in os.listdir(folder) if os.path.isdir(folder) else ():
    if name != keep:
      log.info(f"removing what an interrupted install left: {os.path.join(folder, name)}")
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)

def install(source: str, root: str, trust, activate: bool = False) -> str:
  """Install the set whose manifest is at `source` into `root` (see the module's docstring); returns its name."""
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  from sunnypilot.modeld_v2.daemon.model_sets import ACTIVE_FILE, installable_name
  from sunnypilot.modeld_v2.format.bundle import check_content
  from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, check_folder, parse_manifest
  if (data := fetch_small(source)) is None: raise ArtifactError(f"{source}: no such manifest")
  manifest = parse_manifest(data, source)
  installable_name(manifest.name, source)
  final, staging = os.path.join(root, manifest.name), os.path.join(root, PARTIAL, manifest.name)
  own_entry(os.path.join(root, PARTIAL), folder=True)
  clean_leftovers(root, manifest.name)
  if own_entry(staging, folder=True) is not None and not holds(os.path.join(staging, MANIFEST_NAME), data):
    shutil.rmtree(staging)  # partial files of another version of the set
  if own_entry(final, folder=True) is not None:
    if holds(os.path.join(final, MANIFEST_NAME), data):
      log.info(f"set {manifest.name} is installed already in {final}")
      return manifest.name
    raise ArtifactError(f"{final} holds another set named {manifest.name}: installed sets are never replaced (remove it first, or name the new one "
                        "differently)")
  os.makedirs(staging, exist_ok=True)
  with replaced_atomically(os.path.join(staging, MANIFEST_NAME)) as (tmp,), open(tmp, "xb") as f: f.write(data)
  signature = fetch_small(sig_source(source))
  if signature is not None:
    with replaced_atomically(sig_path(os.path.join(staging, MANIFEST_NAME))) as (tmp,), open(tmp, "xb") as f: f.write(signature)
  elif os.path.exists(sig_path(os.path.join(staging, MANIFEST_NAME))): os.remove(sig_path(os.path.join(staging, MANIFEST_NAME)))
  log.info(f"set {manifest.name}: {trust.manifest(os.path.join(staging, MANIFEST_NAME))[1]}")  # before a byte of any bundle is fetched
  need = sum(e.size for e in manifest.bundles) - sum(st.st_size for e in manifest.bundles
                                                     if (st := own_entry(os.path.join(staging, e.file + ".part"))) is not None)
  if (free := shutil.disk_usage(staging).free) < need: raise ArtifactError(f"{root}: {free:,} bytes free, the set needs {need:,} more")
  for e in manifest.bundles:
    path = os.path.join(staging, e.file)
    if own_entry(path) is not None and check_content(path) == (e.sha256, e.size): continue  # verified in an earlier run
    download(beside(source, e.file), path + ".part", e.size)
    try: got = check_content(path + ".part")
    except ArtifactError as err: got = (f"unreadable: {err}", 0)
    if got != (e.sha256, e.size):
      os.remove(path + ".part")
      raise ArtifactError(f"{beside(source, e.file)}: content hash {got[0][:16]}, the manifest says {e.sha256[:16]}: removed, not installed")
    os.replace(path + ".part", path)
  check_folder(manifest, staging)
  os.rename(staging, final)  # the whole set appears at once
  log.info(f"installed set {manifest.name} in {final} ({len(manifest.bundles)} bundles, {sum(e.size for e in manifest.bundles):,} bytes)")
  if activate:
    with replaced_atomically(os.path.join(root, ACTIVE_FILE)) as (tmp,), open(tmp, "x") as f: f.write(manifest.name + "\n")
    log.info(f"asked for set {manifest.name} in {os.path.join(root, ACTIVE_FILE)}: a running modeld switches to it")
  return manifest.name

@interruptible("install_models")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("install_models", __doc__)
  parser.add_argument("manifest", help="the set's manifest.json: an http(s) URL or a file")
  parser.add_argument("--model-sets", required=True, help="the model sets folder (modeld's --model-sets); made when missing")
  parser.add_argument("--trusted-keys", help="a folder of trusted public keys (*.pem): the manifest must be signed by one of them (without: its "
                      "hashes are checked, its signature is not)")
  parser.add_argument("--activate", action="store_true", help="ask for the set once installed (writes <model-sets>/active)")
  args = parser.parse_args(argv)
  from sunnypilot.modeld_v2.daemon.model_sets import Trust
  try:
    trust = Trust.from_folder(args.trusted_keys)
    if trust.keys is None: log.warning("no --trusted-keys: the manifest's hashes are checked, its signature is not")
    if os.path.exists(args.model_sets) and not os.path.isdir(args.model_sets): raise ArtifactError(f"--model-sets {args.model_sets}: not a folder")
    os.makedirs(args.model_sets, exist_ok=True)
    with open(os.path.join(args.model_sets, LOCK), "a") as lock:
      try: fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError: raise ArtifactError(f"another install_models is installing into {args.model_sets}") from None
      install(args.manifest, args.model_sets, trust, args.activate)
  except (ArtifactError, OSError) as e:
    print(f"install_models: error: {e}", file=sys.stderr)
    return 2
  return 0

if __name__ == "__main__":
  sys.exit(main())
