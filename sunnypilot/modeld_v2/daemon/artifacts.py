"""Finding and checking a daemon's bundles in a model set (an --artifacts folder, or any set model_sets opens): modeld's driving model and
warps (DRIVING), dmonitoringmodeld's driver-monitoring model and driver-camera warps (DRIVER_MONITORING). A set may hold both daemons'
bundles; each reads the files of its own roles (model_sets: by manifest, or by openpilot's file names) and never looks at the other's.
Every header field that discovery, the live frame match and fusion read is checked before use (by the bundle reader's rules, then against
the model): a stale or crafted file is skipped with one line, never a crash when the camera connects."""
from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.model_sets import (
  BIG_DRIVING_MODEL,
  BIG_MODEL_NAME,
  DEFAULT_SET,
  DM_MODEL,
  DM_MODEL_NAME,
  DM_WARP,
  DRIVING_MODEL,
  MODEL_NAME,
  WARP,
  ModelSet,
  Trust,
  folder_role,
  open_set,
)
from sunnypilot.modeld_v2.format.bundle import BundleFile, BundleHead, check_metadata, check_provenance, read_bundle, read_header
from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, parse_frame
from sunnypilot.modeld_v2.runtime.frame_fusion import frames_input

if TYPE_CHECKING:  # the loader imports tinygrad: not at start
  from sunnypilot.modeld_v2.runtime.loader import Verify

log = logging.getLogger(__name__)
T = TypeVar("T")

@dataclass(frozen=True)
class DaemonBundles:
  """What one daemon reads of a set: its model's role, file name (in a folder without a manifest) and metadata kind, its warps' role and
  kind, and the commands that build each (the warp's with its frame geometry as {frame})."""
  model_role: str
  model_name: str
  model_kind: str
  warp_role: str
  warp_kind: str
  what: str  # the model, in words
  build_model: str
  build_warp: str
  big: bool = False  # loaded as the big one of openpilot's big/small pair (modelV2.big)

DRIVING = DaemonBundles(DRIVING_MODEL, MODEL_NAME, "model", WARP, "warp", "driving model", "compile_modeld",
                        "python -m sunnypilot.modeld_v2.compile_warp --frame {frame} --warp-to 512x256 --split-frames")
BIG_DRIVING = DaemonBundles(BIG_DRIVING_MODEL, BIG_MODEL_NAME, "model", WARP, "warp", "big driving model", "compile_modeld",
                           DRIVING.build_warp, big=True)  # the big one of a set's pair: the driving model's warps, its own device's
# the big one sunnypilot's model manager picks for its Chestnut slot: another set's driving model, loaded as the big one
CHESTNUT_DRIVING = DaemonBundles(DRIVING_MODEL, MODEL_NAME, "model", WARP, "warp", "big driving model (the Chestnut pick)", "compile_modeld",
                                 DRIVING.build_warp, big=True)
DRIVER_MONITORING = DaemonBundles(DM_MODEL, DM_MODEL_NAME, "dmonitoring_model", DM_WARP, "dm_warp", "driver-monitoring model",
                                  "compile_modeld --onnx dmonitoring_model.onnx", "python -m sunnypilot.modeld_v2.compile_dm_warp --frame {frame}")

class NoWarp(ArtifactError):
  """A set has no warp for the live camera geometry (find_warp has said what to build)."""

def spec_shape(spec: Any) -> list | None:
  """The shape of a header's tensor spec ([shape, dtype, device]), or None if it is not one."""
  return spec[0] if isinstance(spec, list) and spec and isinstance(spec[0], list) else None

def file_key(path: str) -> tuple[int, int, int] | None:
  """What changes when a file is replaced or rewritten (inode, size, mtime); None if it is gone."""
  try: st = os.stat(path)
  except OSError: return None
  return st.st_ino, st.st_size, st.st_mtime_ns

def warp_bundles(artifacts: str, device: str | None = None, report: Callable[[str], None] = log.warning,
                 new_img: list | None = None, paths: list[str] | None = None, kind: DaemonBundles = DRIVING,
                 verify: Callable[[str, str, int], Any] | None = None) -> list[tuple[str, dict]]:
  """(path, metadata) of every `kind` warp bundle in `artifacts` (by file name, as a folder without a manifest is read) or of `paths` (a
  set's warps) this process can load for a model whose frames input is `new_img` (any, if None) and, with `verify` (ModelSet.verify), one
  its set vouches for (with trusted keys: signed); each unreadable, foreign, unfit, unvouched or other kind of bundle is skipped with a
  line. Only headers are read until a file says it is a warp and is vouched for (a stray large file costs its first bytes), then the warp
  whole (its hash). The load verifies the warp it reads again."""
  out = []
  candidates = paths if paths is not None else [p for p in glob.glob(os.path.join(artifacts, "*.bin")) if folder_role(os.path.basename(p)) == kind.warp_role]
  for path in sorted(candidates):
    if not os.path.isfile(path):  # a FIFO or device would block or never end the read
      report(f"skipping {path}: not a regular file")
      continue
    try:
      if (found := read_header(path)["extras"].get("metadata", {}).get("kind")) != kind.warp_kind:
        model = found in (DRIVING.model_kind, DRIVER_MONITORING.model_kind)  # a model under a warp's name: say where the model goes
        why = f" (only {kind.model_name} is read as the model)" if model else ""
        report(f"skipping {path}: a {found or 'plain'} bundle, not a {kind.warp_kind}{why}")
        continue
      if verify is not None:
        with BundleFile(path) as f: verify(path, f.digest.hex(), f.size)
      head, _ = read_bundle(path)
      if (meta := head["extras"].get("metadata", {})).get("kind") != kind.warp_kind:  # replaced since its header was read
        report(f"skipping {path}: no longer a {kind.warp_kind} bundle (replaced while it was read)")
        continue
      check_provenance(head["provenance"], device, path)
      check_metadata(head["extras"], path)  # the bundle reader's rules: a frame spec, frame inputs that hold the frame, what it makes
      if new_img is not None and (made := spec_shape(head["extras"].get("output_specs", {}).get("warped"))) != new_img:
        report(f"skipping {path}: it makes {made} planes, the model takes {'new_img' if kind is DRIVING else 'input_img'} {new_img}")
      else: out.append((path, meta))
    except ArtifactError as e: report(f"skipping {e}")
    except Exception as e:  # any file in the folder may be damaged or crafted (deep JSON, huge numbers): skipped with its reason, never a crash
      report(f"skipping {path}: unusable header ({type(e).__name__}: {str(e)[:160]})")
  return out

def model_planes(head: BundleHead) -> list | None:
  """The shape of a model bundle's frames input (new_img; input_img for driver monitoring) in its header: what a warp must make for it."""
  extras = head["extras"]
  return spec_shape(extras.get("input_specs", {}).get(frames_input(extras.get("metadata", {}))))

def warp_command(frame: NV12Frame, kind: DaemonBundles = DRIVING, planes: list | None = None) -> str:
  """The command that builds `kind`'s warp for a live buffer layout: camerad's uv_height where the layout is camerad's, else the visible
  rows; a driver-monitoring model of another input size than openpilot's gets a --warp-to to fill in."""
  padded = camerad_frame(frame.width, frame.height)
  spec = padded.spec if (padded.stride, padded.uv_offset, padded.size) == (frame.stride, frame.uv_offset, frame.size) else frame.spec
  size = "" if kind is DRIVING or planes in (None, [1, DM_INPUT_SIZE[0] * DM_INPUT_SIZE[1]]) else f" --warp-to WxH (W*H = {planes[-1]})"
  return f"{kind.build_warp.format(frame=spec)}{size} --output ..."

def find_warp(artifacts: str, main: NV12Frame, extra: NV12Frame | None, device: str | None = None, report: Callable[[str], None] = log.warning,
              new_img: list | None = None, refused: set[str] | frozenset[str] = frozenset(), paths: list[str] | None = None,
              kind: DaemonBundles = DRIVING, verify: Callable[[str, str, int], Any] | None = None) -> str | None:
  """The `kind` warp bundle in `artifacts` (among `paths`, if given) built for the live `main` buffer layout (and fitting in the `extra`
  stream's buffers, if one is used) and a model taking `new_img` planes, split-frames first, none of `refused` (warps that failed to load
  with this model as the files are now); None, with a line saying what to build or why the ones there are not used, if none."""
  matches, seen = [], []
  for path, meta in warp_bundles(artifacts, device, report, new_img, paths, kind, verify):
    frame = parse_frame(meta["frame"])
    seen.append(meta["frame"])
    if (frame.width, frame.height, frame.stride, frame.uv_offset) == (main.width, main.height, main.stride, main.uv_offset) \
       and frame.size <= main.size and (extra is None or frame.size <= extra.size):
      matches.append((not meta.get("split_frames"), path))
  if usable := [m for m in matches if m[1] not in refused]: return min(usable)[1]
  if matches:
    report(f"the {kind.warp_kind} bundles for {main.width}x{main.height} frames ({', '.join(os.path.basename(p) for _, p in sorted(matches))}) failed "
           f"to load with {kind.model_name} (said above): waiting; tried again when one of the files changes")
    return None
  report(f"no {kind.warp_kind} bundle in {artifacts} for {main.width}x{main.height} frames (stride {main.stride}, uv_offset {main.uv_offset}, "
         f"{main.size} bytes); have {seen}. Waiting; build one: {warp_command(main, kind, new_img)}")
  return None

def model_file(model_set: ModelSet, kind: DaemonBundles = DRIVING) -> str:
  """The path of a set's one `kind` model (a folder without a manifest: its file by openpilot's name, there or not); one line when it
  has none or several."""
  if model_set.manifest is None: return os.path.join(model_set.folder, kind.model_name)
  if len(models := model_set.files(kind.model_role)) != 1:
    raise ArtifactError(f"{model_set}: {'no' if not models else f'{len(models)}'} {kind.what} bundles ({kind.model_name}, or role {kind.model_role} "
                        f"in its manifest): build one with {kind.build_model}")
  return models[0]

def has_big_model(model_set: ModelSet) -> bool:
  """Whether `model_set` names a big driving model beside its driving model (openpilot's big/small pair)."""
  if model_set.manifest is not None: return bool(model_set.files(BIG_DRIVING_MODEL))
  return os.path.isfile(os.path.join(model_set.folder, BIG_MODEL_NAME))

def load_pair(model_set: ModelSet, main: NV12Frame, extra: NV12Frame | None, planes: list | None, load: Callable[[str, str, Verify, dict[str, str]], T],
              report: Callable[[str], None], refused: dict[str, tuple] | None = None, kind: DaemonBundles = DRIVING) -> T:
  """Find `kind`'s warp among `model_set`'s for the live buffers (find_warp) and `load(model path, warp path, verify, digests)` the pair, as
  both daemons do: `verify` is the set's check (loader.stream_parts' hook) and fills `digests` {path: content hash} as the load reads each
  bundle. NoWarp when no warp fits (find_warp has said why); ArtifactError "cannot load <model> with <warp>: ..." when the load raised one.
  With `refused` (on the frame thread: {warp: both files' file_key before the read}), a pair that failed is recorded and passed over until
  either file changes."""
  model = model_file(model_set, kind)
  skip = {w for w, keys in refused.items() if keys == (file_key(model), file_key(w))} if refused is not None else set()
  warp = find_warp(model_set.folder, main, extra, report=report, new_img=planes, refused=skip, paths=model_set.files(kind.warp_role), kind=kind,
                   verify=model_set.verify)  # with trusted keys, an unsigned warp is never picked over a signed one
  if warp is None: raise NoWarp(f"none of its {kind.warp_kind} bundles fits {main.width}x{main.height} frames (said above)")
  keys, digests = (file_key(model), file_key(warp)), {}  # keys before the read: a file fixed while it was read is tried again
  def verify(path: str, digest: str, size: int) -> None:
    model_set.verify(path, digest, size)
    digests[path] = digest
  try: handle = load(model, warp, verify, digests)
  except ArtifactError as e:
    if refused is not None: refused[warp] = keys
    raise ArtifactError(f"cannot load {model} with {warp}: {e}") from None
  if refused is not None: refused.pop(warp, None)
  return handle

def check_set(model_set: ModelSet, device: str | None = None, report: Callable[[str], None] = log.warning, kind: DaemonBundles = DRIVING) -> list | None:
  """The shape of `kind`'s model's frames input (what its warp must make; None if it takes none), from its header alone (the load checks
  the rest) and after the set vouched for it (its signature, or its manifest's hash). ArtifactError with the set's problem in one line:
  no model for this device, another kind of bundle where the model should be, a model the daemon cannot parse, no warp at all."""
  model = model_file(model_set, kind)
  if not os.path.isfile(model): raise ArtifactError(f"{model} not found (build it with {kind.build_model})")
  with BundleFile(model) as f:
    check_provenance(f.head["provenance"], device, model)
    if (found := f.head["extras"].get("metadata", {}).get("kind")) != kind.model_kind:
      raise ArtifactError(f"{model} is not a {kind.what} bundle: its metadata kind is {found or 'none'}, not {kind.model_kind}")
    check_metadata(f.head["extras"], model)  # the reader's rules on what the daemon reads of it (a driver-monitoring model's heads)
    model_set.verify(model, f.digest.hex(), f.size)
  if not warp_bundles(model_set.folder, device, report, planes := model_planes(f.head), model_set.files(kind.warp_role), kind, model_set.verify):
    raise ArtifactError(f"no {kind.warp_kind} bundle for this device and model in {model_set.folder} (build one: "
                        f"{kind.build_warp.format(frame='W,H,...')} --output ...)")
  return planes

def check_artifacts(artifacts: str, device: str | None = None, report: Callable[[str], None] = log.warning, trust: Trust | None = None,
                    kind: DaemonBundles = DRIVING) -> list | None:
  """Before waiting for camerad: check_set of the --artifacts folder (the default set), read once here so the daemon never reads the
  model's header again. ArtifactError with the folder's problem in one line: not a folder, no model for this device, no warp at all, a
  manifest that lies, a bundle the trusted keys do not vouch for."""
  if not os.path.isdir(artifacts):
    raise ArtifactError(f"--artifacts {artifacts}: {'is a file, not a folder' if os.path.exists(artifacts) else 'no such folder'} (it holds "
                        f"{kind.model_name} and {kind.warp_kind} bundles)")
  return check_set(open_set(DEFAULT_SET, artifacts, trust or Trust()), device, report, kind)
