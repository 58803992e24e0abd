"""ModelSwitch on its own: sets as folders, a load that records what it loaded (and can fail or wait), the frame thread played by the test."""
import logging
import os
import threading
import time

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_FILE, ModelSets, Trust
from sunnypilot.modeld_v2.daemon.model_switch import ActiveSetFile, ActiveSetParam, ModelSwitch

class Loads:
  """The daemon's side: `load` gives a handle (name, context) unless the set is in `fail` (ArtifactError) or `crash` (anything else, as a
  driver's error); a set in `hold` waits until released."""
  def __init__(self):
    self.loaded, self.closed, self.fail, self.crash, self.hold = [], [], set(), set(), {}

  def load(self, model_set, context):
    if model_set.name in self.hold: self.hold[model_set.name].wait(10)
    if model_set.name in self.fail: raise ArtifactError(f"{model_set.name} is broken")
    if model_set.name in self.crash: raise RuntimeError("the device is gone\nand a second line")
    self.loaded.append((model_set.name, context))
    return (model_set.name, context)

  def close(self, handle): self.closed.append(handle)

def until(condition, timeout: float = 10) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    assert time.monotonic() < deadline, "the condition never held"
    time.sleep(0.005)

@pytest.fixture
def switch(tmp_path, caplog):
  """Sets default, a, b and c as empty folders (a set's contents are the daemon's business here), a switch polling every 10 ms."""
  caplog.set_level(logging.INFO)
  for name in ("default", "root/a", "root/b", "root/c"): os.makedirs(tmp_path / name)
  loads = Loads()
  sets = ModelSets(str(tmp_path / "default"), str(tmp_path / "root"), Trust())
  switch = ModelSwitch(sets, ActiveSetFile(sets), loads.load, loads.close, probation_frames=3, poll_s=0.01)
  switch.loads, switch.root = loads, tmp_path / "root"
  yield switch
  switch.stop()

def ask(switch, name: str) -> None: (switch.root / "active").write_text(name + "\n")

def change_over(switch) -> str:
  """Play the frame thread until the switch thread has a set ready, then change over to it; its name."""
  until(lambda: switch.ready is not None)
  candidate = switch.take()
  switch.changed_over(candidate)
  return candidate.model_set.name

def lines(caplog) -> list[str]: return [r.getMessage() for r in caplog.records]

def test_start_falls_back_from_the_asked_set_to_the_last_that_ran_to_the_default(switch, caplog):
  switch.loads.fail = {"a", "b"}
  ask(switch, "a")
  (switch.root / LAST_RAN_FILE).write_text("b\n")
  assert switch.first("geometry 1").model_set.name == "default"
  assert [line for line in lines(caplog) if "cannot run" in line] == ["cannot run set a: a is broken; falling back to set b",
                                                                       "cannot run set b: b is broken; falling back to set default"]
  switch.loads.fail = {"a"}
  assert switch.first("geometry 1").model_set.name == "b"

def test_a_switch_keeps_the_previous_set_until_the_new_one_passed(switch, caplog):
  switch.first("g")
  for _ in range(3): switch.frame_ran(True)  # the default passed: it is kept while the next one is on probation
  switch.context = "g"
  switch.start()
  ask(switch, "a")
  assert change_over(switch) == "a" and switch.previous.model_set.name == "default" and switch.loads.closed == []
  for _ in range(3): assert switch.frame_ran(True) is None
  assert switch.loads.closed == [("default", "g")] and switch.previous is None
  until(lambda: switch.sets.read_name(LAST_RAN_FILE) == "a")
  assert switch.loads.loaded == [("default", "g"), ("a", "g")]

def test_non_finite_outputs_on_probation_go_back_and_are_not_tried_again_until_asked(switch, caplog):
  switch.first("g")
  for _ in range(3): switch.frame_ran(True)
  switch.context = "g"
  switch.start()
  ask(switch, "a")
  change_over(switch)
  switch.frame_ran(True)
  back = switch.frame_ran(False)
  assert back.model_set.name == "default" and switch.current is back and switch.loads.closed == [("a", "g")]
  assert "set a gave non-finite outputs in its first frames: dropped, back to set default" in lines(caplog)
  for _ in range(3): switch.step()  # a failed set is not loaded again while the request stands
  assert switch.ready is None and switch.loads.loaded.count(("a", "g")) == 1
  ask(switch, "a")  # asked for again: tried again
  assert change_over(switch) == "a"

def test_a_failing_start_set_is_replaced_by_the_next_fallback_in_the_background(switch, caplog):
  ask(switch, "a")
  switch.first("g")
  switch.context = "g"
  switch.start()
  assert switch.frame_ran(False) is None  # no set to go back to: the frames keep running on a while the next one loads
  assert "set a gave non-finite outputs in its first frames: loading set default in the background" in lines(caplog)
  assert change_over(switch) == "default" and switch.loads.closed == [("a", "g")]

def test_two_requests_in_quick_succession_end_on_the_last(switch, caplog):
  switch.first("g")
  switch.context = "g"
  release = switch.loads.hold["a"] = threading.Event()
  switch.start()
  ask(switch, "a")
  until(lambda: any("set a asked for" in line for line in lines(caplog)))
  ask(switch, "b")
  release.set()
  assert change_over(switch) == "b"
  assert ("a", "g") in switch.loads.closed and "set a loaded, but set b was asked for meanwhile: dropped" in lines(caplog)

def test_a_missing_or_broken_set_is_one_line_and_the_running_set_stays(switch, caplog):
  switch.first("g")
  switch.context = "g"
  switch.start()
  ask(switch, "nope")
  until(lambda: any("cannot switch to set nope" in line for line in lines(caplog)))
  assert "cannot switch to set nope: no set nope in" in next(line for line in lines(caplog) if "nope" in line and "cannot" in line)
  ask(switch, "../a")
  until(lambda: any("'../a' is not a plain name" in line for line in lines(caplog)))
  switch.loads.fail = {"c"}
  ask(switch, "c")
  until(lambda: any("cannot switch to set c: c is broken; set default keeps running" in line for line in lines(caplog)))
  assert switch.ready is None and switch.current.model_set.name == "default" and switch.loads.closed == []

def test_a_set_loaded_for_a_camera_that_is_gone_is_loaded_again(switch, caplog):
  switch.first("g1")
  switch.context = "g1"
  switch.start()
  ask(switch, "a")
  until(lambda: switch.ready is not None)
  switch.context = "g2"  # the camera geometry changed while it loaded
  candidate = switch.take()
  assert candidate.context == "g1"
  switch.retry(candidate)
  until(lambda: switch.ready is not None)
  assert switch.take().context == "g2" and ("a", "g1") in switch.loads.closed

def test_the_device_request_is_the_model_managers_parameter():
  class Params:
    def __init__(self, value): self.value = value
    def get(self, key): return self.value if key == ActiveSetParam.KEY else None
  bundle = {"internalName": "my-model", "ref": "abc", "displayName": "My Model", "models": []}  # sunnypilot's JSON param
  assert ActiveSetParam(Params(bundle)).requested()[0] == "my-model"
  import json
  assert ActiveSetParam(Params(json.dumps({"ref": "abc"}).encode())).requested()[0] == "abc"
  assert ActiveSetParam(Params(None)).requested() == ("", None)
  assert ActiveSetParam(Params(b"\x08\x01capnp bytes")).requested()[0] == ""

def test_a_load_that_raises_anything_falls_back_in_one_line(switch, caplog):
  """A load that fails with something other than a bundle's error (a device error, say) is a failed set like any other: at start the next
  set runs, later the running set runs on; the set is not tried again until asked for again."""
  switch.loads.crash = {"a"}
  ask(switch, "a")
  assert switch.first("g").model_set.name == "default"
  assert "cannot run set a: its load failed: RuntimeError: the device is gone; falling back to set default" in lines(caplog)
  switch.context = "g"
  switch.start()
  switch.loads.crash = {"b"}
  ask(switch, "b")
  until(lambda: any("cannot switch to set b: its load failed: RuntimeError" in line for line in lines(caplog)))
  for _ in range(3): switch.step()
  assert switch.loads.loaded == [("default", "g")] and switch.ready is None
