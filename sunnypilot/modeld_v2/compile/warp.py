"""The tinygrad warp of one camera frame into the model's six uint8 input planes, as openpilot's compile_warp.py defines it."""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tinygrad import Tensor, dtypes

from sunnypilot.modeld_v2.model.camera_frame import NV12Frame

UV_SCALE = np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], dtype=np.float32)  # M_inv -> M_inv_uv: half-resolution chroma

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

  def coord(v: Tensor) -> Tensor: return (v != v).where(0.0, v).round()  # NaN would cast to INT_MIN: take 0 instead

  def prepare(frame_bytes: Tensor, m_inv: Tensor) -> Tensor:
    x, y, max_x, max_y, step, base, scale = consts
    m = m_inv.reshape(1, 3, 3) * scale
    coef = [m[:, i, j].reshape(6, 1, 1) for i in range(3) for j in range(3)]  # elementwise 3x3 product: it fuses with the gather
    sx, sy, sw = (coef[3 * r] * x + coef[3 * r + 1] * y + coef[3 * r + 2] for r in range(3))
    ix, iy = (coord(s / sw).clip(0, hi).cast(dtypes.int32) for s, hi in ((sx, max_x), (sy, max_y)))
    index = base + iy * frame.stride + ix * step
    return frame_bytes[index.flatten()].reshape(6, h2, w2)
  return prepare
