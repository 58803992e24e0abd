"""Write a PNG of what the model sees: the warped planes (Y mosaic, U, V) of the road and wide cameras.

  python -m sunnypilot.modeld_v2.tools.preview --warp warp.bin --output preview.png [--rpy 0,0.02,0] [--road road.nv12 --wide wide.nv12]

Without --road/--wide it warps synthetic road scenes (lane lines in perspective) made for the bundle's frame geometry.
"""
from __future__ import annotations

import struct
import sys
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import interruptible
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

PROG = "warp_preview"  # its console command (pyproject.toml): what usage lines and errors name

def write_png(path: str, gray: np.ndarray) -> None:
  """An 8-bit grayscale PNG, no dependencies, written atomically (a full disk or Ctrl-C leaves the old file or none, never half a PNG)."""
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  gray = np.ascontiguousarray(gray, dtype=np.uint8)
  chunk = lambda kind, data: struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
  raw = b"".join(b"\x00" + row.tobytes() for row in gray)
  with replaced_atomically(path) as (tmp,), open(tmp, "xb") as f:
    f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", gray.shape[1], gray.shape[0], 8, 0, 0, 0, 0)) +
            chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))

def planes_image(planes: np.ndarray) -> np.ndarray:
  """(6, H/2, W/2) model planes -> one (1.5 H, W) image: the Y plane reassembled from its four sub-grids, then U beside V."""
  h2, w2 = planes.shape[1:]
  y = np.empty((2 * h2, 2 * w2), np.uint8)
  y[0::2, 0::2], y[1::2, 0::2], y[0::2, 1::2], y[1::2, 1::2] = planes[:4]
  return np.concatenate([y, np.concatenate([planes[4], planes[5]], axis=1)], axis=0)

TITLE, CAPTION, GAP = 20, 16, 8  # pixel rows of each panel's title strip and of the U|V caption strip; columns between the two panels
BACKGROUND, INK = 40, 255
CAMERAS = ("road", "wide")

def layout(h2: int, w2: int) -> dict[str, tuple[int, int, int, int]]:
  """Where each picture of the preview lies, (row, column, height, width) by name (`road Y`, `road U`, `road V`, `wide Y`, ...), for the
  model's (H/2, W/2) planes: per camera a title strip, Y (H, W), a caption strip, then U and V side by side; the wide camera right of the
  road camera. `size` is the whole picture's (height, width)."""
  boxes = {}
  for k, cam in enumerate(CAMERAS):
    col = k * (2 * w2 + GAP)
    boxes[f"{cam} Y"] = (TITLE, col, 2 * h2, 2 * w2)
    boxes[f"{cam} U"] = (TITLE + 2 * h2 + CAPTION, col, h2, w2)
    boxes[f"{cam} V"] = (TITLE + 2 * h2 + CAPTION, col + w2, h2, w2)
  boxes["size"] = (0, 0, TITLE + 3 * h2 + CAPTION, 4 * w2 + GAP)
  return boxes

def _font(size: int) -> Any:
  """PIL's default font at `size` pixels (FreeType's when present, else its bitmap font); None without PIL: the strips stay blank."""
  try:
    from PIL import ImageFont
  except ImportError: return None
  try: return ImageFont.load_default(size=size)
  except (TypeError, OSError): return ImageFont.load_default()

def labeled_image(planes: np.ndarray, captions: dict[str, str]) -> np.ndarray:
  """(2, 6, H/2, W/2) warped planes as one labeled grayscale picture (see `layout`): each camera's title (`captions[camera]`) above its
  Y plane, "U" and "V" above the chroma planes. The planes' pixels are copied unchanged."""
  h2, w2 = planes.shape[2:]
  boxes = layout(h2, w2)
  image = np.full(boxes["size"][2:], BACKGROUND, np.uint8)
  for k, cam in enumerate(CAMERAS):
    mosaic = planes_image(planes[k])  # Y, then U beside V
    (ry, c, _, _), (ru, _, _, _) = boxes[f"{cam} Y"], boxes[f"{cam} U"]
    image[ry:ry + 2 * h2, c:c + 2 * w2], image[ru:ru + h2, c:c + 2 * w2] = mosaic[:2 * h2], mosaic[2 * h2:]
  if (font := _font(13)) is None: return image
  from PIL import Image, ImageDraw
  picture = Image.fromarray(image)
  draw = ImageDraw.Draw(picture)
  for cam in CAMERAS:
    r, c, h, w = boxes[f"{cam} Y"]
    draw.text((c + 4, r - TITLE + 3), captions.get(cam, cam), fill=INK, font=font)
    for plane in "UV":
      r, c, h, w = boxes[f"{cam} {plane}"]
      label = f"{plane} ({'blue' if plane == 'U' else 'red'}-difference chroma, {w}x{h})"
      draw.text((c + 4, r - CAPTION + 1), label, fill=INK, font=_font(11) or font)
      if plane == "V": draw.line([(c, r - CAPTION), (c, r - 1)], fill=INK)
  return np.asarray(picture)

def preview(warp_path: str, output: str, rpy: Sequence[float] = (0.0, 0.0, 0.0), frames: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
  """Warp (road, wide) frames with the calibration's M_inv and write the labeled preview PNG (see `layout`); returns the warped
  (2, 6, H/2, W/2) planes."""
  from tinygrad import Device, Tensor

  from sunnypilot.modeld_v2.format.warp_inputs import PACKED_FRAMES, WARP_FRAMES, WARP_TRANSFORM
  from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, sensor_for_size, warp_matrices
  from sunnypilot.modeld_v2.model.camera_frame import parse_frame
  from sunnypilot.modeld_v2.replay.road_scene import road_scene
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  model = load_bundle(warp_path)
  meta = model.metadata
  if meta.get("kind") != "warp": raise ValueError(f"{warp_path} is not a warp bundle (metadata kind {meta.get('kind')!r})")
  frame = parse_frame(meta["frame"])
  sensor = sensor_for_size(frame.width, frame.height)
  synthetic = frames is None
  road, wide = SENSOR_CAMERAS[sensor]
  if frames is None: frames = (road_scene(frame, road.focal_length), road_scene(frame, wide.focal_length))
  if short := [f"{name} has {len(f):,} bytes" for name, f in zip(("road", "wide"), frames) if len(f) < frame.size]:
    raise ValueError(f"{', '.join(short)}; the warp reads {frame.size:,}-byte NV12 buffers ({meta['frame']})")
  m_inv = Tensor(warp_matrices(SENSOR_CAMERAS[sensor], rpy), device=Device.DEFAULT).realize()
  bufs = [Tensor(np.ascontiguousarray(f[:frame.size]), device=Device.DEFAULT).realize() for f in frames]
  inputs = dict(zip(WARP_FRAMES, bufs, strict=True)) if meta["split_frames"] else {PACKED_FRAMES: Tensor(np.stack(frames)).realize()}
  planes = model.run(**inputs, **{WARP_TRANSFORM: m_inv}).numpy()
  h, w = 2 * planes.shape[2], 2 * planes.shape[3]
  source, rpy_text = "synthetic scene" if synthetic else "given frame", ",".join(f"{v:g}" for v in rpy)
  captions = {cam: f"{cam} camera: Y (luma) {w}x{h}  -  {source}, rpy {rpy_text}" for cam in CAMERAS}
  write_png(output, labeled_image(planes, captions))
  return planes

def read_frame(path: str) -> np.ndarray:
  """A raw NV12 buffer file as uint8 (refused before reading unless it is a regular file: a FIFO would block)."""
  from sunnypilot.modeld_v2.common.files import open_regular
  with open_regular(path) as f: return np.frombuffer(f.read(), np.uint8)

@interruptible(PROG)
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser(PROG, __doc__)
  parser.add_argument("--warp", required=True, help="a warp bundle from compile_warp")
  parser.add_argument("--output", required=True, help="PNG to write")
  parser.add_argument("--rpy", default="0,0,0", help="calibration roll,pitch,yaw in radians (default 0,0,0)")
  parser.add_argument("--road", help="raw NV12 buffer of the road camera (camerad's layout); default: a synthetic road scene")
  parser.add_argument("--wide", help="raw NV12 buffer of the wide camera")
  args = parser.parse_args(argv)
  try:
    rpy = tuple(float(x) for x in args.rpy.split(","))
    assert len(rpy) == 3 and all(np.isfinite(rpy))
  except (ValueError, AssertionError):
    parser.error(f"--rpy wants three finite numbers roll,pitch,yaw, got {args.rpy!r}")
  if bool(args.road) != bool(args.wide): parser.error("give both --road and --wide, or neither")
  from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
  try:
    check_output_path(args.output, inputs=(args.warp, args.road, args.wide))
    frames = (read_frame(args.road), read_frame(args.wide)) if args.road else None
    preview(args.warp, args.output, rpy, frames)
  except (ArtifactError, ValueError, OSError) as e: parser.error(str(e))
  print(f"wrote {args.output}: road (left) and wide (right) camera as the model sees them, labeled; Y on top, U and V below")
  return 0

if __name__ == "__main__":
  sys.exit(main())
