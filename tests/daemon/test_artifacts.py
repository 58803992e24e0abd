"""One artifacts folder, both daemons' files: each daemon's discovery finds its own model's warps and passes over the other's files without
a line; anything else that is not its warp is still named, once."""
import os
import shutil

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, DRIVING, check_artifacts, find_warp, warp_bundles, warp_command
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame

@pytest.fixture
def both(dm_artifacts, native_artifacts, tmp_path) -> str:
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin", "dm_warp_1928x1208.bin"): shutil.copy(os.path.join(dm_artifacts, name), tmp_path / name)
  for name in ("model.bin", "warp_split.bin", "warp_packed.bin"): shutil.copy(os.path.join(native_artifacts, name), tmp_path / name)
  return str(tmp_path)

def test_each_daemon_finds_its_own_and_says_nothing_of_the_others(both):
  for kind, own in ((DRIVING, ["warp_packed.bin", "warp_split.bin"]), (DRIVER_MONITORING, ["dm_warp_1344x760.bin", "dm_warp_1928x1208.bin"])):
    lines = []
    planes = check_artifacts(both, report=lines.append, kind=kind)
    assert [os.path.basename(p) for p, _ in warp_bundles(both, report=lines.append, new_img=planes, kind=kind)] == own
    assert lines == [], lines
  frame = camerad_frame(1928, 1208)
  assert os.path.basename(find_warp(both, frame, None, new_img=[1, 1440 * 960], kind=DRIVER_MONITORING)) == "dm_warp_1928x1208.bin"

def test_a_bundle_of_neither_daemon_is_named_by_both(both, dm_artifacts):
  shutil.copy(os.path.join(both, "model.bin"), os.path.join(both, "spare_model.bin"))
  for kind in (DRIVING, DRIVER_MONITORING):
    lines = []
    warp_bundles(both, report=lines.append, kind=kind)
    assert lines == [f"skipping {both}/spare_model.bin: a model bundle, not a {kind.warp_kind} (only {kind.model} is read as the model)"], lines

def test_each_model_file_is_refused_as_the_other(both):
  shutil.copy(os.path.join(both, "dmonitoring_model.bin"), os.path.join(both, "model.bin"))
  with pytest.raises(ArtifactError, match="model.bin is not a driving model bundle: its metadata kind is dmonitoring_model, not model"):
    check_artifacts(both)

def test_the_no_dm_warp_hint_builds_one():
  frame = camerad_frame(1344, 760)
  assert warp_command(frame, DRIVER_MONITORING) == f"python -m sunnypilot.modeld_v2.compile_dm_warp --frame {frame.spec} --output ..."
  assert "--warp-to WxH (W*H = 4800)" in warp_command(frame, DRIVER_MONITORING, [1, 4800]), "a model of another input size: its size to fill in"
