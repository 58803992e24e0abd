"""The driving model's output vector: named slices (ONNX `output_slices`) and their shapes as openpilot lays them out, their parsing,
and the cereal messages (modelV2, drivingModelData, cameraOdometry) built from them.

The stand-in models are generated with this layout; the daemon parses outputs by the slices stored in each bundle.
"""
from __future__ import annotations

from typing import Any

import numpy as np

IDX_N = 33  # plan points ahead
PLAN_WIDTH, PLAN_MHP_N = 15, 5  # per point: position, velocity, acceleration, orientation, orientation rate (3 each); hypotheses
LEAD_MHP_N, LEAD_TRAJ_LEN, LEAD_WIDTH, LEAD_MHP_SELECTION = 2, 6, 4, 3
NUM_LANE_LINES, NUM_ROAD_EDGES, DESIRE_LEN, DESIRE_PRED_LEN = 4, 2, 8, 4
FEATURE_LEN = 512
META_LEN = 55

def mhp_size(n: int, width: int, selection: int = 1) -> int:
  """Mixture of hypotheses: per hypothesis mean + std of `width` values, plus `selection` logits."""
  return n * (2 * width + selection)

# name -> number of floats. Vision part first (what a split vision model emits), then policy part.
VISION_SLICES = {"pose": 12, "wide_from_device_euler": 6, "road_transform": 12, "hidden_state": FEATURE_LEN}
POLICY_SLICES = {
  "plan": mhp_size(PLAN_MHP_N, IDX_N * PLAN_WIDTH),
  "lane_lines": 2 * NUM_LANE_LINES * IDX_N * 2,
  "lane_lines_prob": 2 * NUM_LANE_LINES,
  "road_edges": 2 * NUM_ROAD_EDGES * IDX_N * 2,
  "lead": mhp_size(LEAD_MHP_N, LEAD_TRAJ_LEN * LEAD_WIDTH, LEAD_MHP_SELECTION),
  "lead_prob": LEAD_MHP_SELECTION,
  "desire_state": DESIRE_LEN,
  "meta": META_LEN,
  "desire_pred": DESIRE_PRED_LEN * DESIRE_LEN,
  "action": 2,
}

def slices_of(sizes: dict[str, int], start: int = 0) -> dict[str, slice]:
  out = {}
  for name, size in sizes.items():
    out[name] = slice(start, start + size)
    start += size
  return out

T_IDXS = [10.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)]  # seconds ahead of each plan point
X_IDXS = [192.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)]  # metres ahead of each lane-line point
LEAD_T_IDXS, LEAD_T_OFFSETS, META_T_IDXS = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0], [0.0, 2.0, 4.0], [2.0, 4.0, 6.0, 8.0, 10.0]

def sigmoid(x: np.ndarray) -> np.ndarray: return 1 / (1 + np.exp(-np.clip(x, -60, 60)))

def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
  e = np.exp(x - x.max(axis=axis, keepdims=True))
  return e / e.sum(axis=axis, keepdims=True)

def _mean_std(raw: np.ndarray, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
  """Mean, then log-std: the MDN heads' encoding."""
  n = int(np.prod(shape))
  return raw[:n].reshape(shape), np.exp(np.clip(raw[n:2 * n], -30, 30)).reshape(shape)

def parse_outputs(outputs: np.ndarray, slices: dict[str, list[int]]) -> dict[str, Any]:
  """The model's (1, N) output vector -> named arrays, with openpilot's activations: best hypothesis of each mixture, exp for
  stds, softmax for desires and lane-line probabilities, sigmoid for meta and lead probabilities."""
  vec = np.asarray(outputs, np.float32).reshape(-1)
  raw = {name: vec[a:b] for name, (a, b) in slices.items()}
  out: dict[str, Any] = {}
  if "plan" in raw:
    hyps = raw["plan"].reshape(PLAN_MHP_N, -1)
    best = int(np.argmax(hyps[:, -1]))
    out["plan"], out["plan_std"] = _mean_std(hyps[best, :-1], (IDX_N, PLAN_WIDTH))
  if "lane_lines" in raw: out["lane_lines"], out["lane_lines_std"] = _mean_std(raw["lane_lines"], (NUM_LANE_LINES, IDX_N, 2))
  if "lane_lines_prob" in raw: out["lane_lines_prob"] = softmax(raw["lane_lines_prob"].reshape(NUM_LANE_LINES, 2))[:, 1]
  if "road_edges" in raw: out["road_edges"], out["road_edges_std"] = _mean_std(raw["road_edges"], (NUM_ROAD_EDGES, IDX_N, 2))
  if "lead" in raw:
    hyps = raw["lead"].reshape(LEAD_MHP_N, -1)
    width = LEAD_TRAJ_LEN * LEAD_WIDTH
    picks = [_mean_std(hyps[int(np.argmax(hyps[:, 2 * width + t])), :2 * width], (LEAD_TRAJ_LEN, LEAD_WIDTH)) for t in range(LEAD_MHP_SELECTION)]
    out["lead"], out["lead_std"] = np.stack([m for m, _ in picks]), np.stack([s for _, s in picks])
  if "lead_prob" in raw: out["lead_prob"] = sigmoid(raw["lead_prob"])
  if "desire_state" in raw: out["desire_state"] = softmax(raw["desire_state"])
  if "desire_pred" in raw: out["desire_pred"] = softmax(raw["desire_pred"].reshape(DESIRE_PRED_LEN, DESIRE_LEN))
  if "meta" in raw: out["meta"] = sigmoid(raw["meta"])
  for name, n in (("pose", 6), ("wide_from_device_euler", 3), ("road_transform", 6)):
    if name in raw: out[name], out[f"{name}_std"] = _mean_std(raw[name], (n,))
  if "action" in raw: out["action"] = raw["action"]
  if "hidden_state" in raw: out["hidden_state"] = raw["hidden_state"]
  return out

def _xyzt(builder, xyz: np.ndarray, t: list[float], std: np.ndarray | None = None) -> None:
  builder.x, builder.y, builder.z, builder.t = xyz[:, 0].tolist(), xyz[:, 1].tolist(), xyz[:, 2].tolist(), t
  if std is not None: builder.xStd, builder.yStd, builder.zStd = std[:, 0].tolist(), std[:, 1].tolist(), std[:, 2].tolist()

def fill_model_msgs(parsed: dict[str, Any], model_v2, driving_data, odometry) -> None:
  """Fill modelV2, drivingModelData and cameraOdometry from parsed outputs (frame ids and timings are the daemon's)."""
  plan, plan_std = parsed["plan"], parsed["plan_std"]
  for field, cols in (("position", slice(0, 3)), ("velocity", slice(3, 6)), ("acceleration", slice(6, 9)), ("orientation", slice(9, 12)),
                      ("orientationRate", slice(12, 15))):
    _xyzt(getattr(model_v2, field), plan[:, cols], T_IDXS, plan_std[:, cols])
  lines = model_v2.init("laneLines", NUM_LANE_LINES)
  for i in range(NUM_LANE_LINES):
    lines[i].x, lines[i].y, lines[i].z, lines[i].t = X_IDXS, parsed["lane_lines"][i, :, 0].tolist(), parsed["lane_lines"][i, :, 1].tolist(), T_IDXS
  model_v2.laneLineProbs = parsed["lane_lines_prob"].tolist()
  model_v2.laneLineStds = parsed["lane_lines_std"][:, 0, 0].tolist()
  edges = model_v2.init("roadEdges", NUM_ROAD_EDGES)
  for i in range(NUM_ROAD_EDGES):
    edges[i].x, edges[i].y, edges[i].z, edges[i].t = X_IDXS, parsed["road_edges"][i, :, 0].tolist(), parsed["road_edges"][i, :, 1].tolist(), T_IDXS
  model_v2.roadEdgeStds = parsed["road_edges_std"][:, 0, 0].tolist()
  leads = model_v2.init("leadsV3", LEAD_MHP_SELECTION)
  for i in range(LEAD_MHP_SELECTION):
    mean, std = parsed["lead"][i], parsed["lead_std"][i]
    leads[i].prob, leads[i].probTime, leads[i].t = float(parsed["lead_prob"][i]), LEAD_T_OFFSETS[i], LEAD_T_IDXS
    leads[i].x, leads[i].y, leads[i].v, leads[i].a = (mean[:, j].tolist() for j in range(4))
    leads[i].xStd, leads[i].yStd, leads[i].vStd, leads[i].aStd = (std[:, j].tolist() for j in range(4))
  meta = model_v2.meta
  meta.engagedProb = float(parsed["meta"][0])
  meta.desirePrediction = parsed["desire_pred"].reshape(-1).tolist()
  meta.desireState = parsed["desire_state"].tolist()
  disengage = meta.disengagePredictions
  disengage.t = META_T_IDXS
  per = parsed["meta"][1:].reshape(-1)
  for j, field in enumerate(("gasDisengageProbs", "brakeDisengageProbs", "steerOverrideProbs", "brake3MetersPerSecondSquaredProbs",
                             "brake4MetersPerSecondSquaredProbs", "brake5MetersPerSecondSquaredProbs", "gasPressProbs", "brakePressProbs")):
    setattr(disengage, field, per[j * len(META_T_IDXS):(j + 1) * len(META_T_IDXS)].tolist())
  meta.hardBrakePredicted = bool(max(disengage.brake5MetersPerSecondSquaredProbs) > 0.9)
  pose, pose_std = parsed["pose"], parsed["pose_std"]
  model_v2.temporalPose.trans, model_v2.temporalPose.rot = pose[:3].tolist(), pose[3:].tolist()
  model_v2.temporalPose.transStd, model_v2.temporalPose.rotStd = pose_std[:3].tolist(), pose_std[3:].tolist()
  model_v2.action.desiredCurvature = float(parsed["action"][0]) if "action" in parsed else 0.0
  model_v2.confidence = "green"
  odometry.trans, odometry.rot, odometry.transStd, odometry.rotStd = pose[:3].tolist(), pose[3:].tolist(), pose_std[:3].tolist(), pose_std[3:].tolist()
  odometry.wideFromDeviceEuler, odometry.wideFromDeviceEulerStd = parsed["wide_from_device_euler"].tolist(), parsed["wide_from_device_euler_std"].tolist()
  odometry.roadTransformTrans, odometry.roadTransformTransStd = parsed["road_transform"][:3].tolist(), parsed["road_transform_std"][:3].tolist()
  driving_data.action.desiredCurvature = model_v2.action.desiredCurvature
  lane = driving_data.laneLineMeta
  lane.leftY, lane.rightY = float(parsed["lane_lines"][1, 0, 0]), float(parsed["lane_lines"][2, 0, 0])
  lane.leftProb, lane.rightProb = float(parsed["lane_lines_prob"][1]), float(parsed["lane_lines_prob"][2])
  path = driving_data.path  # the plan's position as cubic polynomials of time
  path.xCoefficients, path.yCoefficients, path.zCoefficients = (np.polyfit(T_IDXS, plan[:, i], 3).tolist() for i in range(3))
