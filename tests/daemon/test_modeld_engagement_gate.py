"""modeld's engagement gate on a switch of model sets: a warm set waits for openpilot to disengage (--switch-while-engaged defer, the
default), or takes over while engaged (shadow); engagement that flaps changes over only after a disengaged frame."""
import re

import installed_sets
import modeld_daemon
from daemon_process import exchange_until
from installed_sets import model_id, published_id
from modeld_daemon import Daemon, reference

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name: the default set
sets, root = installed_sets.sets, installed_sets.root  # the installed sets, by name

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
