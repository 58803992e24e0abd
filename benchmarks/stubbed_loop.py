"""modeld's own frame loop (ModelD.run) in this process with the camera and the model stubbed: what modeld adds to a frame, hot and after
the sleep a frame rate leaves between frames, with no camera copies, no model run and no other process on the machine.

The stub camera sleeps in place of the VisionIPC wait (optionally spinning the last part of it instead), publishes the car's messages of
that time (car_bus.bus_traffic) and hands over the next frame id; the stub model returns one of a few random output vectors of the layout
at once, and with the parse in its graph (`parse="graph"`) their float block too, as the in-graph parse writes it (the host parse's
values: the two are held equal in tests/compile/test_output_parse.py). Everything else is modeld's: the bus read (a SubMaster on a private
OPENPILOT_PREFIX), the checked inputs, the host-input writes, the parse, fill, serialize and send of modelV2 (or with the graph's parse the
driving state and the block copied into the templates), then the other two messages, stamped by modeld's --timings stamps.
"""
from __future__ import annotations

import gc
import logging
import os
import shutil
import time
import uuid
from collections.abc import Mapping

import numpy as np

from benchmarks.car_bus import BUS_SERVICES, bus_traffic
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.camera_sync import FrameMeta, Frames
from sunnypilot.modeld_v2.daemon.daemon_spec import Loaded
from sunnypilot.modeld_v2.daemon.frame_daemon import FrameDaemon
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs, host_inputs
from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET, ModelSet, Trust
from sunnypilot.modeld_v2.daemon.model_switch import Candidate
from sunnypilot.modeld_v2.model.constants import DESIRE_LEN, LAT_PLANNER_SOLUTION_WIDTH
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, reference_block, trace
from sunnypilot.modeld_v2.modeld import ModelD
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

STUB_SENSOR = "ar0231"  # the intrinsics the transforms are made with: any known sensor does

class StubCamera:
  """CameraSync's interface as the frame loop uses it: after `idle_s` (its last `spin_s` spinning, not asleep) and the car's messages
  sent (with `bus`), the next frame id on both cameras."""
  main_wide, use_extra, clock_frozen = False, True, False

  def __init__(self, idle_s: float, spin_s: float = 0.0, bus: bool = True):
    from sunnypilot.modeld_v2.daemon.messaging import pub_master
    self.sleep_s, self.spin_s, self.frame_id = max(idle_s - spin_s, 0.0), min(spin_s, idle_s), 0
    self.traffic, self.pm = (bus_traffic(), pub_master(list(BUS_SERVICES))) if bus else ({}, None)

  def wait_for_camerad(self) -> bool: return True
  def alive(self) -> None: pass
  def stalled(self, after_s: float) -> bool: return False
  def connect(self) -> bool: return True

  def recv(self) -> Frames:
    if self.sleep_s: time.sleep(self.sleep_s)
    end = time.perf_counter() + self.spin_s
    while time.perf_counter() < end: pass  # the core kept busy, as a modeld polling for its frame would
    for service, raw in self.traffic.items(): self.pm.send(service, raw)
    self.frame_id += 1
    meta = FrameMeta(self.frame_id, self.frame_id * 50_000_000, self.frame_id * 50_000_000 + 1)
    return Frames(dict.fromkeys(CAMERA_BUFFERS), meta, meta)

class StubModel:
  """The adapter's interface as the frame loop uses it: host inputs by name, and random outputs of the layout handed back in turn, at once;
  with `parse` "graph" a bundle with the output parse in its graph (its float block read back into one array, as a readback does)."""
  def __init__(self, slices: dict[str, list[int]], width: int, generation: str, count: int = 16, parse: str = "host"):
    self.output_slices, self.metadata = slices, {"generation": generation, "generation_source": "onnx"}
    rng = np.random.default_rng(0)
    self.outputs, self.runs = [rng.standard_normal((1, width)).astype(np.float32) for _ in range(count)], 0
    self.blocks: list[np.ndarray] = []
    if parse == "graph":
      layout, parser = trace(slices), OutputParser(slices)
      self.metadata[FLOAT_BLOCK] = layout.to_json()
      self.blocks = [reference_block(parser, layout, outputs) for outputs in self.outputs]
      self.block = np.zeros_like(self.blocks[0])
    values = host_inputs(np.zeros((2, 3, 3), np.float32), np.zeros(DESIRE_LEN, np.float32), False, 0.0, 0.0, 0.0, 0.0,
                         np.zeros(LAT_PLANNER_SOLUTION_WIDTH, np.float32))
    self.numpy_inputs = {name: np.zeros(np.size(value), np.float32) for name, value in values.items()}
    self.camera_buffers, self.in_place, self.warp_frame_size = CAMERA_BUFFERS, True, 0  # its frames are never read

  def copy_frames(self, bufs: Mapping[str, object]) -> None: pass
  def run(self) -> None: self.runs += 1
  def output_array(self, name: str = "outputs") -> np.ndarray:
    if name == "outputs": return self.outputs[self.runs % len(self.outputs)]
    self.block[:] = self.blocks[self.runs % len(self.blocks)]
    return self.block
  def reset_states(self) -> None: pass
  def reset_warmup_buffers(self) -> None: pass
  def drop_camera_buffers(self) -> None: pass
  def close(self) -> None: pass
  def hold_gil(self, hold: bool) -> None: pass

class StubbedModelD(FrameDaemon):
  """modeld's skeleton and spec with a StubCamera in place of camerad's streams and a StubModel run as modeld runs a loaded set."""
  def __init__(self, model: StubModel, camera: StubCamera):
    episodes = Episodes(logging.getLogger("sunnypilot.modeld_v2.modeld").warning)
    super().__init__(ModelD(episodes), episodes, "", timings=[], reconnect_after_s=3600)
    self.camera, self.model = camera, model

  def load(self) -> bool:
    stub = Loaded(self.model, HostInputs(self.model.numpy_inputs, self.episodes.once), STUB_SENSOR, "stub", "0" * 64, None,
                  self.spec.own(self.model, STUB_SENSOR, "stub", self.episodes.once))
    candidate = Candidate(ModelSet(DEFAULT_SET, "", None, Trust(), "a stub"), stub, None)
    self.switch.reloaded(candidate)  # the switch holds what runs
    self.use(candidate, fresh=True)
    return True

def run_stubbed(slices: dict[str, list[int]], width: int, generation: str, frames: int, idle_s: float, spin_s: float = 0.0,
                bus: bool = True, parse: str = "host") -> list[list[int]]:
  """`frames` published frames of the stubbed loop, `idle_s` between frames (its last `spin_s` spinning), the car's messages on the bus
  with `bus`, the output parse on the host or in the model's graph (`parse`): modeld's --timings rows (frame id, then STAGE_STAMPS). The
  environment and the collector are as they were afterwards."""
  previous, collecting = os.environ.get("OPENPILOT_PREFIX"), gc.isenabled()
  prefix = f"bench_stub_{uuid.uuid4().hex[:10]}"
  try:
    os.environ["OPENPILOT_PREFIX"] = prefix
    daemon = StubbedModelD(StubModel(slices, width, generation, parse=parse), StubCamera(idle_s, spin_s, bus))
    daemon.run(frames)
    return daemon.timings or []
  finally:
    if collecting: gc.enable()  # ModelD.run turns the collector off, as modeld runs
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
    if previous is None: os.environ.pop("OPENPILOT_PREFIX", None)
    else: os.environ["OPENPILOT_PREFIX"] = previous
