"""Parsed outputs -> the field values of modelV2, drivingModelData and cameraOdometry, as openpilot's fill_model_msg.py computes them.

Mirrors openpilot selfdrive/modeld/fill_model_msg.py (commaai/openpilot @028c5eb9: plan, lane lines and road edges with t from the
plan's PLAN_T_IDXS, leads, meta, FCW history, confidence buffer, polynomial path; fill_pose_msg) and sunnypilot modeld_v2
fill_model_msg.py (sunnypilot/sunnypilot @d671ce18: temporalPose from the plan at t=0 without a sim_pose head, gas/brake press only where
the meta layout has them). commaai's later fill_model_msg.py (@b8f90a7a) publishes lane lines and road edges with an empty t; sunnypilot
@d671ce18 keeps the plan times (models/helpers.py plan_x_idxs_helper @13ce8664), and so does this.

Values are plain, {dotted field path: value} with a struct as a dict and a struct list as a list of dicts, so they can be checked
without a schema; a list field is a numpy array or a list (arrays are not converted to Python floats: the byte template takes them as
they are); messaging.set_fields writes them.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.model.constants import (
  CONFIDENCE_BUFFER_LEN,
  DISENGAGE_WIDTH,
  FCW_THRESHOLDS_3MS2,
  FCW_THRESHOLDS_5MS2,
  IDX_N,
  LEAD_MHP_SELECTION,
  LEAD_T_IDXS,
  LEAD_T_OFFSETS,
  META_LAYOUTS,
  META_T_IDXS,
  MODEL_FREQ,
  NUM_LANE_LINES,
  NUM_ROAD_EDGES,
  POLY_PATH_DEGREE,
  RYG_GREEN,
  RYG_YELLOW,
  T_IDXS,
  X_IDXS,
  MetaLayout,
  Plan,
)
from sunnypilot.modeld_v2.model.drive_helpers import Action

def refilled(cache: dict, key: str, values: np.ndarray) -> np.ndarray:
  """The cache's array under `key` (made on first use) with `values` copied in: a value a `views` part may hold though it is computed."""
  if (array := cache.get(key)) is None: array = cache[key] = np.empty_like(values)
  array[...] = values
  return array

class Fields:
  """One message's field values, added part by part. A part whose output heads the model lacks is left out, so its fields keep their
  defaults, and each of its field names is recorded in `missing` with the reason.

  A `views` part makes nothing but views of the parsed arrays (a 0-d view for one value), constants, and arrays `refilled` in the cache each
  frame. An OutputParser refills the same arrays every frame, so with its parsed dict and a `cache` kept beside the parser such a part is
  made once and its values (the same objects) reused; `static` lists the fields those parts gave, which a message template then gathers
  straight from the parser's buffer (message_template.py)."""
  def __init__(self, parsed: dict[str, np.ndarray], cache: dict[tuple[str, ...] | str, Any] | None = None):
    self.parsed, self.values, self.missing, self.cache, self.static = parsed, {}, {}, cache, []

  def part(self, needs: tuple[str, ...], fields: tuple[str, ...], make: Callable[[], dict[str, Any]], views: bool = False) -> None:
    if views and self.cache is not None and (values := self.cache.get(fields)) is not None:  # checked when made: the parser's heads stay
      self.static.extend(fields)
      self.values.update(values)
      return
    if lacking := [name for name in needs if name not in self.parsed]: return self.skip(fields, f"the model has no {' / '.join(lacking)} output")
    values = make()
    assert tuple(values) == fields, f"part made {list(values)}, declared {list(fields)}"  # in order: a tuple compare, no set per part
    if views and self.cache is not None:
      self.cache[fields] = values
      self.static.extend(fields)
    self.values.update(values)

  def skip(self, fields: tuple[str, ...], reason: str) -> None: self.missing.update(dict.fromkeys(fields, reason))

Floats = np.ndarray | list[float]

def xyzt(t: Floats, x: Floats, y: Floats, z: Floats, x_std: Floats | None = None, y_std: Floats | None = None,
         z_std: Floats | None = None) -> dict[str, Floats]:
  out = {"t": t, "x": x, "y": y, "z": z}
  if x_std is not None: out |= {"xStd": x_std, "yStd": y_std, "zStd": z_std}
  return out

# the fixed axes as read-only float32 arrays (the float32 the message stores): the byte template copies an array at once, a list value by
# value; read-only marks them as constants a `views` part may hold
T_AXIS, X_AXIS, META_T_AXIS = np.array(T_IDXS, np.float32), np.array(X_IDXS, np.float32), np.array(META_T_IDXS, np.float32)
T_AXIS.flags.writeable = X_AXIS.flags.writeable = META_T_AXIS.flags.writeable = False
# numpy compares a float32 plan point with a Python float in float32; X_IDXS (3 k^2 / 16 m) are exact in float32, so a float64 compare agrees
assert all(float(np.float32(x)) == x for x in X_IDXS), "X_IDXS must be float32 values for plan_t_idxs' compares"

def plan_t_idxs(plan_x: np.ndarray) -> np.ndarray:
  """The time at which the plan reaches each X_IDXS distance, linear between plan points: 0 at the first; 10 s for the first distance
  beyond the plan's end and NaN after it; NaN where two plan points coincide. On Python floats (numpy scalars cost ~10x per step);
  openpilot restarts its search at the first plan point for every distance, this carries it on: the distances grow, so it stops at the
  same point."""
  px, t, ti = plan_x.tolist(), [0.0] + [float("nan")] * (IDX_N - 1), 0
  for xi in range(1, IDX_N):
    while ti < IDX_N - 1 and px[ti + 1] < X_IDXS[xi]: ti += 1  # the last plan point short of this distance
    if ti == IDX_N - 1:
      t[xi] = T_IDXS[-1]
      break
    x0, x1 = px[ti], px[ti + 1]
    p = (X_IDXS[xi] - x0) / (x1 - x0) if abs(x1 - x0) > 1e-9 else float("nan")
    t[xi] = p * T_IDXS[ti + 1] + (1 - p) * T_IDXS[ti]
  return np.array(t, np.float32)  # the message's float32: the byte template concatenates it with the other float32 arrays, no cast

def _poly_fit_matrix() -> np.ndarray:
  """numpy.polynomial's polyfit on the fixed T_IDXS as one matrix: the least-squares solve of its column-scaled Vandermonde matrix (the
  pseudo-inverse with polyfit's rcond), then its scaling undone, so a fit is one product instead of an SVD per frame."""
  vander = np.polynomial.polynomial.polyvander(np.asarray(T_IDXS, np.float64), POLY_PATH_DEGREE)
  scale = np.sqrt(np.square(vander).sum(0))
  return np.linalg.pinv(vander / scale, rcond=len(T_IDXS) * np.finfo(np.float64).eps) / scale[:, None]

POLY_FIT = _poly_fit_matrix()
# plan positions below this in magnitude give path coefficients float32 can hold (each is a weighted sum of positions)
POLY_PATH_LIMIT = float(np.finfo(np.float32).max / np.abs(POLY_FIT).sum(axis=1).max())

def poly_path(position: np.ndarray) -> dict[str, np.ndarray]:
  """The plan's (33, 3) position as degree-4 polynomials of time, lowest power first (numpy.polynomial's polyfit, as openpilot)."""
  coeffs = POLY_FIT @ np.asarray(position, np.float64)
  return {"xCoefficients": coeffs[:, 0], "yCoefficients": coeffs[:, 1], "zCoefficients": coeffs[:, 2]}

class HardBrake:
  """FCW: hard braking is predicted when the 5 m/s2 probability (2 s ahead) stayed above its thresholds over the last 5 frames and the
  3 m/s2 one over the last 2. The histories are float32 values held as Python floats: each compare is the float32 one, without numpy calls.
  `update` takes the two probabilities as Python floats of float32 values (what `array.item` gives for a float32 array)."""
  THRESHOLDS_5MS2, THRESHOLDS_3MS2 = FCW_THRESHOLDS_5MS2.tolist(), FCW_THRESHOLDS_3MS2.tolist()

  def __init__(self): self.brake_5ms2, self.brake_3ms2 = [0.0] * len(self.THRESHOLDS_5MS2), [0.0] * len(self.THRESHOLDS_3MS2)

  def update(self, brake_5ms2: float, brake_3ms2: float) -> bool:
    self.brake_5ms2 = self.brake_5ms2[1:] + [brake_5ms2]
    self.brake_3ms2 = self.brake_3ms2[1:] + [brake_3ms2]
    return all(p > t for p, t in zip(self.brake_5ms2, self.THRESHOLDS_5MS2, strict=True)) and \
      all(p > t for p, t in zip(self.brake_3ms2, self.THRESHOLDS_3MS2, strict=True))

class Confidence:
  """Every 2 s (frame ids divisible by 40) the per-2 s-slice disengage probabilities enter a rolling buffer of the last 5 updates; the
  score averages, across those updates, the probability each gave for the slice that ends now."""
  def __init__(self): self.buffer = np.zeros(CONFIDENCE_BUFFER_LEN * DISENGAGE_WIDTH, np.float32)

  def update(self, frame_id: int, gas: np.ndarray, brake: np.ndarray, steer: np.ndarray) -> str:
    if frame_id % (2 * MODEL_FREQ) == 0:
      any_disengage = 1 - (1 - brake) * (1 - gas) * (1 - steer)
      independent = np.r_[any_disengage[0], np.diff(any_disengage) / (1 - any_disengage[:-1])]  # P(first disengage in slice k)
      self.buffer = np.concatenate([self.buffer[DISENGAGE_WIDTH:], independent.astype(np.float32)])
    score = self.score
    return "green" if score < RYG_GREEN else "yellow" if score < RYG_YELLOW else "red"

  @property
  def score(self) -> float:
    return sum(self.buffer.item(i * DISENGAGE_WIDTH + DISENGAGE_WIDTH - 1 - i) / DISENGAGE_WIDTH for i in range(DISENGAGE_WIDTH))

PLAN_FIELDS = ("position", "velocity", "acceleration", "orientation", "orientationRate")
ACTION_FIELDS = ("action.desiredCurvature", "action.desiredAcceleration", "action.shouldStop")
LANE_CHANGE_FIELDS = ("meta.laneChangeState", "meta.laneChangeDirection")
DISENGAGE_FIELDS = {"gasDisengageProbs": "gas_disengage", "brakeDisengageProbs": "brake_disengage", "steerOverrideProbs": "steer_override",
                    "brake3MetersPerSecondSquaredProbs": "hard_brake_3", "brake4MetersPerSecondSquaredProbs": "hard_brake_4",
                    "brake5MetersPerSecondSquaredProbs": "hard_brake_5", "gasPressProbs": "gas_press", "brakePressProbs": "brake_press"}

META_STATE_FIELDS = ("meta.hardBrakePredicted", "confidence")  # the meta fields made per frame: FCW and confidence keep history

def meta_fields(layout: MetaLayout | None) -> tuple[str, ...]:
  """The fields a meta head of this layout fills; None: all that any layout fills."""
  return meta_views(layout) + META_STATE_FIELDS

def meta_views(layout: MetaLayout | None) -> tuple[str, ...]:
  """The meta fields that are views of the head (engagedProb, meta.disengagePredictions) a layout fills; None: all that any layout fills."""
  disengage = [field for field, attr in DISENGAGE_FIELDS.items() if layout is None or getattr(layout, attr) is not None]
  return ("meta.engagedProb", "meta.disengagePredictions.t", *(f"meta.disengagePredictions.{f}" for f in disengage))

ALL_META_FIELDS, ALL_META_VIEWS = meta_fields(None), meta_views(None)
# per meta length, made once: its view fields, and the fields no entry of it fills
META_VIEWS = {n: meta_views(layout) for n, layout in META_LAYOUTS.items()}
META_UNFILLED = {n: tuple(f for f in ALL_META_FIELDS if f not in meta_fields(layout)) for n, layout in META_LAYOUTS.items()}

def action_values(action: Action) -> dict[str, Any]:
  return dict(zip(ACTION_FIELDS, (action.desired_curvature, action.desired_acceleration, action.should_stop), strict=True))

def _plan(p: dict[str, np.ndarray]) -> dict[str, Any]:
  plan, std = p["plan"], p["plan_std"]
  cols = (Plan.POSITION, Plan.VELOCITY, Plan.ACCELERATION, Plan.T_FROM_CURRENT_EULER, Plan.ORIENTATION_RATE)
  out = {name: xyzt(T_AXIS, *plan[:, c].T) for name, c in zip(PLAN_FIELDS, cols, strict=True)}
  out["position"] = xyzt(T_AXIS, *plan[:, Plan.POSITION].T, *std[:, Plan.POSITION].T)  # only the position carries stds
  return out

def _temporal_pose(p: dict[str, np.ndarray]) -> dict[str, Any]:
  if "sim_pose" in p:
    pose, std = p["sim_pose"], p["sim_pose_std"]
    return {"temporalPose": {"trans": pose[:3], "transStd": std[:3], "rot": pose[3:], "rotStd": std[3:]}}
  now, std = p["plan"][0], p["plan_std"][0]  # without a sim_pose head: the plan's velocity and orientation rate at t=0
  return {"temporalPose": {"trans": now[Plan.VELOCITY], "transStd": std[Plan.VELOCITY], "rot": now[Plan.ORIENTATION_RATE],
                           "rotStd": std[Plan.ORIENTATION_RATE]}}

def _lines(p: dict[str, np.ndarray], name: str, count: int, t: np.ndarray) -> list[dict[str, Floats]]:
  return [xyzt(t, X_AXIS, p[name][i, :, 0], p[name][i, :, 1]) for i in range(count)]

def _leads(p: dict[str, np.ndarray]) -> list[dict[str, Any]]:
  leads = []
  for i in range(LEAD_MHP_SELECTION):
    (x, y, v, a), (xs, ys, vs, as_) = p["lead"][i].T, p["lead_std"][i].T
    leads.append({"t": LEAD_T_IDXS, "x": x, "y": y, "v": v, "a": a, "xStd": xs, "yStd": ys, "vStd": vs, "aStd": as_,
                  "prob": p["lead_prob"][i, ...], "probTime": LEAD_T_OFFSETS[i]})  # [i, ...]: a 0-d view, one value that follows the array
  return leads

def _disengage(meta: np.ndarray, layout: MetaLayout) -> dict[str, np.ndarray]:
  """{disengagePredictions field: its probabilities (views of the meta head)}, in DISENGAGE_FIELDS' order."""
  return {field: meta[getattr(layout, attr)] for field, attr in DISENGAGE_FIELDS.items() if getattr(layout, attr) is not None}

def _meta_state(meta: np.ndarray, layout: MetaLayout, hard_brake: HardBrake, confidence: Confidence, frame_id: int) -> dict[str, Any]:
  # .item: a Python float of the float32 value, no numpy scalar (a numpy call path less per frame)
  return {"meta.hardBrakePredicted": hard_brake.update(meta.item(layout.hard_brake_5.start), meta.item(layout.hard_brake_3.start)),
          "confidence": confidence.update(frame_id, meta[layout.gas_disengage], meta[layout.brake_disengage], meta[layout.steer_override])}

def _meta_views(meta: np.ndarray, layout: MetaLayout) -> dict[str, Any]:
  views = {"meta.engagedProb": meta[layout.engaged][0, ...], "meta.disengagePredictions.t": META_T_AXIS}  # [0, ...]: a 0-d view
  return views | {f"meta.disengagePredictions.{field}": v for field, v in _disengage(meta, layout).items()}

def lane_line_probs(p: dict[str, np.ndarray]) -> np.ndarray: return p["lane_lines_prob"][1::2]  # sigmoid of every logit, then each line's second

def model_v2_fields(p: dict[str, np.ndarray], action: Action | None, hard_brake: HardBrake, confidence: Confidence, frame_id: int,
                    cache: dict | None = None) -> Fields:
  """modelV2's model-derived fields (frame ids, timings and lane-change state are the daemon's). `action` is None without a plan. `cache`:
  the views parts kept beside the parser that made `p` (Fields), None to make every part."""
  f = Fields(p, cache)
  t = plan_t_idxs(p["plan"][:, Plan.POSITION][:, 0]) if "plan" in p else None  # when the plan reaches each X_IDXS: lane lines and road edges
  if t is not None and cache is not None: t = refilled(cache, "lane times", t)  # the lines' parts then hold the same array every frame
  f.part(("plan",), PLAN_FIELDS, lambda: _plan(p), views=True)
  f.part(("sim_pose",) if "sim_pose" in p else ("plan",), ("temporalPose",), lambda: _temporal_pose(p), views=True)
  f.part(("plan",), ACTION_FIELDS, lambda: action_values(action))
  f.part(("lane_lines", "plan"), ("laneLines",), lambda: {"laneLines": _lines(p, "lane_lines", NUM_LANE_LINES, t)}, views=True)
  f.part(("lane_lines", "plan"), ("laneLineStds",), lambda: {"laneLineStds": p["lane_lines_std"][:, 0, 0]}, views=True)
  f.part(("lane_lines_prob",), ("laneLineProbs",), lambda: {"laneLineProbs": lane_line_probs(p)}, views=True)
  f.part(("road_edges", "plan"), ("roadEdges",), lambda: {"roadEdges": _lines(p, "road_edges", NUM_ROAD_EDGES, t)}, views=True)
  f.part(("road_edges", "plan"), ("roadEdgeStds",), lambda: {"roadEdgeStds": p["road_edges_std"][:, 0, 0]}, views=True)
  f.part(("lead", "lead_prob"), ("leadsV3",), lambda: {"leadsV3": _leads(p)}, views=True)
  f.part(("desire_state",), ("meta.desireState",), lambda: {"meta.desireState": p["desire_state"]}, views=True)
  f.part(("desire_pred",), ("meta.desirePrediction",), lambda: {"meta.desirePrediction": p["desire_pred"].reshape(-1)}, views=True)
  layout = META_LAYOUTS.get(len(p["meta"])) if "meta" in p else None
  if "meta" in p and layout is None: f.skip(ALL_META_FIELDS, f"no known layout for a meta head of {len(p['meta'])} entries")
  else:  # without a meta head both parts report it missing
    f.part(("meta",), META_VIEWS[len(p["meta"])] if layout else ALL_META_VIEWS, lambda: _meta_views(p["meta"], layout), views=True)
    f.part(("meta",), META_STATE_FIELDS, lambda: _meta_state(p["meta"], layout, hard_brake, confidence, frame_id))
    if layout is not None and (unfilled := META_UNFILLED[len(p["meta"])]): f.skip(unfilled, f"the {len(p['meta'])}-entry meta layout has no such entries")
  return f

def driving_model_data_fields(p: dict[str, np.ndarray], action: Action | None) -> Fields:
  f = Fields(p)  # every field is made per frame: the action, a fit, single values
  f.part(("plan",), ACTION_FIELDS, lambda: action_values(action))
  f.part(("plan",), ("path",), lambda: {"path": poly_path(p["plan"][:, Plan.POSITION])})
  f.part(("lane_lines",), ("laneLineMeta.leftY", "laneLineMeta.rightY"),
         lambda: {"laneLineMeta.leftY": float(p["lane_lines"][1, 0, 0]), "laneLineMeta.rightY": float(p["lane_lines"][2, 0, 0])})
  f.part(("lane_lines_prob",), ("laneLineMeta.leftProb", "laneLineMeta.rightProb"),
         lambda: {"laneLineMeta.leftProb": float(lane_line_probs(p)[1]), "laneLineMeta.rightProb": float(lane_line_probs(p)[2])})
  return f

def camera_odometry_fields(p: dict[str, np.ndarray], cache: dict | None = None) -> Fields:
  """cameraOdometry's fields: the pose heads' views (`cache` as for model_v2_fields)."""
  f = Fields(p, cache)
  f.part(("pose",), ("trans", "rot", "transStd", "rotStd"), lambda: {"trans": p["pose"][:3], "rot": p["pose"][3:],
                                                                   "transStd": p["pose_std"][:3], "rotStd": p["pose_std"][3:]}, views=True)
  f.part(("wide_from_device_euler",), ("wideFromDeviceEuler", "wideFromDeviceEulerStd"),
         lambda: {"wideFromDeviceEuler": p["wide_from_device_euler"], "wideFromDeviceEulerStd": p["wide_from_device_euler_std"]}, views=True)
  f.part(("road_transform",), ("roadTransformTrans", "roadTransformTransStd"),
         lambda: {"roadTransformTrans": p["road_transform"][:3], "roadTransformTransStd": p["road_transform_std"][:3]}, views=True)
  return f
