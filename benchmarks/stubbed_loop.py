"""modeld's own frame loop (ModelD.run) in this process with the camera and the model stubbed: what modeld adds to a frame, hot and after
the sleep a frame rate leaves between frames, with no camera copies, no model run and no other process on the machine.

The stub camera sleeps `idle_s` in place of the VisionIPC wait, publishes the car's messages of that time (bus_traffic) and hands over
the next frame id; the stub model returns one of a few random output vectors of the layout at once. Everything else is modeld's: the bus
read (a SubMaster on a private OPENPILOT_PREFIX), the checked inputs, the host-input writes, the parse, fill, serialize and send of
modelV2, then the other two messages, stamped by modeld's --timings stamps. bench_daemon publishes the same bus_traffic to the real daemon.
"""
from __future__ import annotations

import gc
import os
import shutil
import time
import uuid

import numpy as np

from sunnypilot.modeld_v2.camera_sync import FrameMeta
from sunnypilot.modeld_v2.frame_inputs import HostInputs, host_inputs
from sunnypilot.modeld_v2.generations import GENERATIONS
from sunnypilot.modeld_v2.modeld import ModelD

STUB_SENSOR = "ar0231"  # the intrinsics the transforms are made with: any known sensor does
BUS_SERVICES = ("carState", "carControl", "driverMonitoringState")  # what a car publishes at least once per model frame besides the cameras

def bus_traffic() -> dict[str, bytes]:
  """One message per BUS_SERVICES, as a car at 20 m/s with lateral control on sends them: modeld reads each on every frame (a bus with only
  the camera states would leave its SubMaster almost nothing to read)."""
  from sunnypilot.modeld_v2.messaging import new_message
  car, control, monitoring = (new_message(s) for s in BUS_SERVICES)
  car.carState.vEgo, control.carControl.latActive, monitoring.driverMonitoringState.isRHD = 20.0, True, False
  return {s: m.to_bytes() for s, m in zip(BUS_SERVICES, (car, control, monitoring), strict=True)}

class StubCamera:
  """CameraSync's interface as the frame loop uses it: after `idle_s` asleep and bus_traffic() sent, the next frame id on both cameras."""
  main_wide, use_extra = False, True

  def __init__(self, idle_s: float):
    from sunnypilot.modeld_v2.messaging import pub_master
    self.idle_s, self.frame_id, self.traffic, self.pm = idle_s, 0, bus_traffic(), pub_master(list(BUS_SERVICES))

  def wait_for_camerad(self) -> bool: return True
  def alive(self) -> None: pass
  def stalled(self, after_s: float) -> bool: return False
  def connect(self) -> bool: return True

  def recv_frames(self) -> tuple:
    if self.idle_s: time.sleep(self.idle_s)
    for service, raw in self.traffic.items(): self.pm.send(service, raw)
    self.frame_id += 1
    meta = FrameMeta(self.frame_id, self.frame_id * 50_000_000, self.frame_id * 50_000_000 + 1)
    return None, meta, None, meta

class StubModel:
  """The adapter's interface as the frame loop uses it: host inputs by name, and `outputs` handed back in turn, at once."""
  in_place = True

  def __init__(self, slices: dict[str, list[int]], width: int, generation: str, count: int = 16):
    self.output_slices, self.generation = slices, (generation, "stub")
    rng = np.random.default_rng(0)
    self.outputs, self.runs = [rng.standard_normal((1, width)).astype(np.float32) for _ in range(count)], 0
    zeros = np.zeros((2, 3, 3), np.float32)
    self.numpy_inputs = {name: np.zeros(np.size(value), np.float32) for name, value in
                         host_inputs(zeros, np.zeros(8, np.float32), False, 0.0, 0.0, 0.0, 0.0, np.zeros(4, np.float32)).items()}

  def copy_frames(self, frames: dict) -> None: pass
  def run(self) -> None: self.runs += 1
  def output_array(self) -> np.ndarray: return self.outputs[self.runs % len(self.outputs)]
  def reset_states(self) -> None: pass

class StubbedModelD(ModelD):
  """ModelD with a StubCamera and a StubModel loaded in place of camerad's streams and the bundles."""
  def __init__(self, model: StubModel, idle_s: float):
    super().__init__("", timings=[], reconnect_after_s=3600)
    self.camera, self.model = StubCamera(idle_s), model

  def load(self) -> bool:
    self.adapter, self.slices = self.model, self.model.output_slices
    self.host_inputs = HostInputs(self.model.numpy_inputs, self.log_once)
    self.publish_state.rules = GENERATIONS[self.model.generation[0]]
    self.inputs.use_cameras(STUB_SENSOR, self.camera.main_wide)
    return True

def run_stubbed(slices: dict[str, list[int]], width: int, generation: str, frames: int, idle_s: float) -> list[list[int]]:
  """`frames` published frames of the stubbed loop, `idle_s` asleep before each: modeld's --timings rows (frame id, then STAGE_STAMPS)."""
  prefix = f"bench_stub_{uuid.uuid4().hex[:10]}"
  previous = os.environ.get("OPENPILOT_PREFIX")
  os.environ["OPENPILOT_PREFIX"] = prefix
  daemon = StubbedModelD(StubModel(slices, width, generation), idle_s)
  try: daemon.run(frames)
  finally:
    gc.enable()  # ModelD.run turns the collector off, as modeld runs
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
    if previous is None: os.environ.pop("OPENPILOT_PREFIX", None)
    else: os.environ["OPENPILOT_PREFIX"] = previous
  return daemon.timings or []
