"""modeld switching model sets while frames run: every frame published, the new set warmed in the shadow of the running one, the engagement
gate, back to the previous on bad outputs, the fallbacks at start, signatures. The camerad stand-in and the subscriber run here
(test_modeld.Daemon), modeld in a subprocess."""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
import test_modeld
from onnx import numpy_helper
from test_modeld import Daemon, reference

from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_FILE, folder_roles
from sunnypilot.modeld_v2.format.bundle import PREAMBLE, content_digest
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, entry_of, write_manifest
from sunnypilot.modeld_v2.format.signature import Signed, generate_key, load_private_key, sign

from conftest import ROOT
from daemon_process import exchange_until

artifacts = test_modeld.artifacts  # the daemon tests' fixture, by name: the default set

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

def test_a_switch_warms_the_new_set_in_the_shadow_and_publishes_every_frame(artifacts, root, openpilot_prefix):
  """Frames keep coming while set b loads in the background, then b runs in the shadow of the default on the same frames until its
  context is its own (the native stand-in's state holds 4 frames), and takes over between two frames: every frame sent is published once,
  each by the model that ran it; the default's outputs are exactly its own while b warms (as if b were not there), and b's from the change
  on are b's run on every frame since its warm-up began: no frame of it starts from an empty past."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))  # the default passes its first frames: it is kept while b is on probation
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 25)
  end = exchange_until(daemon, "set b passed its first 20 frames", end)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0
  sent = list(range(end + 5))
  assert daemon.published == sent, "every frame published once, in order"
  ids = [published_id(daemon, i) for i in sent]
  first_b = ids.index(model_id(root / "b"))
  assert set(ids[:first_b]) == {model_id(artifacts)} and set(ids[first_b:]) == {model_id(root / "b")}
  assert first_b > 26, "frames ran on the default while b loaded"
  assert any("set b warms up in the shadow of set default: 4 frames until its context is its own" in line for line in daemon.lines)
  warm = first_b - 4  # the first frame b ran in the shadow
  assert [daemon.raw(i) for i in sent[first_b:]] == reference(str(root / "b"), sent[warm:])[4:], "b with the past it ran in the shadow"
  assert [daemon.raw(i) for i in sent[:first_b]] == reference(artifacts, sent[:first_b]), "the default untouched by the shadow"
  assert (root / LAST_RAN_FILE).read_text() == "b\n"

def test_each_set_publishes_through_its_own_parse(artifacts, root, openpilot_prefix):
  """From the default (its parse in its graph) to old (a bundle parsed on the host) to b (in its graph again): every frame's fields equal
  openpilot's formulas on that frame's own rawPredictions, so each set publishes its own parse, never the block of the set before it."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  slices = load_bundle(os.path.join(artifacts, "model.bin")).metadata["output_slices"]
  assert load_bundle(str(root / "b" / "model.bin")).metadata["output_slices"] == slices, "one stand-in layout: one reference"
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  end = 25
  for name in ("old", "b"):
    (root / "active").write_text(name + "\n")
    end = exchange_until(daemon, f"switched to set {name}", end)
    end = exchange_until(daemon, f"set {name} passed its first 20 frames", end)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0 and daemon.published == list(range(end + 5))
  ids = [published_id(daemon, i) for i in range(end + 5)]
  assert [model_id(f) for f in (artifacts, root / "old", root / "b")] == list(dict.fromkeys(ids)), "default, then old, then b"
  for i in range(end + 5): test_modeld.check_fields({s: m for s, (m, _) in daemon.messages[i].items()}, slices, todays=True)
  said = "".join(daemon.lines)
  assert said.count("has no output parse in its graph") == 1 and "the output parse runs in the model's graph" in said

def test_a_set_whose_outputs_turn_non_finite_in_its_warm_up_never_runs(artifacts, root, openpilot_prefix):
  """inf is finite on zero frames (its load's warm-up) and not on camera frames: in the shadow of the default its first frame is not
  finite, so it is dropped with one line and the default, untouched, publishes every frame; inf is never the last that ran."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  (root / "active").write_text("inf\n")
  end = exchange_until(daemon, "set inf dropped from its warm-up", 25)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0
  assert daemon.published == list(range(end + 5))
  assert {published_id(daemon, i) for i in range(end + 5)} == {model_id(artifacts)}, "inf never ran a published frame"
  assert [daemon.raw(i) for i in range(end + 5)] == reference(artifacts, list(range(end + 5))), "the default as if inf were not there"
  assert sum("set inf dropped from its warm-up: non-finite outputs on frame" in line for line in daemon.lines) == 1
  assert (root / LAST_RAN_FILE).read_text() == "default\n", "a set that failed is never the last that ran"

def test_a_camerad_restart_on_the_same_cameras_keeps_the_set_to_fall_back_to(artifacts, root, openpilot_prefix):
  """b is switched to after the default passed, and camerad restarts with the same cameras while b is in its first frames: only camera
  buffers went, so the default stays kept to fall back to until b has passed them (a reconnect once closed it)."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))  # the default passes its first 20 frames
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 25)  # b has run at most one frame of its 20
  seen = len(daemon.lines)
  daemon.restart_camerad(daemon.frame)
  daemon.wait_for_line("reconnected to camerad", after=seen)
  end = exchange_until(daemon, "set b passed its first 20 frames", end, after=seen)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  said = "".join(daemon.lines[seen:])
  assert "kept to fall back to, was loaded for cameras that are gone" not in said, said
  assert {published_id(daemon, i) for i in range(end, end + 3)} == {model_id(root / "b")}

def test_start_falls_back_to_the_last_set_that_ran(artifacts, root, openpilot_prefix):
  """The set asked for fails its warm-up (NaN outputs on zero frames): modeld starts on the last set that ran, saying so in one line."""
  (root / "active").write_text("nan\n")
  (root / LAST_RAN_FILE).write_text("b\n")
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(3))
  assert daemon.stop() == 0
  assert {published_id(daemon, i) for i in range(3)} == {model_id(root / "b")}, "".join(daemon.lines)
  failed = [line for line in daemon.lines if "cannot run set nan" in line]
  assert len(failed) == 1 and "outputs on zero frames are not finite; falling back to set b" in failed[0], failed

def test_a_manifest_that_lies_and_a_set_that_is_not_there_leave_the_running_set_alone(artifacts, root, openpilot_prefix):
  shutil.copy(root / "b" / "warp_split.bin", root / "b" / "planted.bin")  # a bundle the manifest does not name
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  end = 0
  for name, line in (("b", "planted.bin: a bundle the manifest of b does not name"), ("missing", "no set missing in"),
                     ("../b", "is not a plain name")):
    (root / "active").write_text(name + "\n")
    end = exchange_until(daemon, line, end)
  assert daemon.stop() == 0
  assert daemon.published == list(range(end)) and {published_id(daemon, i) for i in range(end)} == {model_id(artifacts)}

def sign_set(folder, key: str) -> None:
  manifest = str(folder / MANIFEST_NAME)
  sign(manifest, Signed("manifest", MANIFEST_NAME, hashlib.sha256(open(manifest, "rb").read()).hexdigest(), os.path.getsize(manifest)),
       load_private_key(key))

def sign_bundles(folder, key: str) -> None:
  for name in ("model.bin", "warp_split.bin"):
    path = str(folder / name)
    sign(path, Signed("bundle", name, content_digest(path), os.path.getsize(path)), load_private_key(key))

def test_with_trusted_keys_only_signed_sets_run(artifacts, root, tmp_path, openpilot_prefix):
  """The default signed bundle by bundle, set b by a signed manifest: both run. Unsigned, or signed by a key nobody trusts: refused with
  one line at start (the default) or at the switch (a set), the running set untouched."""
  keys = tmp_path / "keys"
  os.makedirs(keys / "trusted")
  publisher, public = generate_key(str(keys / "publisher.pem"))
  stranger, _ = generate_key(str(keys / "stranger.pem"))
  shutil.copy(public, keys / "trusted" / "publisher.pem")
  default = tmp_path / "default"
  os.makedirs(default)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), default / name)
  run = [sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(default), "--trusted-keys", str(keys / "trusted")]
  out = subprocess.run(run, cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and "unsigned: no" in out.stderr and "model.bin.sig" in out.stderr, out.stderr
  sign_bundles(default, publisher)
  sign_set(root / "b", stranger)
  daemon = Daemon(str(default), args=("--model-sets", str(root), "--trusted-keys", str(keys / "trusted")))
  assert any("must be signed by one of 1 trusted keys" in line for line in daemon.lines)
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "none of them trusted", 0)
  os.makedirs(root / "bare")  # a set with no signature at all (no manifest, no .sig): one line that says so, not three about its warps
  for name in ("model.bin", "warp_split.bin"): shutil.copy(root / "b" / name, root / "bare" / name)
  seen = len(daemon.lines)
  (root / "active").write_text("bare\n")
  end = exchange_until(daemon, "cannot switch to set bare", end)
  said = [line for line in daemon.lines[seen:] if "bare" in line and "asked for" not in line]
  assert len(said) == 1 and "unsigned" in said[0] and "model.bin.sig" in said[0], said
  sign_set(root / "b", publisher)
  (root / "active").write_text("b\n")  # asked for again
  end = exchange_until(daemon, "switched to set b", end)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  assert published_id(daemon, end + 2) == model_id(root / "b") and daemon.published == list(range(end + 3))
  assert any("manifest signed by key" in line and "publisher.pem" in line for line in daemon.lines)

def test_a_switch_while_the_camera_geometry_changes(artifacts, root, openpilot_prefix):
  """Set b is asked for, and camerad comes back with 1928x1208 frames while it loads: b has no warp for them, the default has. Whichever
  came first (b opened for the new frames, b loaded for the old ones and loaded again, or b running when the cameras changed: it falls
  back), it is one line about b, and the default runs on the new cameras."""
  from test_modeld import BIG_FRAME
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  (root / "active").write_text("b\n")
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("camera geometry changed to 1928x1208", after=seen)
  end = exchange_until(daemon, ("b cannot run on these cameras", "cannot switch to set b"), 100, after=seen)
  daemon.exchange(range(end, end + 5))
  assert daemon.stop() == 0
  ids = {published_id(daemon, i) for i in range(100, end + 5) if i in daemon.messages}
  assert ids == {model_id(artifacts)} and daemon.published[-5:] == list(range(end, end + 5))
  lines = [line for line in daemon.lines[seen:] if "cannot switch to set b" in line or "b cannot run on these cameras" in line]
  assert len(lines) == 1 and "none of its warp bundles fits 1928x1208" in lines[0], lines

def test_bad_trusted_keys_and_model_sets_are_one_line_at_start(artifacts, tmp_path):
  """A --trusted-keys folder holding a file that is not a public key (text, a private key), none at all, or --model-sets naming a file:
  exit 2 with one line, before waiting for camerad."""
  keys = tmp_path / "keys"
  keys.mkdir()
  (keys / "notes.pem").write_text("not a key\n")
  private, _ = generate_key(str(tmp_path / "publisher.pem"))
  (tmp_path / "file").write_text("")
  cases = [(("--trusted-keys", str(keys)), "notes.pem: not an Ed25519 public key"), (("--trusted-keys", str(tmp_path / "none")), "no such folder"),
           (("--model-sets", str(tmp_path / "file")), "is a file, not a folder")]
  for flags, message in cases:
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, *flags], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1 and "Traceback" not in out.stderr, (flags, out.stderr)
  os.remove(keys / "notes.pem")
  shutil.copy(private, keys / "oops.pem")
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", artifacts, "--trusted-keys", str(keys)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and "oops.pem: holds a private key" in out.stderr and out.stderr.count("\n") == 1, out.stderr

def test_with_trusted_keys_an_unsigned_warp_is_never_picked(artifacts, tmp_path):
  """The default folder, signed bundle by bundle, and an unsigned copy of its warp that sorts first (warp_a_split.bin): modeld picked the
  unsigned one, the load refused it, and the set failed to start. Now the unsigned warp is skipped with a line and the signed one loads."""
  from test_modeld import FRAME

  from sunnypilot.modeld_v2 import modeld
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.camera_sync import Geometry
  from sunnypilot.modeld_v2.daemon.frame_daemon import FrameDaemon
  from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, Trust
  os.makedirs(tmp_path / "trusted")
  publisher, public = generate_key(str(tmp_path / "publisher.pem"))
  shutil.copy(public, tmp_path / "trusted" / "publisher.pem")
  default = tmp_path / "default"
  os.makedirs(default)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(artifacts, name), default / name)
  sign_bundles(default, publisher)
  shutil.copy(default / "warp_split.bin", default / "warp_a_split.bin")
  lines: list[str] = []
  episodes = Episodes(lines.append)
  daemon = FrameDaemon(modeld.ModelD(episodes), episodes, str(default), trust=Trust.from_folder(str(tmp_path / "trusted")))
  prepared = daemon.prepare(daemon.sets.open(DEFAULT_SET), Geometry((0,), FRAME, None))
  try: assert os.path.basename(prepared.warp) == "warp_split.bin"
  finally: prepared.adapter.close()
  assert sum("warp_a_split.bin" in line and "skipping" in line for line in lines) == 1, lines

def shadow_start(daemon: Daemon, name: str) -> int:
  """The frame on which set `name` first ran in the shadow (the daemon says so)."""
  return next(int(m[1]) for line in daemon.lines if (m := re.search(rf"frame (\d+): the first of set {name} in the shadow", line)))

def test_a_set_asked_for_while_engaged_warms_and_waits_for_the_disengagement(artifacts, root, openpilot_prefix):
  """--switch-while-engaged defer (the default): b, asked for while openpilot is engaged, warms up in the shadow and keeps warming while
  engaged (its run state says deferred); the frame after the first disengaged one runs on b, with the past b ran in the shadow; the
  default publishes its own outputs until then."""
  from sunnypilot.modeld_v2.daemon.run_state import read_state
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  daemon.engaged = True
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "set b is warm: it takes over once openpilot disengages", 25)
  daemon.exchange(range(end, end + 10))
  state = read_state("modeld", openpilot_prefix)
  assert state["running"]["set"] == "default" and state["next"]["set"] == "b" and state["next"]["phase"] == "deferred", state
  daemon.engaged = False
  end = exchange_until(daemon, "switched to set b", end + 10)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0
  sent, first_b = list(range(end + 3)), end - 1
  assert [published_id(daemon, i) for i in sent] == [model_id(artifacts)] * first_b + [model_id(root / "b")] * (len(sent) - first_b)
  warm = shadow_start(daemon, "b")
  assert [daemon.raw(i) for i in sent[first_b:]] == reference(str(root / "b"), sent[warm:])[first_b - warm:], "b's past: every shadow frame"
  assert [daemon.raw(i) for i in sent[:first_b]] == reference(artifacts, sent[:first_b]), "the default untouched while b warmed"

def test_with_shadow_the_warm_set_takes_over_while_engaged(artifacts, root, openpilot_prefix):
  daemon = Daemon(artifacts, args=("--model-sets", str(root), "--switch-while-engaged", "shadow"))
  daemon.engaged = True
  daemon.exchange(range(25))
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "switched to set b", 25)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0 and published_id(daemon, end + 2) == model_id(root / "b")
  assert end - 1 - shadow_start(daemon, "b") == 4, "taken over as soon as its context (4 frames) was its own"
  assert not any("takes over once openpilot disengages" in line for line in daemon.lines)

def test_engagement_flapping_during_a_warm_up_changes_over_only_after_a_disengaged_frame(artifacts, root, openpilot_prefix):
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  engaged = {}
  (root / "active").write_text("b\n")
  for frame_id in range(25, 200):
    daemon.engaged = engaged[frame_id] = frame_id % 3 != 0  # two frames engaged, one not
    daemon.exchange([frame_id])
    if any("switched to set b" in line for line in daemon.lines): break
  daemon.exchange(range(frame_id + 1, frame_id + 3))
  assert daemon.stop() == 0
  first_b = next(i for i in range(frame_id + 3) if published_id(daemon, i) == model_id(root / "b"))
  assert not engaged[first_b - 1], "the frame before the change was a disengaged one"
  assert first_b - shadow_start(daemon, "b") >= 4

def test_requests_while_one_warms_the_last_wins(artifacts, root, openpilot_prefix):
  """b warms; old is asked for before b's context is full: b is dropped with one line and old warms and takes over."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "set b warms up in the shadow", 25)  # no frame sent from here on: b cannot fill its context
  (root / "active").write_text("old\n")
  daemon.wait_for_line("set b dropped from its warm-up: set old was asked for meanwhile")
  end = exchange_until(daemon, "switched to set old", end)
  daemon.exchange(range(end, end + 3))
  assert daemon.stop() == 0 and daemon.published == list(range(end + 3))
  assert sum("dropped from its warm-up" in line for line in daemon.lines) == 1
  assert {published_id(daemon, i) for i in range(end, end + 3)} == {model_id(root / "old")}
  assert not any("switched to set b" in line for line in daemon.lines)

def test_a_request_for_the_running_set_changes_nothing(artifacts, root, openpilot_prefix):
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  (root / "active").write_text("default\n")
  daemon.wait_for_line("set default runs already: nothing to change")
  daemon.exchange(range(25, 30))
  assert daemon.stop() == 0 and not any("warms up" in line or "switched" in line for line in daemon.lines)

def test_a_warm_up_whose_context_never_fills_is_dropped(artifacts, root, openpilot_prefix):
  """Frames come every 0.6 s (the stimulus: a camera that stutters), --warm-up-timeout 1: b's 4 frames never fit, one line, the default
  runs on."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root), "--warm-up-timeout", "1"))
  daemon.exchange(range(25))
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "set b warms up in the shadow", 25)
  pace = threading.Event()
  for frame_id in range(end, end + 5):
    pace.wait(0.6)
    daemon.exchange([frame_id])
  assert daemon.stop() == 0
  assert sum("set b dropped from its warm-up: its context did not fill in 1 s" in line for line in daemon.lines) == 1, daemon.lines
  assert {published_id(daemon, i) for i in range(end + 5)} == {model_id(artifacts)}

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

def test_what_runs_is_listed_and_watched(artifacts, root, openpilot_prefix):
  """install_models --list: the installed sets, the one asked for, the last that ran per daemon, and what modeld runs now (its model's
  identity and since which frame); modeld_watch shows the same line live; once modeld exits its record goes with it."""
  daemon = Daemon(artifacts, args=("--model-sets", str(root)))
  daemon.exchange(range(25))
  (root / "active").write_text("b\n")
  end = exchange_until(daemon, "set b passed its first 20 frames", 25)
  daemon.exchange(range(end, end + 2))
  first_b = next(int(m[1]) for line in daemon.lines if (m := re.search(r"frame (\d+): the first on set b ", line)))
  listed = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.tools.install_models", "--list", "--model-sets", str(root)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
  watched = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.tools.watch", "--seconds", "1.5"], cwd=ROOT, capture_output=True,
                           text=True, timeout=60)
  assert daemon.stop() == 0
  b = content_digest(str(root / "b" / "model.bin"))[:16]
  assert listed.returncode == 0 and f"model sets in {root}: b, inf, nan, old; asked for: b" in listed.stdout, listed.stdout + listed.stderr
  assert "last ran in modeld: b" in listed.stdout and "last ran in dmonitoringmodeld: none recorded" in listed.stdout
  assert f"modeld: set b (model {b}) since frame {first_b}, " in listed.stdout and "dmonitoringmodeld: not running (no record)" in listed.stdout
  assert f"modeld           set b (model {b}) since frame {first_b}" in watched.stdout, watched.stdout
  from sunnypilot.modeld_v2.daemon.run_state import read_state
  assert read_state("modeld", openpilot_prefix) is None, "the record goes when modeld exits"
