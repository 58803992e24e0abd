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
from sunnypilot.modeld_v2.compile.warp import add_frame_arguments, check_model_size, frame_arguments
from sunnypilot.modeld_v2.model.camera_frame import parse_frame, parse_size

logger = logging.getLogger(__name__)

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
  fn: Callable[..., Tensor]
  specs: dict[str, tuple[tuple[int, ...], type[np.generic]]]
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
  add_frame_arguments(parser)
  parser.add_argument("--warp-to", required=True, help="model input WxH, e.g. 512x256")
  parser.add_argument("--split-frames", action="store_true", help="one input per camera (frame, big_frame), bound to the camera buffers by pointer")
  add_compile_flags(parser, layers=False)
  args = parser.parse_args(argv)
  frame_arguments(parser, args)
  from sunnypilot.modeld_v2.common.files import ArtifactError
  try: summary = compile_warp(args.frame, args.warp_to, args.output, args.split_frames, beam=args.beam)
  except ArtifactError as e: parser.exit(2, f"compile_warp: error: {e}\n")
  print(f"Saved warp to {summary['output']} ({summary['kernels']} kernels, {summary['calls']} calls, {summary['bytes']} bytes)")
  return 0

if __name__ == "__main__":
  sys.exit(main())
