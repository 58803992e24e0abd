"""openpilot's rules on bundles, which the format's reader knows nothing of, registered with it (the package does so on import): every
bundle read or written is held to them as to the reader's own checks."""
from __future__ import annotations

import numpy as np

from sunnypilot.modeld_v2.format.bundle import ExtrasJSON, Metadata, check_output_slices, register_metadata_check
from sunnypilot.modeld_v2.format.fields import expect, ints
from sunnypilot.modeld_v2.format.warp_inputs import DRIVER_FRAMES, PACKED_FRAMES, WARP_FRAMES, WARP_TRANSFORM
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, parse_frame, parse_size
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import check_dm_heads
from sunnypilot.modeld_v2.model.parse_model_outputs import check_head_sizes
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, check_recorded

def warp_geometry(meta: Metadata) -> tuple[NV12Frame, tuple[int, int]]:
  """A warp's frame, a camera layout, and its model size, even and positive."""
  frame_spec, size = expect(meta.get("frame"), str, "warp frame"), ints(meta.get("model_size"), "warp model_size")
  try: frame = parse_frame(frame_spec)
  except ValueError as e: raise ValueError(f"warp frame: {e}") from None
  try: return frame, parse_size("x".join(map(str, size)))
  except ValueError as e: raise ValueError(f"warp model_size: {e}") from None

def check_warp(extras: ExtrasJSON) -> None:
  """A warp's geometry (warp_geometry) and frame inputs that hold its frame (what compile_warp declares)."""
  meta, inputs = extras["metadata"], extras.get("input_specs", {})
  frame, _ = warp_geometry(meta)
  split = expect(meta.get("split_frames"), bool, "warp split_frames")
  frames = dict.fromkeys(WARP_FRAMES, [frame.size]) if split else {PACKED_FRAMES: [2, frame.size]}
  if (got := {name: inputs[name][0] if name in inputs else None for name in frames}) != frames:
    raise ValueError(f"the warp's frame inputs {got} do not hold {frame.spec} frames")

def check_model(extras: ExtrasJSON) -> None:
  """A model's output_slices name each openpilot head with a size openpilot's parse reads; the float block its graph parses into, where it
  has one, is a layout its output holds."""
  if "output_slices" in (meta := extras["metadata"]):
    try: check_head_sizes(meta["output_slices"])
    except ValueError as e: raise ValueError(f"output_slices: {e}") from None
  if meta.get(FLOAT_BLOCK) is not None: check_recorded(meta[FLOAT_BLOCK], extras.get("output_specs", {}).get(FLOAT_BLOCK, [None])[0])

def check_dm_warp(extras: ExtrasJSON) -> None:
  """A driver-monitoring warp (compile_dm_warp): its geometry, a border fill (a pixel value, or null: clamped), one frame input that holds
  its frame, a (3, 3) transform, and the model input it makes, (1, W*H)."""
  meta, inputs, outputs = extras["metadata"], extras.get("input_specs", {}), extras.get("output_specs", {})
  frame, (w, h) = warp_geometry(meta)
  if (fill := meta.get("border_fill")) is not None and not 0 <= expect(fill, int, "dm_warp border_fill") <= 255:
    raise ValueError(f"dm_warp border_fill {fill} is not a pixel value 0-255")
  want = dict.fromkeys(DRIVER_FRAMES, [frame.size]) | {WARP_TRANSFORM: [3, 3]}
  if (got := {name: inputs[name][0] if name in inputs else None for name in set(inputs) | set(want)}) != want:
    raise ValueError(f"the driver-monitoring warp's inputs {got} are not {want} ({frame.spec} frames)")
  if (made := outputs.get("warped", [None])[0]) != [1, w * h]: raise ValueError(f"the driver-monitoring warp makes {made}, not [1, {w * h}] ({w}x{h})")

def check_dmonitoring_model(extras: ExtrasJSON) -> None:
  """A driver-monitoring model (compile_modeld of openpilot's DM ONNX): output_slices into its `outputs`, with every head of one of
  openpilot's layouts as long as the parse reads it."""
  meta = extras["metadata"]
  if "output_slices" not in meta: raise ValueError("a driver-monitoring model needs output_slices: the heads dmonitoringmodeld parses")
  outputs = extras.get("output_specs", {}).get("outputs")
  if outputs is None or not outputs[0]: raise ValueError("a driver-monitoring model needs an `outputs` output spec")
  try: check_output_slices(meta["output_slices"], int(np.prod(outputs[0], dtype=object))); check_dm_heads(meta["output_slices"])
  except ValueError as e: raise ValueError(f"output_slices: {e}") from None

def register() -> None:
  register_metadata_check("warp", check_warp)
  register_metadata_check("model", check_model)
  register_metadata_check("dm_warp", check_dm_warp)
  register_metadata_check("dmonitoring_model", check_dmonitoring_model)
