"""Camera frames as modeld meets them: an NV12 layout (Y plane, then interleaved UV rows, in a buffer of a given size), read from the
buffers, never assumed: openpilot's camerad pads its buffers (camerad_frame), simulators and webcams do not (unpadded_frame)."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

MAX_BUFFER = 2**31 - 1  # the warp's gather indices are int32

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

  def __post_init__(self) -> None:
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

def camerad_frame(width: int, height: int) -> NV12Frame:
  """openpilot camerad's padded VENUS NV12 layout for a sensor size (1928x1208 -> 2048,1216,608,4804608)."""
  stride, y_height, uv_height = align(width, 128), align(height, 32), align(height // 2, 16)
  size = align(align(stride * y_height + stride * uv_height + 4096 + max(16384, 8 * stride), 4096) + align(width, 512) * 512, 4096)
  return NV12Frame(width, height, stride, y_height, uv_height, size)
