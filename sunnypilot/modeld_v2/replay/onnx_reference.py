"""onnxruntime on a driving model's ONNX file(s), fed from camera buffers as openpilot's modeld feeds it, and on the driver-monitoring
model's, fed as dmonitoringmodeld feeds it: route_replay's reference checks.

  reference = OnnxReference({"onnx": "driving.onnx"})      # or {"vision": ..., "policy": ...}, {"vision": ..., "off_policy": ..., "on_policy": ...}
  outputs = reference.step(road_buf, wide_buf, frame, values)  # values: the host inputs modeld feeds (FrameInputs.step(...).host), "tfm" included
  dm = DMOnnxReference("dmonitoring_model.onnx", model_size=(1440, 960), border_fill=16)
  outputs = dm.step(driver_buf, frame, m_inv, calib)          # M_inv: calibration.dm_warp_matrix; calib: liveCalibration.rpyCalib

It shares no code with the bundle's queues or warp: the frames are warped here in numpy (nearest pixel, round half to even, clamped, as
the tinygrad warp), and the queues keep openpilot's full-length buffers and sample them as openpilot's selfdrive/modeld/modeld.py does
(commaai/openpilot @6c6be47b: the desire history max-pooled per frame_skip window, every frame_skip-th feature and image, features pushed
after the vision model, prev_desired_curv after the policy; @00731a68: the 20 Hz supercombo pushes both after its run). Native models
(new_img + state_X) get their next_X outputs back as X.
"""
from __future__ import annotations

from typing import cast

import numpy as np

from sunnypilot.modeld_v2.compile.model_plan import MODEL_FILES
from sunnypilot.modeld_v2.compile.warp import UV_SCALE
from sunnypilot.modeld_v2.format.bundle import next_name, state_names
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame

MODEL_W, MODEL_H = 512, 256
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}

def _source(m: np.ndarray, out_w: int, out_h: int) -> tuple[np.ndarray, np.ndarray]:
  """Each model pixel's nearest source pixel (round half to even) through M_inv, in float32 as the warps compute it; non-finite kept."""
  xs, ys = np.meshgrid(np.arange(out_w, dtype=np.float32), np.arange(out_h, dtype=np.float32))
  sx, sy, sw = (m[r, 0] * xs + m[r, 1] * ys + m[r, 2] for r in range(3))
  with np.errstate(divide="ignore", invalid="ignore"): return np.round(sx / sw), np.round(sy / sw)

def _sample(plane: np.ndarray, m: np.ndarray, out_w: int, out_h: int) -> np.ndarray: return _gather(plane, *_source(m, out_w, out_h))

def _gather(plane: np.ndarray, fx: np.ndarray, fy: np.ndarray) -> np.ndarray:
  """`plane` at the source pixels _source gave, clamped to its edges."""
  ix = np.clip(np.nan_to_num(fx, nan=0.0, posinf=1e9, neginf=-1e9), 0, plane.shape[1] - 1).astype(np.int64)
  iy = np.clip(np.nan_to_num(fy, nan=0.0, posinf=1e9, neginf=-1e9), 0, plane.shape[0] - 1).astype(np.int64)
  return plane[iy, ix]

def dm_input(buf: np.ndarray, frame: NV12Frame, m_inv: np.ndarray, size: tuple[int, int], border_fill: int | None) -> np.ndarray:
  """The driver camera's buffer as the DM model's input_img (1, w*h) uint8, as openpilot's compile_dm_warp.py makes it: the Y plane, each
  model pixel the nearest source pixel, `border_fill` where that pixel is outside the image (a NaN coordinate too), or clamped (None)."""
  (w, h), m = size, np.asarray(m_inv, np.float32)
  y, _ = frame.planes(buf)
  fx, fy = _source(m, w, h)
  out = _gather(y, fx, fy)
  if border_fill is not None:
    with np.errstate(invalid="ignore"): inside = (fx >= 0) & (fx <= frame.width - 1) & (fy >= 0) & (fy <= frame.height - 1)
    out = np.where(inside, out, np.uint8(border_fill))
  return out.reshape(1, w * h)

def warp_planes(buf: np.ndarray, frame: NV12Frame, m_inv: np.ndarray) -> np.ndarray:
  """One camera buffer (camerad's NV12 layout) through M_inv (model pixel -> camera pixel) into the model's six uint8 planes (6, 128, 256)."""
  m = np.asarray(m_inv, np.float32)
  y, uv = frame.planes(buf)
  full = _sample(y, m, MODEL_W, MODEL_H)
  m_uv = m * UV_SCALE
  u, v = (_sample(uv[:, i::2], m_uv, MODEL_W // 2, MODEL_H // 2) for i in (0, 1))
  return np.stack([full[0::2, 0::2], full[1::2, 0::2], full[0::2, 1::2], full[1::2, 1::2], u, v])

class OnnxReference:
  def __init__(self, files: dict[str, str]):
    import onnxruntime as ort

    from sunnypilot.modeld_v2.compile.onnx_model import load_onnx, read_output_slices
    self.models = [k for k in MODEL_FILES if k in files]
    self.sessions = {k: ort.InferenceSession(files[k], providers=["CPUExecutionProvider"]) for k in self.models}
    meta = {k: load_onnx(files[k])["metadata"] for k in self.models}
    self.slices = {k: {n: slice(a, b) for n, (a, b) in read_output_slices(meta[k]["output_slices"]).items()} for k in self.models}
    self.inputs = {i.name: (tuple(i.shape), ORT_DTYPES[i.type]) for s in self.sessions.values() for i in s.get_inputs()}
    self.output_dtype = np.dtype(ORT_DTYPES[next(o.type for o in self.sessions[self.models[-1]].get_outputs() if o.name == self._main_output(self.models[-1]))])
    self.native = "new_img" in self.inputs
    outputs = [o.name for s in self.sessions.values() for o in s.get_outputs()]  # a native model's states; queued models keep queues
    self.states = {n: np.zeros(*self.inputs[n]) for n in state_names(self.inputs, outputs)} if self.native else {}
    said = [int(m["frame_skip"]) for m in meta.values() if "frame_skip" in m]
    features = self.inputs.get("features_buffer", ((),))[0]
    # openpilot 0.9.x kept a 20 Hz features history (99 entries): every frame; since 0.9.7 its models sample every 4th frame
    self.skip = said[0] if said else (1 if len(features) == 3 and features[1] >= 99 else 4)
    self.images = {wide: next((n for n in self.inputs if "img" in n and ("big" in n) == wide), None) for wide in (False, True)}
    self.desire_name = next((n for n in self.inputs if n.startswith("desire") and len(self.inputs[n][0]) == 3), None)
    self.curv_name = next((n for n in self.inputs if n.startswith("prev_desired_curv")), None)
    self.history = {n: np.zeros((self.skip * self.inputs[n][0][1], self.inputs[n][0][2]), np.float32)
                    for n in (self.desire_name, "features_buffer", self.curv_name) if n in self.inputs}
    self.warped: list[np.ndarray] = []  # the warped (road, wide) pairs the image inputs can still sample, oldest first
    frames = max((self.inputs[n][0][1] // 6 for n in self.images.values() if n is not None), default=1)
    self.keep = self.skip * (frames - 1) + 1  # openpilot's image queue length: older frames are never read again
    self.host = [n for n in self.inputs if n not in self.history and n not in self.states and "img" not in n]

  def _sampled(self, name: str) -> np.ndarray:
    """openpilot's temporal_idxs: every skip-th entry, ending at the newest."""
    n = self.inputs[name][0][1]
    return self.history[name][-1 - self.skip * (n - 1)::self.skip][None]

  def _stacked_images(self, cam: int, name: str) -> np.ndarray:
    shape = self.inputs[name][0]
    picks = [len(self.warped) - 1 - self.skip * k for k in reversed(range(shape[1] // 6))]
    return np.concatenate([self.warped[i][cam] if i >= 0 else np.zeros_like(self.warped[-1][cam]) for i in picks]).reshape(shape)

  def _push(self, name: str, value: np.ndarray) -> None:
    self.history[name] = np.concatenate([self.history[name][1:], np.reshape(value, (1, -1))])

  def _main_output(self, model: str) -> str:
    names = [o.name for o in self.sessions[model].get_outputs()]
    return "outputs" if "outputs" in names else names[0]

  def _run(self, model: str, feeds: dict[str, np.ndarray], names: list[str] | None = None) -> list[np.ndarray]:
    session = self.sessions[model]
    return session.run(names or [self._main_output(model)], {i.name: np.asarray(feeds[i.name]).astype(ORT_DTYPES[i.type]) for i in session.get_inputs()})

  def step(self, road: np.ndarray, wide: np.ndarray, frame: NV12Frame, values: dict) -> np.ndarray:
    """One frame: the outputs (1, N) float32, every model's main output concatenated in MODEL_FILES order. `values` by input name ("tfm" (2, 3, 3),
    "desire" (1, 8) and the other host inputs); an input with no value is zero, as in modeld."""
    m_inv = np.asarray(values[HOST_TRANSFORM], np.float32).reshape(2, 3, 3)
    new_img = np.stack([warp_planes(road, frame, m_inv[0]), warp_planes(wide, frame, m_inv[1])])
    host = {n: np.reshape(values[n], self.inputs[n][0]) if n in values else np.zeros(self.inputs[n][0]) for n in self.host}
    desire = np.reshape(values.get("desire", np.zeros(8)), -1)
    if self.native:
      names = [self._main_output("onnx")] + [next_name(k) for k in self.states]
      out = dict(zip(names, self._run("onnx", {"new_img": new_img} | host | self.states, names)))
      self.states = {k: out[next_name(k)] for k in self.states}
      return out[names[0]].astype(np.float32)
    self.warped = [*self.warped[-(self.keep - 1):], new_img] if self.keep > 1 else [new_img]
    road_img, wide_img = self.images[False], self.images[True]
    assert road_img is not None and wide_img is not None, "a queued model takes a road and a wide image"
    feeds = dict(host) | {road_img: self._stacked_images(0, road_img), wide_img: self._stacked_images(1, wide_img)}
    if self.desire_name:
      self._push(self.desire_name, desire)
      n = self.inputs[self.desire_name][0][1]
      feeds[self.desire_name] = self.history[self.desire_name].reshape(n, self.skip, -1).max(axis=1)[None]
    if self.curv_name: feeds[self.curv_name] = self._sampled(self.curv_name)
    if self.models == ["onnx"]:  # the 20 Hz supercombo: one run, both histories pushed after it
      if "features_buffer" in self.history: feeds["features_buffer"] = self._sampled("features_buffer")
      outs = {"onnx": self._run("onnx", feeds)[0]}
      if "features_buffer" in self.history: self._push("features_buffer", outs["onnx"][0, self.slices["onnx"]["hidden_state"]])
    else:
      outs = {"vision": self._run("vision", feeds)[0]}
      if "features_buffer" in self.history:
        self._push("features_buffer", outs["vision"][0, self.slices["vision"]["hidden_state"]])
        feeds["features_buffer"] = self._sampled("features_buffer")
      outs |= {k: self._run(k, feeds)[0] for k in self.models[1:]}
    if self.curv_name:
      curv = next(o[0, self.slices[k]["desired_curvature"]] for k, o in outs.items() if "desired_curvature" in self.slices[k])
      self._push(self.curv_name, curv[:self.inputs[self.curv_name][0][2]])  # the head's mean, as OutputParser gives it
    return np.concatenate([outs[k] for k in self.models], axis=1).astype(np.float32)

class DMOnnxReference:
  """onnxruntime on the driver-monitoring ONNX, fed what dmonitoringmodeld feeds its bundle: the driver frame warped in numpy (dm_input, with
  the dm_warp's model size and border fill) and calib. No state: each frame stands alone."""
  def __init__(self, path: str, model_size: tuple[int, int], border_fill: int | None):
    import onnxruntime as ort

    from sunnypilot.modeld_v2.compile.onnx_model import load_onnx, read_output_slices
    self.session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    self.slices = read_output_slices(load_onnx(path)["metadata"]["output_slices"])
    self.inputs = {i.name: (tuple(i.shape), ORT_DTYPES[i.type]) for i in self.session.get_inputs()}
    if set(self.inputs) != {"input_img", "calib"}: raise ValueError(f"{path}: not a driver-monitoring model (inputs {', '.join(self.inputs)}, "
                                                                   "openpilot's takes input_img and calib)")
    self.model_size, self.border_fill = cast(tuple[int, int], tuple(model_size)), border_fill  # a list of two is taken too
    outputs = {o.name: o.type for o in self.session.get_outputs()}
    self.output = "outputs" if "outputs" in outputs else next(iter(outputs))
    self.output_dtype = np.dtype(ORT_DTYPES[outputs[self.output]])

  def step(self, buf: np.ndarray, frame: NV12Frame, m_inv: np.ndarray, calib) -> np.ndarray:
    """One driver frame: the outputs (1, N) float32."""
    img = dm_input(buf, frame, m_inv, self.model_size, self.border_fill)
    feeds = {"input_img": img.astype(self.inputs["input_img"][1]).reshape(self.inputs["input_img"][0]),
             "calib": np.asarray(calib, np.float32).astype(self.inputs["calib"][1]).reshape(self.inputs["calib"][0])}
    return self.session.run([self.output], feeds)[0].astype(np.float32)
