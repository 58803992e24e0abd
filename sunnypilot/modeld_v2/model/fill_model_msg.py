"""Parsed outputs -> the fields of modelV2, drivingModelData and cameraOdometry, as openpilot's fill_model_msg.py fills them.

Mirrors openpilot selfdrive/modeld/fill_model_msg.py (commaai/openpilot @028c5eb9: plan, lane lines and road edges with t from the
plan's PLAN_T_IDXS, leads, meta, FCW history, confidence buffer, polynomial path; fill_pose_msg) and sunnypilot modeld_v2
fill_model_msg.py (sunnypilot/sunnypilot @d671ce18: temporalPose from the plan at t=0 without a sim_pose head, gas/brake press only where
the meta layout has them). commaai's later fill_model_msg.py (@b8f90a7a) publishes lane lines and road edges with an empty t; sunnypilot
@d671ce18 keeps the plan times (models/helpers.py plan_x_idxs_helper @13ce8664), and so does this.

Each service has one pure function that returns its fields as {dotted path: value}, one field per line in the order openpilot's
fill_model_msg sets them ("laneLines.2.y": one element of a struct list), so a reader can diff it against openpilot's and log.capnp. The
pointer fields keep the order the project's messages have always allocated them in (temporalPose beside the plan, the disengage arrays
gas first), so the bytes are those of every earlier release. What crosses frames (the action, FCW, confidence, the lane change) comes in
as a FrameState, computed by the daemon's DrivingState. A field whose head the model lacks is left out, its reason in `missing`.

Every value taken from the model is a view of the parse's buffer (the lane lines' times and the path's polynomials too: the parse
derives them from the plan), which is how model/published_floats.py finds where each published float comes from; the daemon's values
come from the small helpers (model_v2_frame, fill_action, fill_meta_state, ...) that host_fields calls for the in-graph parse.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from sunnypilot.modeld_v2.model.constants import (
  CONFIDENCE_BUFFER_LEN,
  DISENGAGE_WIDTH,
  FCW_THRESHOLDS_3MS2,
  FCW_THRESHOLDS_5MS2,
  LEAD_MHP_SELECTION,
  LEAD_T_IDXS,
  LEAD_T_OFFSETS,
  META_LAYOUTS,
  META_T_IDXS,
  MODEL_FREQ,
  NUM_LANE_LINES,
  NUM_ROAD_EDGES,
  RYG_GREEN,
  RYG_YELLOW,
  T_IDXS,
  X_IDXS,
  MetaLayout,
  Plan,
)
from sunnypilot.modeld_v2.model.drive_helpers import Action
from sunnypilot.modeld_v2.model.message_fields import Fields

# the fixed axes as read-only float32 arrays (the float32 the message stores): the byte template copies an array at once, a list value by
# value; read-only marks them as constants a `views` part may hold
T_AXIS, X_AXIS, META_T_AXIS = np.array(T_IDXS, np.float32), np.array(X_IDXS, np.float32), np.array(META_T_IDXS, np.float32)
LEAD_T_AXIS = np.array(LEAD_T_IDXS, np.float32)
for axis in (T_AXIS, X_AXIS, META_T_AXIS, LEAD_T_AXIS): axis.flags.writeable = False
class HardBrake:
  """FCW: hard braking is predicted when the 5 m/s2 probability (2 s ahead) stayed above its thresholds over the last 5 frames and the
  3 m/s2 one over the last 2. The histories are float32 values held as Python floats: each compare is the float32 one, without numpy calls.
  `update` takes the two probabilities as Python floats of float32 values (what `array.item` gives for a float32 array)."""
  THRESHOLDS_5MS2, THRESHOLDS_3MS2 = FCW_THRESHOLDS_5MS2.tolist(), FCW_THRESHOLDS_3MS2.tolist()

  def __init__(self) -> None: self.brake_5ms2, self.brake_3ms2 = [0.0] * len(self.THRESHOLDS_5MS2), [0.0] * len(self.THRESHOLDS_3MS2)

  def update(self, brake_5ms2: float, brake_3ms2: float) -> bool:
    self.brake_5ms2 = self.brake_5ms2[1:] + [brake_5ms2]
    self.brake_3ms2 = self.brake_3ms2[1:] + [brake_3ms2]
    return all(p > t for p, t in zip(self.brake_5ms2, self.THRESHOLDS_5MS2, strict=True)) and \
      all(p > t for p, t in zip(self.brake_3ms2, self.THRESHOLDS_3MS2, strict=True))

class Confidence:
  """Every 2 s (frame ids divisible by 40) the per-2 s-slice disengage probabilities enter a rolling buffer of the last 5 updates; the
  score averages, across those updates, the probability each gave for the slice that ends now; its color is kept between updates."""
  def __init__(self) -> None: self.buffer, self.color = np.zeros(CONFIDENCE_BUFFER_LEN * DISENGAGE_WIDTH, np.float32), "green"

  def update(self, frame_id: int, gas: np.ndarray, brake: np.ndarray, steer: np.ndarray) -> str:
    if frame_id % (2 * MODEL_FREQ) == 0:
      any_disengage = 1 - (1 - brake) * (1 - gas) * (1 - steer)
      independent = np.r_[any_disengage[0], np.diff(any_disengage) / (1 - any_disengage[:-1])]  # P(first disengage in slice k)
      self.buffer = np.concatenate([self.buffer[DISENGAGE_WIDTH:], independent.astype(np.float32)])
      score = self.score
      self.color = "green" if score < RYG_GREEN else "yellow" if score < RYG_YELLOW else "red"
    return self.color

  @property
  def score(self) -> float:
    return sum(self.buffer.item(i * DISENGAGE_WIDTH + DISENGAGE_WIDTH - 1 - i) / DISENGAGE_WIDTH for i in range(DISENGAGE_WIDTH))


SERVICES: tuple[str, ...] = ("modelV2", "drivingModelData", "cameraOdometry")  # what modeld publishes, modelV2 (what controls wait for) first

@dataclass(frozen=True)
class FrameInfo:
  """What the daemon knows about a published frame besides the model's outputs."""
  frame_id: int  # main camera's VisionIPC frame id
  frame_id_extra: int  # extra (wide) camera's
  timestamp_eof: int
  road_frame_id: int  # roadCameraState.frameId: frameAge is how far the model lags the camera
  frame_drop_perc: float
  dropped_frames: int  # frames dropped right before this one: cameraOdometry is invalid then
  model_execution_time: float  # seconds
  live_calib_seen: bool  # every message is invalid until a calibration arrived
  lat_action_t: float  # drive_helpers.action_times: the same times as the model's action_t input
  long_action_t: float
  outputs_finite: bool = True  # False: the model's outputs, or what was computed from them, had NaN or inf: every message is invalid
  clock_ok: bool = True  # False: a camera's timestamps stopped (frames paired by frame id): every message is invalid
  big: bool = False  # the big model of a big/small pair ran this frame (openpilot modeld.py @084747c: modelV2.big)

  @property
  def valid(self) -> dict[str, bool]:
    """Event.valid per service: openpilot marks cameraOdometry invalid on frames that follow dropped ones as well."""
    ok = self.live_calib_seen and self.outputs_finite and self.clock_ok
    return {"modelV2": ok, "drivingModelData": ok, "cameraOdometry": ok and self.dropped_frames < 1}

class FrameState(NamedTuple):
  """What this frame's messages publish of the state kept across frames (the daemon's DrivingState computes it)."""
  action: Action | None  # None without a plan head
  hard_brake_predicted: bool
  confidence: str  # green, yellow, red
  lane_change_state: int
  lane_change_direction: int

DISENGAGE_FIELDS = {"gasDisengageProbs": "gas_disengage", "brakeDisengageProbs": "brake_disengage", "steerOverrideProbs": "steer_override",
                    "brake3MetersPerSecondSquaredProbs": "hard_brake_3", "brake4MetersPerSecondSquaredProbs": "hard_brake_4",
                    "brake5MetersPerSecondSquaredProbs": "hard_brake_5", "gasPressProbs": "gas_press", "brakePressProbs": "brake_press"}

def has(p: dict[str, np.ndarray], heads: tuple[str, ...], fields: tuple[str, ...], missing: dict[str, str] | None) -> bool:
  """Whether the model has every one of `heads`; if not, `fields` are recorded in `missing` with the reason."""
  if all(map(p.__contains__, heads)): return True
  if missing is not None: missing.update(dict.fromkeys(fields, f"the model has no {' / '.join(h for h in heads if h not in p)} output"))
  return False

def lane_line_probs(p: dict[str, np.ndarray]) -> np.ndarray: return p["lane_lines_prob"][1::2]  # sigmoid of every logit, then each line's second

def meta_layout(p: dict[str, np.ndarray], missing: dict[str, str] | None) -> MetaLayout | None:
  """The meta head's layout, None (with the meta fields in `missing`) when the model has none or one of no known length."""
  if "meta" not in p: reason = "the model has no meta output"
  elif (layout := META_LAYOUTS.get(len(p["meta"]))) is not None: return layout
  else: reason = f"no known layout for a meta head of {len(p['meta'])} entries"
  if missing is not None: missing.update(dict.fromkeys(("meta.engagedProb", "meta.disengagePredictions", "meta.hardBrakePredicted", "confidence"), reason))
  return None

def model_v2_fields(p: dict[str, np.ndarray], state: FrameState, frame: FrameInfo, raw: np.ndarray | None = None,
                    missing: dict[str, str] | None = None) -> Fields:
  """modelV2's fields of one frame from the parsed outputs `p` (their arrays are the parser's views: copy what must outlive the frame).
  `raw`: the output vector, published as rawPredictions when given."""
  f = model_v2_frame(frame)
  fill_plan(f, p, missing)
  fill_action(f, state, missing)
  fill_lines(f, p, missing)
  fill_leads(f, p, missing)
  fill_meta(f, p, state, missing)
  fill_raw(f, raw)
  return f

def model_v2_frame(frame: FrameInfo) -> Fields:
  """modelV2's fields of the frame itself: camera frame ids and time, how far it lags, drops, how long the model took."""
  f: Fields = {}
  f["frameId"] = frame.frame_id
  f["frameIdExtra"] = frame.frame_id_extra
  f["frameAge"] = max(frame.road_frame_id - frame.frame_id, 0)
  f["frameDropPerc"] = frame.frame_drop_perc
  f["timestampEof"] = frame.timestamp_eof
  f["modelExecutionTime"] = frame.model_execution_time
  f["big"] = frame.big
  return f

def fill_action(f: Fields, state: FrameState, missing: dict[str, str] | None) -> None:
  """The action controlsd follows (modelV2 and drivingModelData): computed by the driving state from the plan."""
  if state.action is not None:
    f["action.desiredCurvature"] = state.action.desired_curvature
    f["action.desiredAcceleration"] = state.action.desired_acceleration
    f["action.shouldStop"] = state.action.should_stop
  elif missing is not None: missing["action"] = "the model has no plan output"

def fill_raw(f: Fields, raw: np.ndarray | None) -> None:
  if raw is not None: f["rawPredictions"] = np.ascontiguousarray(raw, np.float32).tobytes()

def struct_list_keys(field: str, n: int, names: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
  """The flat paths of a struct list's elements' fields ("laneLines.2.x"), made once: a frame fills them without formatting strings."""
  return tuple(tuple(f"{field}.{i}.{name}" for name in names) for i in range(n))

XYZT = ("t", "x", "y", "z")
LANE_LINE_KEYS, ROAD_EDGE_KEYS = struct_list_keys("laneLines", NUM_LANE_LINES, XYZT), struct_list_keys("roadEdges", NUM_ROAD_EDGES, XYZT)
LEAD_KEYS = struct_list_keys("leadsV3", LEAD_MHP_SELECTION, ("t", "x", "y", "v", "a", "xStd", "yStd", "vStd", "aStd", "prob", "probTime"))

def fill_plan(f: Fields, p: dict[str, np.ndarray], missing: dict[str, str] | None) -> None:
  """modelV2's plan, then its temporal pose: the sim_pose head, else the plan's velocity and orientation rate at t=0 (sunnypilot
  fill_model_msg.py @d671ce18). `plan.T[c]` is the plan's column c over time (a view, as every array here)."""
  if has(p, ("plan",), ("position", "velocity", "acceleration", "orientation", "orientationRate"), missing):
    plan, std = p["plan"].T, p["plan_std"].T
    f["position.t"], f["position.x"], f["position.y"], f["position.z"] = T_AXIS, *plan[Plan.POSITION]
    f["position.xStd"], f["position.yStd"], f["position.zStd"] = std[Plan.POSITION]
    f["velocity.t"], f["velocity.x"], f["velocity.y"], f["velocity.z"] = T_AXIS, *plan[Plan.VELOCITY]
    f["acceleration.t"], f["acceleration.x"], f["acceleration.y"], f["acceleration.z"] = T_AXIS, *plan[Plan.ACCELERATION]
    f["orientation.t"], f["orientation.x"], f["orientation.y"], f["orientation.z"] = T_AXIS, *plan[Plan.T_FROM_CURRENT_EULER]
    f["orientationRate.t"], f["orientationRate.x"], f["orientationRate.y"], f["orientationRate.z"] = T_AXIS, *plan[Plan.ORIENTATION_RATE]
  if "sim_pose" in p:
    f["temporalPose.trans"], f["temporalPose.transStd"] = p["sim_pose"][:3], p["sim_pose_std"][:3]
    f["temporalPose.rot"], f["temporalPose.rotStd"] = p["sim_pose"][3:], p["sim_pose_std"][3:]
  elif has(p, ("plan",), ("temporalPose",), missing):
    f["temporalPose.trans"], f["temporalPose.transStd"] = p["plan"][0, Plan.VELOCITY], p["plan_std"][0, Plan.VELOCITY]
    f["temporalPose.rot"], f["temporalPose.rotStd"] = p["plan"][0, Plan.ORIENTATION_RATE], p["plan_std"][0, Plan.ORIENTATION_RATE]

def fill_lines(f: Fields, p: dict[str, np.ndarray], missing: dict[str, str] | None) -> None:
  """modelV2's lane lines and road edges (t, x, y, z of each), their t the time the plan reaches each X_IDXS distance (the parse's plan_t)."""
  if has(p, ("lane_lines", "plan"), ("laneLines", "laneLineStds"), missing):
    t = p["plan_t"]  # the parse derives it from the plan
    for keys, (y, z) in zip(LANE_LINE_KEYS, p["lane_lines"].transpose(0, 2, 1)): f.update(zip(keys, (t, X_AXIS, y, z)))
    f["laneLineStds"] = p["lane_lines_std"][:, 0, 0]
  if has(p, ("lane_lines_prob",), ("laneLineProbs",), missing): f["laneLineProbs"] = lane_line_probs(p)
  if has(p, ("road_edges", "plan"), ("roadEdges", "roadEdgeStds"), missing):
    t = p["plan_t"]
    for keys, (y, z) in zip(ROAD_EDGE_KEYS, p["road_edges"].transpose(0, 2, 1)): f.update(zip(keys, (t, X_AXIS, y, z)))
    f["roadEdgeStds"] = p["road_edges_std"][:, 0, 0]

def fill_leads(f: Fields, p: dict[str, np.ndarray], missing: dict[str, str] | None) -> None:
  """modelV2's leads, one per time offset: t, x, y, v, a, their stds, the probability (a 0-d view: one value) and its time."""
  if not has(p, ("lead", "lead_prob"), ("leadsV3",), missing): return
  for i, (keys, lead, std, prob_time) in enumerate(zip(LEAD_KEYS, p["lead"].transpose(0, 2, 1), p["lead_std"].transpose(0, 2, 1), LEAD_T_OFFSETS)):
    f.update(zip(keys, (LEAD_T_AXIS, *lead, *std, p["lead_prob"][i, ...], prob_time)))

def fill_meta(f: Fields, p: dict[str, np.ndarray], state: FrameState, missing: dict[str, str] | None) -> None:
  """modelV2's meta: desires, the engaged and disengage probabilities of its layout, FCW, confidence, the lane change."""
  if has(p, ("desire_state",), ("meta.desireState",), missing): f["meta.desireState"] = p["desire_state"]
  if has(p, ("desire_pred",), ("meta.desirePrediction",), missing): f["meta.desirePrediction"] = p["desire_pred"].reshape(-1)
  if (layout := meta_layout(p, missing)) is not None:
    meta = p["meta"]
    f["meta.engagedProb"] = meta[layout.engaged][0, ...]
    f["meta.disengagePredictions.t"] = META_T_AXIS
    for field, attr in DISENGAGE_FIELDS.items():
      if (where := getattr(layout, attr)) is not None: f[f"meta.disengagePredictions.{field}"] = meta[where]
      elif missing is not None: missing[f"meta.disengagePredictions.{field}"] = f"the {len(meta)}-entry meta layout has no such entries"
  fill_meta_state(f, state, layout is not None)

def fill_meta_state(f: Fields, state: FrameState, fcw: bool) -> None:
  """modelV2's meta from the driving state: FCW and confidence (`fcw`: where the meta head has a known layout), the lane change."""
  if fcw:
    f["meta.hardBrakePredicted"] = state.hard_brake_predicted
    f["confidence"] = state.confidence
  fill_lane_change(f, state)

def fill_lane_change(f: Fields, state: FrameState) -> None:
  f["meta.laneChangeState"] = state.lane_change_state
  f["meta.laneChangeDirection"] = state.lane_change_direction

def driving_model_data_fields(p: dict[str, np.ndarray], state: FrameState, frame: FrameInfo, missing: dict[str, str] | None = None) -> Fields:
  """drivingModelData's fields of one frame: the action, the plan's path as polynomials, the lane lines nearest the car."""
  f = driving_model_data_frame(frame)
  fill_action(f, state, missing)
  if has(p, ("plan",), ("path",), missing): f["path.xCoefficients"], f["path.yCoefficients"], f["path.zCoefficients"] = p["path"].T
  if has(p, ("lane_lines",), ("laneLineMeta.leftY", "laneLineMeta.rightY"), missing):  # one value each, as 0-d views
    f["laneLineMeta.leftY"], f["laneLineMeta.rightY"] = p["lane_lines"][1, 0, 0, ...], p["lane_lines"][2, 0, 0, ...]
  if has(p, ("lane_lines_prob",), ("laneLineMeta.leftProb", "laneLineMeta.rightProb"), missing):
    f["laneLineMeta.leftProb"], f["laneLineMeta.rightProb"] = lane_line_probs(p)[1, ...], lane_line_probs(p)[2, ...]
  fill_lane_change(f, state)
  return f

def driving_model_data_frame(frame: FrameInfo) -> Fields:
  f: Fields = {}
  f["frameId"] = frame.frame_id
  f["frameIdExtra"] = frame.frame_id_extra
  f["frameDropPerc"] = frame.frame_drop_perc
  f["modelExecutionTime"] = frame.model_execution_time
  return f

def camera_odometry_fields(p: dict[str, np.ndarray], frame: FrameInfo, missing: dict[str, str] | None = None) -> Fields:
  """cameraOdometry's fields of one frame: the pose heads (openpilot's fill_pose_msg)."""
  f = camera_odometry_frame(frame)
  if has(p, ("pose",), ("trans", "rot", "transStd", "rotStd"), missing):
    f["trans"], f["rot"], f["transStd"], f["rotStd"] = p["pose"][:3], p["pose"][3:], p["pose_std"][:3], p["pose_std"][3:]
  if has(p, ("wide_from_device_euler",), ("wideFromDeviceEuler", "wideFromDeviceEulerStd"), missing):
    f["wideFromDeviceEuler"], f["wideFromDeviceEulerStd"] = p["wide_from_device_euler"], p["wide_from_device_euler_std"]
  if has(p, ("road_transform",), ("roadTransformTrans", "roadTransformTransStd"), missing):
    f["roadTransformTrans"], f["roadTransformTransStd"] = p["road_transform"][:3], p["road_transform_std"][:3]
  return f

def camera_odometry_frame(frame: FrameInfo) -> Fields:
  f: Fields = {}
  f["frameId"] = frame.frame_id
  f["timestampEof"] = frame.timestamp_eof
  return f

def host_fields(state: FrameState, frame: FrameInfo, raw: np.ndarray | None, fcw: bool) -> dict[str, Fields]:
  """Each message's fields that come from the daemon, not from the parsed outputs (the frame, the action, the driving state, the raw
  outputs), by the same helpers the fill functions use: with the parse in the model's graph, these and the graph's floats are the whole
  messages (model/published_floats.py). `fcw`: the model's meta head has a known layout."""
  v2, dmd = model_v2_frame(frame), driving_model_data_frame(frame)
  fill_action(v2, state, None); fill_meta_state(v2, state, fcw); fill_raw(v2, raw)
  fill_action(dmd, state, None); fill_lane_change(dmd, state)
  return {"modelV2": v2, "drivingModelData": dmd, "cameraOdometry": camera_odometry_frame(frame)}

def frame_fields(p: dict[str, np.ndarray], state: FrameState, frame: FrameInfo, raw: np.ndarray | None = None,
                 missing: dict[str, str] | None = None) -> dict[str, Fields]:
  """The three messages' fields of one frame, by service (modeld makes modelV2's first and sends it before filling the others);
  `missing` gets each field left default as "service.path"."""
  gaps: dict[str, dict[str, str]] = {s: {} for s in SERVICES}
  out = {"modelV2": model_v2_fields(p, state, frame, raw, gaps["modelV2"]),
         "drivingModelData": driving_model_data_fields(p, state, frame, gaps["drivingModelData"]),
         "cameraOdometry": camera_odometry_fields(p, frame, gaps["cameraOdometry"])}
  if missing is not None: missing.update({f"{s}.{path}": why for s, g in gaps.items() for path, why in g.items()})
  return out
