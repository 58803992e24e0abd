"""Compile the NV12 camera warp (road + wide cameras) into a plain bundle.

  python -m sunnypilot.modeld_v2.compile_warp --frame 1928,1208,2048,1216,608,4804608 --warp-to 512x256 --output warp.bin [--split-frames]
"""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.compile_job import add_compile_flags
from sunnypilot.modeld_v2.model.calibration import sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame, parse_frame, parse_size

logger = logging.getLogger(__name__)
MAX_MODEL_PIXELS = 4096 * 4096  # a warp's output size: far above openpilot's models (512x256; driver monitoring 1440x960)

def check_model_size(width: int, height: int) -> None:
  """ValueError for a model input no warp should make: what it allocates grows with it, and past this it fails only after the capture."""
  if width * height > MAX_MODEL_PIXELS:
    raise ValueError(f"--warp-to {width}x{height} is more than {MAX_MODEL_PIXELS:,} pixels (openpilot's models take 512x256)")

def compile_warp(frame_spec: str, warp_to: str, output: str, split_frames: bool = False, beam: int | None = None,
                 log: Callable[[str], None] = logger.info) -> dict:
  """Capture the warp for one frame geometry and model size, self-check it, write the bundle. Returns a summary. Fails before any work
  (ArtifactError) when `output` cannot be written or `beam` cannot search here (None: tinygrad's BEAM setting; refused on NULL), and
  (ValueError) on a malformed frame or size."""
  from tinygrad import Tensor

  from sunnypilot.modeld_v2.compile.compile_job import BundleCompile
  from sunnypilot.modeld_v2.compile.warp import make_frame_prepare
  from sunnypilot.modeld_v2.format.warp_inputs import PACKED_FRAMES, WARP_FRAMES, WARP_TRANSFORM
  frame, (model_w, model_h) = parse_frame(frame_spec), parse_size(warp_to)
  check_model_size(model_w, model_h)
  job = BundleCompile(output, (), beam)
  warp = make_frame_prepare(frame, model_w, model_h)
  if split_frames:  # the parameters' names are the bundle's input names (WARP_FRAMES, WARP_TRANSFORM)
    fn = lambda frame, big_frame, M_inv: Tensor.stack(warp(frame, M_inv[0]), warp(big_frame, M_inv[1]))
    specs = dict.fromkeys(WARP_FRAMES, ((frame.size,), np.uint8))
  else:
    fn = lambda input_frame, M_inv: Tensor.stack(*(warp(input_frame[i], M_inv[i]) for i in range(2)))
    specs = {PACKED_FRAMES: ((2, frame.size), np.uint8)}
  specs |= {WARP_TRANSFORM: ((2, 3, 3), np.float32)}
  log(f"capturing the warp of {frame.width}x{frame.height} (stride {frame.stride}) frames to {model_w}x{model_h} on {job.device} ...")
  _, part, _ = job.capture(lambda: fn, lambda: job.random_inputs(specs), fuse_layers=True, log=log)  # no ONNX runners: no layers to bound
  metadata = {"kind": "warp", "frame": frame.spec, "model_size": [model_w, model_h], "split_frames": split_frames}
  return job.write(part, specs, {"warped": ((2, 6, model_h // 2, model_w // 2), np.uint8)}, metadata)

@interruptible("compile_warp")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("compile_warp", __doc__)
  parser.add_argument("--frame", required=True, help="width,height,stride,y_height,uv_height,buffer_size (camerad's layout), "
                      f"e.g. {camerad_frame(1928, 1208).spec} or {camerad_frame(1344, 760).spec}")
  parser.add_argument("--warp-to", required=True, help="model input WxH, e.g. 512x256")
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--split-frames", action="store_true", help="one input per camera (frame, big_frame), bound to the camera buffers by pointer")
  parser.add_argument("--any-camera", action="store_true", help="build for a frame size no comma camera has (modeld runs only comma cameras, "
                      "whose intrinsics it knows: for experiments and tests)")
  add_compile_flags(parser, layers=False)
  args = parser.parse_args(argv)
  try: frame, size = parse_frame(args.frame), parse_size(args.warp_to)
  except ValueError as e: parser.error(str(e))
  try: sensor_for_size(frame.width, frame.height)
  except ValueError as e:
    if not args.any_camera: parser.error(f"{e} (--any-camera builds it anyway)")
  try: check_model_size(*size)
  except ValueError as e: parser.error(str(e))
  from sunnypilot.modeld_v2.common.files import ArtifactError
  try: summary = compile_warp(args.frame, args.warp_to, args.output, args.split_frames, beam=args.beam)
  except ArtifactError as e: parser.exit(2, f"compile_warp: error: {e}\n")
  print(f"Saved warp to {summary['output']} ({summary['kernels']} kernels, {summary['calls']} calls, {summary['bytes']} bytes)")
  return 0

if __name__ == "__main__":
  sys.exit(main())
