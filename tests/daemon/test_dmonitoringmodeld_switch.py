"""dmonitoringmodeld switching model sets while frames run: the new DM model takes over between two frames, sets that cannot run leave
the running one alone, the fallbacks at start, on bad outputs and on new cameras; its own record of the last set that ran."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_DM_FILE, LAST_RAN_FILE, folder_roles
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest

import dm_daemon
from conftest import ROOT
from daemon_process import exchange_until
from dm_daemon import BIG_FRAME, DMDaemon, reference
from installed_sets import poisoned

folder = dm_daemon.folder  # the daemon tests' fixture, by name: both daemons' artifacts

@pytest.fixture(scope="module")
def dm_sets(dm_artifacts, native_artifacts, tmp_path_factory):
  """Installed sets, each with a manifest as install_models leaves it: b (another tiny DM stand-in, seed 7, with the default's dm_warp),
  driving (modeld's driving model and warp, no DM model), broken (b's files, its model's last byte changed after the install: its content
  no longer matches the hash its preamble and manifest declare), inf (b with an infinite weight in its first convolution: finite on the
  warm-up's zero frame, not on camera frames), nan (b with a NaN weight in its heads: fails its warm-up)."""
  import onnx

  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools.stand_in_models import build_dmonitoring
  root, work = tmp_path_factory.mktemp("dm_sets"), tmp_path_factory.mktemp("dm_sources")
  names = ("b", "driving", "broken", "inf", "nan")
  for name in names: os.makedirs(root / name)
  onnx.save(build_dmonitoring("tiny", 7)[0], work / "b.onnx")
  compile_model(str(root / "b" / "dmonitoring_model.bin"), onnx=str(work / "b.onnx"), log=lambda s: None)
  shutil.copy(os.path.join(dm_artifacts, "dm_warp_1344x760.bin"), root / "b" / "dm_warp_1344x760.bin")
  for name in ("broken", "inf", "nan"): shutil.copy(root / "b" / "dm_warp_1344x760.bin", root / name / "dm_warp_1344x760.bin")
  shutil.copy(root / "b" / "dmonitoring_model.bin", root / "broken" / "dmonitoring_model.bin")
  poisoned(str(root / "b" / "dmonitoring_model.bin"), str(root / "inf" / "dmonitoring_model.bin"), str(work / "b.onnx"), np.inf)
  poisoned(str(root / "b" / "dmonitoring_model.bin"), str(root / "nan" / "dmonitoring_model.bin"), str(work / "b.onnx"), np.nan, head=True)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), root / "driving" / name)
  for name in names:
    folder = root / name
    write_manifest(str(folder / MANIFEST_NAME), name, [entry_of(str(folder / f), role) for f, role in folder_roles(str(folder)).items()])
  data = bytearray((root / "broken" / "dmonitoring_model.bin").read_bytes())  # damaged after it was installed
  data[-1] ^= 0xFF
  (root / "broken" / "dmonitoring_model.bin").write_bytes(bytes(data))
  return root

@pytest.fixture
def sets_root(dm_sets, tmp_path):
  """A fresh copy of the installed sets per test (the daemon writes last_ran_dm; tests write active)."""
  shutil.copytree(dm_sets, tmp_path / "sets")
  return tmp_path / "sets"

def test_a_switch_publishes_every_frame_and_runs_the_new_dm_model(folder, sets_root, openpilot_prefix):
  """Set b asked for while frames run: it loads beside them and takes over between two frames. Every frame sent is published once; up
  to the change each is the default pair's outputs on that frame, from the change on b's pair's, run directly."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(25))  # the default passes its first 20 frames
  (sets_root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 25)
  end = exchange_until(daemon, "set b passed its first 20 frames", end)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0 and daemon.left_no_cycles()
  sent = list(range(end + 5))
  assert daemon.published == sent, "every frame published once, in order"
  raws, b = [daemon.raw(i).tobytes() for i in sent], reference(str(sets_root / "b"), sent)
  first_b = next(i for i, (raw, ref) in enumerate(zip(raws, b, strict=True)) if raw == ref)
  assert first_b > 25, "frames ran on the default while b loaded"
  assert raws[:first_b] == reference(folder, sent[:first_b]) and raws[first_b:] == b[first_b:], "the default's pair, then b's"
  assert (sets_root / LAST_RAN_DM_FILE).read_text() == "b\n" and not (sets_root / LAST_RAN_FILE).exists(), "its own record, not modeld's"
  assert sum("switched to set b" in line for line in daemon.lines) == 1

def test_a_set_that_cannot_run_leaves_the_running_model_alone(folder, sets_root, openpilot_prefix):
  """A set with no DM model (a driving model only), one whose DM model is damaged, one whose warm-up gives NaN, one that is not there: one
  line each, and every frame runs on the default's pair."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  end = 0
  cases = (("driving", "no driver-monitoring model bundles"), ("broken", "content hash mismatch"), ("nan", "outputs on zero frames are not finite"),
           ("missing", "no set missing in"))
  for name, line in cases:
    (sets_root / "active").write_text(name + "\n")
    end = exchange_until(daemon, line, end)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  sent = list(range(end + 3))
  assert daemon.published == sent and [daemon.raw(i).tobytes() for i in sent] == reference(folder, sent), "the default ran every frame"
  for name, _ in cases:
    said = [line for line in daemon.lines if f"cannot switch to set {name}" in line]
    assert len(said) == 1 and said[0].rstrip().endswith("set default keeps running"), (name, said)
  assert "Traceback" not in "".join(daemon.lines)

def test_start_falls_back_to_the_last_dm_model_that_ran(folder, sets_root, openpilot_prefix):
  """The set asked for cannot load at start: the daemon starts on the last set whose DM model ran (its own record), saying so in one line."""
  (sets_root / "active").write_text("broken\n")
  (sets_root / LAST_RAN_DM_FILE).write_text("b\n")
  (sets_root / LAST_RAN_FILE).write_text("driving\n")  # modeld's record: not dmonitoringmodeld's to follow
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(3))
  assert daemon.stop() == 0
  assert [daemon.raw(i).tobytes() for i in range(3)] == reference(str(sets_root / "b"), range(3)), "".join(daemon.lines)
  failed = [line for line in daemon.lines if "cannot run set broken" in line]
  assert len(failed) == 1 and failed[0].rstrip().endswith("falling back to set b"), failed

def test_non_finite_outputs_in_the_first_frames_go_back_to_the_previous_set(folder, sets_root, openpilot_prefix):
  """Set inf passes its warm-up and gives non-finite outputs on its first camera frame: that frame is published invalid (zeroed), and
  from the next one the default, kept loaded meanwhile, runs again; inf is never recorded as the last DM model that ran."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  daemon.exchange(range(25))
  (sets_root / "active").write_text("inf\n")
  end = exchange_until(daemon, "dropped, back to set default", 25)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0
  sent = list(range(end + 5))
  assert daemon.published == sent
  invalid = [i for i in sent if not daemon.messages[i][1]]
  assert len(invalid) == 1 and not daemon.raw(invalid[0]).any(), "one frame on inf, published invalid and zeroed"
  valid = [i for i in sent if i != invalid[0]]
  assert [daemon.raw(i).tobytes() for i in valid] == reference(folder, valid), "the default before and after it"
  assert (sets_root / LAST_RAN_DM_FILE).read_text() == "default\n", "a set that failed is never the last that ran"
  assert sum("set inf gave non-finite outputs in its first frames: dropped, back to set default" in line for line in daemon.lines) == 1

def test_new_cameras_the_running_set_has_no_warp_for_fall_back_to_the_default(folder, sets_root, openpilot_prefix):
  """Set b runs (a dm_warp for 1344x760 only) and camerad comes back with 1928x1208 driver frames: one line says b cannot run on them,
  and the default (a dm_warp for both) runs them through its own warp."""
  daemon = DMDaemon(folder, args=("--model-sets", str(sets_root)))
  (sets_root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 0)
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("driver camera geometry changed to 1928x1208", after=seen)
  ids = range(100, 105)
  daemon.exchange(ids)
  assert daemon.stop() == 0 and daemon.published == [*range(end), *ids]
  assert [daemon.raw(i).tobytes() for i in ids] == reference(folder, ids, BIG_FRAME)
  said = [line for line in daemon.lines[seen:] if "set b cannot run on these cameras" in line]
  assert len(said) == 1 and "none of its dm_warp bundles fits 1928x1208" in said[0] and said[0].rstrip().endswith("falling back to set default"), said

def test_model_sets_naming_a_file_is_one_line(folder, tmp_path):
  (tmp_path / "file").write_text("")
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", folder, "--model-sets", str(tmp_path / "file")],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr == f"dmonitoringmodeld: error: --model-sets {tmp_path / 'file'}: is a file, not a folder\n", out.stderr
