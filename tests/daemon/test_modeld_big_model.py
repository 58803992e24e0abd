"""modeld's big/small pair: the small model drives until the big one is warm in its shadow; a big one that fails (its load, its
outputs, its device, its load time) hands back to the small one; sunnypilot's Chestnut pick as the big model."""
import os
import re
import shutil

import pytest

import installed_sets
import modeld_daemon
from daemon_process import exchange_until
from modeld_daemon import Daemon, reference

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name: the default set
sets, root = installed_sets.sets, installed_sets.root  # the installed sets, by name

@pytest.fixture(scope="module")
def pair(artifacts, sets, tmp_path_factory):
  """A default set with a big/small pair: the default's native stand-in as model.bin (small), set b's as big_model.bin (big); and a folder
  with b's model as model.bin, the big one's reference."""
  folder = tmp_path_factory.mktemp("pair")
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), folder / name)
  shutil.copy(sets / "b" / "model.bin", folder / "big_model.bin")
  return folder

def test_the_small_model_drives_until_the_big_one_is_warm(pair, sets, artifacts, openpilot_prefix):
  """openpilot's big/small pair: the small one publishes from the first frame, the big one loads beside it, warms in its shadow (4 frames)
  and takes over between two frames; the small one's outputs are its own until then, the big one's its own run on every frame since its
  warm-up began. (modelV2.big is in today's schema; on the bundled one the run state and the first-frame line say it.)"""
  from sunnypilot.modeld_v2.daemon.run_state import read_state
  daemon = Daemon(str(pair))
  end = exchange_until(daemon, "big model takes over from the small one", 0)
  daemon.exchange(range(end, end + 5))
  state = read_state("modeld", openpilot_prefix)
  assert daemon.stop() == 0 and daemon.published == list(range(end + 5))
  assert state["running"]["big"] is True and state["big"]["phase"] == "active", state
  sent = list(range(end + 5))
  first_big = next(int(m[1]) for line in daemon.lines if (m := re.search(r"frame (\d+): the first on set default \(model \w+, the big one\)", line)))
  warm = next(int(m[1]) for line in daemon.lines if (m := re.search(r"frame (\d+): the first of the big model in the shadow", line)))
  assert first_big - warm == 4
  assert [daemon.raw(i) for i in sent[:first_big]] == reference(artifacts, sent[:first_big]), "the small one, untouched by the big one"
  assert [daemon.raw(i) for i in sent[first_big:]] == reference(str(sets / "b"), sent[warm:])[first_big - warm:], "the big one with its past"

@pytest.mark.parametrize("fault", ["load", "non-finite", "device", "timeout"])
def test_a_big_model_that_fails_hands_back_to_the_small_one(pair, sets, artifacts, tmp_path, openpilot_prefix, fault):
  """A big model whose file is broken (its load), whose outputs turn non-finite on camera frames (inf: its warm-up in the shadow), whose
  device goes away while it drives (its run raises, the 5th frame after it took over), or that loads slower than --big-model-timeout: one
  line, and the small one drives every frame for the rest of the drive, warm (it ran every frame, in the big one's shadow after the
  takeover)."""
  folder = tmp_path / "pair"
  shutil.copytree(pair, folder)
  if fault == "load": (folder / "big_model.bin").write_bytes((folder / "big_model.bin").read_bytes()[:4096])
  if fault == "non-finite": shutil.copy(sets / "inf" / "model.bin", folder / "big_model.bin")
  patch = {"device": BIG_DEVICE_LOST, "timeout": BIG_SLOW_LOAD}.get(fault)
  daemon = Daemon(str(folder), args=("--big-model-timeout", "1") if fault == "timeout" else (), command=patch or ("-m", "sunnypilot.modeld_v2.modeld"))
  end = exchange_until(daemon, "big model failed", 0, after=0)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0 and daemon.published == list(range(end + 5)), "every frame published, the failing one too"
  said = [line for line in daemon.lines if "big model failed" in line]
  why = {"load": "its load failed", "non-finite": "non-finite outputs on frame", "device": "a device error at run time: RuntimeError: the USB "
         "GPU went away", "timeout": "its load took longer than 1 s"}[fault]
  assert len(said) == 1 and why in said[0] and "the small one drives for the rest of the drive" in said[0], said
  sent = list(range(end + 5))
  if fault != "device": assert [daemon.raw(i) for i in sent] == reference(artifacts, sent), "the small one throughout"
  else: assert [daemon.raw(i) for i in sent[-5:]] == reference(artifacts, sent)[-5:], "the small one, warm: its run on every frame"

# the big model's device goes away while it drives: its run raises on the 5th frame after its warm-up (ModelRunner.run of big_model.bin)
BIG_DEVICE_LOST = ("-c", """import sys
from sunnypilot.modeld_v2 import modeld
from sunnypilot.modeld_v2.runtime import model_runner
init, run, runs = model_runner.ModelRunner.__init__, model_runner.ModelRunner.run, {}
def init_(self, model_path, *args, **kwargs):
  init(self, model_path, *args, **kwargs)
  self.big_one = model_path.endswith("big_model.bin")
def run_(self):
  if self.big_one:
    runs[id(self)] = runs.get(id(self), 0) + 1
    if runs[id(self)] == 3 + 4 + 5: raise RuntimeError("the USB GPU went away")  # 3 warm-up runs, 4 in the shadow, 5 driving
  return run(self)
model_runner.ModelRunner.__init__, model_runner.ModelRunner.run = init_, run_
sys.exit(modeld.main())""")

# the big model's load is slower than --big-model-timeout (1 s): 3 s more in its adapter's making
BIG_SLOW_LOAD = ("-c", """import sys, time
from sunnypilot.modeld_v2 import modeld
from sunnypilot.modeld_v2.runtime import model_runner
init = model_runner.ModelRunner.__init__
def init_(self, model_path, *args, **kwargs):
  if model_path.endswith("big_model.bin"): time.sleep(3)
  init(self, model_path, *args, **kwargs)
model_runner.ModelRunner.__init__ = init_
sys.exit(modeld.main())""")

# a sunnypilot device's Params (common/params @084747c raises UnknownKeyName for a key it does not list): only the Chestnut slot holds a
# bundle, as sunnypilot's model manager writes it (JSON, the set in internalName); every other key is unknown, so no CarParams either
CHESTNUT_PICK = ("-c", """import json, os, sys
from sunnypilot.modeld_v2 import modeld
from sunnypilot.modeld_v2.daemon import daemon_main, device_params
class UnknownKeyName(Exception): pass
class Params:
  def get(self, key):
    if key == "ModelManager_ActiveBundleChestnut": return json.dumps({"internalName": os.environ["PICK"], "ref": "0" * 40}).encode()
    raise UnknownKeyName(key)
  def put_bool(self, key, value): raise UnknownKeyName(key)
daemon_main.device_params = lambda report: device_params.DeviceParams(Params(), report)
sys.exit(modeld.main())""")

def test_sunnypilots_chestnut_pick_is_the_big_model(artifacts, root, sets, openpilot_prefix):
  """sunnypilot's second model slot: the set its model manager picked for the Chestnut loads as the big model beside the running set
  (which names none), warms in its shadow and takes over; the small one's outputs are its own until then."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)), env={"PICK": "b"}, command=CHESTNUT_PICK)
  end = exchange_until(daemon, "big model takes over from the small one", 0)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0 and daemon.published == list(range(end + 5))
  assert any("set b's big model loaded" in line for line in daemon.lines), daemon.lines
  sent = list(range(end + 5))
  first_big = next(int(m[1]) for line in daemon.lines if (m := re.search(r"frame (\d+): the first on set default \(model \w+, the big one\)", line)))
  warm = next(int(m[1]) for line in daemon.lines if (m := re.search(r"frame (\d+): the first of the big model in the shadow", line)))
  assert [daemon.raw(i) for i in sent[:first_big]] == reference(artifacts, sent[:first_big]), "the small one, untouched by the big one"
  assert [daemon.raw(i) for i in sent[first_big:]] == reference(str(sets / "b"), sent[warm:])[first_big - warm:], "set b's model, with its past"

def test_a_chestnut_pick_that_is_not_installed_is_one_line(artifacts, root, openpilot_prefix):
  daemon = Daemon(artifacts, args=("--model-sets", str(root)), env={"PICK": "nope"}, command=CHESTNUT_PICK)
  daemon.exchange(range(10))
  assert daemon.stop() == 0 and daemon.published == list(range(10))
  said = [line for line in daemon.lines if "Chestnut pick" in line]
  assert len(said) == 1 and "the Chestnut pick (set nope) is not used as the big model: no set nope in" in said[0], daemon.lines
  assert not any("big model" in line for line in daemon.lines if line not in said), "no big model without a pick that opens"
