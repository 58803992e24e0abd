"""modeld with --trusted-keys: only signed sets run (bundle by bundle, or by a signed manifest), bad keys and folders are one line at
start, an unsigned warp is never picked."""
import hashlib
import os
import shutil
import subprocess
import sys

from sunnypilot.modeld_v2.format.bundle import content_digest
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME
from sunnypilot.modeld_v2.format.signature import Signed, generate_key, load_private_key, sign

import installed_sets
import modeld_daemon
from conftest import ROOT
from daemon_process import exchange_until
from installed_sets import model_id, published_id
from modeld_daemon import FRAME, Daemon

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name: the default set
sets, root = installed_sets.sets, installed_sets.root  # the installed sets, by name

def sign_set(folder, key: str) -> None:
  manifest = str(folder / MANIFEST_NAME)
  sign(manifest, Signed("manifest", MANIFEST_NAME, hashlib.sha256(open(manifest, "rb").read()).hexdigest(), os.path.getsize(manifest)),
       load_private_key(key))

def sign_bundles(folder, key: str) -> None:
  for name in ("model.bin", "warp_split.bin"):
    path = str(folder / name)
    sign(path, Signed("bundle", name, content_digest(path), os.path.getsize(path)), load_private_key(key))

def test_with_trusted_keys_only_signed_sets_run(artifacts, root, tmp_path, openpilot_prefix):
  """The default signed bundle by bundle, set b by a signed manifest: both run. Unsigned, or signed by a key nobody trusts: refused with
  one line at start (the default) or at the switch (a set), the running set untouched."""
  keys = tmp_path / "keys"
  os.makedirs(keys / "trusted")
  publisher, public = generate_key(str(keys / "publisher.pem"))
  stranger, _ = generate_key(str(keys / "stranger.pem"))
  shutil.copy(public, keys / "trusted" / "publisher.pem")
  default = tmp_path / "default"
  os.makedirs(default)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), default / name)
  run = [sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(default), "--trusted-keys", str(keys / "trusted")]
  out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unsigned: no" in out.stderr and "model.bin.sig" in out.stderr, out.stderr
  sign_bundles(default, publisher)
  sign_set(root / "b", stranger)
  daemon = Daemon(str(default), args=("--model-sets", str(root), "--trusted-keys", str(keys / "trusted")))
  assert any("must be signed by one of 1 trusted keys" in line for line in daemon.lines)
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "none of them trusted", 0)
  os.makedirs(root / "bare")  # a set with no signature at all (no manifest, no .sig): one line that says so, not three about its warps
  for name in ("model.bin", "warp_split.bin"): shutil.copy(root / "b" / name, root / "bare" / name)
  seen = len(daemon.lines)
  (root / "active").write_text("bare\n")
  end = exchange_until(daemon, "cannot switch to set bare", end)
  said = [line for line in daemon.lines[seen:] if "bare" in line and "asked for" not in line]
  assert len(said) == 1 and "unsigned" in said[0] and "model.bin.sig" in said[0], said
  sign_set(root / "b", publisher)
  (root / "active").write_text("b\n")  # asked for again
  end = exchange_until(daemon, "switched to set b", end)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  assert published_id(daemon, end + 2) == model_id(root / "b") and daemon.published == list(range(end + 3))
  assert any("manifest signed by key" in line and "publisher.pem" in line for line in daemon.lines)

def test_bad_trusted_keys_and_model_sets_are_one_line_at_start(artifacts, tmp_path):
  """A --trusted-keys folder holding a file that is not a public key (text, a private key), none at all, or --model-sets naming a file:
  exit 2 with one line, before waiting for camerad."""
  keys = tmp_path / "keys"
  keys.mkdir()
  (keys / "notes.pem").write_text("not a key\n")
  private, _ = generate_key(str(tmp_path / "publisher.pem"))
  (tmp_path / "file").write_text("")
  cases = [(("--trusted-keys", str(keys)), "notes.pem: not an Ed25519 public key"), (("--trusted-keys", str(tmp_path / "none")), "no such folder"),
           (("--model-sets", str(tmp_path / "file")), "is a file, not a folder")]
  for flags, message in cases:
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, *flags], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, (flags, out.stderr)
  os.remove(keys / "notes.pem")
  shutil.copy(private, keys / "oops.pem")
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--trusted-keys", str(keys)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "oops.pem: holds a private key" in out.stderr and out.stderr.count("\n") == 1, out.stderr

def test_with_trusted_keys_an_unsigned_warp_is_never_picked(artifacts, tmp_path):
  """The default folder, signed bundle by bundle, and an unsigned copy of its warp that sorts first (warp_a_split.bin): modeld picked the
  unsigned one, the load refused it, and the set failed to start. Now the unsigned warp is skipped with a line and the signed one loads."""
  from sunnypilot.modeld_v2 import modeld
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.camera_sync import Geometry
  from sunnypilot.modeld_v2.daemon.frame_daemon import FrameDaemon
  from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, Trust
  os.makedirs(tmp_path / "trusted")
  publisher, public = generate_key(str(tmp_path / "publisher.pem"))
  shutil.copy(public, tmp_path / "trusted" / "publisher.pem")
  default = tmp_path / "default"
  os.makedirs(default)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), default / name)
  sign_bundles(default, publisher)
  shutil.copy(default / "warp_split.bin", default / "warp_a_split.bin")
  lines: list[str] = []
  episodes = Episodes(lines.append)
  daemon = FrameDaemon(modeld.ModelD(episodes), episodes, str(default), trust=Trust.from_folder(str(tmp_path / "trusted")))
  prepared = daemon.prepare(daemon.sets.open(DEFAULT_SET), Geometry((0,), FRAME, None))
  try: assert os.path.basename(prepared.warp) == "warp_split.bin"
  finally: prepared.adapter.close()
  assert sum("warp_a_split.bin" in line and "skipping" in line for line in lines) == 1, lines
