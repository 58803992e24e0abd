"""One model set, both daemons' bundles: each daemon finds its own model and warps (by openpilot's file names, or its manifest's roles) and
never looks at the other's; a file under its warps' name that is not one is named, once."""
import os
import shutil

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, DRIVING, check_artifacts, check_set, find_warp, model_file, warp_bundles, warp_command
from sunnypilot.modeld_v2.daemon.model_sets import DM_MODEL, DM_WARP, DRIVING_MODEL, WARP, Trust, open_set
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest
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

def test_a_misnamed_bundle_is_named_by_the_daemon_its_name_belongs_to(both):
  """In a folder without a manifest a file's name gives its role: a model under a driving warp's name is modeld's to refuse, a driving
  warp under a dm_warp name dmonitoringmodeld's."""
  shutil.copy(os.path.join(both, "model.bin"), os.path.join(both, "spare_model.bin"))
  shutil.copy(os.path.join(both, "warp_split.bin"), os.path.join(both, "dm_warp_spare.bin"))
  for kind, name, found in ((DRIVING, "spare_model.bin", "model"), (DRIVER_MONITORING, "dm_warp_spare.bin", "warp")):
    lines = []
    warp_bundles(both, report=lines.append, kind=kind)
    said = " (only model.bin is read as the model)" if kind is DRIVING else ""  # a model under a warp's name; a warp of the other daemon's is none
    assert lines == [f"skipping {both}/{name}: a {found} bundle, not a {kind.warp_kind}{said}"], lines

def test_a_manifest_gives_each_daemon_its_bundles_by_role(both):
  """With a manifest, roles are what it says, whatever the names: a set of both daemons' bundles under other names."""
  for old, new in (("dmonitoring_model.bin", "dm.bin"), ("dm_warp_1928x1208.bin", "driver_ox.bin"), ("warp_split.bin", "road.bin")):
    os.rename(os.path.join(both, old), os.path.join(both, new))
  os.remove(os.path.join(both, "dm_warp_1344x760.bin"))
  os.remove(os.path.join(both, "warp_packed.bin"))
  roles = {"model.bin": DRIVING_MODEL, "road.bin": WARP, "dm.bin": DM_MODEL, "driver_ox.bin": DM_WARP}
  write_manifest(os.path.join(both, MANIFEST_NAME), "both", [entry_of(os.path.join(both, f), role) for f, role in roles.items()])
  model_set = open_set("both", both, Trust())
  for kind, model, warp in ((DRIVING, "model.bin", "road.bin"), (DRIVER_MONITORING, "dm.bin", "driver_ox.bin")):
    lines = []
    assert model_file(model_set, kind) == os.path.join(both, model)
    planes = check_set(model_set, report=lines.append, kind=kind)
    assert [os.path.basename(p) for p, _ in warp_bundles(both, report=lines.append, new_img=planes, paths=model_set.files(kind.warp_role), kind=kind)] == [warp]
    assert lines == [], lines

def test_each_model_file_is_refused_as_the_other(both):
  shutil.copy(os.path.join(both, "dmonitoring_model.bin"), os.path.join(both, "model.bin"))
  with pytest.raises(ArtifactError, match="model.bin is not a driving model bundle: its metadata kind is dmonitoring_model, not model"):
    check_artifacts(both)

def test_the_no_dm_warp_hint_builds_one():
  frame = camerad_frame(1344, 760)
  assert warp_command(frame, DRIVER_MONITORING) == f"python -m sunnypilot.modeld_v2.compile_dm_warp --frame {frame.spec} --output ..."
  assert "--warp-to WxH (W*H = 4800)" in warp_command(frame, DRIVER_MONITORING, [1, 4800]), "a model of another input size: its size to fill in"
