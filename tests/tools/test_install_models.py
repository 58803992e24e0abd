"""install_models against an HTTP server on 127.0.0.1 started here (Range requests, cut connections, slow pieces, a trickle, 404s), and from
a folder; killed at each step of an install, then run again."""
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME
from sunnypilot.modeld_v2.tools import install_models, sign_bundle

from conftest import ROOT

class Server:
  """Serves `folder` on 127.0.0.1 with HTTP Range requests; `cut[name]`: bytes sent before the connection drops; `slow[name]`: seconds
  between 64 KiB pieces; `trickle[name]`: seconds between single bytes (until the client or the server goes). `requests` records (file
  name, Range header)."""
  def __init__(self, folder):
    self.folder, self.cut, self.slow, self.trickle, self.requests, self.closing = str(folder), {}, {}, {}, [], threading.Event()
    server = self
    class Handler(http.server.BaseHTTPRequestHandler):
      def log_message(self, *args): pass
      def do_GET(self):
        name = self.path.lstrip("/")
        server.requests.append((name, self.headers.get("Range")))
        path = os.path.join(server.folder, name)
        if "/" in name or not os.path.isfile(path): return self.send_error(404)
        data = open(path, "rb").read()
        start = int(r.removeprefix("bytes=").split("-")[0]) if (r := self.headers.get("Range")) else 0
        self.send_response(206 if start else 200)
        if start: self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.send_header("Content-Length", str(len(data) - start))
        self.end_headers()
        body = data[start:server.cut[name]] if name in server.cut and start < server.cut[name] else data[start:]
        if name in server.trickle:
          for at in range(len(body)):
            self.wfile.write(body[at:at + 1])
            self.wfile.flush()
            if server.closing.wait(server.trickle[name]): return
        for at in range(0, len(body), 1 << 16):
          self.wfile.write(body[at:at + (1 << 16)])
          if name in server.slow: time.sleep(server.slow[name])
    class Quiet(http.server.ThreadingHTTPServer):
      def handle_error(self, request, client_address): pass  # a client killed mid-download is what the tests do
    self.httpd = Quiet(("127.0.0.1", 0), Handler)
    self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
    self.thread.start()
    self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"

  def close(self):
    self.closing.set()
    self.httpd.shutdown()
    self.httpd.server_close()

@pytest.fixture
def published(native_artifacts, tmp_path, capsys):
  """A set `first` as a publisher puts it on a server: model, warp, a manifest signed by the publisher; the publisher's trusted folder."""
  folder = tmp_path / "published"
  folder.mkdir()
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  assert sign_bundle.main(["--generate-key", str(tmp_path / "publisher.pem")]) == 0
  assert sign_bundle.main(["--key", str(tmp_path / "publisher.pem"), "--manifest", str(folder), "--name", "first"]) == 0
  (tmp_path / "trusted").mkdir()
  shutil.copy(tmp_path / "publisher.pub.pem", tmp_path / "trusted" / "publisher.pem")
  capsys.readouterr()
  return folder

@pytest.fixture
def server(published):
  server = Server(published)
  yield server
  server.close()

def run(capsys, *argv) -> tuple[int, str]:
  code = install_models.main([str(a) for a in argv])
  return code, capsys.readouterr().err

SET_FILES = ("model.bin", "warp_split.bin", MANIFEST_NAME, MANIFEST_NAME + ".sig")

def same_files(a, b, names=SET_FILES) -> bool:
  return all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in names)

def leftovers(root, sets=()) -> list[str]:
  """What is in the model sets folder besides the installed `sets` (each holding exactly its files), `active` and the lock."""
  extra = sorted(set(os.listdir(root)) - {*sets, "active", install_models.LOCK})
  return extra + [f"{s}/{n}" for s in sets for n in sorted(set(os.listdir(os.path.join(root, s))) - set(SET_FILES))]

def test_install_verifies_writes_at_once_and_activates(server, published, tmp_path, capsys):
  root = tmp_path / "sets"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted", "--activate")
  assert code == 0, err
  assert same_files(published, root / "first") and (root / "active").read_text() == "first\n"
  assert "manifest signed by key" in err and "installed set first" in err
  assert leftovers(root, ["first"]) == [], "nothing staged is left"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0 and "installed already" in err

def test_activate_of_a_set_installed_already_activates_it(server, published, tmp_path, capsys):
  """A rerun with --activate (or one after power was lost between the rename and the activation) said "installed already", exited 0 and
  never wrote `active`."""
  root = tmp_path / "sets"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0 and not (root / "active").exists(), err
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted", "--activate")
  assert code == 0 and "installed already" in err and (root / "active").read_text() == "first\n", err
  assert leftovers(root, ["first"]) == []

# a fresh install_models killed (SIGKILL, as a power loss) at one step: during the download (from outside, while a slow server sends), while
# verifying a downloaded bundle, before the rename of the staged set, after it (before the activation), and while writing `active`
KILLED_AT = """
import os, signal, sys
from sunnypilot.modeld_v2.tools import install_models
step, die = sys.argv[1], lambda: os.kill(os.getpid(), signal.SIGKILL)
check, rename, replace = install_models.check_content, os.rename, os.replace
def checked(path):
  if step == "verify" and path.endswith(".part"): die()
  return check(path)
def renamed(src, dst):
  if step == "rename": die()
  rename(src, dst)
  if step == "renamed": die()
def replaced(src, dst):
  if step == "activate" and os.path.basename(dst) == "active": die()
  replace(src, dst)
install_models.check_content, os.rename, os.replace = checked, renamed, replaced
sys.exit(install_models.main(sys.argv[2:]))
"""

def killed_install(server, root, step: str) -> None:
  """install_models --activate in a process of its own, SIGKILLed at `step`."""
  argv = [server.url + MANIFEST_NAME, "--model-sets", str(root), "--activate"]
  if step == "download": server.slow["model.bin"] = 0.02
  proc = subprocess.Popen([sys.executable, "-c", KILLED_AT, step, *argv], cwd=ROOT, stderr=subprocess.PIPE, text=True)
  if step == "download":
    part, deadline = root / ".partial" / "first" / "model.bin.part", time.monotonic() + 60
    while not (part.exists() and part.stat().st_size > 1 << 20):
      assert time.monotonic() < deadline and proc.poll() is None, "the download never started"
      time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == -signal.SIGKILL, f"{step}: never reached ({proc.returncode}): {err}"
  server.slow.clear()

@pytest.mark.parametrize("step", ["download", "verify", "rename", "renamed", "activate"])
def test_an_install_killed_at_any_step_is_completed_by_the_next(server, published, tmp_path, capsys, step):
  """Whatever step a power loss cut, the next `install_models --activate` ends with the set installed, `active` naming it and nothing else
  in the folder: no staged files, no temporary `active.tmp<pid>` of the dead writer."""
  root = tmp_path / "sets"
  killed_install(server, root, step)
  if step == "activate": assert [n for n in os.listdir(root) if n.startswith("active.tmp")], "the kill left the dead writer's temporary file"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted", "--activate")
  assert code == 0, err
  assert same_files(published, root / "first") and (root / "active").read_text() == "first\n"
  assert leftovers(root, ["first"]) == [], err

def test_stale_temporaries_are_removed_by_any_next_install_a_live_writers_kept(server, published, tmp_path, capsys):
  """`active.tmp<pid>` of an install killed while activating stayed for good (only an install that activated again removed it); the next
  install removes it, activating or not, and keeps a temporary file whose writer still runs (modeld writing last_ran)."""
  root = tmp_path / "sets"
  killed_install(server, root, "activate")
  dead = [n for n in os.listdir(root) if n.startswith("active.tmp")]
  live = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
  try:
    (root / f"last_ran.tmp{live.pid}").write_text("first\n")
    code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
    assert code == 0 and "installed already" in err, err
    assert dead and not any((root / n).exists() for n in dead), "the dead writer's temporary file is removed"
    assert (root / f"last_ran.tmp{live.pid}").exists(), "a live writer's is kept"
  finally:
    live.communicate(b"")

def test_an_interrupted_download_resumes(server, published, tmp_path, capsys):
  root, cut = tmp_path / "sets", 5_000_000
  server.cut["model.bin"] = cut
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and err.count("error:") == 1 and f"ended at {cut:,} of" in err and "run again to resume" in err, err
  assert not (root / "first").exists() and os.path.getsize(root / ".partial" / "first" / "model.bin.part") == cut
  del server.cut["model.bin"]
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0, err
  assert ("model.bin", f"bytes={cut}-") in server.requests and f"resuming at {cut:,}" in err
  assert same_files(published, root / "first")

def test_a_killed_install_is_cleaned_up_and_resumed(server, published, tmp_path, capsys):
  root = tmp_path / "sets"
  server.slow["model.bin"] = 0.02
  command = [sys.executable, "-m", "sunnypilot.modeld_v2.tools.install_models", server.url + MANIFEST_NAME, "--model-sets", str(root)]
  proc = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.DEVNULL)
  part = root / ".partial" / "first" / "model.bin.part"
  deadline = time.monotonic() + 60
  while not (part.exists() and part.stat().st_size > 1 << 20):
    assert time.monotonic() < deadline and proc.poll() is None, "the download never started"
    time.sleep(0.01)
  proc.send_signal(signal.SIGKILL)
  proc.wait(10)
  killed_at = part.stat().st_size
  os.makedirs(root / ".partial" / "older")  # what an install of another set, killed long ago, left
  (root / ".partial" / "older" / "model.bin.part").write_bytes(b"x" * 100)
  del server.slow["model.bin"]
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0, err
  assert not (root / ".partial" / "older").exists() and "removing what an interrupted install left" in err
  assert ("model.bin", f"bytes={killed_at}-") in server.requests and same_files(published, root / "first")

@pytest.mark.parametrize("lie, message", [
  ("hash", "content hash"), ("dotdot", "is not a plain name"), ("unsigned", "unsigned: no"), ("stranger", "none of them trusted"),
  ("truncated", "is 40 bytes, not 64"),
])
def test_a_lying_or_unsigned_manifest_installs_nothing(server, published, tmp_path, capsys, lie, message):
  import base64
  import json
  manifest, sig = published / MANIFEST_NAME, published / (MANIFEST_NAME + ".sig")
  if lie == "hash":  # the server has another model under the name the manifest gives
    data = bytearray(open(published / "model.bin", "rb").read())
    data[-1] ^= 1
    open(published / "model.bin", "wb").write(data)
  elif lie == "dotdot":
    doc = json.load(open(manifest))
    doc["bundles"][0]["file"] = "../model.bin"
    json.dump(doc, open(manifest, "w"))
  elif lie == "unsigned": os.remove(sig)
  elif lie == "stranger":
    assert sign_bundle.main(["--generate-key", str(tmp_path / "stranger.pem")]) == 0
    os.remove(sig)
    assert sign_bundle.main(["--key", str(tmp_path / "stranger.pem"), str(manifest)]) == 0
  elif lie == "truncated":
    doc = json.load(open(sig))
    doc["signatures"][0]["signature"] = base64.b64encode(base64.b64decode(doc["signatures"][0]["signature"])[:40]).decode()
    json.dump(doc, open(sig, "w"))
  capsys.readouterr()
  root = tmp_path / "sets"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and err.count("error:") == 1 and message in err and "Traceback" not in err, err
  assert leftovers(root) == [], "a refused install leaves nothing of the set (its staged manifest and bundles are removed)"

def test_a_trickling_server_ends_at_the_deadline_with_progress(server, published, tmp_path):
  """A server sending a byte every 5 s kept install_models (30 s per read, no overall limit) running for ever, silent (a line only every
  8 MiB). Now a progress line comes every 2 s, saying nothing arrives, and --deadline ends it with one line and nothing of the set kept."""
  root = tmp_path / "sets"
  server.trickle["model.bin"] = 5.0
  command = [sys.executable, "-m", "sunnypilot.modeld_v2.tools.install_models", server.url + MANIFEST_NAME, "--model-sets", str(root), "--deadline", "5"]
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
  lines = proc.stderr.strip().splitlines()
  assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
  assert lines[-1].startswith("install_models: error: ") and "deadline of 5 s (--deadline)" in lines[-1] and "model.bin" in lines[-1], lines[-1]
  assert [line for line in lines if "model.bin: " in line and " of 16," in line and "nothing for" in line], proc.stderr
  assert leftovers(root) == []

def test_a_trickling_manifest_ends_at_the_deadline(server, published, tmp_path, capsys):
  root = tmp_path / "sets"
  server.trickle[MANIFEST_NAME] = 5.0
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--deadline", "1")
  assert code == 2 and err.strip().splitlines()[-1].endswith(f"{MANIFEST_NAME}: the install took longer than its deadline of 1 s (--deadline): "
                                                               "stopped, nothing of the set kept"), err
  assert leftovers(root) == []

def test_a_missing_file_names_the_http_status_and_the_url(server, published, tmp_path, capsys):
  """A 404 was reported as the bare URL."""
  root = tmp_path / "sets"
  code, err = run(capsys, server.url + "other.json", "--model-sets", root)
  assert code == 2 and err.strip().splitlines()[-1] == f"install_models: error: no such manifest: {server.url}other.json: HTTP 404 Not Found", err
  os.remove(published / "warp_split.bin")
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and err.strip().splitlines()[-1] == f"install_models: error: {server.url}warp_split.bin: HTTP 404 Not Found", err
  assert leftovers(root) == []

def write_manifest_json(folder, bundles) -> str:
  path = folder / MANIFEST_NAME
  path.write_text(json.dumps({"format": "spmv2-model-set", "version": 1, "name": "first", "bundles": bundles}))
  if (sig := folder / (MANIFEST_NAME + ".sig")).exists(): os.remove(sig)
  return str(path)

def test_a_manifest_of_too_many_bundles_or_a_zero_size_is_refused_in_one_line(published, tmp_path, capsys):
  """1,030 entries installed the first 1,024 and said nothing; a size of 0 failed as "[Errno 2] ... model.bin.part"."""
  root, entry = tmp_path / "sets", json.load(open(published / MANIFEST_NAME))["bundles"][0]
  manifest = write_manifest_json(published, [entry | {"file": f"m{i}.bin"} for i in range(1030)])
  code, err = run(capsys, manifest, "--model-sets", root)
  assert code == 2 and err.strip().splitlines()[-1] == f"install_models: error: {manifest}: names 1,030 bundles, more than the 1,024 a manifest may name"
  manifest = write_manifest_json(published, [entry | {"size": 0}])
  code, err = run(capsys, manifest, "--model-sets", root)
  assert code == 2 and err.strip().splitlines()[-1].endswith("model.bin: size 0 is less than a bundle's 52-byte preamble: not a bundle"), err
  assert leftovers(root) == []

def test_a_fifo_as_manifest_or_bundle_is_refused_not_waited_on(published, tmp_path):
  """A FIFO given as the manifest, or standing for a bundle beside it, blocked the install for ever (open() waits for a writer)."""
  (tmp_path / "fifo.json").unlink(missing_ok=True)
  os.mkfifo(tmp_path / "fifo.json")
  os.remove(published / "warp_split.bin")
  os.mkfifo(published / "warp_split.bin")
  for manifest, what in ((tmp_path / "fifo.json", "fifo.json is a FIFO"), (published / MANIFEST_NAME, "warp_split.bin is a FIFO")):
    command = [sys.executable, "-m", "sunnypilot.modeld_v2.tools.install_models", str(manifest), "--model-sets", str(tmp_path / "sets")]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("error:") == 1 and what in proc.stderr and "not a regular file" in proc.stderr, proc.stderr
    assert leftovers(tmp_path / "sets") == []

def test_a_planted_lock_link_is_never_followed(published, tmp_path, capsys):
  """A link planted as .install.lock made the install create a file where it pointed."""
  root, target = tmp_path / "sets", tmp_path / "elsewhere"
  root.mkdir()
  os.symlink(target, root / install_models.LOCK)
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root)
  line = f"install_models: error: {root / install_models.LOCK} is a symbolic link: install_models follows none in the model sets folder (remove it)"
  assert code == 2 and err.strip().splitlines()[-1] == line, err
  assert not target.exists() and sorted(os.listdir(root)) == [install_models.LOCK]

def test_from_a_folder_and_an_installed_name_is_never_replaced(published, tmp_path, capsys):
  """From a folder (a USB stick): only what the manifest names is copied (a stray bundle there stays behind); a second set of the same
  name is refused, the installed one untouched."""
  root = tmp_path / "sets"
  shutil.copy(published / "warp_split.bin", published / "stray.bin")
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0 and same_files(published, root / "first") and not (root / "first" / "stray.bin").exists(), err
  os.remove(published / "stray.bin")
  other = tmp_path / "other"
  shutil.copytree(published, other)
  os.remove(other / "warp_split.bin")
  assert sign_bundle.main(["--key", str(tmp_path / "publisher.pem"), "--manifest", str(other), "--name", "first"]) == 0
  capsys.readouterr()
  code, err = run(capsys, other / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and "holds another set named first: installed sets are never replaced" in err
  assert same_files(published, root / "first"), "the installed set is untouched"
  (tmp_path / "file").write_text("")
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", tmp_path / "file")
  assert code == 2 and "not a folder" in err
  code, err = run(capsys, tmp_path / "nothing.json", "--model-sets", root)
  assert code == 2 and f"no such manifest: {tmp_path / 'nothing.json'}: no such file" in err

@pytest.mark.parametrize("name", ["default", "active", "last_ran"])
def test_a_set_named_as_the_folders_own_files_is_refused(published, tmp_path, capsys, name):
  """`default` is the --artifacts folder (a set installed under it never runs), `active` and `last_ran` are the folder's flag files:
  such a set is refused in one line, nothing written."""
  assert sign_bundle.main(["--key", str(tmp_path / "publisher.pem"), "--manifest", str(published), "--name", name]) == 0
  capsys.readouterr()
  root = tmp_path / "sets"
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and err.count("error:") == 1 and f"the set name '{name}' is reserved" in err, err
  assert not (root / name).exists() and not (root / ".partial" / name).exists()

def test_links_in_the_model_sets_folder_are_never_followed(published, tmp_path, capsys):
  """A link planted where a partial download resumes made the install append the bundle to the file it points to; one where the installed
  set's manifest is made a foreign manifest read as the set's. Both are refused in one line, the file pointed to untouched."""
  root, victim = tmp_path / "sets", tmp_path / "victim"
  victim.write_bytes(b"precious")
  staging = root / ".partial" / "first"
  staging.mkdir(parents=True)
  shutil.copy(published / MANIFEST_NAME, staging / MANIFEST_NAME)  # the same version of the set: its partial files resume
  os.symlink(victim, staging / "model.bin.part")
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and err.count("error:") == 1 and "model.bin.part is a symbolic link" in err, err
  assert victim.read_bytes() == b"precious" and not (root / "first").exists()
  shutil.rmtree(root)
  (root / "first").mkdir(parents=True)
  shutil.copy(published / MANIFEST_NAME, victim)
  os.symlink(victim, root / "first" / MANIFEST_NAME)
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and "holds another set named first" in err, err

def test_an_installed_manifest_is_read_only_as_far_as_the_new_one(published, tmp_path, capsys):
  """The installed set's manifest.json was read whole to compare: a huge file there (here 1 TiB, sparse) was read into memory. Now at
  most one byte more than the new manifest is read."""
  root = tmp_path / "sets"
  (root / "first").mkdir(parents=True)
  with open(root / "first" / MANIFEST_NAME, "wb") as f: f.truncate(1 << 40)
  code, err = run(capsys, published / MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 2 and "holds another set named first" in err, err
