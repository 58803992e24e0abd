"""Compile an openpilot driving model (ONNX) of any generation, or its driver-monitoring model, into a plain bundle that takes the warp's output.

  python -m sunnypilot.modeld_v2.compile_modeld --onnx driving.onnx --output driving.bin              # native or supercombo
  python -m sunnypilot.modeld_v2.compile_modeld --vision vision.onnx --policy policy.onnx --output driving.bin
  python -m sunnypilot.modeld_v2.compile_modeld --vision vision.onnx --off-policy off.onnx --on-policy on.onnx --output driving.bin
  python -m sunnypilot.modeld_v2.compile_modeld --onnx dmonitoring_model.onnx --output dmonitoring_model.bin   # driver monitoring

The driver-monitoring model is told by its `input_img` input (the warped driver camera, compile_dm_warp's output); it runs as
`run(input_img=..., calib=..., output_buffers={"outputs": ...})`, its output_slices checked against the heads openpilot's dmonitoringmodeld
parses, and its bundle's metadata kind is `dmonitoring_model` (dmonitoringmodeld reads it, modeld refuses it).

Every bundle runs as `run(new_img=..., desire=..., <host inputs by ONNX name>=..., <states>=..., output_buffers={...})`. Input roles come
from the ONNX's names and shapes. Native models (`new_img` + states): each input X with an output next_X is a state, every other input a
host input. Queued models (supercombo, vision + policy, vision + off-policy + on-policy): the images, the desire history, features_buffer
and prev_desired_curv become openpilot's input queues, compiled in as states (see input_queues); `desire` is this frame's one-hot pulse;
every other input is a host input under its ONNX name and shape. A queued bundle also takes `prepare_only` (1, 1): above 0.5 the queues
that the generation does not push on a prepare-only frame (generations.py) keep their entries, so the frame after a drop is still one
launch. The generation is derived from the ONNX inputs and heads, or given with --generation where more than one or none fits, and recorded
in the bundle. Host inputs are float32, cast in the graph to the model's dtype;
`outputs` is float32 (the models' outputs concatenated in the order given). The bundle also returns `message_floats`: openpilot's output
parse, in the graph (compile/output_parse.py), as the float block modeld copies into modelV2, drivingModelData and cameraOdometry
(model/published_floats.py); --host-parse leaves it out. --precision float16 (the default under FLOAT16=1, as a comma device builds)
computes in half with the same inputs and outputs (compile/precision.py). docs/FORMAT.md has the metadata each bundle carries.
"""
from __future__ import annotations

import functools
import logging
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, file_sha256
from sunnypilot.modeld_v2.compile.compile_job import BundleCompile, add_compile_flags
from sunnypilot.modeld_v2.compile.input_queues import (  # POLICY_INPUTS, derive_frame_skip, make_*_input_queues: the seed's adapter imports them from here
  POLICY_INPUTS,
  QueueError,
  check_frame_skip,
  derive_frame_skip,
  make_split_input_queues,
  make_supercombo_input_queues,
)
from sunnypilot.modeld_v2.compile.model_plan import DMONITORING, Plan, QueuedPlan, add_model_flags, plan_model
from sunnypilot.modeld_v2.compile.onnx_model import ModelError
from sunnypilot.modeld_v2.compile.output_parse import message_floats
from sunnypilot.modeld_v2.compile.precision import OnnxRun, as_dtype
from sunnypilot.modeld_v2.format.bundle import next_name
from sunnypilot.modeld_v2.model.generations import GENERATIONS
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, FloatLayout, trace

if TYPE_CHECKING:
  from tinygrad import Tensor

__all__ = ["compile_model", "main", "make_step",  # then the seed's names (see compat.py)
           "POLICY_INPUTS", "derive_frame_skip", "make_split_input_queues", "make_supercombo_input_queues"]

# *** the compiled step ***

def _write(output_buffers: dict[str, Tensor], values: dict[str, Tensor], parse: Callable[[Tensor], Tensor] | None = None) -> None:
  """Compute every value before writing any buffer, so a caller may alias next_X to X (the part reads X before it writes next_X). `parse`:
  the output vector -> the messages' float block, written into output_buffers[FLOAT_BLOCK] (the in-graph parse, output_parse)."""
  from tinygrad import Tensor
  temps = {k: v.contiguous() for k, v in values.items()}
  Tensor.realize(*temps.values())
  parsed = [output_buffers[FLOAT_BLOCK].assign(parse(temps["outputs"]))] if parse is not None else []
  Tensor.realize(*(output_buffers[k].assign(t) for k, t in temps.items()), *parsed)

def make_step(plan: Plan, runners: dict[str, OnnxRun], floats: FloatLayout | None = None) -> Callable[..., None]:
  """The function TinyJit captures for a plan, with an OnnxRunner per model; with `floats`, the output parse in the graph too (output_parse:
  the messages' float block of that layout, as the output FLOAT_BLOCK)."""
  parse = functools.partial(message_floats, slices=plan.slices, layout=floats) if floats is not None else None
  if not isinstance(plan, QueuedPlan):
    def native(output_buffers: dict[str, Tensor], **inputs: Tensor) -> None:
      out = runners["model"]({name: as_dtype(inputs[name], dtype) for name, dtype in plan.dtypes["model"].items()})
      _write(output_buffers, {k: as_dtype(out[k], plan.out_specs[k][1]) for k in output_buffers if k != FLOAT_BLOCK}, parse)
    return native

  def run(model: str, values: dict[str, Tensor]) -> Tensor:
    """One model on the values of its inputs, cast to its dtypes; its output read, as float32, computed once."""
    feeds = {name: as_dtype(values[name], dtype) for name, dtype in plan.dtypes[model].items()}
    return as_dtype(runners[model](feeds)[plan.outputs[model]], np.float32).contiguous()

  queues, runs = plan.queues, [functools.partial(run, k) for k in plan.paths]
  def queued(output_buffers: dict[str, Tensor], new_img: Tensor, prepare_only: Tensor, **inputs: Tensor) -> None:
    state = {name: inputs.pop(name) for name in queues.queues}
    out, new = queues.step(state, new_img, prepare_only, inputs, runs)
    _write(output_buffers, {"outputs": out} | {next_name(name): q for name, q in new.items()}, parse)
  return queued

# *** compile ***

logger = logging.getLogger(__name__)

def compile_model(output: str, onnx: str | None = None, vision: str | None = None, policy: str | None = None, frame_skip: int | None = None,
                  off_policy: str | None = None, on_policy: str | None = None, log: Callable[[str], None] = logger.info, beam: int | None = None,
                  fuse_layers: bool = False, generation: str | None = None, host_parse: bool = False, precision: str | None = None) -> dict:
  """Compile one ONNX (native or supercombo), a vision + policy pair or a vision + off-policy + on-policy triple into a bundle at `output`.
  Returns a summary. Fails before any work when `output` cannot be written or `beam` cannot search here. `beam`: search every kernel
  with BEAM on this device (None: tinygrad's BEAM setting). `fuse_layers`: no realize point per layer (see bundle_compile.layer_boundaries).
  `generation`: the model's generation (generations.GENERATIONS) when its ONNX does not tell. `host_parse`: leave the output parse out of
  the graph (modeld parses on the host, as with bundles built before the parse was in the graph). `precision`: float32 or float16
  (compile/precision.py; None: float16 when the environment sets FLOAT16=1, else float32)."""
  job = BundleCompile(output, (onnx, vision, policy, off_policy, on_policy), beam, precision)
  plan = plan_model(onnx, vision, policy, off_policy, on_policy, frame_skip, generation)
  frame_skip = plan.queues.frame_skip if isinstance(plan, QueuedPlan) else None
  log(f"{plan.layout} ({', '.join(f'{k} {p}' for k, p in plan.paths.items())}), generation {plan.generation} ({plan.generation_source}), "
      f"frame_skip {frame_skip}, {job.precision}, on {job.device}")
  try: floats = None if host_parse or plan.layout == DMONITORING else trace(plan.slices)  # driverStateV2 parses on the host
  except ValueError as e: raise ModelError(f"{', '.join(plan.paths.values())}: the output parse cannot go in the graph: {e} (--host-parse)") from None
  if floats is not None and not len(floats.sources): floats = None  # no head the messages publish: nothing for the graph to parse
  out_specs = plan.out_specs | ({FLOAT_BLOCK: ((len(floats.sources),), np.float32)} if floats is not None else {})
  jit, part, inputs = job.capture(lambda: make_step(plan, {k: job.onnx_runner(p) for k, p in plan.paths.items()}, floats),
                                  lambda: job.random_inputs(plan.specs) | {"output_buffers": job.random_inputs(out_specs)}, fuse_layers, log)
  metadata = {"kind": "dmonitoring_model" if plan.layout == DMONITORING else "model", "layout": plan.layout, "generation": plan.generation,
              "generation_source": plan.generation_source,
              "layer_boundaries": not fuse_layers,
              "frame_skip": frame_skip, "output_slices": plan.slices, "input_roles": plan.input_roles,
              "onnx_roles": plan.roles, "input_shapes": {n: list(s) for n, s in plan.input_shapes.items()},
              "output_shapes": {k: list(s) for k, (s, _) in plan.out_specs.items()},
              FLOAT_BLOCK: floats.to_json() if floats is not None else None,
              "stand_in": plan.metadata.get("stand_in"), "sources": {k: os.path.basename(p) for k, p in plan.paths.items()},
              "source_sha256": {k: file_sha256(p) for k, p in (("onnx", onnx), ("vision", vision), ("policy", policy), ("off_policy", off_policy),
                                                               ("on_policy", on_policy)) if p}}  # by compile_model keyword, as the flags name them
  summary = job.write(part, plan.specs, out_specs, metadata) | {"layout": plan.layout, "jit": jit, "part": part, "inputs": inputs}
  log(f"wrote {output}: {summary['kernels']} kernels ({summary['programs']} programs), {summary['weight_bytes'] / 1e6:.1f} MB weights, "
      f"{summary['bytes'] / 1e6:.1f} MB bundle, {summary['compile_s']:.1f} s" + (f"  [{plan.metadata['stand_in']}]" if plan.metadata.get("stand_in") else ""))
  return summary

@interruptible("compile_modeld")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("compile_modeld", __doc__)
  add_model_flags(parser)
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--generation", choices=tuple(GENERATIONS), help="the model's generation, which decides modeld's rules (curvature source, "
                      "prev_desired_curv feed, smoothing, prepare-only pushes; see README). Default: derived from the ONNX inputs and heads; "
                      "required when they fit none or several")
  parser.add_argument("--host-parse", action="store_true", help="leave openpilot's output parse out of the model's graph: modeld then parses "
                      "the output vector in Python each frame, as for bundles built before the parse was in the graph (for comparison)")
  parser.add_argument("--frame-skip", help="frames between the queues' samples, at least 1 (default: the ONNX's frame_skip, else 1 for a "
                      "features_buffer of >= 99 entries, else 4)")
  add_compile_flags(parser)
  args = parser.parse_args(argv)
  try:
    frame_skip = None if args.frame_skip is None else check_frame_skip(args.frame_skip, "--frame-skip")
    compile_model(args.output, args.onnx, args.vision, args.policy, frame_skip, args.off_policy, args.on_policy,
                  log=logger.info, beam=args.beam, fuse_layers=args.fuse_layers, generation=args.generation, host_parse=args.host_parse,
                  precision=args.precision)
  except (ModelError, QueueError, ArtifactError) as e:
    parser.exit(2, f"compile_modeld: error: {e}\n")
  return 0

if __name__ == "__main__":
  sys.exit(main())
