"""Model sets: the bundles the daemons load, switch and fall back between, as one unit (a driving model and its warps, a driver-monitoring
model and its warps), and the daemons' policy on signatures (`Trust`).

On disk a set is a folder: `manifest.json` (format/manifest.py; signed as `manifest.json.sig`) naming exactly the bundles beside it by role
and content hash, or, without a manifest, a folder as modeld has always read (`model.bin`, `dmonitoring_model.bin`, `dm_warp_*.bin`, and
every other `*.bin` a driving warp candidate). `ModelSets` knows where they live:

  --artifacts DIR        the bundled default set (DEFAULT_SET): what runs when nothing else is active or everything else failed
  --model-sets ROOT      installed sets, ROOT/<name>/ (install_models writes them and never removes one), with
    ROOT/active          the set a PC asks for: its name on one line (none, empty or `default`: the default); on a comma device the
                         daemons read sunnypilot's model manager parameter instead (model_switch.ActiveSetParam)
    ROOT/last_ran        the last set whose driving model passed its first frames, written by modeld: its fallback at start
    ROOT/last_ran_dm     the same for dmonitoringmodeld's DM model (a set may hold one daemon's bundles and not the other's)

With trusted keys (`Trust`), every bundle a daemon loads must be vouched for by one of them: by a signed manifest naming it by content
hash, or by its own .sig; the check runs on the hash the bundle's preamble declares, before a byte of its kernels is read or mapped
(runtime/loader's `verify`). Nothing here knows modeld: a set gives files by role and the `verify` hook; what to load is the daemon's.
"""
from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

from sunnypilot.modeld_v2.common.files import ArtifactError, open_regular, replaced_atomically
from sunnypilot.modeld_v2.daemon.device_paths import DEVICE_MODEL_SETS, DEVICE_TRUSTED_KEYS, first_folder
from sunnypilot.modeld_v2.format.bundle import BundleFile, read_header
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, Manifest, check_folder, plain_name, read_manifest
from sunnypilot.modeld_v2.format.signature import TrustedKeys, check_signed

log = logging.getLogger(__name__)

DRIVING_MODEL, WARP, DM_MODEL, DM_WARP = "driving_model", "warp", "dm_model", "dm_warp"  # the roles a manifest gives its bundles
BIG_DRIVING_MODEL = "big_driving_model"  # openpilot's big/small pair: the big one, loaded beside the driving model (daemon/big_model.py)
ROLES = {DRIVING_MODEL: "modeld's driving model", BIG_DRIVING_MODEL: "modeld's big driving model, taking over from the small one once warm",
         WARP: "modeld's camera warps, one per camera geometry",
         DM_MODEL: "dmonitoringmodeld's model", DM_WARP: "dmonitoringmodeld's driver camera warps"}
# a folder without a manifest: openpilot's file names (selfdrive/modeld/models/: dmonitoring_model, dm_warp_<w>x<h>) as bundles
MODEL_NAME, DM_MODEL_NAME, DM_WARP_PREFIX, BIG_MODEL_NAME = "model.bin", "dmonitoring_model.bin", "dm_warp_", "big_model.bin"
DEFAULT_SET = "default"
ACTIVE_FILE, LAST_RAN_FILE, LAST_RAN_DM_FILE = "active", "last_ran", "last_ran_dm"
RESERVED_NAMES = (DEFAULT_SET, ACTIVE_FILE, LAST_RAN_FILE, LAST_RAN_DM_FILE)  # a model sets folder's own names: no installed set may take one

def installable_name(name: str, where: str) -> str:
  """`name` if a set may be installed under it in a model sets folder: a plain name (never hidden: the folder's work files are) that is
  none of RESERVED_NAMES (the default set is the --artifacts folder, `active`, `last_ran` and `last_ran_dm` the folder's flag files); else one
  line."""
  plain_name(name, "the set name", where)
  if name in RESERVED_NAMES: raise ArtifactError(f"{where}: the set name {name!r} is reserved in a model sets folder ({', '.join(RESERVED_NAMES)})")
  return name

def sets_root(given: str | None, device: bool) -> str | None:
  """A daemon's model sets folder: --model-sets, else DEVICE_MODEL_SETS on a comma device, else none (the default set only). One line for
  a file where the folder should be (a folder not made yet is fine: install_models makes it)."""
  root = given or (DEVICE_MODEL_SETS if device else None)
  if root is not None and os.path.exists(root) and not os.path.isdir(root): raise ArtifactError(f"--model-sets {root}: is a file, not a folder")
  return root

class Trust:
  """The daemons' policy on signatures: with `keys`, a bundle loads only when vouched for by one of them; without, any bundle that passes
  the format's checks loads, as before signatures existed."""
  def __init__(self, keys: TrustedKeys | None = None):
    self.keys = keys

  @staticmethod
  def from_folder(folder: str | None) -> Trust:
    """The keys in `folder` (ArtifactError, one line, for a folder that holds anything but public keys), or no keys for None."""
    return Trust(TrustedKeys.load(folder) if folder is not None else None)

  @staticmethod
  def for_daemon(given: str | None, device: bool) -> Trust:
    """A daemon's keys: --trusted-keys, else on a comma device the first of DEVICE_TRUSTED_KEYS that exists, else none (see from_folder)."""
    return Trust.from_folder(given or (first_folder(DEVICE_TRUSTED_KEYS) if device else None))

  def describe(self) -> str:
    if self.keys is None: return "none required (no trusted keys; with --trusted-keys DIR every bundle must be signed by one of them)"
    return f"bundles must be signed by one of {len(self.keys.keys)} trusted keys in {self.keys.folder}: {', '.join(f for f, _ in self.keys.keys.values())}"

  def manifest(self, path: str) -> tuple[Manifest, str]:
    """A set's manifest, its signature checked when there are keys; with how it is vouched for, for the log."""
    manifest, digest, size = read_manifest(path)
    if self.keys is None: return manifest, "unsigned (no trusted keys)"
    return manifest, f"manifest signed by {check_signed(path, 'manifest', digest, size, self.keys)}"

  def bundle(self, path: str, digest: str, size: int) -> str:
    """Refuse (ArtifactError, one line) a bundle that no trusted key signed, when there are keys; else who signed it."""
    return "not checked (no trusted keys)" if self.keys is None else f"signed by {check_signed(path, 'bundle', digest, size, self.keys)}"

@dataclass(frozen=True)
class ModelSet:
  """One set, opened: its folder, its manifest (None: a folder as modeld has always read), and how its bundles are vouched for."""
  name: str
  folder: str
  manifest: Manifest | None
  trust: Trust
  vouched: str  # for the log: "manifest signed by key ...", "each bundle by its own signature", "unsigned (no trusted keys)"

  def files(self, role: str) -> list[str]:
    """The paths of the set's bundles of `role` (a folder without a manifest: by openpilot's file names; any other *.bin may be a warp)."""
    if self.manifest is not None: return [os.path.join(self.folder, f) for f in self.manifest.files(role)]
    names = sorted(os.path.basename(p) for p in glob.glob(os.path.join(self.folder, "*.bin")))
    return [os.path.join(self.folder, n) for n in names if role == folder_role(n)]

  def verify(self, path: str, digest: str, size: int) -> str:
    """The loader's hook (runtime/loader.Verify): refuse a bundle this set does not vouch for, before a byte of its blob is read. Returns
    who vouched for it, for a person."""
    if self.manifest is None: return self.trust.bundle(path, digest, size)
    entry = self.manifest.entry(os.path.basename(path)) if os.path.dirname(os.path.abspath(path)) == os.path.abspath(self.folder) else None
    if entry is None: raise ArtifactError(f"{path}: not a bundle of set {self.name}")
    if (entry.sha256, entry.size) != (digest, size):
      raise ArtifactError(f"{path}: content hash {digest[:16]} ({size:,} bytes), the manifest of set {self.name} says {entry.sha256[:16]} "
                          f"({entry.size:,} bytes)")
    return f"named as its {entry.role} by set {self.name}'s {self.vouched}"

  def __str__(self) -> str: return f"set {self.name} ({self.folder}, {self.vouched})"

def folder_role(name: str) -> str:
  """The role of a bundle file in a folder without a manifest, by its name."""
  if name == MODEL_NAME: return DRIVING_MODEL
  if name == BIG_MODEL_NAME: return BIG_DRIVING_MODEL
  if name == DM_MODEL_NAME: return DM_MODEL
  return DM_WARP if name.startswith(DM_WARP_PREFIX) else WARP

# a bundle's metadata kind -> the roles it may play (compile_modeld, compile_warp, compile_modeld of the DM model, compile_dm_warp)
KIND_ROLES: dict[str, tuple[str, ...]] = {"model": (DRIVING_MODEL, BIG_DRIVING_MODEL), "warp": (WARP,), "dmonitoring_model": (DM_MODEL,), "dm_warp": (DM_WARP,)}

def folder_roles(folder: str, given: dict[str, str] | None = None) -> dict[str, str]:
  """{file name: role} of every bundle in `folder`, for a manifest: `given` where given, else by folder_role, checked against what the
  bundle's header says it is (a warp named model.bin is an error, not a driving model). One line for a bundle whose role cannot be told."""
  roles = {}
  for path in sorted(glob.glob(os.path.join(folder, "*.bin"))):
    name = os.path.basename(path)
    kind = read_header(path)["extras"].get("metadata", {}).get("kind")
    role = (given or {}).get(name) or folder_role(name)
    if role not in ROLES: raise ArtifactError(f"{path}: role {role!r} is none of {', '.join(ROLES)}")
    if role not in KIND_ROLES.get(kind or "", ()) and name not in (given or {}):
      raise ArtifactError(f"{path}: a {kind or 'plain'} bundle cannot be the {role} by its name: give its role (--role {name}=ROLE)")
    roles[name] = role
  if unknown := sorted(set(given or {}) - set(roles)): raise ArtifactError(f"{os.path.join(folder, unknown[0])}: no such bundle")
  return roles

def vouch_for(path: str, trust: Trust) -> str:
  """Who vouches for the bundle at `path` as a daemon would decide it: the set of its folder (its signed manifest, or the bundle's own
  signature). ArtifactError, one line, when nothing does."""
  with BundleFile(path) as f: return open_set(DEFAULT_SET, os.path.dirname(os.path.abspath(path)), trust).verify(path, f.digest.hex(), f.size)

def open_set(name: str, folder: str, trust: Trust) -> ModelSet:
  """The set in `folder`, opened as `name`: its manifest read, signature checked (with keys) and its folder matched to it. One line for
  a missing folder, a manifest that lies (a bundle it does not name, one of another size, a path with '..') or is signed by no one trusted."""
  if not os.path.isdir(folder): raise ArtifactError(f"set {name}: {folder} {'is not a folder' if os.path.exists(folder) else 'does not exist'}")
  path = os.path.join(folder, MANIFEST_NAME)
  if not os.path.lexists(path):
    return ModelSet(name, folder, None, trust, "each bundle by its own signature" if trust.keys is not None else "unsigned (no trusted keys)")
  manifest, vouched = trust.manifest(path)
  if name != DEFAULT_SET and manifest.name != name: raise ArtifactError(f"{path}: the manifest of set {manifest.name}, in the folder of set {name}")
  check_folder(manifest, folder)
  return ModelSet(name, folder, manifest, trust, vouched)

class ModelSets:
  """Where the sets live (see the module's docstring): the default folder, and the installed sets under `root` (None: the default only).
  `last_ran`: the daemon's record of the last set that ran in `root` (LAST_RAN_FILE: modeld's, LAST_RAN_DM_FILE: dmonitoringmodeld's)."""
  def __init__(self, default: str, root: str | None, trust: Trust, last_ran: str = LAST_RAN_FILE):
    self.default, self.root, self.trust, self.last_ran = default, root, trust, last_ran

  def open(self, name: str) -> ModelSet:
    """The set called `name` ("" or DEFAULT_SET: the default), opened. One line for a name that is not a plain name, or no such set."""
    if name in ("", DEFAULT_SET): return open_set(DEFAULT_SET, self.default, self.trust)
    plain_name(name, "the set name", "model sets")
    if self.root is None: raise ArtifactError(f"no set {name}: no --model-sets folder, only the default set")
    if not os.path.isdir(folder := os.path.join(self.root, name)):
      raise ArtifactError(f"no set {name} in {self.root} (installed: {', '.join(self.installed()) or 'none'})")
    return open_set(name, folder, self.trust)

  def describe(self) -> str:
    if self.root is None: return f"the default set in {self.default} only (no --model-sets)"
    return f"the default set in {self.default}, installed sets in {self.root} ({', '.join(self.installed()) or 'none yet'})"

  def installed(self) -> list[str]:
    if self.root is None or not os.path.isdir(self.root): return []
    return sorted(n for n in os.listdir(self.root) if not n.startswith(".") and os.path.isdir(os.path.join(self.root, n)))

  def read_name(self, file: str) -> str:
    """The set name in ROOT/`file` (ACTIVE_FILE, the last_ran file): "" when there is none. Only its first line, at most 256 bytes."""
    if self.root is None or not os.path.isfile(path := os.path.join(self.root, file)): return ""
    try:
      with open_regular(path) as f: return f.read(256).decode("utf-8", "replace").split("\n")[0].strip()
    except (OSError, ArtifactError): return ""

  def record_ran(self, name: str) -> None:
    """Remember `name` as the last set that ran (the fallback at the next start); a failure to write is logged, never raised."""
    if self.root is None or not os.path.isdir(self.root) or self.read_name(self.last_ran) == name: return
    try:
      with replaced_atomically(os.path.join(self.root, self.last_ran)) as (tmp,), open(tmp, "x") as f: f.write(name + "\n")
    except (OSError, ArtifactError) as e: log.warning(f"cannot record {name} as the last set that ran: {e}")

  def fallbacks(self, requested: str) -> list[str]:
    """The sets to try at start, in order: the one asked for, the last that ran, the default (each once)."""
    order = [requested or DEFAULT_SET, self.read_name(self.last_ran) or DEFAULT_SET, DEFAULT_SET]
    return list(dict.fromkeys(DEFAULT_SET if n == "" else n for n in order))
