"""Finding and checking modeld's artifacts: the driving model and the warp bundles of a model set (an --artifacts folder, or any set
model_sets opens). Every header field that discovery, the live frame match and fusion read is checked before use (by the bundle reader's
rules, then against the model): a stale or crafted file is skipped with one line, never a crash when the camera connects."""
from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from typing import Any

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, DRIVING_MODEL, MODEL_NAME, WARP, ModelSet, Trust, open_set
from sunnypilot.modeld_v2.format.bundle import BundleFile, check_metadata, check_provenance, read_bundle, read_header
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, parse_frame

log = logging.getLogger(__name__)

def spec_shape(spec: Any) -> list | None:
  """The shape of a header's tensor spec ([shape, dtype, device]), or None if it is not one."""
  return spec[0] if isinstance(spec, list) and spec and isinstance(spec[0], list) else None

def file_key(path: str) -> tuple[int, int, int] | None:
  """What tells one version of a file from the next (inode, size, modification time), or None when it is gone: a pair refused at load is
  tried again once either file changes."""
  try: st = os.stat(path)
  except OSError: return None
  return st.st_ino, st.st_size, st.st_mtime_ns

def warp_bundles(artifacts: str, device: str | None = None, report: Callable[[str], None] = log.warning,
                 new_img: list | None = None, paths: list[str] | None = None, verify: Callable[[str, str, int], Any] | None = None) -> list[tuple[str, dict]]:
  """(path, metadata) of every warp bundle in `artifacts` (or of `paths`: a set's warps) this process can load for a model taking `new_img`
  planes (any, if None) and, with `verify` (ModelSet.verify), one its set vouches for (with trusted keys: signed); each unreadable, foreign,
  unfit, unvouched or other kind of bundle is skipped with a line. Only headers are read until a file says it is a warp and is vouched for
  (a stray large file costs its first bytes), then the warp whole (its hash). The load verifies the warp it reads again."""
  out = []
  candidates = paths if paths is not None else [p for p in glob.glob(os.path.join(artifacts, "*.bin")) if os.path.basename(p) != MODEL_NAME]
  for path in sorted(candidates):
    if not os.path.isfile(path):  # a FIFO or device would block or never end the read
      report(f"skipping {path}: not a regular file")
      continue
    try:
      if (kind := read_header(path)["extras"].get("metadata", {}).get("kind")) != "warp":
        report(f"skipping {path}: a {kind or 'plain'} bundle, not a warp (only {MODEL_NAME} is read as the model)")
        continue
      if verify is not None:
        with BundleFile(path) as f: verify(path, f.digest.hex(), f.size)
      head, _ = read_bundle(path)
      if (meta := head["extras"].get("metadata", {})).get("kind") != "warp":  # replaced since its header was read
        report(f"skipping {path}: no longer a warp bundle (replaced while it was read)")
        continue
      check_provenance(head["provenance"], device, path)
      check_metadata(head["extras"], path)  # the bundle reader's rules: a frame spec, a split flag, frame inputs that hold the frame
      if new_img is not None and (made := spec_shape(head["extras"].get("output_specs", {}).get("warped"))) != new_img:
        report(f"skipping {path}: it makes {made} planes, the model takes new_img {new_img}")
      else: out.append((path, meta))
    except ArtifactError as e: report(f"skipping {e}")
    except Exception as e:  # any file in the folder may be damaged or crafted (deep JSON, huge numbers): skipped with its reason, never a crash
      report(f"skipping {path}: unusable header ({type(e).__name__}: {str(e)[:160]})")
  return out

def model_planes(head: dict) -> list | None:
  """The new_img shape in a model bundle's header: what a warp must make for it."""
  return spec_shape(head["extras"].get("input_specs", {}).get("new_img"))

def warp_command(frame: NV12Frame) -> str:
  """The compile_warp command for a live buffer layout: camerad's uv_height where the layout is camerad's, else the visible rows."""
  padded = camerad_frame(frame.width, frame.height)
  spec = padded.spec if (padded.stride, padded.uv_offset, padded.size) == (frame.stride, frame.uv_offset, frame.size) else frame.spec
  return f"python -m sunnypilot.modeld_v2.compile_warp --frame {spec} --warp-to 512x256 --split-frames --output ..."

def find_warp(artifacts: str, main: NV12Frame, extra: NV12Frame | None, device: str | None = None, report: Callable[[str], None] = log.warning,
              new_img: list | None = None, refused: set[str] | frozenset[str] = frozenset(), paths: list[str] | None = None,
              verify: Callable[[str, str, int], Any] | None = None) -> str | None:
  """The warp bundle in `artifacts` (among `paths`, if given) built for the live `main` buffer layout (and fitting in the `extra` stream's
  buffers, if one is used) and a model taking `new_img` planes, split-frames first, none of `refused` (warps that failed to load with this
  model as the files are now), each vouched for by `verify` (see warp_bundles); None, with a line saying what to build or why the ones
  there are not used, if none."""
  matches, seen = [], []
  for path, meta in warp_bundles(artifacts, device, report, new_img, paths, verify):
    frame = parse_frame(meta["frame"])
    seen.append(meta["frame"])
    if (frame.width, frame.height, frame.stride, frame.uv_offset) == (main.width, main.height, main.stride, main.uv_offset) \
       and frame.size <= main.size and (extra is None or frame.size <= extra.size):
      matches.append((not meta.get("split_frames"), path))
  if usable := [m for m in matches if m[1] not in refused]: return min(usable)[1]
  if matches:
    report(f"the warp bundles for {main.width}x{main.height} frames ({', '.join(os.path.basename(p) for _, p in sorted(matches))}) failed to load with "
           f"{MODEL_NAME} (said above): waiting; tried again when one of the files changes")
    return None
  report(f"no warp bundle in {artifacts} for {main.width}x{main.height} frames (stride {main.stride}, uv_offset {main.uv_offset}, {main.size} "
         f"bytes); have {seen}. Waiting; build one: {warp_command(main)}")
  return None

def driving_model(model_set: ModelSet) -> str:
  """The path of a set's one driving model (a folder without a manifest: its model.bin, there or not); one line when it has none or several."""
  if model_set.manifest is None: return os.path.join(model_set.folder, MODEL_NAME)
  if len(models := model_set.files(DRIVING_MODEL)) != 1:
    raise ArtifactError(f"{model_set}: {'no' if not models else f'{len(models)}'} driving model bundles ({MODEL_NAME}, or role {DRIVING_MODEL} in "
                        "its manifest): build one with compile_modeld")
  return models[0]

def check_driving_set(model_set: ModelSet, device: str | None = None, report: Callable[[str], None] = log.warning) -> list | None:
  """The model's new_img planes (what its warp must make; None if it takes none), from its header alone (the load checks the rest) and
  after the set vouched for it (its signature, or its manifest's hash). ArtifactError with the set's problem in one line: no model for
  this device, no warp at all."""
  model = driving_model(model_set)
  if not os.path.isfile(model): raise ArtifactError(f"{model} not found (build it with compile_modeld)")
  with BundleFile(model) as f:
    check_provenance(f.head["provenance"], device, model)
    if f.head["extras"].get("metadata", {}).get("kind") != "model": raise ArtifactError(f"{model} is not a driving model bundle")
    model_set.verify(model, f.digest.hex(), f.size)
  if not warp_bundles(model_set.folder, device, report, planes := model_planes(f.head), model_set.files(WARP), model_set.verify):
    raise ArtifactError(f"no warp bundle for this device and model in {model_set.folder} (build one with compile_warp --split-frames)")
  return planes

def check_artifacts(artifacts: str, device: str | None = None, report: Callable[[str], None] = log.warning, trust: Trust | None = None) -> list | None:
  """Before waiting for camerad: check_driving_set of the --artifacts folder (the default set), read once here so the daemon never reads
  the model's header again. ArtifactError with the folder's problem in one line: not a folder, no model for this device, no warp at all,
  a manifest that lies, a bundle the trusted keys do not vouch for."""
  if not os.path.isdir(artifacts):
    raise ArtifactError(f"--artifacts {artifacts}: {'is a file, not a folder' if os.path.exists(artifacts) else 'no such folder'} (it holds "
                        f"{MODEL_NAME} and warp bundles)")
  return check_driving_set(open_set(DEFAULT_SET, artifacts, trust or Trust()), device, report)
