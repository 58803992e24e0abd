"""Indices and sizes of the driving model's outputs, as openpilot lays them out.

Mirrors openpilot selfdrive/modeld/constants.py (commaai/openpilot @105a379a: ModelConstants, Plan) and sunnypilot
sunnypilot/modeld_v2/model/constants.py (sunnypilot/sunnypilot @61c00f46: POLY_PATH_DEGREE and the Meta layouts of each model generation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MODEL_FREQ = 20
DT_MDL = 1 / MODEL_FREQ

IDX_N = 33  # plan points ahead
T_IDXS = [10.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)]  # seconds ahead of each plan point
X_IDXS = [192.0 * (i / (IDX_N - 1)) ** 2 for i in range(IDX_N)]  # metres ahead of each lane-line point
LEAD_T_IDXS = [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
LEAD_T_OFFSETS = [0.0, 2.0, 4.0]
META_T_IDXS = [2.0, 4.0, 6.0, 8.0, 10.0]

FEATURE_LEN = 512
DESIRE_LEN = 8
PLAN_WIDTH, PLAN_MHP_N, PLAN_MHP_SELECTION = 15, 5, 1  # per point: position, velocity, acceleration, orientation, orientation rate (3 each)
LEAD_MHP_N, LEAD_TRAJ_LEN, LEAD_WIDTH, LEAD_MHP_SELECTION = 2, 6, 4, 3  # per lead point: x, y, v, a
NUM_LANE_LINES, NUM_ROAD_EDGES, LANE_LINES_WIDTH = 4, 2, 2  # per point: y, z
DESIRE_PRED_LEN = 4
POSE_WIDTH, WIDE_FROM_DEVICE_WIDTH, DESIRED_CURV_WIDTH = 6, 3, 1
LAT_PLANNER_SOLUTION_WIDTH = 4  # x, y, yaw, curvature (openpilot constants.py of the lat_planner models)
META_LEN = 55
POLY_PATH_DEGREE = 4

# forward collision warning: the hard-brake probabilities must stay above these over the last 5 and 2 frames
FCW_THRESHOLDS_5MS2 = np.array([0.05, 0.05, 0.15, 0.15, 0.15], dtype=np.float32)
FCW_THRESHOLDS_3MS2 = np.array([0.7, 0.7], dtype=np.float32)
DISENGAGE_WIDTH, CONFIDENCE_BUFFER_LEN = 5, 5
RYG_GREEN, RYG_YELLOW = 0.01165, 0.06157

class Plan:
  POSITION = slice(0, 3)
  VELOCITY = slice(3, 6)
  ACCELERATION = slice(6, 9)
  T_FROM_CURRENT_EULER = slice(9, 12)
  ORIENTATION_RATE = slice(12, 15)

@dataclass(frozen=True)
class MetaLayout:
  """Where each probability sits in the meta head: the disengage arrays interleave by time step (2..10 s); gas/brake press, where a
  generation has them separately, cover 0..10 s."""
  engaged: slice
  gas_disengage: slice
  brake_disengage: slice
  steer_override: slice
  hard_brake_3: slice
  hard_brake_4: slice
  hard_brake_5: slice
  gas_press: slice
  brake_press: slice | None

# meta length -> layout: the engaged probability, then the disengage arrays interleaved by time step (stride 6 up to 31 in today's layout);
# 55: openpilot's current models (sunnypilot `Meta`), gas/brake press after them; 53: "Tomb Raider" (`MetaTombRaider`), stride 8 with the
# press arrays interleaved; 48: sim-pose models and 0.9.x supercombos (`MetaSimPose`, openpilot constants.py @0559c5b1), stride 7 with gas
# press interleaved and no brake-press entries.
META_LAYOUTS = {
  55: MetaLayout(engaged=slice(0, 1), gas_disengage=slice(1, 31, 6), brake_disengage=slice(2, 31, 6), steer_override=slice(3, 31, 6),
                 hard_brake_3=slice(4, 31, 6), hard_brake_4=slice(5, 31, 6), hard_brake_5=slice(6, 31, 6),
                 gas_press=slice(31, 55, 4), brake_press=slice(32, 55, 4)),
  53: MetaLayout(engaged=slice(0, 1), gas_disengage=slice(1, 41, 8), brake_disengage=slice(2, 41, 8), steer_override=slice(3, 41, 8),
                 hard_brake_3=slice(4, 41, 8), hard_brake_4=slice(5, 41, 8), hard_brake_5=slice(6, 41, 8),
                 gas_press=slice(7, 41, 8), brake_press=slice(8, 41, 8)),
  48: MetaLayout(engaged=slice(0, 1), gas_disengage=slice(1, 36, 7), brake_disengage=slice(2, 36, 7), steer_override=slice(3, 36, 7),
                 hard_brake_3=slice(4, 36, 7), hard_brake_4=slice(5, 36, 7), hard_brake_5=slice(6, 36, 7),
                 gas_press=slice(7, 36, 7), brake_press=None),
}

def mhp_size(n: int, width: int, selection: int = 1) -> int:
  """Mixture of hypotheses: per hypothesis mean + std of `width` values, plus `selection` logits."""
  return n * (2 * width + selection)

# The stand-in models' output layout, name -> number of floats: vision part first (what a split vision model emits), then policy part.
VISION_SLICES = {"pose": 2 * POSE_WIDTH, "wide_from_device_euler": 2 * WIDE_FROM_DEVICE_WIDTH, "road_transform": 2 * POSE_WIDTH, "hidden_state": FEATURE_LEN}
POLICY_SLICES = {
  "plan": mhp_size(PLAN_MHP_N, IDX_N * PLAN_WIDTH),
  "lane_lines": 2 * NUM_LANE_LINES * IDX_N * LANE_LINES_WIDTH,
  "lane_lines_prob": 2 * NUM_LANE_LINES,
  "road_edges": 2 * NUM_ROAD_EDGES * IDX_N * LANE_LINES_WIDTH,
  "lead": mhp_size(LEAD_MHP_N, LEAD_TRAJ_LEN * LEAD_WIDTH, LEAD_MHP_SELECTION),
  "lead_prob": LEAD_MHP_SELECTION,
  "desire_state": DESIRE_LEN,
  "meta": META_LEN,
  "desire_pred": DESIRE_PRED_LEN * DESIRE_LEN,
  "action": 2,
}

# openpilot's current layout (selfdrive/modeld/compile_modeld.py @55cac784 and the heads its Parser reads): the vision model carries the lanes,
# edges, meta, desire prediction and a single-hypothesis lead (one mean/std pair of 3x6x4) before hidden_state; the policy a
# single-hypothesis plan (one mean/std pair of 33x15), the desire state and two floats of padding
CURRENT_VISION_SLICES = {k: n for k, n in VISION_SLICES.items() if k != "hidden_state"} | {
  "lane_lines": POLICY_SLICES["lane_lines"], "lane_lines_prob": POLICY_SLICES["lane_lines_prob"], "road_edges": POLICY_SLICES["road_edges"],
  "desire_pred": POLICY_SLICES["desire_pred"], "meta": META_LEN, "lead": 2 * LEAD_MHP_SELECTION * LEAD_TRAJ_LEN * LEAD_WIDTH,
  "lead_prob": LEAD_MHP_SELECTION, "hidden_state": FEATURE_LEN}
CURRENT_POLICY_SLICES = {"plan": 2 * IDX_N * PLAN_WIDTH, "desire_state": DESIRE_LEN, "pad": 2}

def slices_of(sizes: dict[str, int], start: int = 0) -> dict[str, slice]:
  out = {}
  for name, size in sizes.items():
    out[name] = slice(start, start + size)
    start += size
  return out
