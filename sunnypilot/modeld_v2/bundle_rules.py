"""openpilot's rules on bundles, which the format's reader knows nothing of, registered with it (the package does so on import): every
bundle read or written is held to them as to the reader's own checks."""
from __future__ import annotations

from sunnypilot.modeld_v2.format.bundle import register_metadata_check
from sunnypilot.modeld_v2.format.part import expect, ints
from sunnypilot.modeld_v2.format.warp_inputs import PACKED_FRAMES, WARP_FRAMES
from sunnypilot.modeld_v2.model.camera_frame import parse_frame, parse_size
from sunnypilot.modeld_v2.model.parse_model_outputs import check_head_sizes
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, check_recorded

def check_warp(extras: dict) -> None:
  """A warp's frame is a camera layout, its model size even and positive, and its frame inputs hold that frame (what compile_warp declares)."""
  meta, inputs = extras["metadata"], extras.get("input_specs", {})
  frame_spec, size = expect(meta.get("frame"), str, "warp frame"), ints(meta.get("model_size"), "warp model_size")
  split = expect(meta.get("split_frames"), bool, "warp split_frames")
  try: frame = parse_frame(frame_spec)
  except ValueError as e: raise ValueError(f"warp frame: {e}") from None
  try: parse_size("x".join(map(str, size)))
  except ValueError as e: raise ValueError(f"warp model_size: {e}") from None
  frames = dict.fromkeys(WARP_FRAMES, [frame.size]) if split else {PACKED_FRAMES: [2, frame.size]}
  if (got := {name: inputs[name][0] if name in inputs else None for name in frames}) != frames:
    raise ValueError(f"the warp's frame inputs {got} do not hold {frame.spec} frames")

def check_model(extras: dict) -> None:
  """A model's output_slices name each openpilot head with a size openpilot's parse reads; the float block its graph parses into, where it
  has one, is a layout its output holds."""
  if "output_slices" in (meta := extras["metadata"]):
    try: check_head_sizes(meta["output_slices"])
    except ValueError as e: raise ValueError(f"output_slices: {e}") from None
  if meta.get(FLOAT_BLOCK) is not None: check_recorded(meta[FLOAT_BLOCK], extras.get("output_specs", {}).get(FLOAT_BLOCK, [None])[0])

def register() -> None:
  register_metadata_check("warp", check_warp)
  register_metadata_check("model", check_model)
