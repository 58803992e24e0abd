"""Sign bundles, or a manifest naming a model set's bundles, with a publisher's Ed25519 key (a detached <file>.sig beside each).

  python -m sunnypilot.modeld_v2.tools.sign_bundle --generate-key keys/publisher.pem    # keys/publisher.pem (private) + publisher.pub.pem
  python -m sunnypilot.modeld_v2.tools.sign_bundle --key keys/publisher.pem out/first/model.bin out/first/warp.bin   # each: <file>.sig
  python -m sunnypilot.modeld_v2.tools.sign_bundle --key keys/publisher.pem --manifest out/first --name first [--role dm.bin=dm_model]
      # out/first/manifest.json naming every bundle there by role and content hash, then signed: manifest.json.sig

A device trusts the public halves (*.pub.pem) put in the folder modeld's --trusted-keys names. A bundle is signed by its content hash
(what its preamble declares, checked against its content here first): its bytes never change, so a manifest naming it stays valid. A
file signed again by another key keeps the first signature (a key rotation); signed again after it changed, its old signatures go.
A manifest's roles come from the bundles' names and headers (model.bin: driving_model; a warp: warp; dm_warp_*.bin: dm_warp;
dmonitoring_model.bin: dm_model); --role FILE=ROLE gives any other.
"""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

if TYPE_CHECKING:
  from sunnypilot.modeld_v2.format.signature import Signed

def role_arg(text: str) -> tuple[str, str]:
  import argparse
  name, sep, role = text.partition("=")
  if not sep or not name or not role: raise argparse.ArgumentTypeError(f"expected FILE=ROLE, got {text!r}")
  return name, role

def statement(path: str) -> Signed:
  """What a signature of `path` states, after checking it: a bundle whose content matches its hash, or a manifest whose folder holds
  exactly its bundles, each matching the hash it names."""
  from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular
  from sunnypilot.modeld_v2.format.bundle import MAGIC, check_content
  from sunnypilot.modeld_v2.format.manifest import check_folder, read_manifest
  from sunnypilot.modeld_v2.format.signature import Signed
  with open_regular(path) as f: magic = f.read(len(MAGIC))
  if magic == MAGIC:
    digest, size = check_content(path)
    return Signed("bundle", os.path.basename(path), digest, size)
  manifest, digest, size = read_manifest(path)
  folder = os.path.dirname(os.path.abspath(path))
  check_folder(manifest, folder)
  for e in manifest.bundles:
    if (got := check_content(os.path.join(folder, e.file))) != (e.sha256, e.size):
      raise ArtifactError(f"{os.path.join(folder, e.file)}: content hash {got[0][:16]}, the manifest says {e.sha256[:16]}")
  return Signed("manifest", os.path.basename(path), digest, size)

def write_set_manifest(folder: str, name: str, roles: dict[str, str]) -> str:
  """FOLDER/manifest.json naming every bundle in `folder` (roles: model_sets.folder_roles, `roles` where given); returns its path."""
  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.daemon.model_sets import folder_roles
  from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, plain_name, write_manifest
  if not os.path.isdir(folder): raise ArtifactError(f"--manifest {folder}: not a folder")
  plain_name(name, "--name", "sign_bundle")
  if not (found := folder_roles(folder, roles)): raise ArtifactError(f"{folder}: no bundle (*.bin) to name")
  path = os.path.join(folder, MANIFEST_NAME)
  write_manifest(path, name, [entry_of(os.path.join(folder, f), role) for f, role in found.items()])
  return path

@interruptible("sign_bundle")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("sign_bundle", __doc__)
  parser.add_argument("files", nargs="*", help="bundles or manifests to sign")
  parser.add_argument("--key", help="the publisher's Ed25519 private key (PEM)")
  parser.add_argument("--generate-key", metavar="PATH", help="write a new key pair: PATH (private, readable by you alone) and <stem>.pub.pem")
  parser.add_argument("--manifest", metavar="FOLDER", help="write FOLDER/manifest.json naming every bundle in FOLDER by role and content hash, and sign it")
  parser.add_argument("--name", help="with --manifest: the set's name (its folder's name when installed)")
  parser.add_argument("--role", type=role_arg, action="append", default=[], help="with --manifest: FILE=ROLE for a bundle whose name does not tell it")
  args = parser.parse_args(argv)
  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.format.signature import generate_key, load_private_key, sign
  if args.generate_key:
    if args.key or args.files or args.manifest: parser.error("--generate-key makes a key pair and signs nothing: give it alone")
    try: private, public = generate_key(args.generate_key)
    except (ArtifactError, OSError) as e: return failed(e)
    print(f"wrote {private} (private: keep it off devices) and {public} (public: put it in a device's --trusted-keys folder)")
    return 0
  if not args.key: parser.error("--key is required to sign (or --generate-key to make one)")
  if bool(args.manifest) != bool(args.name): parser.error("--manifest FOLDER and --name NAME go together")
  if args.role and not args.manifest: parser.error("--role goes with --manifest")
  if not args.files and not args.manifest: parser.error("nothing to sign: give files, or --manifest FOLDER --name NAME")
  try:
    key = load_private_key(args.key)
    files = list(args.files) + ([write_set_manifest(args.manifest, args.name, dict(args.role))] if args.manifest else [])
    for path in files:
      signed = statement(path)
      out = sign(path, signed, key)
      print(f"signed {path}: a {signed.kind}, sha256 {signed.sha256[:16]}, {signed.size:,} bytes -> {out}")
  except (ArtifactError, OSError) as e: return failed(e)
  return 0

def failed(e: Exception) -> int:
  print(f"sign_bundle: error: {e}", file=sys.stderr)
  return 2

if __name__ == "__main__":
  sys.exit(main())
