"""Pictures of a replayed drive: the plan drawn over the road camera as openpilot's UI draws it (an MP4, PyAV), and the model's
decisions over time (a PNG, matplotlib).

The projection is the warp's (calibration.camera_from_calib: the sensor's intrinsics and the roll/pitch/yaw modeld took from
liveCalibration, checked by BusInputs as modeld checks it), with the shapes of openpilot's selfdrive/ui/onroad/model_renderer.py
(commaai/openpilot @0275c7af): the path 0.9 m to each side raised by the camera height (BusInputs' too), lane lines 0.025 m x their
probability with opacity min(probability, 0.7), road edges 0.025 m with opacity 1 - their std, everything cut at the plan's length
(10-100 m). With no radar here, leads are the model's own (leadsV3, probability over 0.5, as radard takes them), drawn as the UI's
chevron.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, camera_from_calib
from sunnypilot.modeld_v2.model.fill_driver_state import DRIVER_DATA, PROB_FIELDS
from sunnypilot.modeld_v2.replay.route_segment import Segment

MIN_DRAW_DISTANCE, MAX_DRAW_DISTANCE = 10.0, 100.0
SCALE = 0.5  # the MP4 is half the camera's size
CONFIDENCE = {"green": 0, "yellow": 1, "red": 2}

def _points(line) -> np.ndarray: return np.array([list(line.x), list(line.y), list(line.z)], np.float64).T

def _polygon(transform: np.ndarray, points: np.ndarray, y_off: float, z_off: float, max_x: float, monotone: bool = False) -> list[tuple]:
  """A line widened by y_off to each side and raised by z_off, projected: the outline as pixel (x, y) pairs, left side out, right side back."""
  points = points[(points[:, 0] >= 0) & (points[:, 0] <= max_x)]
  if len(points) < 2: return []
  sides = [transform @ (points + [0, -y_off, z_off]).T, transform @ (points + [0, y_off, z_off]).T]
  keep = (sides[0][2] > 1e-6) & (sides[1][2] > 1e-6)  # in front of the camera
  left, right = (s[:2, keep] / s[2, keep] * SCALE for s in sides)
  if monotone and left.shape[1] > 1:  # a path over a hill crest must not fold back down the picture
    ok = left[1] == np.minimum.accumulate(left[1])
    left, right = left[:, ok], right[:, ok]
  return [tuple(p) for p in left.T] + [tuple(p) for p in right.T[::-1]]

def draw_model(image, model: Any, rpy: tuple[float, ...], height: float, sensor: str) -> None:
  """Draw one modelV2 over a PIL RGB image of the road camera (already scaled by SCALE), with the calibration `rpy` and camera `height`
  (metres) modeld used for that frame (BusInputs.calibration, BusInputs.camera_height)."""
  from PIL import Image, ImageDraw
  transform = camera_from_calib(rpy, SENSOR_CAMERAS[sensor][0].intrinsics)
  path = _points(model.position)
  if len(path) == 0: return
  max_x = float(np.clip(path[-1, 0], MIN_DRAW_DISTANCE, MAX_DRAW_DISTANCE))
  layer = Image.new("RGBA", image.size)
  draw = ImageDraw.Draw(layer)
  for line, prob in zip(model.laneLines, model.laneLineProbs):
    if len(poly := _polygon(transform, _points(line), 0.025 * prob, 0.0, max_x)) > 2: draw.polygon(poly, fill=(255, 255, 255, int(np.clip(prob, 0, 0.7) * 255)))
  for edge, std in zip(model.roadEdges, model.roadEdgeStds):
    if len(poly := _polygon(transform, _points(edge), 0.025, 0.0, max_x)) > 2: draw.polygon(poly, fill=(255, 0, 0, int(np.clip(1 - std, 0, 1) * 255)))
  if len(poly := _polygon(transform, path, 0.9, height, max_x, monotone=True)) > 2: draw.polygon(poly, fill=(242, 242, 242, 102))
  for lead in list(model.leadsV3)[:2]:
    if lead.prob <= 0.5 or not len(lead.x): continue
    d, y = float(lead.x[0]), float(lead.y[0])
    z = float(np.interp(d, path[:, 0], path[:, 2])) + height
    pt = transform @ [d, y, z]
    if pt[2] <= 1e-6: continue
    x, yy = pt[0] / pt[2] * SCALE, pt[1] / pt[2] * SCALE
    sz = float(np.clip(25 * 30 / (d / 3 + 30), 15.0, 30.0) * 2.35 * SCALE)
    alpha = int(min(255 * (1 - d / 40), 255)) if d < 40 else 0
    draw.polygon([(x + sz * 1.35, yy + sz), (x, yy - sz / 10), (x - sz * 1.35, yy + sz)], fill=(218, 202, 37, 255))
    draw.polygon([(x + sz * 1.25, yy + sz), (x, yy), (x - sz * 1.25, yy + sz)], fill=(201, 34, 49, max(alpha, 60)))
  image.paste(Image.alpha_composite(image.convert("RGBA"), layer).convert("RGB"))

LEGEND = (("path", "plan path (0.9 m each side)", (242, 242, 242, 160)), ("line", "lane lines: opacity = probability", (255, 255, 255, 230)),
          ("line", "road edges: opacity = 1 - std", (255, 0, 0, 230)), ("lead", "lead (model's, probability > 0.5)", (201, 34, 49, 255)))
STAND_IN_CAPTION = "RANDOM WEIGHTS: a stand-in model (openpilot's I/O, seeded random weights) - what is drawn is noise"

def _font(size: int):
  from PIL import ImageFont
  try: return ImageFont.load_default(size=size)
  except (TypeError, OSError): return ImageFont.load_default()

def draw_caption(image, frame_index: int, frame_id: int | None = None, stand_in: str | None = None) -> None:
  """The overlay's key, over a PIL RGB image: a legend of what is drawn (top left), the video frame number and camera frame id (top
  right), and with a stand-in model (its bundle's metadata `stand_in`) a 'random weights' banner along the bottom."""
  from PIL import Image, ImageDraw
  font, layer = _font(max(11, image.size[1] // 45)), Image.new("RGBA", image.size)
  draw = ImageDraw.Draw(layer)
  line_h = font.getbbox("Ag")[3] + 6
  width = max(font.getlength(text) for _, text, _ in LEGEND) + 44
  draw.rectangle([6, 6, 6 + width, 10 + line_h * len(LEGEND)], fill=(0, 0, 0, 150))
  for k, (kind, text, color) in enumerate(LEGEND):
    x, y = 12, 10 + k * line_h
    mid = y + line_h // 2 - 2
    if kind == "path": draw.polygon([(x + 6, mid + 6), (x + 12, mid - 6), (x + 18, mid - 6), (x + 24, mid + 6)], fill=color)
    elif kind == "line": draw.rectangle([x, mid - 1, x + 24, mid + 2], fill=color)
    else:
      draw.polygon([(x + 22, mid + 6), (x + 12, mid - 6), (x + 2, mid + 6)], fill=(218, 202, 37, 255))
      draw.polygon([(x + 20, mid + 6), (x + 12, mid - 4), (x + 4, mid + 6)], fill=color)
    draw.text((x + 32, y + 1), text, fill=(255, 255, 255, 255), font=font)
  label = f"frame {frame_index}" + (f"  (camera frame id {frame_id})" if frame_id is not None else "")
  right = image.size[0] - 6
  draw.rectangle([right - font.getlength(label) - 12, 6, right, 6 + line_h + 2], fill=(0, 0, 0, 150))
  draw.text((right - font.getlength(label) - 6, 9), label, fill=(255, 255, 255, 255), font=font)
  if stand_in:
    banner = _font(max(12, image.size[1] // 38))
    h = banner.getbbox("Ag")[3] + 10
    draw.rectangle([0, image.size[1] - h, image.size[0], image.size[1]], fill=(150, 20, 20, 200))
    draw.text((8, image.size[1] - h + 4), STAND_IN_CAPTION, fill=(255, 255, 255, 255), font=banner)
  image.paste(Image.alpha_composite(image.convert("RGBA"), layer).convert("RGB"))

def write_overlay(path: str, segment: Segment, items: list[tuple[int, Any, tuple[float, ...], float]], stand_in: str | None = None) -> None:
  """An MP4 (20 fps, half size) of the road video's frames `items` = [(video frame index, modelV2, rpy, camera height)], drawn over, each
  with its legend and frame number (draw_caption), and a 'random weights' banner when `stand_in` (the model bundle's metadata
  `stand_in`) says the model is a stand-in."""
  import av
  from PIL import Image
  wanted = {k: (model, rpy, height) for k, model, rpy, height in items}
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  with replaced_atomically(path) as (tmp,), av.open(segment.road_video) as source, av.open(tmp, "w", format="mp4") as sink:
    stream = sink.add_stream("libx264" if "libx264" in av.codecs_available else "mpeg4", rate=20)
    stream.width, stream.height, stream.pix_fmt = int(segment.frame.width * SCALE), int(segment.frame.height * SCALE), "yuv420p"
    for k, picture in enumerate(source.decode(video=0)):
      if k > max(wanted, default=-1): break
      if k not in wanted: continue
      image = Image.fromarray(picture.to_ndarray(format="rgb24", width=stream.width, height=stream.height))
      draw_model(image, *wanted[k], segment.sensor)
      draw_caption(image, k, getattr(wanted[k][0], "frameId", None), stand_in)
      for packet in stream.encode(av.VideoFrame.from_image(image)): sink.mux(packet)
    for packet in stream.encode(): sink.mux(packet)

# a driver's probabilities as driverStateV2 carries them (the fields this schema has; the rest are not published)
DRIVER_PROBS = tuple(PROB_FIELDS.values())

def plot_drive(path: str, title: str, items: list[tuple[float, Any]], stand_in: str | None = None, driver: list[tuple[float, Any]] | None = None,
               rhd: bool = False) -> None:
  """desired curvature, acceleration, lead distance (with its probability) and confidence over `items` = [(seconds, modelV2)]; with `driver`
  = [(seconds, driverStateV2)] also the driver's face (facePosition x, y and faceOrientation, which openpilot's monitoring reads as pitch,
  yaw, roll) and the probabilities published (face, eyes, blinks, sunglasses, phone), of the right-hand driver with `rhd`. The title says
  'random weights' when `stand_in` (the model bundle's metadata) marks a stand-in."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  t = [s for s, _ in items]
  models = [m for _, m in items]
  has_accel = bool(models) and "desiredAcceleration" in models[0].action.schema.fieldnames
  fig, axes = plt.subplots(4 + 2 * (driver is not None), 1, figsize=(11, 9 + 4.5 * (driver is not None)), sharex=True)
  axes[0].plot(t, [m.action.desiredCurvature for m in models])
  axes[0].set_ylabel("desired curvature (1/m)")
  axes[1].plot(t, [m.action.desiredAcceleration if has_accel else (m.acceleration.x[0] if len(m.acceleration.x) else np.nan) for m in models])
  axes[1].set_ylabel("desired accel (m/s²)" if has_accel else "plan accel at t=0 (m/s²)")
  axes[2].plot(t, [m.leadsV3[0].x[0] if len(m.leadsV3) and len(m.leadsV3[0].x) else np.nan for m in models], label="lead distance")
  axes[2].set_ylabel("lead distance (m)")
  prob = axes[2].twinx()
  prob.plot(t, [m.leadsV3[0].prob if len(m.leadsV3) else np.nan for m in models], color="tab:orange", lw=0.8)
  prob.set_ylabel("lead probability", color="tab:orange")
  prob.set_ylim(0, 1)
  axes[3].plot(t, [CONFIDENCE.get(str(m.confidence), np.nan) for m in models], drawstyle="steps-post")
  axes[3].set_yticks([0, 1, 2], ["green", "yellow", "red"])
  axes[3].set_ylabel("confidence")
  if driver is not None: plot_driver(axes[4], axes[5], driver, rhd)
  axes[-1].set_xlabel("seconds into the segment")
  fig.suptitle(title + ("\nRANDOM WEIGHTS: a stand-in model, these decisions are noise" if stand_in else ""), color="black")
  fig.tight_layout()
  fig.savefig(path, dpi=90)
  plt.close(fig)

def plot_driver(face, probs, states: list[tuple[float, Any]], rhd: bool) -> None:
  """The driver's face position and orientation on `face`, the published probabilities on `probs` (matplotlib axes), over
  [(seconds, driverStateV2)]."""
  t, side = [s for s, _ in states], DRIVER_DATA["rhd" if rhd else "lhd"]
  data = [getattr(d, side) for _, d in states]
  for k, name in enumerate(("x", "y")): face.plot(t, [d.facePosition[k] if len(d.facePosition) > k else np.nan for d in data], label=f"facePosition {name}")
  for k, name in enumerate(("pitch", "yaw", "roll")):
    face.plot(t, [d.faceOrientation[k] if len(d.faceOrientation) > k else np.nan for d in data], ls="--", label=f"faceOrientation {name} (rad)")
  face.set_ylabel(f"{'right' if rhd else 'left'}-hand driver's face")
  face.legend(fontsize=7, ncol=5, loc="best")
  fields = [f for f in DRIVER_PROBS if data and f in data[0].schema.fieldnames and any(getattr(d, f) for d in data)]
  for f in fields: probs.plot(t, [getattr(d, f) for d in data], label=f)
  probs.plot(t, [d.wheelOnRightProb for _, d in states], color="gray", lw=0.8, label="wheelOnRightProb")
  probs.set_ylim(-0.02, 1.02)
  probs.set_ylabel("driverStateV2 probabilities")
  probs.legend(fontsize=7, ncol=4, loc="upper right")
