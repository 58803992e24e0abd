"""Compile the NV12 camera warp (road + wide cameras) into a plain bundle.

  python -m sunnypilot.modeld_v2.compile_warp --frame 1928,1208,2048,1216,608,4804608 --warp-to 512x256 --output warp.bin [--split-frames]
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

import numpy as np

from sunnypilot.modeld_v2.cli import interruptible, non_negative_int
from sunnypilot.modeld_v2.warp import camerad_frame, parse_frame, parse_size

logger = logging.getLogger(__name__)

def compile_warp(frame_spec: str, warp_to: str, output: str, split_frames: bool = False, seed: int = 42, beam: int | None = None,
                 log: Callable[[str], None] = logger.info) -> dict:
  """Capture the warp for one frame geometry and model size, self-check it, write the bundle. Returns a summary.
  `beam`: search the kernels with BEAM on this device (None: tinygrad's BEAM setting); refused on NULL before any work."""
  from tinygrad import Device, Tensor

  from sunnypilot.modeld_v2.bundle import write_bundle
  from sunnypilot.modeld_v2.capture import capture_part, compile_session, search_level
  from sunnypilot.modeld_v2.warp import PACKED_FRAMES, WARP_FRAMES, WARP_TRANSFORM, make_frame_prepare
  level = search_level(beam)
  frame, (model_w, model_h) = parse_frame(frame_spec), parse_size(warp_to)
  warp = make_frame_prepare(frame, model_w, model_h)
  rng, dev = np.random.default_rng(seed), Device.DEFAULT
  def make_inputs() -> dict:
    frames, m_inv = rng.integers(0, 256, (2, frame.size), dtype=np.uint8), Tensor((rng.standard_normal((2, 3, 3)) * 8).astype(np.float32), device=dev)
    if split_frames: return {WARP_FRAMES[i]: Tensor(frames[i], device=dev).realize() for i in range(2)} | {WARP_TRANSFORM: m_inv.realize()}
    return {PACKED_FRAMES: Tensor(frames, device=dev).realize(), WARP_TRANSFORM: m_inv.realize()}
  if split_frames:  # the parameters' names are the bundle's input names (WARP_FRAMES, WARP_TRANSFORM)
    fn = lambda frame, big_frame, M_inv: Tensor.stack(warp(frame, M_inv[0]), warp(big_frame, M_inv[1]))
    specs = dict.fromkeys(WARP_FRAMES, ((frame.size,), "|u1", dev))
  else:
    fn = lambda input_frame, M_inv: Tensor.stack(*(warp(input_frame[i], M_inv[i]) for i in range(2)))
    specs = {PACKED_FRAMES: ((2, frame.size), "|u1", dev)}
  log(f"capturing the warp of {frame.width}x{frame.height} (stride {frame.stride}) frames to {model_w}x{model_h} on {dev} ...")
  with compile_session() as null_holds_data: part = capture_part(fn, make_inputs, null_holds_data=null_holds_data, beam=level, log=log).part
  specs |= {WARP_TRANSFORM: ((2, 3, 3), "<f4", dev)}
  out_shape = (2, 6, model_h // 2, model_w // 2)
  metadata = {"kind": "warp", "frame": frame.spec, "model_size": [model_w, model_h], "split_frames": split_frames}
  size = write_bundle(output, {"run": part}, {"input_specs": specs, "output_specs": {"warped": (out_shape, "|u1", dev)}, "metadata": metadata},
                      flags={"BEAM": level})
  calls = part[0].calls
  return {"output": output, "kernels": sum(c.kind == "program" for c in calls), "calls": len(calls), "bytes": size}

@interruptible("compile_warp")
def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--frame", required=True, help="width,height,stride,y_height,uv_height,buffer_size (camerad's layout), "
                      f"e.g. {camerad_frame(1928, 1208).spec} or {camerad_frame(1344, 760).spec}")
  parser.add_argument("--warp-to", required=True, help="model input WxH, e.g. 512x256")
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--split-frames", action="store_true", help="one input per camera (frame, big_frame), bound to the camera buffers by pointer")
  parser.add_argument("--beam", type=non_negative_int, help="search each kernel's optimizations with tinygrad's BEAM of this width on this device (slow once: "
                      "tinygrad caches the searches); the bundle then ships the searched kernels. Default: the BEAM environment setting, else 0")
  args = parser.parse_args(argv)
  try:
    parse_frame(args.frame), parse_size(args.warp_to)
  except ValueError as e:
    parser.error(str(e))
  from sunnypilot.modeld_v2.bundle import ArtifactError, check_output_path
  from sunnypilot.modeld_v2.capture import search_level
  try:
    check_output_path(args.output)
    search_level(args.beam)
  except ArtifactError as e: parser.exit(2, f"compile_warp: error: {e}\n")
  try: summary = compile_warp(args.frame, args.warp_to, args.output, args.split_frames, beam=args.beam)
  except (ArtifactError, OSError) as e: parser.exit(1, f"compile_warp: error: {e}\n")
  print(f"Saved warp to {summary['output']} ({summary['kernels']} kernels, {summary['calls']} calls, {summary['bytes']} bytes)")
  return 0

if __name__ == "__main__":
  sys.exit(main())
