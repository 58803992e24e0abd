"""Ed25519 signatures of bundles and manifests, in a detached `<file>.sig` beside the signed file, with `cryptography`'s Ed25519.

A bundle holds native kernel code: loading one is running it. A signature names what it signs by content hash and size (a bundle's is the
hash its preamble declares, sha256 of header + blob: known before a byte of its blob is read, so a signature is checked before any kernel
is mapped; a manifest's is the sha256 of its bytes) and signs that statement with a publisher's key:

  {"format": "spmv2-signature", "version": 1,
   "signed": {"kind": "bundle" | "manifest", "name": "model.bin", "sha256": "<hex>", "size": 123},
   "signatures": [{"key_id": "<16 hex>", "public_key": "<base64, 32 bytes>", "signature": "<base64, 64 bytes>"}]}

The signed message is SIGNED_PREFIX + the canonical JSON of `signed`. A .sig holds several signatures of one statement (a key rotation:
devices trusting either key accept it). The bundle's bytes never change when it is signed, so a manifest naming it by hash stays valid.
Keys are PEM files: a private key in PKCS#8, a public key as SubjectPublicKeyInfo; a key's id is the first 16 hex digits of the sha256 of
its 32 raw bytes. Whether a signature is required is the caller's policy (the daemons: --trusted-keys); this module only checks.
"""
from __future__ import annotations

import base64
import binascii
import glob
import hashlib
import json
import os
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, TypeVar

from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular, replaced_atomically

if TYPE_CHECKING:  # cryptography is an optional extra (signing), imported when a key is first used
  from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

T = TypeVar("T")

SIG_FORMAT, SIG_VERSION = "spmv2-signature", 1
SIGNED_PREFIX = b"sunnypilot-modeld-v2 signature v1\0"  # a signature here can never be mistaken for one of anything else signed by the key
KINDS = ("bundle", "manifest")
MAX_SIG_BYTES = 1 << 20  # a .sig is a few hundred bytes a signature: a larger one is a stray or crafted file, refused before it is read

def sig_path(path: str) -> str:
  """Where the signatures of `path` live."""
  return path + ".sig"

def _crypto() -> tuple[ModuleType, ModuleType]:
  try:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ed25519
  except ImportError:
    raise ArtifactError("signatures need the cryptography package: pip install 'sunnypilot-modeld-v2[signing]'") from None
  return serialization, ed25519

def _raw(public_key: Ed25519PublicKey) -> bytes:
  serialization, _ = _crypto()
  return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)

def key_id(raw_public: bytes) -> str: return hashlib.sha256(raw_public).hexdigest()[:16]

def _read_small(path: str, what: str) -> bytes:
  with open_regular(path) as f: data = f.read(MAX_SIG_BYTES + 1)
  if len(data) > MAX_SIG_BYTES: raise ArtifactError(f"{path}: more than {MAX_SIG_BYTES:,} bytes: not {what}")
  return data

def load_private_key(path: str) -> Ed25519PrivateKey:
  """An Ed25519 private key from a PEM file; one line naming the file when it is anything else (a public key, another algorithm, text)."""
  serialization, ed25519 = _crypto()
  data = _read_small(path, "a key")
  try: key = serialization.load_pem_private_key(data, password=None)
  except (ValueError, TypeError) as e:
    hint = ": that is a public key; sign with its private half" if b"PUBLIC KEY" in data else ""
    raise ArtifactError(f"{path}: not an unencrypted Ed25519 private key in PEM{hint} ({str(e).split('.')[0][:80]})") from None
  if not isinstance(key, ed25519.Ed25519PrivateKey): raise ArtifactError(f"{path}: a {type(key).__name__}, not an Ed25519 private key")
  return key

def load_public_key(path: str) -> Ed25519PublicKey:
  """An Ed25519 public key from a PEM file; one line naming the file when it is anything else (a private key included)."""
  serialization, ed25519 = _crypto()
  data = _read_small(path, "a key")
  if b"PRIVATE KEY" in data: raise ArtifactError(f"{path}: holds a private key: only public keys are trusted (sign_bundle --generate-key "
                                                 "writes the public half as <name>.pub.pem)")
  try: key = serialization.load_pem_public_key(data)
  except (ValueError, TypeError) as e: raise ArtifactError(f"{path}: not an Ed25519 public key in PEM ({str(e).split('.')[0][:80]})") from None
  if not isinstance(key, ed25519.Ed25519PublicKey): raise ArtifactError(f"{path}: a {type(key).__name__}, not an Ed25519 public key")
  return key

def generate_key(path: str) -> tuple[str, str]:
  """A new key pair: the private key at `path` (readable by its owner only), the public one at `<path stem>.pub.pem`, their folder made
  when missing. Neither may exist yet (a key is never overwritten). Returns (private path, public path)."""
  serialization, ed25519 = _crypto()
  public_path = public_key_path(path)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  for p in (path, public_path):
    if os.path.lexists(p): raise ArtifactError(f"{p} exists: a key is never overwritten")
  key = ed25519.Ed25519PrivateKey.generate()
  private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
  public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
  with replaced_atomically(path, public_path) as (tmp_private, tmp_public):
    with os.fdopen(os.open(tmp_private, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f: f.write(private)
    with open(tmp_public, "xb") as f: f.write(public)
  return path, public_path

def public_key_path(private_path: str) -> str:
  stem = private_path[:-4] if private_path.endswith(".pem") else private_path
  return stem + ".pub.pem"

@dataclass(frozen=True)
class Signed:
  """What a signature states: a file of `kind`, its name when signed, its content hash and size."""
  kind: str
  name: str
  sha256: str
  size: int

  def message(self) -> bytes: return SIGNED_PREFIX + json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

  def to_json(self) -> dict: return {"kind": self.kind, "name": self.name, "sha256": self.sha256, "size": self.size}

@dataclass(frozen=True)
class Signature:
  key_id: str
  public_key: bytes  # 32 raw bytes
  signature: bytes  # 64 bytes

  def to_json(self) -> dict:
    return {"key_id": self.key_id, "public_key": base64.b64encode(self.public_key).decode(), "signature": base64.b64encode(self.signature).decode()}

@dataclass(frozen=True)
class SignatureFile:
  """A .sig: one statement and its signatures, each structurally checked (not yet verified)."""
  signed: Signed
  signatures: tuple[Signature, ...]

  def to_json(self) -> dict:
    return {"format": SIG_FORMAT, "version": SIG_VERSION, "signed": self.signed.to_json(), "signatures": [s.to_json() for s in self.signatures]}

def _field(d: object, key: str, kind: type[T], path: str) -> T:
  if not isinstance(d, dict) or not isinstance(value := d.get(key), kind) or isinstance(value, bool):
    raise ArtifactError(f"{path}: malformed signature file: {key!r} missing or not a {kind.__name__}")
  return value

def _b64(text: str, size: int, what: str, path: str) -> bytes:
  try: raw = base64.b64decode(text, validate=True)
  except (binascii.Error, ValueError): raise ArtifactError(f"{path}: the {what} is not base64") from None
  if len(raw) != size: raise ArtifactError(f"{path}: the {what} is {len(raw)} bytes, not {size} (truncated?)")
  return raw

def read_signatures(path: str) -> SignatureFile:
  """The signature file `path` (a .sig), its structure checked; one line naming it when it is missing, truncated or malformed."""
  if not os.path.lexists(path): raise ArtifactError(f"unsigned: no {path}")
  data = _read_small(path, "a signature file")
  try: doc = json.loads(data)
  except (UnicodeDecodeError, ValueError, RecursionError): raise ArtifactError(f"{path}: not valid JSON (truncated?)") from None
  if not isinstance(doc, dict) or doc.get("format") != SIG_FORMAT or doc.get("version") != SIG_VERSION:
    raise ArtifactError(f"{path}: not a {SIG_FORMAT} version {SIG_VERSION} file")
  signed_doc = _field(doc, "signed", dict, path)
  signed = Signed(_field(signed_doc, "kind", str, path), _field(signed_doc, "name", str, path), _field(signed_doc, "sha256", str, path),
                  _field(signed_doc, "size", int, path))
  if signed.kind not in KINDS: raise ArtifactError(f"{path}: signs a {signed.kind!r:.20}, not one of {KINDS}")
  sigs = []
  for s in _field(doc, "signatures", list, path)[:64]:
    public = _b64(_field(s, "public_key", str, path), 32, "public key", path)
    sigs.append(Signature(key_id(public), public, _b64(_field(s, "signature", str, path), 64, f"signature of key {key_id(public)}", path)))
  if not sigs: raise ArtifactError(f"{path}: holds no signature")
  return SignatureFile(signed, tuple(sigs))

@dataclass(frozen=True)
class TrustedKeys:
  """The public keys a device trusts: every *.pem in one folder, by key id (several keys: a rotation). `folder` names them in errors."""
  folder: str
  keys: dict[str, tuple[str, Ed25519PublicKey]]  # key id -> (file name, public key)

  @staticmethod
  def load(folder: str) -> TrustedKeys:
    """Every *.pem in `folder` as a public key; one line for a folder that is missing or empty, or a file that is not a public key."""
    if not os.path.isdir(folder): raise ArtifactError(f"trusted keys {folder}: {'not a folder' if os.path.exists(folder) else 'no such folder'}")
    keys = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.pem"))):
      key = load_public_key(path)
      keys[key_id(_raw(key))] = (os.path.basename(path), key)
    if not keys: raise ArtifactError(f"trusted keys {folder}: no public key (*.pem) in it")
    return TrustedKeys(folder, keys)

  def describe(self, kid: str) -> str:
    return f"key {kid} ({self.keys[kid][0]})" if kid in self.keys else f"key {kid}"

def check_signed(path: str, kind: str, sha256: str, size: int, trusted: TrustedKeys) -> str:
  """Raise an ArtifactError (one line naming `path`) unless `path.sig` signs a `kind` of this content hash and size with a trusted key,
  and that signature verifies. Returns the trusted key that signed, for the log."""
  sigs, sig = read_signatures(sig_path(path)), sig_path(path)
  signed = sigs.signed
  if signed.kind != kind: raise ArtifactError(f"{sig}: signs a {signed.kind}, {os.path.basename(path)} is read as a {kind}")
  if (signed.sha256, signed.size) != (sha256, size):
    raise ArtifactError(f"{sig}: signs {signed.name} (sha256 {signed.sha256[:16]}, {signed.size:,} bytes), not this file (sha256 {sha256[:16]}, "
                        f"{size:,} bytes): a signature for another {kind}, or the {kind} changed after it was signed")
  known = [s for s in sigs.signatures if s.key_id in trusted.keys]
  if not known:
    raise ArtifactError(f"{sig}: signed by {', '.join(f'key {s.key_id}' for s in sigs.signatures)}, none of them trusted in {trusted.folder}")
  from cryptography.exceptions import InvalidSignature
  for s in known:
    try: trusted.keys[s.key_id][1].verify(s.signature, signed.message())
    except InvalidSignature: raise ArtifactError(f"{sig}: the signature of trusted {trusted.describe(s.key_id)} does not verify (edited or forged)") from None
  return trusted.describe(known[0].key_id)

def describe_signatures(path: str, sha256: str, size: int) -> list[str]:
  """What `path.sig` says, for a person: whether it states this content, and per signature its key and whether it verifies with that key
  (not whether the key is trusted: that is check_signed's, with a device's keys)."""
  try: sigs = read_signatures(sig_path(path))
  except ArtifactError as e: return [str(e)]
  _, ed25519 = _crypto()
  from cryptography.exceptions import InvalidSignature
  signed = sigs.signed
  same = (signed.sha256, signed.size) == (sha256, size)
  lines = [f"{sig_path(path)}: a {signed.kind} {signed.name}, sha256 {signed.sha256[:16]}, {signed.size:,} bytes: "
           f"{'this file' if same else 'NOT this file (another file, or this one changed after it was signed)'}"]
  for s in sigs.signatures:
    try:
      ed25519.Ed25519PublicKey.from_public_bytes(s.public_key).verify(s.signature, signed.message())
      ok = "verifies"
    except InvalidSignature: ok = "DOES NOT VERIFY"
    lines.append(f"signed by key {s.key_id}: {ok}")
  return lines

def sign(path: str, signed: Signed, private_key: Ed25519PrivateKey) -> str:
  """Add a signature of `signed` by `private_key` to `path.sig`, written atomically: kept with the signatures of other keys already
  there when they sign the same statement, replacing them when they sign other content (the file changed). Returns the .sig's path."""
  public = _raw(private_key.public_key())
  new = Signature(key_id(public), public, private_key.sign(signed.message()))
  try: old = read_signatures(sig_path(path))
  except ArtifactError: old = None
  kept = tuple(s for s in old.signatures if s.key_id != new.key_id) if old is not None and old.signed == signed else ()
  with replaced_atomically(sig_path(path)) as (tmp,), open(tmp, "x") as f:
    json.dump(SignatureFile(signed, (*kept, new)).to_json(), f, indent=1)
  return sig_path(path)
