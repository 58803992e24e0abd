"""install_models against an HTTP server on 127.0.0.1 started here (Range requests, cut connections, slow pieces), and from a folder."""
import http.server
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
  between 64 KiB pieces. `requests` records (file name, Range header)."""
  def __init__(self, folder):
    self.folder, self.cut, self.slow, self.requests = str(folder), {}, {}, []
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

def same_files(a, b, names=("model.bin", "warp_split.bin", MANIFEST_NAME, MANIFEST_NAME + ".sig")) -> bool:
  return all(open(os.path.join(a, n), "rb").read() == open(os.path.join(b, n), "rb").read() for n in names)

def test_install_verifies_writes_at_once_and_activates(server, published, tmp_path, capsys):
  root = tmp_path / "sets"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted", "--activate")
  assert code == 0, err
  assert same_files(published, root / "first") and (root / "active").read_text() == "first\n"
  assert "manifest signed by key" in err and "installed set first" in err
  assert os.listdir(root / ".partial") == [], "nothing staged is left"
  code, err = run(capsys, server.url + MANIFEST_NAME, "--model-sets", root, "--trusted-keys", tmp_path / "trusted")
  assert code == 0 and "installed already" in err

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
  assert not (root / "first").exists()

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
  assert code == 2 and "no such manifest" in err
