"""Model sets installed for modeld's switch tests: another tiny native stand-in and its broken copies, each with a manifest as
install_models leaves it (`sets`, module-scoped; `root`, a fresh copy per test), and which model ran a frame, as modeld says it."""
import hashlib
import os
import re
import shutil

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from sunnypilot.modeld_v2.daemon.model_sets import folder_roles
from sunnypilot.modeld_v2.format.bundle import PREAMBLE, content_digest
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest

from modeld_daemon import Daemon

def install(folder, name: str) -> None:
  """A set's manifest naming every bundle in `folder` (roles by name), as install_models leaves it."""
  write_manifest(str(folder / MANIFEST_NAME), name, [entry_of(str(folder / f), role) for f, role in folder_roles(str(folder)).items()])

def poisoned(src: str, dst: str, onnx_path: str, value: float, head: bool = False) -> None:
  """A copy of model bundle `src` whose first convolution's first weight (or with `head` the output head's) is `value`, the content hash
  recomputed: a bundle that reads as intact. +inf in the convolution: finite on zero frames (every input -1: -inf, then relu 0), not on
  camera frames; NaN in the head: not finite on anything."""
  weights = [numpy_helper.to_array(i) for i in onnx.load(onnx_path).graph.initializer]
  weight = max((w for w in weights if w.ndim == 2), key=lambda w: w.size) if head else next(w for w in weights if w.ndim == 4)
  data = bytearray(open(src, "rb").read())
  at = data.find(weight.astype(np.float32).tobytes())
  assert at > 0, "the weight is stored as the ONNX has it"
  data[at:at + 4] = np.float32(value).tobytes()
  data[PREAMBLE.size - 32:PREAMBLE.size] = hashlib.sha256(bytes(data[PREAMBLE.size:])).digest()
  open(dst, "wb").write(data)

@pytest.fixture(scope="module")
def sets(artifacts, tmp_path_factory):
  """Installed sets: b (another tiny native stand-in), inf (b with an infinite weight: finite at warm-up, not on camera frames), nan
  (b with a NaN weight in its head: fails its warm-up), old (b built with --host-parse, as bundles from before the parse was in the
  graph)."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools import stand_in_models
  root, work = tmp_path_factory.mktemp("sets"), tmp_path_factory.mktemp("sources")
  stand_in_models.write("native", "tiny", str(work / "b.onnx"), seed=7)
  for name in ("b", "inf", "nan", "old"): os.makedirs(root / name)
  compile_model(str(root / "b" / "model.bin"), onnx=str(work / "b.onnx"), log=lambda s: None)
  compile_model(str(root / "old" / "model.bin"), onnx=str(work / "b.onnx"), log=lambda s: None, host_parse=True)
  poisoned(str(root / "b" / "model.bin"), str(root / "inf" / "model.bin"), str(work / "b.onnx"), np.inf)
  poisoned(str(root / "b" / "model.bin"), str(root / "nan" / "model.bin"), str(work / "b.onnx"), np.nan, head=True)
  for name in ("b", "inf", "nan", "old"):
    shutil.copy(os.path.join(artifacts, "warp_split.bin"), root / name / "warp_split.bin")
    install(root / name, name)
  return root

@pytest.fixture
def root(sets, tmp_path):
  """A fresh copy of the installed sets per test (modeld writes last_ran; tests write active)."""
  shutil.copytree(sets, tmp_path / "sets")
  return tmp_path / "sets"

def model_id(folder) -> int: return int(content_digest(os.path.join(folder, "model.bin"))[:16], 16)

def published_id(daemon: Daemon, frame_id: int) -> int:
  """Which model ran `frame_id`: modelV2 has no field for it, so the daemon says "frame N: the first on set X (model D)" where one takes over."""
  firsts = [(int(m[1]), int(m[2], 16)) for line in daemon.lines if (m := re.search(r"frame (\d+): the first on set \S+ \(model ([0-9a-f]{16})\)", line))]
  return ([model for first, model in firsts if first <= frame_id] or [0])[-1]  # the last to take over by then (lines come in frame order)
