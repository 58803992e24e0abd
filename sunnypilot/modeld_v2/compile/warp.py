"""The tinygrad warps of a camera frame: the road cameras' into the driving model's six uint8 input planes (openpilot's compile_warp.py),
the driver camera's Y plane into the driver-monitoring model's input_img (openpilot's compile_dm_warp.py); and the checks both compilers
make of their frame and size arguments before any work."""
from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from tinygrad import Tensor, dtypes

from sunnypilot.modeld_v2.model.calibration import sensor_for_size
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, parse_frame, parse_size

MAX_MODEL_PIXELS = 4096 * 4096  # a warp's output size: far above openpilot's models (512x256; driver monitoring 1440x960)

UV_SCALE = np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], dtype=np.float32)  # M_inv -> M_inv_uv: half-resolution chroma

def coord(v: Tensor) -> Tensor: return (v != v).where(0.0, v).round()  # NaN would cast to INT_MIN: take 0 instead

def make_frame_prepare(frame: NV12Frame, model_w: int, model_h: int) -> Callable[[Tensor, Tensor], Tensor]:
  """The warp of one NV12 frame: `(frame uint8 (size,), M_inv float32 (3,3)) -> uint8 (6, model_h/2, model_w/2)`.

  M_inv maps a model pixel to a camera pixel; the nearest source pixel (round half to even) is taken, clamped to the image. Any M_inv is
  safe: a non-finite coordinate (NaN from 0/0, inf/inf) reads pixel 0, infinite or huge ones clamp, so no index leaves the buffer.
  Planes: Y[0::2,0::2], Y[1::2,0::2], Y[0::2,1::2], Y[1::2,1::2], U, V. All six are gathered by one index computation.
  """
  h2, w2 = model_h // 2, model_w // 2
  # per plane: model-pixel offsets (dx, dy) of the Y sub-grids, whether it is chroma, and the byte offset of U or V
  dx, dy = np.array([0, 0, 1, 1, 0, 0], np.float32), np.array([0, 1, 0, 1, 0, 0], np.float32)
  chroma = np.array([0, 0, 0, 0, 1, 1], bool)
  every = np.where(chroma, 1, 2).astype(np.float32)[:, None, None]  # float32 all the way: GPUs without float64 (Adreno) compile it as is
  x = np.arange(w2, dtype=np.float32)[None, None, :] * every + dx[:, None, None]
  y = np.arange(h2, dtype=np.float32)[None, :, None] * every + dy[:, None, None]
  max_x = np.where(chroma, frame.width // 2 - 1, frame.width - 1).astype(np.float32)[:, None, None]
  max_y = np.where(chroma, frame.height // 2 - 1, frame.height - 1).astype(np.float32)[:, None, None]
  step = np.where(chroma, 2, 1).astype(np.int32)[:, None, None]
  base = np.array([0, 0, 0, 0, frame.uv_offset, frame.uv_offset + 1], np.int32)[:, None, None]
  scale = np.stack([np.ones((3, 3), np.float32)] * 4 + [UV_SCALE] * 2)  # (6, 3, 3)
  consts = [Tensor(a) for a in (x, y, max_x, max_y, step, base, scale)]
  assert all(a.dtype in (np.float32, np.int32) for a in (x, y, max_x, max_y, step, base, scale))

  def prepare(frame_bytes: Tensor, m_inv: Tensor) -> Tensor:
    x, y, max_x, max_y, step, base, scale = consts
    m = m_inv.reshape(1, 3, 3) * scale
    coef = [m[:, i, j].reshape(6, 1, 1) for i in range(3) for j in range(3)]  # elementwise 3x3 product: it fuses with the gather
    sx, sy, sw = (coef[3 * r] * x + coef[3 * r + 1] * y + coef[3 * r + 2] for r in range(3))
    ix, iy = (coord(s / sw).clip(0, hi).cast(dtypes.int32) for s, hi in ((sx, max_x), (sy, max_y)))
    index = base + iy * frame.stride + ix * step
    return frame_bytes[index.flatten()].reshape(6, h2, w2)
  return prepare

def make_dm_warp(frame: NV12Frame, model_w: int, model_h: int, border_fill: int | None) -> Callable[[Tensor, Tensor], Tensor]:
  """The driver camera's warp: `(frame uint8 (size,), M_inv float32 (3,3)) -> uint8 (1, model_w*model_h)`, the Y plane only, row by row.

  openpilot's compile_dm_warp.py (warp_perspective_tinygrad with border_fill_val): the nearest source pixel (round half to even); where
  that pixel lies outside the image (a NaN coordinate included: openpilot's bounds compares are false for it) the pixel is `border_fill`
  (16 in openpilot), or with None the image's edge, clamped, as the road warp reads. The 3x3 product is elementwise, fused with the gather.
  """
  consts = Tensor(np.arange(model_w, dtype=np.float32)[None, :]), Tensor(np.arange(model_h, dtype=np.float32)[:, None])  # broadcast (h, w)

  def warp(frame_bytes: Tensor, m_inv: Tensor) -> Tensor:
    x, y = consts
    m = m_inv.reshape(1, 1, 9)
    sx, sy, sw = (m[..., 3 * r] * x + m[..., 3 * r + 1] * y + m[..., 3 * r + 2] for r in range(3))
    fx, fy = (sx / sw).round(), (sy / sw).round()
    ix, iy = (coord(f).clip(0, hi).cast(dtypes.int32) for f, hi in ((fx, frame.width - 1), (fy, frame.height - 1)))
    sampled = frame_bytes[(iy * frame.stride + ix)]
    if border_fill is not None:
      # tinygrad's a >= b is not(a < b), true for NaN: a NaN coordinate is kept out by itself
      inside = (fx >= 0) & (fx <= frame.width - 1) & (fy >= 0) & (fy <= frame.height - 1) & (fx == fx) & (fy == fy)
      sampled = inside.where(sampled, border_fill).cast(dtypes.uint8)
    return sampled.reshape(1, model_w * model_h)
  return warp

def check_model_size(width: int, height: int) -> None:
  """ValueError for a model input no warp should make: what it allocates grows with it, and past this it fails only after the capture."""
  if width * height > MAX_MODEL_PIXELS:
    raise ValueError(f"--warp-to {width}x{height} is more than {MAX_MODEL_PIXELS:,} pixels (openpilot's models take 512x256 and 1440x960)")

def add_frame_arguments(parser: argparse.ArgumentParser) -> None:
  """--frame, --output and --any-camera, as both warp compilers take them."""
  parser.add_argument("--frame", required=True, help="width,height,stride,y_height,uv_height,buffer_size (camerad's layout), "
                      f"e.g. {camerad_frame(1928, 1208).spec} or {camerad_frame(1344, 760).spec}")
  parser.add_argument("--output", required=True, help="bundle path to write")
  parser.add_argument("--any-camera", action="store_true", help="build for a frame size no comma camera has (the daemons run only comma "
                      "cameras, whose intrinsics they know: for experiments and tests)")

def frame_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[NV12Frame, tuple[int, int]]:
  """The --frame geometry and --warp-to size, checked before any work: a malformed one, a frame no comma camera has (unless --any-camera)
  or a model input past MAX_MODEL_PIXELS is argparse's one-line error."""
  try: frame, size = parse_frame(args.frame), parse_size(args.warp_to)
  except ValueError as e: parser.error(str(e))
  try: sensor_for_size(frame.width, frame.height)
  except ValueError as e:
    if not args.any_camera: parser.error(f"{e} (--any-camera builds it anyway)")
  try: check_model_size(*size)
  except ValueError as e: parser.error(str(e))
  return frame, size
