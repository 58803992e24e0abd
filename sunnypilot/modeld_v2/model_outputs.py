"""The driving model's output vector: named slices (ONNX `output_slices`) and their shapes, as openpilot lays them out.

The stand-in models are generated with this layout; the daemon parses outputs by the slices stored in each bundle.
"""
from __future__ import annotations

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
