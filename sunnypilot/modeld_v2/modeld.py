"""The model daemon: VisionIPC camera frames in, one fused warp+model run per frame, modelV2 / drivingModelData / cameraOdometry out.

  python -m sunnypilot.modeld_v2.modeld --artifacts out/artifacts/cpu_native_tiny [--max-frames N] [--rhd]   # the demo's folder on a CPU

`--artifacts` holds `model.bin` (compile_modeld) and warp bundles (compile_warp); the daemon picks the warp whose frame layout matches the
live camera buffers (a --split-frames warp first: it reads them in place), another when camerad comes back with another geometry, or none,
publishing nothing, until one is built. The bundle's generation (model/generations.py) decides the action's rules and the frame after a drop:
today's publish it as any other (openpilot's modeld publishes every frame), older ones run it with the graph's `prepare_only` gate on and
publish nothing, as the openpilot of their day did. Delays: CarParams on a device (waited for at start, as openpilot's modeld does) until
liveDelay publishes; --lat-delay and --long-delay on a PC.

Model sets (daemon/model_sets.py): --artifacts is the default set; with --model-sets ROOT the set asked for (ROOT/active on a PC,
sunnypilot's ModelManager_ActiveBundle parameter on a device) loads beside the frames, warms up in the shadow of the running one and takes
over between two frames (daemon/model_switch.py); one whose first 20 frames are not finite is dropped for the previous one, and at start one
that fails falls back to the last that ran, then the default. With --trusted-keys every bundle must be signed (format/signature.py).
This file says what modeld reads, how a frame becomes its model's inputs (daemon/frame_inputs.py) and how the outputs become its three
messages; the frame loop, the cameras, loading and switching sets are the skeleton's (daemon/frame_daemon.py).
"""
from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, interruptible
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DRIVING
from sunnypilot.modeld_v2.daemon.bus_inputs import CAMERA_OFFSET_MAX, BusInputs, parse_camera_offset, parse_delay
from sunnypilot.modeld_v2.daemon.camera_sync import CameraSync
from sunnypilot.modeld_v2.daemon.daemon_main import daemon_main, daemon_parser
from sunnypilot.modeld_v2.daemon.daemon_spec import Clock, Frame, Loaded, Published
from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR, TYPICAL_STEER_ACTUATOR_DELAY, Delays, camera_offset, read_car_params
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs, FrameValues, cameras_of
from sunnypilot.modeld_v2.daemon.graph_parse import GraphParse, graph_parse_of
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.model_sets import LAST_RAN_FILE
from sunnypilot.modeld_v2.daemon.schema import car
from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.calibration import DEFAULT_RPY, warp_matrices
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES, FrameInfo, camera_odometry_fields, driving_model_data_fields, host_fields, model_v2_fields
from sunnypilot.modeld_v2.model.generations import GENERATIONS, of_bundle
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK

# what sm.update reads each frame, by role (daemon/topics.py: today's names where the schema has them; none where it has no such topic)
SUBSCRIBED = tuple(t for t in (TOPICS.device_state, TOPICS.car_state, TOPICS.road_camera_state, TOPICS.calibration, TOPICS.driver_monitoring_state,
                               TOPICS.car_control, TOPICS.lateral_delay) if t is not None)
PARAMS_EVERY = 60  # frames between reads of sunnypilot's CameraOffset parameter (modeld_v2/modeld.py @13ce8664)
# openpilot's modeld (selfdrive/modeld/modeld.py @6c6be47b) runs config_realtime_process(7, 54) on a device: core 7, SCHED_FIFO priority 54
DEVICE_CORE, REALTIME_PRIORITY = 7, 54

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class ModelParse:
  """What modeld keeps with a loaded model: its output parse on the host, and in its graph when it has one this build publishes."""
  parser: OutputParser
  reads: ParsedReads  # what the driving state reads of the host's parse: views of the parser's buffer, refilled by each parse
  graph: GraphParse | None
  note: str  # where its outputs are parsed and why: said when frames first run on it

@dataclass(frozen=True)
class ModelFrame:
  """One frame's inputs as modeld computed them, and what its messages need of the bus besides."""
  fed: FrameValues
  road_frame_id: int  # roadCameraState.frameId (the main frame's own id before one): frameAge is how far the model lags the camera

class ModelD:
  """modeld's spec (daemon/frame_daemon.DaemonSpec): what crosses frames (the driving state, the messages' templates, the bus inputs)
  and how a frame goes in and out of the model."""
  name, services, subscribed, bundles = "modeld", SERVICES, SUBSCRIBED, DRIVING
  device_core, realtime_priority, last_ran, camera_name = DEVICE_CORE, REALTIME_PRIORITY, LAST_RAN_FILE, ""
  fresh, warm_up_runs = "its recurrent state and queues start from zero", 3

  def __init__(self, episodes: Episodes, rhd: bool = False, lat_delay: float = TYPICAL_CAR.lateral, long_delay: float = TYPICAL_CAR.longitudinal,
               send_raw: bool = False, camera_offset: float = 0.0):
    self.episodes, self.send_raw = episodes, send_raw
    self.delays = Delays(lat_delay, long_delay, "--lat-delay/--long-delay")  # CarParams' on a device (start)
    self.params: Any = None
    self.state = DrivingState()  # what crosses frames besides the model's states: the input side reads it, the output side advances it
    self.bytes = MessageBytes(episodes.once)  # the messages' bytes, through a template per service
    self.frame_inputs = FrameInputs(BusInputs(episodes), rhd, camera_offset)  # the bus state -> the model's host inputs, frame by frame
    self.graph: GraphParse | None = None  # the running model's output parse in its graph, while this build publishes it
    self.missing: dict[str, dict[str, str]] | None = None  # per service, the fields a model's first frame leaves default: said once

  def camera(self, exit_event: threading.Event, episodes: Episodes) -> CameraSync: return CameraSync(exit_event, episodes)

  def start(self, params: Any, stop: threading.Event) -> None:
    self.params = params
    if params is not None: self.delays = read_car_params(params, car, stop, log.info)
    log.info(f"delays from {self.delays.source}: lateral {self.delays.lateral:.3f} s until liveDelay publishes, longitudinal "
             f"{self.delays.longitudinal:.3f} s")

  def own(self, adapter: Any, sensor: str, warp: str, report: Any) -> ModelParse:
    notes: list[str] = []
    parser = OutputParser(adapter.output_slices)
    return ModelParse(parser, ParsedReads.of(parser.parsed), graph_parse_of(adapter, notes.append), "".join(notes))

  def warm_up_inputs(self, loaded: Loaded[ModelParse], camera: CameraSync) -> None:
    loaded.adapter.numpy_inputs[HOST_TRANSFORM][:] = warp_matrices(cameras_of(loaded.sensor, camera.main_wide), DEFAULT_RPY)

  def use(self, loaded: Loaded[ModelParse], camera: CameraSync, fresh: bool) -> None:
    """Run frames on `loaded` from the next one on: its output layout, its generation's rules and its sensor's intrinsics, and with a
    `fresh` model (not warmed in the shadow) lat_planner_state from zero (fed back from the model's outputs); what controls see carries on
    (the action is smoothed against the last one, the lane-change state stays)."""
    own, self.missing = loaded.own, {s: {} for s in SERVICES}
    self.graph = own.graph
    if self.graph is not None: self.graph.unbind()  # its first frame is parsed on the host: that builds the templates its block goes into
    if own.note: self.episodes.once(own.note)
    generation, source = of_bundle(loaded.adapter.metadata)
    self.state.rules = GENERATIONS[generation]
    self.episodes.once(f"generation {generation} ({source}): {self.state.rules.about}")
    if "prepare_only" not in loaded.adapter.numpy_inputs and not self.state.rules.every_frame:
      self.episodes.once("this bundle has no prepare_only gate (built before it): frames after a drop run a full step, and are not published")
    self.frame_inputs.use_cameras(loaded.sensor, camera.main_wide)
    if fresh: self.state.lat_planner_state[:] = 0.0

  def inputs(self, sm: Any, frame: Frame, loaded: Loaded[ModelParse]) -> ModelFrame:
    if self.params is not None and sm.frame % PARAMS_EVERY == 0:
      self.frame_inputs.camera_offset_target = camera_offset(self.params, self.frame_inputs.camera_offset_target)
    road = TOPICS.road_camera_state
    road_frame = sm[road].frameId if road is not None and sm.seen.get(road) else frame.frames.meta.frame_id
    prepare_only = frame.dropped > 0 and not self.state.rules.every_frame
    return ModelFrame(self.frame_inputs.step(sm, self.delays, self.state, prepare_only=prepare_only), road_frame)

  def host_values(self, inputs: ModelFrame) -> dict[str, Any]: return inputs.fed.host

  def read_outputs(self, loaded: Loaded[ModelParse]) -> np.ndarray:
    outputs = loaded.adapter.output_array()
    if self.graph is not None and self.graph.writers is not None: loaded.adapter.output_array(FLOAT_BLOCK)  # into graph.block (waits for the device)
    return outputs

  def non_finite(self) -> str: return "recurrent states reset, its messages marked valid=False"

  def about(self, loaded: Loaded[ModelParse]) -> str: return ""

  def running(self, camera: CameraSync) -> str:
    return f"main {'wide' if camera.main_wide else 'road'} camera{', extra wide camera' if camera.use_extra else ''}"

  def publish(self, pm: Any, loaded: Loaded[ModelParse], outputs: np.ndarray, finite: bool, frame: Frame, inputs: ModelFrame,
              clock: Clock) -> Published | None:
    """One frame's three messages: the driving state advanced, then modelV2 filled, made and sent (what controls wait for) before the
    other two; none after a drop (prepare-only: the frame went through the queues the generation pushes then)."""
    meta, meta_extra = frame.frames.meta, frame.frames.meta_extra
    if frame.dropped > 0 and not self.state.rules.every_frame:
      self.episodes.happened("drops", f"frame {meta.frame_id}: {frame.dropped} frame(s) dropped before it: prepare-only, nothing published")
      return None
    self.episodes.ended("drops", "frame ids jumped on consecutive frames")
    in_graph = self.graph is not None and self.graph.writers is not None
    parsed = None if in_graph else loaded.own.parser(outputs)  # the graph parses the same way: non-finite outputs as 0
    execution_time = time.perf_counter() - clock.start  # openpilot's modelExecutionTime covers the model run and the parsing of its outputs
    fed = inputs.fed
    info = FrameInfo(meta.frame_id, meta_extra.frame_id, meta.timestamp_eof, inputs.road_frame_id, frame.drop_perc, frame.dropped, execution_time,
                     fed.calibrated, fed.lat_t, fed.long_t, finite, not frame.frames.clock_frozen, loaded.big)
    stamps = self.publish_block(pm, outputs, info, fed) if parsed is None else self.publish_parsed(pm, loaded, parsed, outputs, info, fed)
    return Published(execution_time, *stamps)

  def published_finite(self, frame: FrameInfo, values: np.ndarray, reads: ParsedReads) -> FrameInfo:
    """`frame`, marked invalid when what was computed from finite outputs is not finite (outputs near float32's limits can make an
    infinite curvature or std): what is published is checked, not only what the model returned."""
    if self.state.published_finite(values, reads):
      if frame.outputs_finite: self.episodes.ended("published", "computed values finite again")
      return frame
    self.episodes.happened("published", f"frame {frame.frame_id}: values computed from the outputs are not finite (outputs near float32's limits): "
                           "its messages marked valid=False, the action starts again from zero")
    return dataclasses.replace(frame, outputs_finite=False)

  def publish_parsed(self, pm: Any, loaded: Loaded[ModelParse], parsed: dict[str, np.ndarray], outputs: np.ndarray, frame: FrameInfo,
                     fed: FrameValues) -> tuple[int, int, int]:
    """publish with the host's parse; the monotonic ns after modelV2 was filled, made and sent."""
    own = loaded.own
    state = self.state.update(own.reads, frame, fed.car, fed.lateral_active)
    frame, missing = self.published_finite(frame, own.parser.values, own.reads), self.missing or dict.fromkeys(SERVICES)
    valid = frame.valid
    fields = model_v2_fields(parsed, state, frame, outputs if self.send_raw else None, missing["modelV2"])
    t_fill = time.monotonic_ns()
    model_v2 = self.bytes.to_bytes("modelV2", fields, valid["modelV2"], t_fill)
    t_serialize = time.monotonic_ns()
    pm.send("modelV2", model_v2)
    t_send = time.monotonic_ns()
    pm.send("drivingModelData", self.bytes.to_bytes("drivingModelData", driving_model_data_fields(parsed, state, frame, missing["drivingModelData"]),
                                                    valid["drivingModelData"], time.monotonic_ns()))
    pm.send("cameraOdometry", self.bytes.to_bytes("cameraOdometry", camera_odometry_fields(parsed, frame, missing["cameraOdometry"]),
                                                  valid["cameraOdometry"], time.monotonic_ns()))
    if self.missing is not None:  # the model's first frame: what its heads leave default, once
      for service, gaps in self.missing.items():
        for path, reason in gaps.items(): self.episodes.once(f"{service}.{path} stays default: {reason}")
      self.missing = None
    if self.graph is not None and self.graph.writers is None and not self.graph.bind(self.bytes, self.daemon_fields(state, frame, outputs)):
      self.graph = None  # the templates cannot take the block (said): this model is parsed on the host from now on
    return t_fill, t_serialize, t_send

  def daemon_fields(self, state: Any, frame: FrameInfo, outputs: np.ndarray) -> dict[str, dict[str, Any]]:
    """With the parse in the graph, each message's fields that are not the block's (host_fields)."""
    assert self.graph is not None
    return host_fields(state, frame, outputs if self.send_raw else None, self.graph.layout.fcw)

  def publish_block(self, pm: Any, outputs: np.ndarray, frame: FrameInfo, fed: FrameValues) -> tuple[int, int, int]:
    """publish with the output parse in the model's graph: the driving state from the block's views, then per service the host's fields
    and the block's floats copied into its byte template (graph_parse)."""
    graph = self.graph
    assert graph is not None
    state = self.state.update(graph.reads, frame, fed.car, fed.lateral_active)
    frame = self.published_finite(frame, graph.checked_values(), graph.reads)
    valid, host = frame.valid, self.daemon_fields(state, frame, outputs)
    t_fill = time.monotonic_ns()
    model_v2 = graph.bytes_of("modelV2", host["modelV2"], valid["modelV2"], t_fill)
    t_serialize = time.monotonic_ns()
    pm.send("modelV2", model_v2)
    t_send = time.monotonic_ns()
    pm.send("drivingModelData", graph.bytes_of("drivingModelData", host["drivingModelData"], valid["drivingModelData"], time.monotonic_ns()))
    pm.send("cameraOdometry", graph.bytes_of("cameraOdometry", host["cameraOdometry"], valid["cameraOdometry"], time.monotonic_ns()))
    return t_fill, t_serialize, t_send

@interruptible("modeld")
def main(argv: list[str] | None = None) -> int:
  parser = daemon_parser("modeld", __doc__, "model.bin and warp bundles", "put raw outputs in modelV2.rawPredictions", DEVICE_CORE, REALTIME_PRIORITY)
  parser.add_argument("--rhd", action="store_true", help="right-hand drive traffic convention (else driverMonitoringState.isRHD decides)")
  parser.add_argument("--lat-delay", type=checked(parse_delay), default=TYPICAL_CAR.lateral, help="on a PC: the lateral delay in seconds, 0 to 5, as liveDelay "
                      "gives it (steerActuatorDelay + 0.2); liveDelay.lateralDelay replaces it when published, CarParams on a device. Default "
                      f"{TYPICAL_CAR.lateral:g}: a Toyota TSS2 torque car's steerActuatorDelay {TYPICAL_STEER_ACTUATOR_DELAY:g} (opendbc) + 0.2")
  parser.add_argument("--long-delay", type=checked(parse_delay), default=TYPICAL_CAR.longitudinal, help="on a PC: the longitudinal actuator delay in "
                      f"seconds, 0 to 5 (CarParams.longitudinalActuatorDelay on a device). Default {TYPICAL_CAR.longitudinal:g}: that car's "
                      "(opendbc's CarParams default)")
  parser.add_argument("--camera-offset", type=checked(parse_camera_offset), default=0.0, help="on a PC: sunnypilot's CameraOffset in metres, at "
                      f"most {CAMERA_OFFSET_MAX:g} either way: the camera seen as moved sideways by this much (a shear of the warp); the CameraOffset "
                      "parameter on a device")
  return daemon_main(parser, argv, lambda args, episodes: ModelD(episodes, args.rhd, args.lat_delay, args.long_delay, args.send_raw, args.camera_offset),
                     Episodes(log.warning))

if __name__ == "__main__":
  sys.exit(main())
