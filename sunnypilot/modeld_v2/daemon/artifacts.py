"""Finding and checking a daemon's artifacts: its model bundle and its warp bundles in an --artifacts folder. One folder holds both
daemons' files: modeld's `model.bin` and `warp` bundles, dmonitoringmodeld's `dmonitoring_model.bin` and `dm_warp` bundles (any other
file names ending .bin); each daemon reads its own (an ArtifactSet) and passes over the other's without a word. Every header field that
discovery, the live frame match and fusion read is checked before use (by the bundle reader's rules, then against the model): a stale or
crafted file is skipped with one line, never a crash when the camera connects."""
from __future__ import annotations

import glob
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import check_metadata, check_provenance, read_bundle, read_header
from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, parse_frame
from sunnypilot.modeld_v2.runtime.frame_fusion import frames_input

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ArtifactSet:
  """What one daemon reads from an artifacts folder: its model's file name and metadata kind, its warps' metadata kind, and what builds
  each."""
  model: str
  model_kind: str
  warp_kind: str
  what: str  # the model, in words
  build_model: str
  build_warp: str  # the command that builds a warp, its frame geometry {frame}

DRIVING = ArtifactSet("model.bin", "model", "warp", "driving model", "compile_modeld",
                      "python -m sunnypilot.modeld_v2.compile_warp --frame {frame} --warp-to 512x256 --split-frames")
DRIVER_MONITORING = ArtifactSet("dmonitoring_model.bin", "dmonitoring_model", "dm_warp", "driver-monitoring model",
                                "compile_modeld --onnx dmonitoring_model.onnx", "python -m sunnypilot.modeld_v2.compile_dm_warp --frame {frame}")
ARTIFACT_SETS = (DRIVING, DRIVER_MONITORING)
MODEL_NAME = DRIVING.model  # the driving model in an artifacts folder

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
                 new_img: list | None = None, kind: ArtifactSet = DRIVING) -> list[tuple[str, dict]]:
  """(path, metadata) of every warp bundle of `kind` in `artifacts` this process can load for a model whose frames input takes `new_img`
  planes (any, if None); each unreadable, foreign, unfit or other kind of bundle is skipped with a line, but the other daemon's model and
  warps, which belong there, silently. Only headers are read until a file says it is a warp (a stray large file costs its first bytes),
  then the warp whole (its hash)."""
  out, theirs = [], [other for other in ARTIFACT_SETS if other is not kind]
  models = {kind.model} | {other.model for other in theirs}
  for path in sorted(p for p in glob.glob(os.path.join(artifacts, "*.bin")) if os.path.basename(p) not in models):
    if not os.path.isfile(path):  # a FIFO or device would block or never end the read
      report(f"skipping {path}: not a regular file")
      continue
    try:
      if (found := read_header(path)["extras"].get("metadata", {}).get("kind")) != kind.warp_kind:
        if found not in {other.warp_kind for other in theirs}:
          report(f"skipping {path}: a {found or 'plain'} bundle, not a {kind.warp_kind} (only {kind.model} is read as the model)")
        continue
      head, _ = read_bundle(path)
      if (meta := head["extras"].get("metadata", {})).get("kind") != kind.warp_kind:  # replaced since its header was read
        report(f"skipping {path}: no longer a {kind.warp_kind} bundle (replaced while it was read)")
        continue
      check_provenance(head["provenance"], device, path)
      check_metadata(head["extras"], path)  # the bundle reader's rules: a frame spec, a split flag, frame inputs that hold the frame
      if new_img is not None and (made := spec_shape(head["extras"].get("output_specs", {}).get("warped"))) != new_img:
        report(f"skipping {path}: it makes {made} planes, the model takes {'new_img' if kind is DRIVING else 'input_img'} {new_img}")
      else: out.append((path, meta))
    except ArtifactError as e: report(f"skipping {e}")
    except Exception as e:  # any file in the folder may be damaged or crafted (deep JSON, huge numbers): skipped with its reason, never a crash
      report(f"skipping {path}: unusable header ({type(e).__name__}: {str(e)[:160]})")
  return out

def model_planes(head: dict) -> list | None:
  """The shape of a model bundle's frames input (new_img; input_img for driver monitoring) in its header: what a warp must make for it."""
  extras = head["extras"]
  return spec_shape(extras.get("input_specs", {}).get(frames_input(extras.get("metadata", {}))))

def warp_command(frame: NV12Frame, kind: ArtifactSet = DRIVING, planes: list | None = None) -> str:
  """The command that builds `kind`'s warp for a live buffer layout: camerad's uv_height where the layout is camerad's, else the visible
  rows; a driver-monitoring model of another input size than openpilot's gets a --warp-to to fill in."""
  padded = camerad_frame(frame.width, frame.height)
  spec = padded.spec if (padded.stride, padded.uv_offset, padded.size) == (frame.stride, frame.uv_offset, frame.size) else frame.spec
  size = "" if kind is DRIVING or planes in (None, [1, DM_INPUT_SIZE[0] * DM_INPUT_SIZE[1]]) else f" --warp-to WxH (W*H = {planes[-1]})"
  return f"{kind.build_warp.format(frame=spec)}{size} --output ..."

def find_warp(artifacts: str, main: NV12Frame, extra: NV12Frame | None, device: str | None = None, report: Callable[[str], None] = log.warning,
              new_img: list | None = None, refused: set[str] | frozenset[str] = frozenset(), kind: ArtifactSet = DRIVING) -> str | None:
  """The warp bundle of `kind` in `artifacts` built for the live `main` buffer layout (and fitting in the `extra` stream's buffers, if one
  is used) and a model taking `new_img` planes, split-frames first, none of `refused` (warps that failed to load with this model as the
  files are now); None, with a line saying what to build or why the ones there are not used, if none."""
  matches, seen = [], []
  for path, meta in warp_bundles(artifacts, device, report, new_img, kind):
    frame = parse_frame(meta["frame"])
    seen.append(meta["frame"])
    if (frame.width, frame.height, frame.stride, frame.uv_offset) == (main.width, main.height, main.stride, main.uv_offset) \
       and frame.size <= main.size and (extra is None or frame.size <= extra.size):
      matches.append((not meta.get("split_frames"), path))
  if usable := [m for m in matches if m[1] not in refused]: return min(usable)[1]
  if matches:
    report(f"the {kind.warp_kind} bundles for {main.width}x{main.height} frames ({', '.join(os.path.basename(p) for _, p in sorted(matches))}) failed "
           f"to load with {kind.model} (said above): waiting; tried again when one of the files changes")
    return None
  report(f"no {kind.warp_kind} bundle in {artifacts} for {main.width}x{main.height} frames (stride {main.stride}, uv_offset {main.uv_offset}, "
         f"{main.size} bytes); have {seen}. Waiting; build one: {warp_command(main, kind, new_img)}")
  return None

def load_pair(artifacts: str, main: NV12Frame, extra: NV12Frame | None, load: Callable[[str, str], None], refused: dict[str, tuple],
              report: Callable[[str], None], new_img: list | None = None, kind: ArtifactSet = DRIVING) -> str | None:
  """Find `kind`'s warp for the live buffers (find_warp) and `load(model path, warp path)` the pair, as both daemons do. A pair whose load
  raised an ArtifactError goes into `refused` ({warp: both files' file_key as they were before the read}) and is passed over until either
  file changes. The warp loaded, or None with a line saying why (then the daemon waits)."""
  model, warp = os.path.join(artifacts, kind.model), None
  skip = {w for w, keys in refused.items() if keys == (file_key(model), file_key(w))}  # a file that changed is tried again
  try:
    warp = find_warp(artifacts, main, extra, report=report, new_img=new_img, refused=skip, kind=kind)
    if warp is None: return None
    keys = (file_key(model), file_key(warp))  # before the read: a file fixed while it was read is tried again
    load(model, warp)
  except ArtifactError as e:
    if warp is not None: refused[warp] = keys
    report(f"cannot load {model} with {warp}: {e}; waiting: tried again when one of them changes")
    return None
  refused.pop(warp, None)
  return warp

def check_artifacts(artifacts: str, device: str | None = None, report: Callable[[str], None] = log.warning, kind: ArtifactSet = DRIVING) -> list | None:
  """Before waiting for camerad: the shape of `kind`'s model's frames input (what its warp must make; None if it takes none), read once
  here so the daemon never reads the model's header again. ArtifactError with the folder's problem in one line: no model for this device,
  another kind of bundle where the model should be, no warp at all."""
  model = os.path.join(artifacts, kind.model)
  if not os.path.isdir(artifacts):
    raise ArtifactError(f"--artifacts {artifacts}: {'is a file, not a folder' if os.path.exists(artifacts) else 'no such folder'} (it holds "
                        f"{kind.model} and {kind.warp_kind} bundles)")
  if not os.path.isfile(model): raise ArtifactError(f"{model} not found (build it with {kind.build_model})")
  head, _ = read_bundle(model)
  check_provenance(head["provenance"], device, model)
  if (found := head["extras"].get("metadata", {}).get("kind")) != kind.model_kind:
    raise ArtifactError(f"{model} is not a {kind.what} bundle: its metadata kind is {found or 'none'}, not {kind.model_kind}")
  check_metadata(head["extras"], model)  # the reader's rules on what the daemon reads of it (a driver-monitoring model's heads)
  if not warp_bundles(artifacts, device, report, planes := model_planes(head), kind):
    raise ArtifactError(f"no {kind.warp_kind} bundle for this device and model in {artifacts} (build one: "
                        f"{kind.build_warp.format(frame='W,H,...')} --output ...)")
  return planes
