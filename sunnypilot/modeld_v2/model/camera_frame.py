"""NV12 camera geometry and the tinygrad warp of one camera frame into the model's six uint8 input planes."""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from tinygrad import Tensor, dtypes

UV_SCALE = np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], dtype=np.float32)  # M_inv -> M_inv_uv: half-resolution chroma
MAX_BUFFER = 2**31 - 1  # the warp's gather indices are int32

# The camera path's names, road camera first, wide second (openpilot's order), each kept where users and the seed already use it:
CAMERA_BUFFERS = ("img", "big_img")  # modeld's keys for the two VisionIPC buffers (copy_frames), openpilot modeld's vision input names
WARP_FRAMES = ("frame", "big_frame")  # a --split-frames warp's input per camera, bound to that buffer in place
PACKED_FRAMES = "input_frame"  # a packed warp's one frame input: both buffers copied, (2, size)
WARP_TRANSFORM = "M_inv"  # the warp's (2, 3, 3) transforms, model pixel -> camera pixel, one per camera
HOST_TRANSFORM = "tfm"  # the same transforms as the fused part's host input (the seed's name: modeld fills numpy_inputs["tfm"])

def align(x: int, a: int) -> int: return (x + a - 1) // a * a

@dataclass(frozen=True)
class NV12Frame:
  """A camera buffer: Y plane (`y_height` rows of `stride` bytes), then the interleaved UV plane (`uv_height` rows), `size` bytes in all."""
  width: int
  height: int
  stride: int
  y_height: int
  uv_height: int
  size: int

  def __post_init__(self):
    problems = [f"{name} must be a positive integer" for name, v in vars(self).items() if not isinstance(v, int) or v <= 0]
    if not problems:
      if self.width % 2 or self.height % 2: problems.append(f"width and height must be even for 4:2:0 chroma, got {self.width}x{self.height}")
      if self.stride < self.width: problems.append(f"stride {self.stride} is smaller than the width {self.width}")
      if self.y_height < self.height: problems.append(f"y_height {self.y_height} is smaller than the height {self.height}")
      if self.uv_height < self.height // 2: problems.append(f"uv_height {self.uv_height} is smaller than half the height {self.height // 2}")
      if self.size < self.stride * (self.y_height + self.uv_height):
        problems.append(f"size {self.size} is smaller than the planes: stride*(y_height+uv_height) = {self.stride * (self.y_height + self.uv_height)}")
      if max(self.size, self.stride * (self.y_height + self.uv_height)) > MAX_BUFFER:
        problems.append(f"a {max(self.size, self.stride * (self.y_height + self.uv_height)):,} byte buffer is more than the warp's int32 indices "
                        f"reach ({MAX_BUFFER:,})")
    if problems: raise ValueError("impossible NV12 geometry: " + "; ".join(problems))

  @property
  def uv_offset(self) -> int: return self.stride * self.y_height

  @property
  def spec(self) -> str: return f"{self.width},{self.height},{self.stride},{self.y_height},{self.uv_height},{self.size}"

  def planes(self, buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Views of a buffer's visible planes: Y (height, width) and interleaved UV (height/2, width); writing them writes `buf`."""
    y = buf[:self.stride * self.height].reshape(self.height, self.stride)[:, :self.width]
    uv = buf[self.uv_offset:self.uv_offset + self.stride * (self.height // 2)].reshape(self.height // 2, self.stride)[:, :self.width]
    return y, uv

def camerad_frame(width: int, height: int) -> NV12Frame:
  """openpilot camerad's padded VENUS NV12 layout for a sensor size (1928x1208 -> 2048,1216,608,4804608)."""
  stride, y_height, uv_height = align(width, 128), align(height, 32), align(height // 2, 16)
  size = align(align(stride * y_height + stride * uv_height + 4096 + max(16384, 8 * stride), 4096) + align(width, 512) * 512, 4096)
  return NV12Frame(width, height, stride, y_height, uv_height, size)

def unpadded_frame(width: int, height: int) -> NV12Frame:
  """Simulators and webcams: no padding, UV right after Y."""
  return NV12Frame(width, height, width, height, height // 2, width * height * 3 // 2)

def parse_frame(spec: str) -> NV12Frame:
  """`"w,h,stride,y_height,uv_height,buffer_size"` -> NV12Frame (camerad's numbers, as compile_warp's --frame takes them)."""
  parts = spec.split(",")
  if len(parts) != 6 or not all(p.strip().isdigit() for p in parts):
    raise ValueError(f"--frame wants six integers width,height,stride,y_height,uv_height,buffer_size, got {spec!r}")
  return NV12Frame(*(int(p) for p in parts))

def parse_size(spec: str) -> tuple[int, int]:
  """`"512x256"` -> (512, 256)."""
  if not (m := re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", spec)) or int(m[1]) % 2 or int(m[2]) % 2 or not int(m[1]) or not int(m[2]):
    raise ValueError(f"a size is WIDTHxHEIGHT with even positive numbers, e.g. 512x256, got {spec!r}")
  return int(m[1]), int(m[2])

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
