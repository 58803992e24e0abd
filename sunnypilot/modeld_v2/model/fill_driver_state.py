"""Parsed driver-monitoring outputs -> the fields of driverStateV2, as openpilot's dmonitoringmodeld fills them.

Mirrors get_driverstate_packet and fill_driver_data of sunnypilot selfdrive/modeld/dmonitoringmodeld.py (sunnypilot/sunnypilot @41dea5d4,
the `current` layout) and openpilot selfdrive/modeld/dmonitoringmodeld.py (commaai/openpilot @084747c, the `sleep` layout, and @63cf2e70,
the `previous` one): one field per line in their order, as {dotted path: value}. The message's `valid` is the daemon's (finite outputs), not a field here.
"""
from __future__ import annotations

import numpy as np

from sunnypilot.modeld_v2.model.message_fields import Fields

# a probability head -> its DriverData field (openpilot's fill_driver_data)
PROB_FIELDS = {"face_prob": "faceProb", "eyes_visible_prob": "eyesVisibleProb", "eyes_closed_prob": "eyesClosedProb", "left_eye_prob": "leftEyeProb",
               "right_eye_prob": "rightEyeProb", "left_blink_prob": "leftBlinkProb", "right_blink_prob": "rightBlinkProb",
               "sunglasses_prob": "sunglassesProb", "using_phone_prob": "phoneProb", "sleep_prob": "sleepProb"}
DRIVER_DATA = {"lhd": "leftDriverData", "rhd": "rightDriverData"}

def driver_state_fields(p: dict[str, np.ndarray], probs: tuple[str, ...], frame_id: int, execution_time: float, gpu_execution_time: float,
                        raw: bytes = b"") -> Fields:
  """driverStateV2's fields of one frame from the parse `p` of a layout reading the probability heads `probs`; `raw`: the output vector's
  bytes (openpilot's SEND_RAW_PRED), else empty."""
  f: Fields = {}
  f["frameId"] = frame_id
  f["modelExecutionTime"] = execution_time
  f["gpuExecutionTime"] = gpu_execution_time
  f["rawPredictions"] = raw
  f["wheelOnRightProb"] = float(p["wheel_on_right"][0])
  for side, data in DRIVER_DATA.items():
    descs, stds = p[f"face_descs_{side}"], p[f"face_descs_{side}_std"]
    f[f"{data}.faceOrientation"] = descs[:3]
    f[f"{data}.faceOrientationStd"] = stds[:3]
    f[f"{data}.facePosition"] = descs[3:5]
    f[f"{data}.facePositionStd"] = stds[3:5]
    for key in probs: f[f"{data}.{PROB_FIELDS[key]}"] = float(p[f"{key}_{side}"][0])
  return f
