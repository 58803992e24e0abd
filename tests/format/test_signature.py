"""Signatures and manifests: every way a bundle can be unsigned, re-hashed, signed by someone else or for something else is one line."""
import base64
import hashlib
import json
import os
import shutil
import stat

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import PREAMBLE, content_digest
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, Entry, Manifest, check_folder, read_manifest, write_manifest
from sunnypilot.modeld_v2.format.signature import (
  Signed,
  TrustedKeys,
  check_signed,
  generate_key,
  load_private_key,
  load_public_key,
  read_signatures,
  sig_path,
  sign,
)

@pytest.fixture
def keys(tmp_path) -> dict:
  """Two publishers' key pairs (the old and the new of a rotation) and a third nobody trusts; `trusted` holds the first two's public keys."""
  out = {}
  for name in ("old", "new", "stranger"):
    private, public = generate_key(str(tmp_path / f"{name}.pem"))
    out[name] = (private, public)
  os.makedirs(trusted := tmp_path / "trusted")
  for name in ("old", "new"): shutil.copy(out[name][1], trusted / f"{name}.pem")
  out["trusted"] = str(trusted)
  return out

@pytest.fixture
def bundles(native_artifacts, tmp_path) -> dict:
  folder = tmp_path / "set"
  os.makedirs(folder)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  return {name: str(folder / name) for name in ("model.bin", "warp_split.bin")}

def signed_bundle(path: str) -> Signed: return Signed("bundle", os.path.basename(path), content_digest(path), os.path.getsize(path))

def check(path: str, keys: dict) -> str:
  return check_signed(path, "bundle", content_digest(path), os.path.getsize(path), TrustedKeys.load(keys["trusted"]))

def test_a_generated_pair_signs_and_either_trusted_key_verifies(keys, bundles):
  private, public = keys["old"]
  assert stat.S_IMODE(os.stat(private).st_mode) == 0o600 and public.endswith("old.pub.pem")
  model = bundles["model.bin"]
  sign(model, signed_bundle(model), load_private_key(private))
  assert "old.pem" in check(model, keys)
  sign(model, signed_bundle(model), load_private_key(keys["new"][0]))  # a rotation: the new key signs too, the old signature stays
  assert len(read_signatures(sig_path(model)).signatures) == 2
  os.remove(os.path.join(keys["trusted"], "old.pem"))  # a device that trusts only the new key
  assert "new.pem" in check(model, keys)
  with pytest.raises(ArtifactError, match="exists: a key is never overwritten"): generate_key(private)

def test_unsigned_untrusted_and_forged_are_one_line_each(keys, bundles):
  model = bundles["model.bin"]
  with pytest.raises(ArtifactError, match=r"unsigned: no .*model\.bin\.sig"): check(model, keys)
  sign(model, signed_bundle(model), load_private_key(keys["stranger"][0]))
  with pytest.raises(ArtifactError, match="none of them trusted"): check(model, keys)
  sign(model, signed_bundle(model), load_private_key(keys["old"][0]))
  doc = json.load(open(sig_path(model)))
  raw = bytearray(base64.b64decode(doc["signatures"][-1]["signature"]))
  raw[0] ^= 1
  doc["signatures"][-1]["signature"] = base64.b64encode(raw).decode()
  json.dump(doc, open(sig_path(model), "w"))
  with pytest.raises(ArtifactError, match="does not verify"): check(model, keys)
  doc["signatures"][-1]["signature"] = base64.b64encode(raw[:40]).decode()  # a truncated signature
  json.dump(doc, open(sig_path(model), "w"))
  with pytest.raises(ArtifactError, match="is 40 bytes, not 64"): check(model, keys)
  open(sig_path(model), "w").write(json.dumps(doc)[:50])  # a truncated file
  with pytest.raises(ArtifactError, match="not valid JSON"): check(model, keys)

def test_rehashed_but_not_resigned_and_another_bundles_signature_are_refused(keys, bundles):
  model, warp = bundles["model.bin"], bundles["warp_split.bin"]
  for path in (model, warp): sign(path, signed_bundle(path), load_private_key(keys["old"][0]))
  data = bytearray(open(model, "rb").read())
  data[-1] ^= 1  # an edited weight, and the preamble's hash recomputed to match: the bundle reads as intact
  data[PREAMBLE.size - 32:PREAMBLE.size] = hashlib.sha256(bytes(data[PREAMBLE.size:])).digest()
  open(model, "wb").write(data)
  assert content_digest(model) == hashlib.sha256(bytes(data[PREAMBLE.size:])).hexdigest()
  with pytest.raises(ArtifactError, match="changed after it was signed"): check(model, keys)
  shutil.copy(sig_path(warp), sig_path(model))
  with pytest.raises(ArtifactError, match=r"signs warp_split\.bin .*not this file"): check(model, keys)

def test_a_key_file_that_is_not_a_key(keys, tmp_path):
  (text := tmp_path / "notes.pem").write_text("hello\n")
  for load in (load_private_key, load_public_key):
    with pytest.raises(ArtifactError, match=r"notes\.pem: not an"): load(str(text))
  with pytest.raises(ArtifactError, match="that is a public key"): load_private_key(keys["old"][1])
  shutil.copy(keys["stranger"][0], os.path.join(keys["trusted"], "oops.pem"))
  with pytest.raises(ArtifactError, match=r"oops\.pem: holds a private key"): TrustedKeys.load(keys["trusted"])
  with pytest.raises(ArtifactError, match="no such folder"): TrustedKeys.load(str(tmp_path / "nowhere"))
  os.makedirs(empty := tmp_path / "empty")
  with pytest.raises(ArtifactError, match="no public key"): TrustedKeys.load(str(empty))

def manifest_of(bundles: dict) -> list[Entry]:
  return [Entry(os.path.basename(p), role, content_digest(p), os.path.getsize(p)) for p, role in zip(bundles.values(), ("driving_model", "warp"))]

def test_a_manifest_names_its_folder_exactly(bundles):
  folder = os.path.dirname(bundles["model.bin"])
  path = os.path.join(folder, MANIFEST_NAME)
  written = write_manifest(path, "set-1", manifest_of(bundles))
  manifest, digest, size = read_manifest(path)
  assert manifest == written and digest == hashlib.sha256(open(path, "rb").read()).hexdigest() and size == os.path.getsize(path)
  assert manifest.files("warp") == ["warp_split.bin"] and manifest.entry("model.bin").sha256 == content_digest(bundles["model.bin"])
  check_folder(manifest, folder)
  shutil.copy(bundles["warp_split.bin"], os.path.join(folder, "planted.bin"))
  with pytest.raises(ArtifactError, match=r"planted\.bin: a bundle the manifest of set-1 does not name"): check_folder(manifest, folder)
  os.remove(os.path.join(folder, "planted.bin"))
  open(bundles["warp_split.bin"], "ab").write(b"x")
  with pytest.raises(ArtifactError, match="the manifest says"): check_folder(manifest, folder)

@pytest.mark.parametrize("edit, error", [
  (lambda d: d["bundles"][0].update(file="../model.bin"), "not a plain name"),
  (lambda d: d["bundles"][0].update(file="sub/model.bin"), "not a plain name"),
  (lambda d: d["bundles"][0].update(file=".hidden.bin"), "not a plain name"),
  (lambda d: d.update(name=".."), "not a plain name"),
  (lambda d: d["bundles"].append(dict(d["bundles"][0])), "names model.bin twice"),
  (lambda d: d["bundles"][0].update(sha256="abc"), "not 64 hex digits"),
  (lambda d: d["bundles"][0].update(size=True), "is not a size"),
  (lambda d: d.update(version=2), "not a spmv2-model-set version 1"),
  (lambda d: d.update(bundles=[]), "names no bundles"),
])
def test_a_malformed_manifest_is_one_line(bundles, edit, error):
  doc = Manifest("set-1", tuple(manifest_of(bundles))).to_json()
  edit(doc)
  with pytest.raises(ArtifactError, match=error): Manifest.from_json(doc, "m.json")

def test_a_signature_file_larger_than_a_signature_is_not_read(bundles):
  model = bundles["model.bin"]
  with open(sig_path(model), "wb") as f: f.write(b" " * (2 << 20))
  with pytest.raises(ArtifactError, match="not a signature file"): read_signatures(sig_path(model))
