"""sign_bundle and inspect_bundle's signature views, through their mains as a person runs them."""
import json
import os
import shutil

import pytest

from sunnypilot.modeld_v2.tools import inspect_bundle, sign_bundle

@pytest.fixture
def folder(native_artifacts, tmp_path):
  """A set's folder: the tiny native model and its split warp; keys beside it: a publisher's, and a trusted folder holding its public half."""
  (tmp_path / "set").mkdir()
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), tmp_path / "set" / name)
  return tmp_path / "set"

def keys(tmp_path, capsys) -> tuple[str, str]:
  """(private key, trusted folder) of a new publisher, made with --generate-key."""
  assert sign_bundle.main(["--generate-key", str(tmp_path / "publisher.pem")]) == 0
  assert "publisher.pub.pem" in capsys.readouterr().out
  (tmp_path / "trusted").mkdir(exist_ok=True)
  shutil.copy(tmp_path / "publisher.pub.pem", tmp_path / "trusted" / "publisher.pem")
  return str(tmp_path / "publisher.pem"), str(tmp_path / "trusted")

def error(capsys) -> str:
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "Traceback" not in err, err
  return err

def test_sign_bundles_then_inspect_and_verify_them(folder, tmp_path, capsys):
  key, trusted = keys(tmp_path, capsys)
  model = str(folder / "model.bin")
  assert sign_bundle.main(["--key", key, model, str(folder / "warp_split.bin")]) == 0
  assert capsys.readouterr().out.count("signed ") == 2
  assert inspect_bundle.main(["inspect", model]) == 0
  out = capsys.readouterr().out
  assert "this file" in out and "verifies" in out and "signed by key" in out
  assert inspect_bundle.main(["verify", model, "--trusted-keys", trusted]) == 0
  out = capsys.readouterr().out
  assert "PASS signature: signed by key" in out and "publisher.pem" in out and out.strip().endswith("verified")
  (tmp_path / "nobody").mkdir()
  shutil.copy(tmp_path / "publisher.pub.pem", tmp_path / "nobody" / "other.pem")
  os.remove(os.path.join(trusted, "publisher.pem"))
  assert sign_bundle.main(["--generate-key", str(tmp_path / "other.pem")]) == 0
  shutil.copy(tmp_path / "other.pub.pem", os.path.join(trusted, "other.pem"))
  capsys.readouterr()
  assert inspect_bundle.main(["verify", model, "--trusted-keys", trusted]) == 1
  out = capsys.readouterr().out
  assert "FAIL signature:" in out and "none of them trusted" in out and "NOT SIGNED" in out

def test_a_manifest_signed_names_its_folder_and_verifies_every_hash(folder, tmp_path, capsys):
  key, trusted = keys(tmp_path, capsys)
  assert sign_bundle.main(["--key", key, "--manifest", str(folder), "--name", "first"]) == 0
  manifest = str(folder / "manifest.json")
  assert [(b["file"], b["role"]) for b in json.load(open(manifest))["bundles"]] == [("model.bin", "driving_model"), ("warp_split.bin", "warp")]
  capsys.readouterr()
  assert inspect_bundle.main(["inspect", manifest]) == 0
  out = capsys.readouterr().out
  assert "the manifest of set first, 2 bundles" in out and out.count("matches") == 2 and "verifies" in out
  assert inspect_bundle.main(["inspect", str(folder / "model.bin")]) == 0
  assert "manifest.json of set first names it as its driving_model, with this content hash" in capsys.readouterr().out
  assert inspect_bundle.main(["verify", manifest, "--trusted-keys", trusted]) == 0
  assert "PASS signature: manifest signed by key" in (out := capsys.readouterr().out) and "PASS bundles" in out
  assert inspect_bundle.main(["verify", str(folder / "model.bin"), "--trusted-keys", trusted]) == 0  # vouched for by its folder's manifest
  assert "named as its driving_model by set default's manifest signed by" in capsys.readouterr().out
  shutil.copy(folder / "warp_split.bin", folder / "planted.bin")
  assert inspect_bundle.main(["verify", manifest, "--trusted-keys", trusted]) == 1
  assert "FAIL bundles:" in (out := capsys.readouterr().out) and "planted.bin: a bundle the manifest of first does not name" in out

def test_bad_keys_and_files_are_one_line(folder, tmp_path, capsys):
  key, trusted = keys(tmp_path, capsys)
  model = str(folder / "model.bin")
  assert sign_bundle.main(["--key", str(tmp_path / "publisher.pub.pem"), model]) == 2
  assert "that is a public key" in error(capsys)
  (tmp_path / "text.pem").write_text("not a key\n")
  assert sign_bundle.main(["--key", str(tmp_path / "text.pem"), model]) == 2
  assert "not an unencrypted Ed25519 private key" in error(capsys)
  assert sign_bundle.main(["--generate-key", key]) == 2 and "a key is never overwritten" in error(capsys)
  (tmp_path / "notes.txt").write_text("hello")
  assert sign_bundle.main(["--key", key, str(tmp_path / "notes.txt")]) == 2 and "not valid JSON" in error(capsys)
  data = bytearray(open(model, "rb").read())
  data[-1] ^= 1
  open(model, "wb").write(data)
  assert sign_bundle.main(["--key", key, model]) == 2 and "content hash mismatch" in error(capsys), "only intact bundles are signed"
  assert not os.path.exists(model + ".sig")
  shutil.copy(folder / "warp_split.bin", folder / "dm_thing.bin")
  assert sign_bundle.main(["--key", key, "--manifest", str(folder), "--name", "../up"]) == 2 and "not a plain name" in error(capsys)
  assert inspect_bundle.main(["verify", str(folder / "warp_split.bin"), "--trusted-keys", str(tmp_path / "nowhere")]) == 2
  assert "no such folder" in error(capsys)
  with pytest.raises(SystemExit): sign_bundle.main(["--key", key, "--role", "x.bin=dm_model", model])  # --role needs --manifest
