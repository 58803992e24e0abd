"""Compile the driver camera's warp for the driver-monitoring model into a plain bundle (openpilot's compile_dm_warp.py, without a pickle).

  python -m sunnypilot.modeld_v2.compile_dm_warp --frame 1928,1208,2048,1216,608,4804608 --output dm_warp_1928x1208.bin
  python -m sunnypilot.modeld_v2.compile_dm_warp --frame 1344,760,1408,768,384,2428928 --output dm_warp_1344x760.bin

The bundle takes `frame` (one driver-camera buffer, which dmonitoringmodeld binds by pointer: read in place) and `M_inv` (3, 3), and
makes the model's input_img (1, W*H): the Y plane warped nearest-pixel to the model's W x H (default openpilot's 1440x960), pixels outside
the camera image filled with 16 (--border-fill). dmonitoringmodeld fuses it with dmonitoring_model.bin into one graph per frame; an
artifacts folder holds one per driver-camera geometry (comma 3/3X: 1928x1208, comma 4: 1344x760), any file name ending .bin.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.compile_job import add_compile_flags
from sunnypilot.modeld_v2.compile.warp import add_frame_arguments, check_model_size, frame_arguments
from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
from sunnypilot.modeld_v2.model.camera_frame import parse_frame, parse_size

logger = logging.getLogger(__name__)
# openpilot's compile_dm_warp.py passes border_fill_val=16 to warp_perspective_tinygrad (some of its versions, such as @7850cfad, pass
# none and clamp to the image's edge: --border-fill clamp builds that)
BORDER_FILL = 16

def parse_border_fill(text: str) -> int | None:
  """--border-fill: a pixel value 0-255, or `clamp` (None: the image's edge pixel)."""
  if text == "clamp": return None
  if not text.isdigit() or int(text) > 255: raise argparse.ArgumentTypeError(f"expected a pixel value 0-255 or 'clamp', got {text!r}")
  return int(text)

def compile_dm_warp(frame_spec: str, output: str, warp_to: str = "x".join(map(str, DM_INPUT_SIZE)), border_fill: int | None = BORDER_FILL,
                    beam: int | None = None, log: Callable[[str], None] = logger.info) -> dict:
  """Capture the driver camera's warp for one frame geometry and model size, self-check it, write the bundle. Returns a summary. Fails
  before any work (ArtifactError) when `output` cannot be written or `beam` cannot search here, and (ValueError) on a malformed frame or
  size."""
  from sunnypilot.modeld_v2.compile.compile_job import BundleCompile
  from sunnypilot.modeld_v2.compile.warp import make_dm_warp
  from sunnypilot.modeld_v2.format.warp_inputs import DRIVER_FRAMES, WARP_TRANSFORM
  frame, (model_w, model_h) = parse_frame(frame_spec), parse_size(warp_to)
  check_model_size(model_w, model_h)
  if border_fill is not None and not 0 <= border_fill <= 255: raise ValueError(f"the border fill is a pixel value 0-255, got {border_fill!r}")
  job = BundleCompile(output, (), beam)
  warp = make_dm_warp(frame, model_w, model_h, border_fill)
  specs = dict.fromkeys(DRIVER_FRAMES, ((frame.size,), np.uint8)) | {WARP_TRANSFORM: ((3, 3), np.float32)}
  log(f"capturing the driver camera's warp of {frame.width}x{frame.height} (stride {frame.stride}) frames to {model_w}x{model_h} on {job.device} ...")
  _, part, _ = job.capture(lambda: lambda frame, M_inv: warp(frame, M_inv), lambda: job.random_inputs(specs), fuse_layers=True, log=log)
  metadata = {"kind": "dm_warp", "frame": frame.spec, "model_size": [model_w, model_h], "border_fill": border_fill}
  return job.write(part, specs, {"warped": ((1, model_w * model_h), np.uint8)}, metadata)

@interruptible("compile_dm_warp")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("compile_dm_warp", __doc__)
  add_frame_arguments(parser)
  parser.add_argument("--warp-to", default="x".join(map(str, DM_INPUT_SIZE)), help="the driver-monitoring model's input WxH (default: openpilot's "
                      f"{DM_INPUT_SIZE[0]}x{DM_INPUT_SIZE[1]})")
  parser.add_argument("--border-fill", type=parse_border_fill, default=BORDER_FILL, help="the value of model pixels that fall outside the "
                      f"camera image, 0-255, or 'clamp' for the image's edge pixel (default {BORDER_FILL}, as openpilot's compile_dm_warp.py)")
  add_compile_flags(parser, layers=False)
  args = parser.parse_args(argv)
  frame_arguments(parser, args)
  from sunnypilot.modeld_v2.common.files import ArtifactError
  try: summary = compile_dm_warp(args.frame, args.output, args.warp_to, args.border_fill, beam=args.beam)
  except ArtifactError as e: parser.exit(2, f"compile_dm_warp: error: {e}\n")
  print(f"Saved driver-monitoring warp to {summary['output']} ({summary['kernels']} kernels, {summary['calls']} calls, {summary['bytes']} bytes)")
  return 0

if __name__ == "__main__":
  sys.exit(main())
