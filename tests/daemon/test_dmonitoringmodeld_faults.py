"""dmonitoringmodeld against bad input: calibrations refused and non-finite outputs published invalid, one daemon per bus, bad artifacts
at start, unsigned bundles under --trusted-keys."""
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np

from sunnypilot.modeld_v2.compile_dm_warp import compile_dm_warp
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import read_bundle

import dm_daemon
from conftest import ROOT
from dm_daemon import FRAME, RPY, DMDaemon, reference

folder = dm_daemon.folder  # the daemon tests' fixture, by name: both daemons' artifacts

# the calibration check switched off: a NaN calib reaches the model, and only the output check stands between it and the bus
UNCHECKED_CALIB = ("-c", "import sys; from sunnypilot.modeld_v2 import dmonitoringmodeld; from sunnypilot.modeld_v2.daemon import bus_inputs; "
                   "bus_inputs.BusInputs.calibration = lambda self, sm: tuple(sm['liveCalibration'].rpyCalib) if sm.seen['liveCalibration'] else (0, 0, 0); "
                   "sys.exit(dmonitoringmodeld.main())")

def test_bad_calibrations_are_refused_and_non_finite_outputs_published_invalid(folder, openpilot_prefix):
  nan = (float("nan"), 0.0, 0.0)
  daemon = DMDaemon(folder)
  daemon.exchange(range(3), RPY)
  daemon.exchange(range(3, 6), nan)
  daemon.exchange(range(6, 8), RPY)
  assert daemon.stop(signal.SIGINT) == 130 and "Traceback" not in "".join(daemon.lines), "Ctrl-C: 130, no traceback"
  assert all(daemon.messages[i][1] for i in range(8)) and daemon.raw(4).tobytes() == reference(folder, [4], calibs={4: RPY})[0], "the last good one"
  assert sum("liveCalibration.rpyCalib = [nan, 0.0, 0.0] refused" in line for line in daemon.lines) == 1, daemon.lines
  unchecked = DMDaemon(folder, command=UNCHECKED_CALIB)
  unchecked.exchange(range(3), RPY)
  unchecked.exchange(range(3, 5), nan)
  unchecked.exchange(range(5, 8), RPY)
  assert unchecked.stop() == 0
  assert [unchecked.messages[i][1] for i in range(8)] == [True] * 3 + [False] * 2 + [True] * 3, "valid=False exactly while outputs are NaN"
  assert np.isfinite(unchecked.raw(3)).all() and not unchecked.raw(3).any(), "published zeroed, no NaN on the bus"
  assert sum("non-finite model outputs" in line for line in unchecked.lines) == 1, unchecked.lines

def test_one_dmonitoringmodeld_per_bus(folder, openpilot_prefix):
  daemon = DMDaemon(folder)
  daemon.exchange(range(3))
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", folder], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 2
  assert out.stderr == f"dmonitoringmodeld: error: another dmonitoringmodeld is already running on the bus OPENPILOT_PREFIX={openpilot_prefix}\n"
  from sunnypilot.modeld_v2.daemon.messaging import claim_bus
  assert (claim := claim_bus("modeld")) is not None, "modeld's claim is its own: both daemons run on one bus"
  claim.close()
  daemon.exchange(range(3, 6))
  assert daemon.stop() == 0, "the first one kept running"

def crafted(src: str, dst, edit) -> str:
  """A copy of bundle `src` with its header dict passed through `edit`, the hash recomputed (a file that passes the integrity check)."""
  head, blob = read_bundle(src)
  edit(head)
  data = json.dumps(head).encode()
  dst.write_bytes(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + bytes(blob)).digest()) + data + bytes(blob))
  return str(dst)

def test_bad_artifacts_are_one_line_and_exit_2(folder, native_artifacts, tmp_path):
  """Checked before waiting for camerad: no model, a warp where the model should be, a model without output_slices or with a head of the
  wrong size; a driving model, a driving warp or a dm_warp for another model input where a dm_warp is expected (each skipped with a line)
  and so no dm_warp at all."""
  model, warp = os.path.join(folder, "dmonitoring_model.bin"), os.path.join(folder, "dm_warp_1344x760.bin")
  slices = lambda head: head["extras"]["metadata"]["output_slices"]
  def shorter(head):  # face_descs_rhd one value short
    slices(head)["face_descs_rhd"][1] -= 1
  cases = {"no model": ({"dm_warp_1344x760.bin": warp}, "dmonitoring_model.bin not found (build it with compile_modeld --onnx dmonitoring_model.onnx)"),
           "a warp as the model": ({"dmonitoring_model.bin": warp, "dm_warp_1344x760.bin": warp},
                                   "is not a driver-monitoring model bundle: its metadata kind is dm_warp, not dmonitoring_model"),
           "no output_slices": ({"dmonitoring_model.bin": lambda d: crafted(model, d, lambda h: h["extras"]["metadata"].pop("output_slices")),
                                 "dm_warp_1344x760.bin": warp}, "a driver-monitoring model needs output_slices"),
           "a head of the wrong size": ({"dmonitoring_model.bin": lambda d: crafted(model, d, shorter), "dm_warp_1344x760.bin": warp},
                                        "face_descs_rhd has 11 values, openpilot's driver-monitoring parse reads 12"),
           "a model where a warp is expected": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": os.path.join(native_artifacts, "model.bin")},
                                                "no dm_warp bundle for this device and model"),
           "a driving warp where a dm_warp is expected": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": os.path.join(folder, "warp_split.bin")},
                                                          "no dm_warp bundle for this device and model"),
           "a dm_warp for another model size": ({"dmonitoring_model.bin": model, "dm_warp_1344x760.bin": lambda d: compile_dm_warp(FRAME.spec, str(d),
                                                 "720x480", log=lambda s: None)}, "no dm_warp bundle for this device and model")}
  skips = {"a model where a warp is expected": "a model bundle, not a dm_warp (only dmonitoring_model.bin is read as the model)",
           "a driving warp where a dm_warp is expected": "a warp bundle, not a dm_warp",
           "a dm_warp for another model size": f"it makes [1, {720 * 480}] planes, the model takes input_img [1, {1440 * 960}]"}
  for case, (files, message) in cases.items():
    case_dir = tmp_path / case.replace(" ", "_")
    case_dir.mkdir()
    for name, src in files.items():
      if callable(src): src(case_dir / name)
      else: shutil.copy(src, case_dir / name)
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", str(case_dir)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and message in lines[-1] and lines[-1].startswith("dmonitoringmodeld: error:"), (case, out.stderr)
    assert "Traceback" not in out.stderr
    skipped = [line for line in lines if "skipping" in line]
    assert skipped == ([f"dmonitoringmodeld: skipping {case_dir}/dm_warp_1344x760.bin: {skips[case]}"] if case in skips else []), (case, lines)
    assert len(lines) == 1 + len(skipped), (case, lines)

def test_with_trusted_keys_only_a_signed_pair_runs(dm_artifacts, tmp_path, openpilot_prefix):
  """--trusted-keys as modeld takes it: the unsigned DM model is refused with one line before waiting for camerad (exit 2); once the model
  and its warp are signed by the trusted publisher (each its own .sig), frames run."""
  from sunnypilot.modeld_v2.format.bundle import content_digest
  from sunnypilot.modeld_v2.format.signature import Signed, generate_key, load_private_key, sign
  keys, folder = tmp_path / "keys", tmp_path / "dm"
  os.makedirs(keys / "trusted")
  os.makedirs(folder)
  publisher, public = generate_key(str(keys / "publisher.pem"))
  shutil.copy(public, keys / "trusted" / "publisher.pem")
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  run = [sys.executable, "-m", "sunnypilot.modeld_v2.dmonitoringmodeld", "--artifacts", str(folder), "--trusted-keys", str(keys / "trusted")]
  out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "dmonitoring_model.bin.sig" in out.stderr, out.stderr
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin"):
    path = str(folder / name)
    sign(path, Signed("bundle", name, content_digest(path), os.path.getsize(path)), load_private_key(publisher))
  daemon = DMDaemon(str(folder), args=("--trusted-keys", str(keys / "trusted")))
  daemon.exchange(range(3))
  assert daemon.stop() == 0 and daemon.published == [0, 1, 2]
  assert any("must be signed by one of 1 trusted keys" in line for line in daemon.lines), daemon.lines
