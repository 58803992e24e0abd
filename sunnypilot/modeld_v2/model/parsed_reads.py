"""The parsed values the driving state reads each frame (daemon/driving_state.py): views that the parse refills in place, taken once per
model, from the host parse's dict (`ParsedReads.of`) or from the in-graph parse's float block (published_floats.FloatLayout.reads_of),
so the action, FCW, confidence and lane change are computed the same way from either."""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from sunnypilot.modeld_v2.model.constants import META_LAYOUTS, Plan

class ParsedReads(NamedTuple):
  speeds: np.ndarray | None  # the plan's forward speed at T_IDXS (33); None without a plan head
  accels: np.ndarray | None  # its forward acceleration (33): the first is read
  yaws: np.ndarray | None  # its yaw (orientation z, 33)
  yaw_rates: np.ndarray | None  # its yaw rate (33): the first is read
  positions: np.ndarray | None  # its position as (3, 33) rows x, y, z: the path fitted to it overflows float32 past POLY_PATH_LIMIT
  desired_curvature: np.ndarray | None  # the desired_curvature head's mean (1,)
  action: np.ndarray | None  # the action head as it is (2,): lateral acceleration, acceleration (today's openpilot acts on it)
  lat_planner: np.ndarray | None  # lat_planner_solution's yaw and curvature over T_IDXS (2, 33)
  hard_brake_5: np.ndarray | None  # meta's 5 m/s2 hard-brake probabilities (the first, 2 s ahead, is read); None without a known meta layout
  hard_brake_3: np.ndarray | None  # meta's 3 m/s2 ones
  gas: np.ndarray | None  # the disengage probabilities per 2 s slice (5)
  brake: np.ndarray | None
  steer: np.ndarray | None
  desire_state: np.ndarray | None  # the softmax of the desire state (8)

  @staticmethod
  def of(parsed: dict[str, np.ndarray]) -> ParsedReads:
    """The views of a parse's dict (OutputParser's: the same views on every call, so once per model does)."""
    plan, meta = parsed.get("plan"), parsed.get("meta")
    columns = (plan[:, Plan.VELOCITY][:, 0], plan[:, Plan.ACCELERATION][:, 0], plan[:, Plan.T_FROM_CURRENT_EULER][:, 2],
               plan[:, Plan.ORIENTATION_RATE][:, 2], plan[:, Plan.POSITION].T) if plan is not None else (None, None, None, None, None)
    layout = META_LAYOUTS.get(len(meta)) if meta is not None else None
    disengage = (meta[layout.hard_brake_5], meta[layout.hard_brake_3], meta[layout.gas_disengage], meta[layout.brake_disengage],
                 meta[layout.steer_override]) if layout is not None and meta is not None else (None, None, None, None, None)
    solution = parsed.get("lat_planner_solution")
    return ParsedReads._make((*columns, parsed.get("desired_curvature"), parsed.get("action"), solution[:, 2:4].T if solution is not None else None,
                              *disengage, parsed.get("desire_state")))
