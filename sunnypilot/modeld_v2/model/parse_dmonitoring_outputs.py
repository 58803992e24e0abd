"""The driver-monitoring model's raw output vector -> named arrays, with openpilot's activation for each head it reads.

Mirrors the parse of three dmonitoringmodeld.py versions, one per output layout (the bundle's output_slices say which):
- `current`: sunnypilot selfdrive/modeld/dmonitoringmodeld.py (sunnypilot/sunnypilot @41dea5d4, openpilot's DM model with eyes-visible and
  eyes-closed heads; commaai's log.capnp moved the per-eye fields of DriverStateV2.DriverData into `deprecated` for it):
  face_prob, eyes_visible_prob, eyes_closed_prob, using_phone_prob per driver side.
- `sleep`: openpilot selfdrive/modeld/dmonitoringmodeld.py (commaai/openpilot @084747c, today's; sunnypilot master merged it): the
  `previous` heads and sleep_prob per driver side (driverStateV2's sleepProb, which driver monitoring's policy reads).
- `previous`: openpilot selfdrive/modeld/dmonitoringmodeld.py (commaai/openpilot @63cf2e70): face_prob, left/right_eye_prob,
  left/right_blink_prob, sunglasses_prob, using_phone_prob per driver side.
Both: wheel_on_right through sigmoid; per side (`lhd`, `rhd`: a driver on the left, on the right) `face_descs_<side>` of 12 values, the
first 6 the face orientation (3) and position (3), the last 6 their log-stds through safe_exp; every probability head through sigmoid.
Other heads (the 512 features, poor_vision, ...) are not read. Arrays carry no batch axis.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from sunnypilot.modeld_v2.model.parse_model_outputs import safe_exp, sigmoid

DRIVER_SIDES = ("lhd", "rhd")
FACE_DESCS_LEN, FACE_DESCS_STDS = 12, 6  # orientation 3, position 3, then their 6 log-stds
DM_LAYOUTS = {
  "current": ("face_prob", "eyes_visible_prob", "eyes_closed_prob", "using_phone_prob"),
  "sleep": ("face_prob", "left_eye_prob", "right_eye_prob", "left_blink_prob", "right_blink_prob", "sunglasses_prob", "using_phone_prob", "sleep_prob"),
  "previous": ("face_prob", "left_eye_prob", "right_eye_prob", "left_blink_prob", "right_blink_prob", "sunglasses_prob", "using_phone_prob"),
}  # in the order dm_layout tries them: `sleep` holds every head of `previous`

def dm_heads(layout: str) -> dict[str, int]:
  """{head: its length} of every head a layout's parse reads."""
  heads = {"wheel_on_right": 1}
  for side in DRIVER_SIDES: heads |= {f"face_descs_{side}": FACE_DESCS_LEN} | {f"{key}_{side}": 1 for key in DM_LAYOUTS[layout]}
  return heads

def dm_layout(slices: Mapping[str, Sequence[int]]) -> str:
  """The layout whose heads the output_slices name, `current` first; ValueError naming what the nearest one misses."""
  missing = {layout: [head for head in dm_heads(layout) if head not in slices] for layout in DM_LAYOUTS}
  if found := [layout for layout, gaps in missing.items() if not gaps]: return found[0]
  layout = min(missing, key=lambda k: len(missing[k]))
  raise ValueError(f"the driver-monitoring heads are not all there: {', '.join(missing[layout])} missing (openpilot's {layout} layout reads "
                   f"{', '.join(dm_heads(layout))})")

def check_dm_heads(slices: Mapping[str, Sequence[int]]) -> None:
  """Raise ValueError unless output_slices ({name: [start, stop]}, its structure checked) hold every head of a layout, each as long as the
  parse reads it: checked when the model is compiled and when its bundle is read, not in the middle of a drive."""
  for name, size in dm_heads(dm_layout(slices)).items():
    start, stop = slices[name]
    if stop - start != size: raise ValueError(f"{name} has {stop - start} values, openpilot's driver-monitoring parse reads {size}")

class DMOutputParser:
  """The parse of one output_slices layout: the model's (1, N) outputs -> {head: array} after openpilot's activations; `face_descs_<side>`
  holds the 6 means and `face_descs_<side>_std` the 6 stds."""
  def __init__(self, slices: Mapping[str, Sequence[int]]):
    check_dm_heads(slices)
    self.layout = dm_layout(slices)
    self.slices = {name: slice(int(slices[name][0]), int(slices[name][1])) for name in dm_heads(self.layout)}
    self.probs = DM_LAYOUTS[self.layout]

  def __call__(self, outputs: np.ndarray) -> dict[str, np.ndarray]:
    vec = np.asarray(outputs, np.float32).reshape(-1)
    parsed = {"wheel_on_right": sigmoid(vec[self.slices["wheel_on_right"]])}
    for side in DRIVER_SIDES:
      descs = vec[self.slices[f"face_descs_{side}"]]
      parsed[f"face_descs_{side}"], parsed[f"face_descs_{side}_std"] = descs[:-FACE_DESCS_STDS], safe_exp(descs[-FACE_DESCS_STDS:])
      for key in self.probs: parsed[f"{key}_{side}"] = sigmoid(vec[self.slices[f"{key}_{side}"]])
    return parsed
