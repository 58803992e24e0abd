"""Install a model set as a model manager would: its manifest from a URL or a file, every bundle it names downloaded with resume and checked
against the manifest's content hash, the manifest's signature checked with the trusted keys, the set written into the model sets folder
at once (a folder renamed into place), the sets already there kept for the fallback.

  python -m sunnypilot.modeld_v2.tools.install_models https://example.com/sets/my-set/manifest.json --model-sets /data/models/modeld_v2 \\
      --trusted-keys /data/openpilot/sunnypilot/modeld_v2/trusted_keys --activate
  python -m sunnypilot.modeld_v2.tools.install_models out/first/manifest.json --model-sets out/sets --activate    # from a folder (a USB stick)

The bundles are fetched beside the manifest (its URL's folder, or its folder), the signature from <manifest>.sig. Downloads go to
ROOT/.partial/<set>/ with a progress line every 2 s, and resume there after an interruption (a connection cut, Ctrl-C, a kill: HTTP
Range). An install refused (a bundle whose content does not match the manifest, a signature no trusted key made, a server error, the
deadline) stops with one line and leaves nothing of the set behind. Only when every bundle matched does the folder become ROOT/<set> (one
rename): a running modeld never sees half a set. `--activate` then writes ROOT/active, which a running modeld on a PC switches to (on a
comma device the model manager's parameter asks instead); a set installed already is only activated. A second install waits for none:
it is refused while one runs. What a killed install left (partial downloads of other sets, temporary files of the folder's flag files
whose writer is gone) is removed by the next one. A set may not take one of the folder's own names (default, active, last_ran), and
nothing in the folder is followed if it is a symbolic link: one line, remove it.

--deadline bounds the transfers (manifest, signature, bundles) in all, connecting and a server that trickles included. Its default
scales with the set: 60 s plus 1 s per 100 kB its bundles hold (a set of 100 MB: about 18 minutes), so that only a
link slower than 100 kB/s needs a longer one.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import logging
import os
import shutil
import signal
import stat
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from io import BufferedReader
from typing import BinaryIO, Literal, overload

from sunnypilot.modeld_v2.common.cli import finite_float, interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, file_kind, open_regular, remove_stale_temporaries, replaced_atomically
from sunnypilot.modeld_v2.daemon.device_paths import DEVICE_MODEL_SETS
from sunnypilot.modeld_v2.daemon.hardware import on_device
from sunnypilot.modeld_v2.daemon.model_sets import ACTIVE_FILE, DEFAULT_SET, LAST_RAN_DM_FILE, LAST_RAN_FILE, ModelSets, Trust, installable_name
from sunnypilot.modeld_v2.daemon.run_state import describe, read_state
from sunnypilot.modeld_v2.format.bundle import check_content
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, MAX_MANIFEST_BYTES, Manifest, check_folder, parse_manifest
from sunnypilot.modeld_v2.format.signature import sig_path

log = logging.getLogger(__name__)

PARTIAL, LOCK = ".partial", ".install.lock"
PIECE_BYTES = 8 << 20  # the most read and written at once (sunnypilot's model fetcher downloads in 8 MiB pieces too); a read takes what has come
TIMEOUT_S = 30  # a server silent this long in one read is cut off (the download resumes on the next run)
PROGRESS_EVERY_S = 2.0
DEADLINE_BASE_S, DEADLINE_BYTES_PER_S = 60.0, 100_000  # the default --deadline: 60 s plus the set's bytes at 100 kB/s

class Resumable(ArtifactError):
  """A transfer broken off (the connection cut or silent, a server error): what arrived is kept, and the next run resumes it."""

class Missing(ArtifactError):
  """Nothing at a source (a file that is not there, HTTP 404): the message says which and, for a URL, the HTTP status."""

class DeadlinePassed(ArtifactError):
  """--deadline passed during a transfer (raised from SIGALRM, so in whatever read waited)."""

class Deadline:
  """--deadline: the seconds the install's transfers may take in all, counted from the start; None: DEADLINE_BASE_S plus the set's bytes
  at DEADLINE_BYTES_PER_S. `armed` arms SIGALRM around one transfer (so an install runs in the main thread, as the command does): a read
  that waits on a server however it trickles (connecting and its headers too) ends at the deadline, while verifying and renaming are never
  cut."""
  def __init__(self, seconds: float | None):
    self.seconds, self.start, self.set_bytes = seconds, time.monotonic(), 0

  def limit(self) -> float: return self.seconds if self.seconds is not None else DEADLINE_BASE_S + self.set_bytes / DEADLINE_BYTES_PER_S

  def __str__(self) -> str:
    how = "--deadline" if self.seconds is not None else f"{DEADLINE_BASE_S:g} s and 1 s per {DEADLINE_BYTES_PER_S // 1000} kB of the set; --deadline sets it"
    return f"{self.limit():,.0f} s ({how})"

  @contextlib.contextmanager
  def armed(self, what: str) -> Iterator[None]:
    def passed(*_: object) -> None: raise DeadlinePassed(f"{what}: the install took longer than its deadline of {self}: stopped, nothing of the set kept")
    if (left := self.start + self.limit() - time.monotonic()) <= 0: passed()
    previous = signal.signal(signal.SIGALRM, passed)
    signal.setitimer(signal.ITIMER_REAL, left)
    try: yield
    finally:
      signal.setitimer(signal.ITIMER_REAL, 0)
      signal.signal(signal.SIGALRM, previous)

class DownloadProgress:
  """A line about a download every PROGRESS_EVERY_S, from a thread of its own, so that it comes while a read waits on a slow or silent
  server (whose count then stands still). The reader sets `have`."""
  def __init__(self, name: str, have: int, size: int):
    self.name, self.have, self.size, self.start_have = name, have, size, have
    self.stop, self.thread = threading.Event(), threading.Thread(target=self.report, name=f"progress {name}", daemon=True)

  def __enter__(self) -> DownloadProgress:
    self.start = time.monotonic()
    self.thread.start()
    return self

  def __exit__(self, *exc: object) -> None:
    self.stop.set()
    self.thread.join()

  def report(self) -> None:
    seen, since = self.have, self.start
    while not self.stop.wait(PROGRESS_EVERY_S):
      now, have = time.monotonic(), self.have
      if have != seen: seen, since = have, now
      rate = (have - self.start_have) / (now - self.start)
      speed = f"{rate / 1e6:.1f} MB/s" if rate >= 1e6 else f"{rate / 1e3:.1f} kB/s"
      log.info(f"  {self.name}: {have:,} of {self.size:,} bytes ({have / self.size:.0%}), {speed}"
               + (f", nothing for {now - since:.0f} s" if now - since >= 1 else ""))

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

def open_source(source: str, offset: int = 0) -> tuple[BufferedReader | http.client.HTTPResponse, int | None, bool]:
  """(stream from `offset`, total bytes if known, whether it resumes at `offset`): a regular file (a FIFO or device is refused: it would
  block or never end), or an HTTP GET with a Range header (a server that ignores it sends the whole file: not resumed). Missing when there
  is nothing at `source`; Resumable for a server error or a connection that fails."""
  if not is_url(source):
    if not os.path.exists(source): raise Missing(f"{source}: no such file")
    f = open_regular(source)
    f.seek(offset)
    return f, os.fstat(f.fileno()).st_size, True
  request = urllib.request.Request(source, headers={"Range": f"bytes={offset}-"} if offset else {})
  try: response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
  except urllib.error.HTTPError as e:
    if e.code == 404: raise Missing(f"{source}: HTTP 404 {e.reason}") from None
    if e.code == 416 and offset: return open_source(source, 0)  # the partial file is longer than the file: start again
    raise (Resumable if e.code >= 500 else ArtifactError)(f"{source}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError, http.client.HTTPException) as e: raise Resumable(f"{source}: {getattr(e, 'reason', e)}") from None
  resumed = response.status == 206
  length = response.headers.get("Content-Length")
  return response, (int(length) + (offset if resumed else 0)) if length is not None else None, resumed

@overload
def fetch_small(source: str, deadline: Deadline, optional: Literal[False] = False, limit: int = MAX_MANIFEST_BYTES) -> bytes: ...
@overload
def fetch_small(source: str, deadline: Deadline, optional: bool, limit: int = MAX_MANIFEST_BYTES) -> bytes | None: ...
def fetch_small(source: str, deadline: Deadline, optional: bool = False, limit: int = MAX_MANIFEST_BYTES) -> bytes | None:
  """A small file's bytes (the manifest, its signature); None when there is none and it is `optional`, else Missing."""
  with deadline.armed(source):
    try: stream, _, _ = open_source(source)
    except Missing:
      if optional: return None
      raise
    with stream:
      try: data = stream.read(limit + 1)
      except (OSError, http.client.HTTPException) as e: raise Resumable(f"{source}: the transfer broke off: {e}") from None
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

def download(source: str, dest: str, size: int, deadline: Deadline) -> None:
  """`source` into `dest`, `size` bytes, resuming a partial `dest`, with a progress line every PROGRESS_EVERY_S. One line for more bytes
  than `size`; Resumable when the transfer breaks off."""
  have = st.st_size if (st := own_entry(dest)) is not None else 0
  if have >= size: return
  with deadline.armed(source):
    stream, total, resumed = open_source(source, have)
    if not resumed: have = 0
    if total is not None and total != size: raise ArtifactError(f"{source}: {total:,} bytes, the manifest says {size:,}")
    log.info(f"{'downloading' if is_url(source) else 'copying'} {source}: {size:,} bytes" + (f", resuming at {have:,}" if have else ""))
    if not have and st is not None: os.remove(dest)  # starting over: the new file is made, never opened through whatever is there
    mode = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | (os.O_APPEND if have else os.O_CREAT | os.O_EXCL)
    with stream, os.fdopen(os.open(dest, mode, 0o644), "ab" if have else "wb") as out, DownloadProgress(os.path.basename(source), have, size) as seen:
      while have < size:
        try: piece = stream.read1(min(PIECE_BYTES, size - have + 1))
        except (OSError, http.client.HTTPException) as e: raise Resumable(f"{source}: the download broke off at {have:,} of {size:,} bytes ({e}): "
                                                                          "run again to resume") from None
        if not piece: break
        if (have := have + len(piece)) > size: raise ArtifactError(f"{source}: more than the {size:,} bytes the manifest says")
        out.write(piece)
        seen.have = have
  if have != size: raise Resumable(f"{source}: the download ended at {have:,} of {size:,} bytes: run again to resume")

def clean_leftovers(root: str, keep: str) -> None:
  """Remove what killed installs left: partial downloads of every set but `keep` (which resumes), and temporary files of the folder's flag
  files whose writer is gone (common.files names them <file>.tmp<pid>; a live writer's are kept)."""
  folder = os.path.join(root, PARTIAL)
  for name in os.listdir(folder) if os.path.isdir(folder) else ():
    if name != keep:
      log.info(f"removing what an interrupted install left: {os.path.join(folder, name)}")
      shutil.rmtree(os.path.join(folder, name), ignore_errors=True)
  for name in (ACTIVE_FILE, LAST_RAN_FILE, LAST_RAN_DM_FILE): remove_stale_temporaries(os.path.join(root, name))

def remove_staging(root: str, staging: str) -> None:
  """The set's staging folder, and .partial when nothing else is staged there."""
  shutil.rmtree(staging, ignore_errors=True)
  with contextlib.suppress(OSError): os.rmdir(os.path.join(root, PARTIAL))

def activate(root: str, name: str) -> None:
  """Ask for set `name`: ROOT/active, written atomically."""
  with replaced_atomically(os.path.join(root, ACTIVE_FILE)) as (tmp,), open(tmp, "x") as f: f.write(name + "\n")
  log.info(f"asked for set {name} in {os.path.join(root, ACTIVE_FILE)}: a running modeld switches to it")

def install(source: str, root: str, trust: Trust, activate_it: bool = False, deadline: Deadline | None = None) -> str:
  """Install the set whose manifest is at `source` into `root` (see the module's docstring); returns its name."""
  deadline = deadline or Deadline(None)
  try: data = fetch_small(source, deadline)
  except Missing as e: raise ArtifactError(f"no such manifest: {e}") from None
  manifest = parse_manifest(data, source)
  installable_name(manifest.name, source)
  final, staging = os.path.join(root, manifest.name), os.path.join(root, PARTIAL, manifest.name)
  own_entry(os.path.join(root, PARTIAL), folder=True)
  clean_leftovers(root, manifest.name)
  if own_entry(staging, folder=True) is not None and not holds(os.path.join(staging, MANIFEST_NAME), data):
    shutil.rmtree(staging)  # partial files of another version of the set
  if own_entry(final, folder=True) is not None:
    if not holds(os.path.join(final, MANIFEST_NAME), data):
      raise ArtifactError(f"{final} holds another set named {manifest.name}: installed sets are never replaced (remove it first, or name the new one "
                          "differently)")
    log.info(f"set {manifest.name} is installed already in {final}")
    remove_staging(root, staging)
    if activate_it: activate(root, manifest.name)
    return manifest.name
  os.makedirs(staging, exist_ok=True)
  try: stage(source, staging, data, manifest, trust, deadline)
  except (ArtifactError, OSError) as e:
    if not isinstance(e, Resumable): remove_staging(root, staging)  # refused: nothing of it stays; broken off: the next run resumes
    raise
  os.rename(staging, final)  # the whole set appears at once
  with contextlib.suppress(OSError): os.rmdir(os.path.join(root, PARTIAL))
  log.info(f"installed set {manifest.name} in {final} ({len(manifest.bundles)} bundles, {sum(e.size for e in manifest.bundles):,} bytes)")
  if activate_it: activate(root, manifest.name)
  return manifest.name

def stage(source: str, staging: str, data: bytes, manifest: Manifest, trust: Trust, deadline: Deadline) -> None:
  """The set complete in `staging`: its manifest and signature, checked with the trusted keys before a byte of any bundle is fetched, then
  each bundle downloaded (or resumed) and checked against its content hash. Whatever else is in `staging` (a killed run's temporary files)
  is removed, so the folder renamed into place holds the set and nothing more."""
  named = {MANIFEST_NAME, sig_path(MANIFEST_NAME)} | {n for e in manifest.bundles for n in (e.file, e.file + ".part")}
  for name in set(os.listdir(staging)) - named:
    if stat.S_ISDIR(os.lstat(path := os.path.join(staging, name)).st_mode): shutil.rmtree(path)
    else: os.remove(path)
  with replaced_atomically(os.path.join(staging, MANIFEST_NAME)) as (tmp,), open(tmp, "xb") as f: f.write(data)
  signature = fetch_small(sig_source(source), deadline, optional=True)
  if signature is not None:
    with replaced_atomically(sig_path(os.path.join(staging, MANIFEST_NAME))) as (tmp,), open(tmp, "xb") as f: f.write(signature)
  elif os.path.exists(sig_path(os.path.join(staging, MANIFEST_NAME))): os.remove(sig_path(os.path.join(staging, MANIFEST_NAME)))
  log.info(f"set {manifest.name}: {trust.manifest(os.path.join(staging, MANIFEST_NAME))[1]}")  # before a byte of any bundle is fetched
  deadline.set_bytes = sum(e.size for e in manifest.bundles)
  need = deadline.set_bytes - sum(st.st_size for e in manifest.bundles if (st := own_entry(os.path.join(staging, e.file + ".part"))) is not None)
  if (free := shutil.disk_usage(staging).free) < need: raise ArtifactError(f"{staging}: {free:,} bytes free, the set needs {need:,} more")
  for e in manifest.bundles:
    path = os.path.join(staging, e.file)
    if own_entry(path) is not None and check_content(path) == (e.sha256, e.size): continue  # verified in an earlier run
    download(beside(source, e.file), path + ".part", e.size, deadline)
    try: got = check_content(path + ".part")
    except ArtifactError as err: got = (f"unreadable: {err}", 0)
    if got != (e.sha256, e.size):
      raise ArtifactError(f"{beside(source, e.file)}: content hash {got[0][:16]}, the manifest says {e.sha256[:16]}: removed, not installed")
    os.replace(path + ".part", path)
  check_folder(manifest, staging)

def open_lock(root: str) -> BinaryIO:
  """ROOT/.install.lock opened for flock: never through a link (O_NOFOLLOW) nor anything but a regular file, each refused in one line."""
  path = os.path.join(root, LOCK)
  own_entry(path)
  try: fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
  except OSError as e:
    if e.errno == errno.ELOOP: own_entry(path)  # a link planted since the check: its one line
    raise ArtifactError(f"{path}: cannot open the lock: {e.strerror or e}") from None
  if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
    os.close(fd)
    raise ArtifactError(f"{path} is {file_kind(mode)}, not a regular file (remove it)")
  return os.fdopen(fd, "ab")

def sets_listing(root: str | None) -> str:
  """--list: the sets in `root`, which is asked for and which ran last per daemon, and each daemon's run state on this bus."""
  lines = []
  if root is None: lines.append("no model sets folder (--model-sets): the daemons run their default set (--artifacts) only")
  else:
    sets = ModelSets("", root, Trust())
    installed, active = sets.installed(), sets.read_name(ACTIVE_FILE) or DEFAULT_SET
    lines.append(f"model sets in {root}: {', '.join(installed) or 'none installed'}; asked for: {active}")
    for daemon, file in (("modeld", LAST_RAN_FILE), ("dmonitoringmodeld", LAST_RAN_DM_FILE)):
      lines.append(f"  last ran in {daemon}: {sets.read_name(file) or 'none recorded'}")
  for daemon in ("modeld", "dmonitoringmodeld"): lines.append(f"{daemon}: {describe(read_state(daemon))}")
  return "\n".join(lines)

@interruptible("install_models")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("install_models", __doc__)
  parser.add_argument("manifest", nargs="?", help="the set's manifest.json: an http(s) URL or a file")
  parser.add_argument("--model-sets", help=f"the model sets folder (modeld's --model-sets); made when missing. On a comma device {DEVICE_MODEL_SETS}")
  parser.add_argument("--list", action="store_true", help="list the installed sets, the one asked for, the last that ran per daemon, and what "
                      "each daemon on this bus (OPENPILOT_PREFIX) runs now, since when, and what is on its way; installs nothing")
  parser.add_argument("--trusted-keys", help="a folder of trusted public keys (*.pem): the manifest must be signed by one of them (without: its "
                      "hashes are checked, its signature is not)")
  parser.add_argument("--activate", action="store_true", help="ask for the set once installed (writes <model-sets>/active), or now if it is installed")
  parser.add_argument("--deadline", type=finite_float(0, 10**7, low_open=True), metavar="SECONDS", help="the most the transfers may take in all "
                      f"(default: {DEADLINE_BASE_S:g} s plus 1 s per {DEADLINE_BYTES_PER_S // 1000} kB of the set); past it the install stops, "
                      "nothing of the set kept")
  args = parser.parse_args(argv)
  root = args.model_sets or (DEVICE_MODEL_SETS if on_device() else None)
  if args.list:
    print(sets_listing(root))
    return 0
  if args.manifest is None or root is None:
    parser.exit(2, f"install_models: error: {'a manifest' if args.manifest is None else '--model-sets'} is required (or --list)\n")
  args.model_sets = root
  try:
    trust = Trust.from_folder(args.trusted_keys)
    if trust.keys is None: log.warning("no --trusted-keys: the manifest's hashes are checked, its signature is not")
    if os.path.exists(args.model_sets) and not os.path.isdir(args.model_sets): raise ArtifactError(f"--model-sets {args.model_sets}: not a folder")
    os.makedirs(args.model_sets, exist_ok=True)
    with open_lock(args.model_sets) as lock:
      try: fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError: raise ArtifactError(f"another install_models is installing into {args.model_sets}") from None
      install(args.manifest, args.model_sets, trust, args.activate, Deadline(args.deadline))
  except (ArtifactError, OSError) as e:
    print(f"install_models: error: {e}", file=sys.stderr)
    return 2
  return 0

if __name__ == "__main__":
  sys.exit(main())
