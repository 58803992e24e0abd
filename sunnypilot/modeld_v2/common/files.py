"""Files as every command here reads and writes them: outputs written to a temporary name and renamed into place (never a partial file,
never a device node or an input replaced), inputs opened only when they are regular files, and content hashes read in blocks."""
from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from io import BufferedReader

class ArtifactError(ValueError):
  """A file that cannot be used: a bundle or part that is corrupt, for another device/arch/tinygrad, or an unsupported capture; an output
  that cannot be written. Its message is the one line a command prints."""

def file_kind(mode: int) -> str:
  kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
           (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file"))
  return next((what for test, what in kinds if test(mode)), "not a regular file")

def temporary_path(path: str) -> str:
  """Where a file is written before it is renamed into place: next to it, named for this process."""
  return f"{path}.tmp{os.getpid()}"

def _process_alive(pid: int) -> bool:
  try: os.kill(pid, 0)
  except ProcessLookupError: return False
  except (PermissionError, OverflowError): pass  # another user's process, or no process id at all: leave its file
  return True

def remove_stale_temporaries(path: str) -> None:
  """Remove `path`'s temporary files left by writers that were killed (their process is gone, or had this process's id before it: this
  one is not writing `path` yet); a live writer's is kept. Writers then create theirs exclusively, never through something planted."""
  folder, base = os.path.split(os.path.abspath(path))
  prefix = f"{base}.tmp"
  try: names = os.listdir(folder)
  except OSError: return
  for name in names:
    pid = name[len(prefix):] if name.startswith(prefix) else ""
    if pid.isdigit() and (int(pid) == os.getpid() or not _process_alive(int(pid))):
      with contextlib.suppress(OSError): os.remove(os.path.join(folder, name))

def _refuse_replacing(path: str) -> None:
  try: st = os.stat(path)
  except FileNotFoundError: return
  except OSError as e: raise ArtifactError(f"cannot use {path}: {e.strerror or e}") from None
  if stat.S_ISDIR(st.st_mode): raise ArtifactError(f"{path} is a folder: give a file name")
  if not stat.S_ISREG(st.st_mode): raise ArtifactError(f"{path} is {file_kind(st.st_mode)}, not a regular file: refusing to replace it")

def check_output_path(path: str, inputs: Iterable[str | None] = ()) -> None:
  """Fail before any work when `path` cannot become a new file: empty, a folder, a device node, FIFO or anything but a regular file, the
  same file as one of `inputs` (under any name), a missing folder, or a place this user cannot create a file in. Removes temporary
  files of `path` left by killed runs."""
  if not path: raise ArtifactError("the output path is empty: give a file name")
  _refuse_replacing(path)
  for source in filter(None, inputs):
    with contextlib.suppress(OSError):
      if os.path.samefile(path, source): raise ArtifactError(f"the output {path} is the input {source}: writing it would destroy the input")
  folder = os.path.dirname(os.path.abspath(path))
  if not os.path.isdir(folder): raise ArtifactError(f"the output folder {folder} does not exist")
  if os.path.exists(path) and not os.access(path, os.W_OK): raise ArtifactError(f"cannot write {path}: permission denied")
  remove_stale_temporaries(path)
  try: os.close(os.open(tmp := temporary_path(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))  # can a file be created there?
  except OSError as e: raise ArtifactError(f"cannot write {path}: {e.strerror or e}") from None
  os.remove(tmp)

@contextlib.contextmanager
def replaced_atomically(*paths: str) -> Iterator[list[str]]:
  """Temporary names for `paths`, next to them. When the block ends they are renamed over `paths`, all after every one is complete, so
  readers see the old files or the new ones, never half a file; on any failure (an exception, Ctrl-C) the temporary files are removed
  and `paths` are left as they were. Nothing but a regular file is ever replaced."""
  for path in paths: remove_stale_temporaries(path)
  tmps = [temporary_path(path) for path in paths]
  try:
    yield tmps
    for path in paths: _refuse_replacing(path)  # again: something may have appeared there during the work
    for tmp, path in zip(tmps, paths): os.replace(tmp, path)
  except BaseException:
    for tmp in tmps:
      with contextlib.suppress(OSError): os.remove(tmp)
    raise

def open_regular(path: str) -> BufferedReader:
  """`path` opened for reading, refused before a byte is read unless it is a regular file (a FIFO would block, a device never end)."""
  try: fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
  except OSError as e: raise ArtifactError(f"{path}: cannot read: {e.strerror or e}") from None
  if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
    os.close(fd)
    raise ArtifactError(f"{path} is {file_kind(mode)}, not a regular file")
  os.set_blocking(fd, True)
  return os.fdopen(fd, "rb")

def file_sha256(path: str) -> str:
  """A file's content hash, read in 1 MiB blocks (a full-size model is hundreds of MB): what a bundle records of the sources it was built
  from, so that a rebuild is decided by content, not by a name."""
  digest = hashlib.sha256()
  with open_regular(path) as f:
    while block := f.read(1 << 20): digest.update(block)
  return digest.hexdigest()

