"""Each driving-model generation's own rules, in one table the compiler and the daemon both read.

sunnypilot's modeld_v2 keys these on the model bundle's generation number (sunnypilot/modeld_v2/modeld.py @13ce8664: `mlsim` is
generation >= 11, the curvature smoothing and low-speed hold apply from generation 10 on; fill_model_msg.py @d671ce18
get_curvature_from_output: an mlsim model's curvature comes from its plan even when it has a desired_curvature head; modeld.py
`process_desired_curvature`: an mlsim model is fed zeros as prev_desired_curv). This project names generations by their I/O layout; the
table below states, per name, what those numbers decide. What a prepare-only frame (the one after a drop) pushes follows openpilot:
selfdrive/modeld/modeld.py @6c6be47b and @00731a68 (0.9.x) push the desire before the prepare-only return and features and
prev_desired_curv only after the run; compile_modeld.py @55cac784 (0.10 on) pushes only the images on a prepare-only frame; today's
openpilot (@084747c, whose model is supercombo_action's one ONNX, and the native models after it) has no prepare-only frame. sunnypilot's
modeld_v2 @13ce8664 pushes the desire on every frame of every generation; for 0.10 and later this follows openpilot, whose models were
trained with that history.

A bundle records its generation (compile_modeld derives it from the ONNX inputs and heads where one generation fits, else --generation);
a bundle built before generations were recorded is read by the same derivation from the layout, input shapes and output slices it carries.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sunnypilot.modeld_v2.model.parse_model_outputs import mdn_layout

@dataclass(frozen=True)
class Rules:
  """What a generation's daemon and queues do differently."""
  curvature_from_plan: bool  # the action's curvature from the plan even with a desired_curvature head (sunnypilot mlsim)
  feeds_prev_curvature: bool  # prev_desired_curv sees the curvature history; False: zeros (sunnypilot mlsim)
  smooth_and_hold: bool  # curvature smoothed against the last one, and held below MIN_LAT_CONTROL_SPEED (sunnypilot generation >= 10)
  prepare_pushes_desire: bool  # a prepare-only frame pushes the desire pulse (openpilot before 0.10); images are always pushed
  about: str
  every_frame: bool = False  # no prepare-only frames: the frame after a drop runs a full step and is published (openpilot #38252)
  todays_action: bool = False  # the action as today's openpilot makes it: the action head when the model has one, the stop from the
  # acceleration, action times under MIN_STABLE_DELAY read at that delay and scaled (modeld.py and drive_helpers.py @084747c)

# The openpilot 0.9.x supercombo predates the post-FOF smoothing; 0.9.7-0.9.9 split models are post-FOF (sunnypilot generation 10); the
# 0.10 models on are mlsim (sunnypilot generation 11 and later).
PRE_FOF = Rules(False, True, False, True, "0.9.x: desired_curvature head, fed back, no smoothing or hold; desire pushed on prepare-only")
POST_FOF = Rules(False, True, True, True, "0.9.7-0.9.9: desired_curvature head, fed back, smoothed and held; desire pushed on prepare-only")
MLSIM = Rules(True, False, True, False, "0.10 on: curvature from the plan, prev_desired_curv zeros, smoothed and held; only images on prepare-only")
# today's openpilot (selfdrive/modeld/modeld.py @084747c) runs and publishes every frame: prepare-only frames went in #38252 (2026-06-29)
TODAY = Rules(True, False, True, False, "today's: the action from its action head (else the plan), smoothed and held, stop from the "
              "acceleration; prev_desired_curv zeros; every frame published", every_frame=True, todays_action=True)
GENERATIONS: dict[str, Rules] = {
  "native": TODAY,
  "supercombo_20hz": PRE_FOF,
  "split_09": POST_FOF,
  "split_010": MLSIM,
  "split_action": MLSIM,
  "supercombo_action": TODAY,
  "multi_policy": MLSIM,
  "split_current": MLSIM,
}

class GenerationError(ValueError):
  """No generation, or more than one, fits a model: name it."""

def candidates(layout: str, input_shapes: Mapping[str, Sequence[int]], slices: Mapping[str, Sequence[int]]) -> list[str]:
  """The generations whose inputs and heads fit a model: its layout (model_plan.LAYOUTS), every ONNX input's shape, its output slices."""
  names, plan = set(input_shapes), slices.get("plan")
  features = input_shapes.get("features_buffer")
  single_plan = plan is not None and mdn_layout("plan", plan[1] - plan[0])[1] == 1  # today's policies: one mean/std pair, no hypotheses
  fits = {
    "native": layout == "native",
    "supercombo_20hz": layout == "supercombo" and features is not None and features[1] >= 99,
    "supercombo_action": layout == "supercombo" and "action_t" in names and (features is None or features[1] < 99),
    "split_09": layout == "split" and "lateral_control_params" in names,
    "split_action": layout == "split" and "action_t" in names,
    "split_010": layout == "split" and not {"lateral_control_params", "action_t"} & names and not single_plan,
    "split_current": layout == "split" and not {"lateral_control_params", "action_t"} & names and single_plan,
    "multi_policy": layout == "multi_policy",
  }
  return [name for name, fit in fits.items() if fit]

def derive(layout: str, input_shapes: Mapping[str, Sequence[int]], slices: Mapping[str, Sequence[int]], given: str | None = None) -> str:
  """The generation of a model: `given` (checked) if any, else the one generation that fits; GenerationError otherwise."""
  if given is not None:
    if given not in GENERATIONS: raise GenerationError(f"--generation must be one of {', '.join(GENERATIONS)}, got {given!r}")
    return given
  fits = candidates(layout, input_shapes, slices)
  if len(fits) == 1: return fits[0]
  what = f"fits {' and '.join(fits)}" if fits else "fits no known generation"
  raise GenerationError(f"the model's inputs and heads ({layout}: {', '.join(sorted(input_shapes))}) {what}: give --generation, one of "
                        f"{', '.join(GENERATIONS)}")

def of_bundle(metadata: dict) -> tuple[str, str]:
  """(generation, where it came from) of a model bundle's metadata; a bundle without one is derived from what it records."""
  if isinstance(metadata.get("generation"), str) and metadata["generation"] in GENERATIONS:
    return metadata["generation"], "recorded, given with --generation" if metadata.get("generation_source") == "--generation" else "recorded, from the ONNX"
  try: return derive(metadata.get("layout", ""), metadata.get("input_shapes", {}), metadata.get("output_slices", {})), "derived: the bundle records none"
  except GenerationError: return "split_010", "a default (split_010): the bundle records none and its inputs fit no one generation"
