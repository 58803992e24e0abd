"""Which tinygrad is imported, read from the package itself (format/tinygrad_identity), and which bundles it replays: PyPI's 0.14.0 as
installed here; openpilot's 138fb4a as a comma device imports it (a symlinked checkout, no pip metadata), and beside a stale 0.14.0
dist-info; a tinygrad that is neither. Each runs the way a user meets it: a fresh process, the inspect_bundle CLI, one line on stderr.
The 138fb4a cases need that commit's source archive (tinygrad/tinygrad at 138fb4a, ARCHIVE below, where the workplace keeps it) and skip
without it."""
import hashlib
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import tinygrad
from tinygrad import Tensor

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import read_header, read_parts, write_bundle
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad

from conftest import ROOT

ARCHIVE = os.path.normpath(os.path.join(ROOT, "..", "shared", "upstream", "tinygrad-138fb4a.tar.gz"))
needs_138fb4a = pytest.mark.skipif(not os.path.isfile(ARCHIVE), reason=f"openpilot's tinygrad 138fb4a archive is absent ({ARCHIVE})")
INSTALLED = os.path.dirname(os.path.realpath(tinygrad.__file__))
SITE = os.path.dirname(INSTALLED)  # this venv's site-packages: tinygrad 0.14.0 and its dist-info
on_pypi_0_14_0 = pytest.mark.skipif(importlib.metadata.version("tinygrad") != "0.14.0" or not os.path.isdir(os.path.join(SITE, "tinygrad-0.14.0.dist-info")),
                                    reason="these cases run in an environment with PyPI's tinygrad 0.14.0 installed")

def reference_digest(folder: str) -> str:
  """The source identity written out: sha256 over each .py file outside __pycache__, sorted by relative path with "/", each hashed as that
  path, a NUL byte, its size as 8 bytes little endian, then its bytes."""
  files = []
  for d, _, names in os.walk(folder):
    rel = os.path.relpath(d, folder)
    if "__pycache__" in rel.split(os.sep): continue
    files += [("" if rel == "." else rel.replace(os.sep, "/") + "/") + n for n in names if n.endswith(".py")]
  h = hashlib.sha256()
  for rel in sorted(files):
    data = open(os.path.join(folder, rel), "rb").read()
    h.update(rel.encode() + b"\x00" + len(data).to_bytes(8, "little") + data)
  return h.hexdigest()

def run(args: list[str], pythonpath: list[str], isolated: bool = False) -> subprocess.CompletedProcess:
  """A fresh interpreter with `pythonpath` first; `isolated`: without site-packages (-S), so no pip metadata of any tinygrad is found."""
  env = {**os.environ, "PYTHONPATH": os.pathsep.join(pythonpath)}
  return subprocess.run([sys.executable, *(["-S"] if isolated else []), *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)

def identity_in(pythonpath: list[str], isolated: bool = False) -> dict:
  """What a fresh process with `pythonpath` identifies, and what pip's metadata says there (None: no metadata of tinygrad)."""
  proc = run(["-c", """
import importlib.metadata, json
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
try: meta = importlib.metadata.version("tinygrad")
except importlib.metadata.PackageNotFoundError: meta = None
here = imported_tinygrad()
print(json.dumps({"version": here.version, "source": here.source, "folder": here.folder, "release": here.release, "metadata": meta}))
"""], pythonpath, isolated)
  assert proc.returncode == 0, proc.stderr
  return json.loads(proc.stdout)

def small_bundle(path: str) -> np.ndarray:
  """A one-kernel CPU bundle at `path`, built with the tinygrad of this process; returns the input its recorded check is not about."""
  x = np.arange(8, dtype=np.float32)
  write_bundle(path, {"run": capture(lambda x: (x * 2 + 1).contiguous(), lambda: {"x": Tensor(x, device="CPU").realize()}).part}, {})
  return x

@pytest.fixture(scope="module")
def openpilot(tmp_path_factory) -> str:
  """openpilot's tree as a device has it: `tinygrad_repo/` (the 138fb4a checkout: its pyproject.toml and tinygrad/, no pip metadata) and
  the symlink `tinygrad -> tinygrad_repo/tinygrad` at the root, which is on PYTHONPATH (openpilot launch_chffrplus.sh @084747c)."""
  if not os.path.isfile(ARCHIVE): pytest.skip(f"openpilot's tinygrad 138fb4a archive is absent ({ARCHIVE})")
  root = str(tmp_path_factory.mktemp("openpilot"))
  with tarfile.open(ARCHIVE) as tar:
    top = tar.getmembers()[0].name.split("/")[0]
    tar.extractall(root, filter="data")
  os.rename(os.path.join(root, top), os.path.join(root, "tinygrad_repo"))
  os.symlink(os.path.join("tinygrad_repo", "tinygrad"), os.path.join(root, "tinygrad"))
  return root

@pytest.fixture(scope="module")
def numpy_only(tmp_path_factory) -> str:
  """A folder holding only numpy (links into this venv): with -S, what a process imports besides the project and tinygrad."""
  folder = str(tmp_path_factory.mktemp("numpy_only"))
  for name in ("numpy", "numpy.libs"):
    if os.path.exists(os.path.join(SITE, name)): os.symlink(os.path.join(SITE, name), os.path.join(folder, name))
  return folder

def refusal(bundle_path: str, pythonpath: list[str], isolated: bool = False) -> str:
  """`inspect_bundle verify` of a bundle this process must refuse: exit 2, one line on stderr, which is returned (no traceback, no crash)."""
  proc = run(["-m", "sunnypilot.modeld_v2.tools.inspect_bundle", "verify", bundle_path], pythonpath, isolated)
  assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, (proc.returncode, proc.stdout, proc.stderr)
  return proc.stderr.strip()

@on_pypi_0_14_0
def test_pypi_0_14_0_is_identified_by_its_code():
  here = imported_tinygrad()
  assert here.version == importlib.metadata.version("tinygrad") == "0.14.0"  # here pip's metadata is the package's own: they agree
  assert (here.folder, here.source, here.release) == (INSTALLED, reference_digest(INSTALLED), "PyPI's 0.14.0")
  assert str(here) == "tinygrad 0.14.0 (PyPI's 0.14.0)"

@needs_138fb4a
def test_138fb4a_as_a_device_has_it_is_identified_without_pip_metadata(openpilot, numpy_only):
  """Before: the bundle reader asked pip, which has no tinygrad here, and loading a bundle ended in a PackageNotFoundError traceback."""
  got = identity_in([openpilot, ROOT, numpy_only], isolated=True)
  checkout = os.path.join(openpilot, "tinygrad_repo", "tinygrad")
  assert got == {"version": "0.13.0", "source": reference_digest(checkout), "folder": checkout, "release": "openpilot's 138fb4a", "metadata": None}

@needs_138fb4a
@on_pypi_0_14_0
def test_138fb4a_beside_0_14_0_metadata_is_138fb4a_and_refuses_a_0_14_0_bundle_in_one_line(openpilot, numpy_only, tmp_path):
  """Before: with 0.14.0's metadata beside a 138fb4a checkout the versions matched, 0.14.0's ELF kernels were run as raw code by 138fb4a's
  CPU runtime and the process died of SIGSEGV. Both a stale dist-info found on sys.path (this venv's) and one faked right beside it."""
  small_bundle(path := str(tmp_path / "built_with_0_14_0.bin"))
  fake = tmp_path / "site"
  shutil.copytree(os.path.join(SITE, "tinygrad-0.14.0.dist-info"), fake / "tinygrad-0.14.0.dist-info")
  os.symlink(os.path.join(openpilot, "tinygrad_repo", "tinygrad"), fake / "tinygrad")
  checkout = os.path.join(openpilot, "tinygrad_repo", "tinygrad")
  for pythonpath, isolated in (([openpilot, ROOT], False), ([str(fake), ROOT, numpy_only], True)):
    got = identity_in(pythonpath, isolated)
    assert (got["metadata"], got["version"], got["release"], got["folder"]) == ("0.14.0", "0.13.0", "openpilot's 138fb4a", checkout), pythonpath
    line = refusal(path, pythonpath, isolated)
    assert line.endswith(f"{path}: built with tinygrad 0.14.0 (PyPI's 0.14.0), this is tinygrad 0.13.0 (openpilot's 138fb4a): rebuild the "
                         "bundle"), line

@needs_138fb4a
@on_pypi_0_14_0
def test_138fb4a_replays_the_bundles_it_builds_and_0_14_0_refuses_them(openpilot, tmp_path):
  """138fb4a builds a bundle (its CPU kernels stored as ELF objects, linked again at load), replays it bit for bit against its build's
  recorded check in a fresh process, and computes 2x + 1; this 0.14.0 process refuses it in one line."""
  path = str(tmp_path / "built_with_138fb4a.bin")
  proc = run(["-c", f"""
import numpy as np
from tinygrad import Tensor
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.format.bundle import write_bundle
from sunnypilot.modeld_v2.runtime.loader import load_bundle
x = lambda: {{"x": Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()}}
write_bundle({path!r}, {{"run": capture(lambda x: (x * 2 + 1).contiguous(), x).part}}, {{}})
print(load_bundle({path!r}).run(x=Tensor(np.full(8, 5, np.float32), device="CPU").realize()).numpy().tolist())
"""], [openpilot, ROOT])
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines()[-1] == str([11.0] * 8), proc.stdout  # 5 * 2 + 1
  verified = run(["-m", "sunnypilot.modeld_v2.tools.inspect_bundle", "verify", path], [openpilot, ROOT])
  assert verified.returncode == 0 and verified.stdout.splitlines()[-1] == f"{path}: verified", verified.stdout + verified.stderr
  prov = read_header(path)["provenance"]
  assert (prov["tinygrad"], prov["tinygrad_source"]) == ("0.13.0", reference_digest(os.path.join(openpilot, "tinygrad_repo", "tinygrad")))
  with pytest.raises(ArtifactError) as e: read_parts(path)
  assert str(e.value) == f"{path}: built with tinygrad 0.13.0 (openpilot's 138fb4a), this is tinygrad 0.14.0 (PyPI's 0.14.0): rebuild the bundle"

@on_pypi_0_14_0
def test_a_tinygrad_neither_supported_version_is_refused_in_one_line_at_load_and_compile(tmp_path):
  """A copy of this tinygrad whose code states another version: a source no supported tinygrad has, refused before anything is replayed or
  compiled."""
  small_bundle(path := str(tmp_path / "model.bin"))
  other = tmp_path / "site" / "tinygrad"
  shutil.copytree(INSTALLED, other, ignore=shutil.ignore_patterns("__pycache__"))
  helpers = (other / "helpers.py").read_text()
  assert helpers.count('"User-Agent": "tinygrad 0.14.0"') == 1
  (other / "helpers.py").write_text(helpers.replace('"User-Agent": "tinygrad 0.14.0"', '"User-Agent": "tinygrad 0.15.0"'))
  got = identity_in([str(other.parent), ROOT])
  assert (got["version"], got["release"], got["source"]) == ("0.15.0", None, reference_digest(str(other)))
  line = refusal(path, [str(other.parent), ROOT])
  assert re.fullmatch(rf"inspect_bundle: error: {re.escape(path)}: not replayed: tinygrad 0\.15\.0 \(source {got['source'][:12]}\) at "
                      rf"{re.escape(str(other))} is not a tinygrad this runtime supports \(0\.14\.0 \(PyPI's 0\.14\.0\), 0\.13\.0 \(openpilot's "
                      r"138fb4a\)\): install tinygrad==0\.14\.0 or run openpilot's checkout", line), line
  compiled = run(["-m", "sunnypilot.modeld_v2.compile_warp", "--frame", "1928,1208,2048,1216,608,4804608", "--warp-to", "512x256",
                  "--output", out := str(tmp_path / "warp.bin")], [str(other.parent), ROOT])  # refused before any work, nothing written
  assert compiled.returncode == 2 and compiled.stderr.count("\n") == 1 and "not compiling: tinygrad 0.15.0" in compiled.stderr, compiled.stderr
  assert not os.path.exists(out)

def test_a_bundle_recording_a_version_alone_loads_where_that_version_is_imported(tmp_bundle, monkeypatch):
  """Bundles written before sources were recorded: replayed where the imported tinygrad states their version, refused where not."""
  real, here = bundle.provenance, imported_tinygrad()
  for version in (here.version, "0.12.0"):
    monkeypatch.setattr(bundle, "provenance", lambda device, flags=None, version=version: {k: v for k, v in real(device, flags).items()
                                                                                   if k != "tinygrad_source"} | {"tinygrad": version})
    write_bundle(tmp_bundle, {"run": capture(lambda x: (x + 1).contiguous(), lambda: {"x": Tensor(np.ones(4, np.float32)).realize()}).part}, {},
                 check=False)
    monkeypatch.undo()
    if version == here.version:
      assert "tinygrad_source" not in read_header(tmp_bundle)["provenance"] and read_parts(tmp_bundle)[0]["run"][0].calls
      continue
    with pytest.raises(ArtifactError) as e: read_parts(tmp_bundle)
    assert str(e.value) == f"{tmp_bundle}: built with tinygrad 0.12.0, this is {here}: rebuild the bundle"

def test_another_source_of_the_same_version_is_refused(tmp_bundle, monkeypatch):
  """A bundle's recorded source decides, not its version: the same version built by other code (a patched tinygrad) is refused."""
  real, here = bundle.provenance, imported_tinygrad()
  monkeypatch.setattr(bundle, "provenance", lambda device, flags=None: real(device, flags) | {"tinygrad_source": "ab" * 32})
  write_bundle(tmp_bundle, {"run": capture(lambda x: (x + 1).contiguous(), lambda: {"x": Tensor(np.ones(4, np.float32)).realize()}).part}, {}, check=False)
  monkeypatch.undo()
  with pytest.raises(ArtifactError) as e: read_parts(tmp_bundle)
  assert str(e.value) == f"{tmp_bundle}: built with tinygrad {here.version} (source abababababab), this is {here}: rebuild the bundle"
