"""modeld switching model sets while frames run: every frame published, the new set warmed in the shadow of the running one, each set
through its own parse, back to the previous on bad outputs, the fallbacks at start, requests that come while one warms, what runs listed
and watched. The camerad stand-in and the subscriber run here (modeld_daemon.Daemon), modeld in a subprocess."""
import os
import re
import shutil
import subprocess
import sys
import threading

from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_FILE
from sunnypilot.modeld_v2.format.bundle import content_digest

import installed_sets
import modeld_daemon
from conftest import ROOT
from daemon_process import exchange_until
from installed_sets import model_id, published_id
from modeld_daemon import BIG_FRAME, Daemon, check_fields, reference

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name: the default set
sets, root = installed_sets.sets, installed_sets.root  # the installed sets, by name

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
  for i in range(end + 5): check_fields({s: m for s, (m, _) in daemon.messages[i].items()}, slices, todays=True)
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

def test_a_switch_while_the_camera_geometry_changes(artifacts, root, openpilot_prefix):
  """Set b is asked for, and camerad comes back with 1928x1208 frames while it loads: b has no warp for them, the default has. Whichever
  came first (b opened for the new frames, b loaded for the old ones and loaded again, or b running when the cameras changed: it falls
  back), it is one line about b, and the default runs on the new cameras."""
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
