"""One frame of a driving model as openpilot's modeld runs it, for the benchmark's peers (onnxruntime on numpy, torch on a GPU): the warp
of both camera frames, then the model(s) of any stand-in generation with their input queues, written once over a small array interface.

Followed, in this project's words: commaai/openpilot selfdrive/modeld/modeld.py @6c6be47b (0.9.7+ vision + policy: each queue keeps
frame_skip*(n-1)+1 entries and the model sees every frame_skip-th ending at the newest; desire max-pooled per frame_skip window; the
vision's hidden_state pushed before the policy runs; prev_desired_curv pushed after it) and @00731a68 (one 20 Hz supercombo: its own
hidden_state and desired_curvature pushed after the run). Native models feed their next_X outputs back as X.

Every buffer is allocated once and updated in place, so the torch step is one CUDA graph.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from sunnypilot.modeld_v2.compile.input_queues import CURVATURE, DESIRE_HISTORY, FEATURES, derive_frame_skip, queue_role
from sunnypilot.modeld_v2.compile.onnx_model import load_onnx, main_output, model_slices
from sunnypilot.modeld_v2.format.bundle import next_name, state_names

class NumpyOps:
  """The array operations a step needs, on numpy."""
  def zeros(self, shape, dtype) -> np.ndarray: return np.zeros(shape, dtype)
  def cat(self, xs: list, axis: int) -> np.ndarray: return np.concatenate(xs, axis=axis)
  def amax(self, x, axis: int) -> np.ndarray: return x.max(axis=axis)
  def assign(self, dst, src) -> None: dst[...] = src
  def cast(self, x, dtype) -> np.ndarray: return x.astype(dtype, copy=False)

def clear(step: Any) -> None:
  """Zero a step's queues, states and host inputs in place (a CUDA graph keeps their addresses): the next frame starts from nothing, as
  a freshly loaded bundle does."""
  for buffers in (step.images, step.queues, step.states, step.host):
    for v in buffers.values(): step.ops.assign(v, step.ops.zeros(tuple(v.shape), v.dtype))

class PeerStep:
  """`step()` runs one frame: warp `frames` (2, size) uint8 with `m_inv` (2, 3, 3), feed the queues and the host inputs (`host`, by the ONNX's
  names), run the model(s), return (1, N) float32 outputs, models concatenated in the bundle's order. `run_model(key, feeds)` runs one ONNX
  (its inputs by name) and returns its outputs by name; `warp(frame_bytes, m_inv)` makes one camera's six planes."""
  def __init__(self, files: dict[str, str], frame, ops: Any, run_model: Any, warp: Any, cast_dtype: Any = lambda d: d):
    self.ops, self.run_model, self.warp = ops, run_model, warp
    self.f32 = cast_dtype(np.float32)  # made once: step() calls no numpy (torch.compile traces it)
    infos = {k: load_onnx(p) for k, p in files.items()}
    self.keys = list(infos)
    self.inputs = {k: info["inputs"] for k, info in infos.items()}
    self.output = {k: main_output(files[k], info) for k, info in infos.items()}
    self.slices = {k: model_slices(files[k], info, self.output[k]) for k, info in infos.items()}
    shapes = {n: s for spec in self.inputs.values() for n, (s, _) in spec.items()}
    dtypes = {n: d for spec in self.inputs.values() for n, (_, d) in spec.items()}
    self.dtypes = {n: cast_dtype(d) for n, d in dtypes.items()}
    self.native = "new_img" in shapes
    self.frames = ops.zeros((2, frame.size), cast_dtype(np.uint8))
    self.m_inv = ops.zeros((2, 3, 3), cast_dtype(np.float32))
    states = state_names(shapes, infos["onnx"]["outputs"]) if self.native else []
    self.states = {n: ops.zeros(shapes[n], self.dtypes[n]) for n in states}
    roles = {n: queue_role(n, s) for n, s in shapes.items()} if not self.native else {}
    self.fs = derive_frame_skip(next(iter(infos.values()))["metadata"], shapes) if not self.native else 1
    # images: (fs*(n-1)+1, 6, H, W) per camera; desire: fs*L pulses; features and curvature: fs*(L-1)+1 entries
    self.images = {n: ops.zeros((self.fs * (s[1] // 6 - 1) + 1, 6, *s[2:]), cast_dtype(np.uint8)) for n, s in shapes.items() if roles.get(n) in
                   ("road_image", "wide_image")}
    self.desire = next((n for n, r in roles.items() if r == DESIRE_HISTORY), None)
    self.features = next((n for n, r in roles.items() if r == FEATURES), None)
    self.curvature = next((n for n, r in roles.items() if r == CURVATURE), None)
    length = lambda n: self.fs * shapes[n][1] if n == self.desire else self.fs * (shapes[n][1] - 1) + 1
    self.queues = {n: ops.zeros((length(n), shapes[n][2]), cast_dtype(np.float32)) for n in (self.desire, self.features, self.curvature) if n}
    queued = set(self.images) | set(self.queues) | set(self.states) | {"new_img"}
    self.host = {n: ops.zeros(s, cast_dtype(np.float32)) for n, s in shapes.items() if n not in queued}
    if self.desire: self.host["desire"] = ops.zeros((1, shapes[self.desire][2]), cast_dtype(np.float32))  # this frame's pulse, queued here
    self.camera = {n: 0 if roles[n] == "road_image" else 1 for n in self.images}

  def _push(self, name: str, value) -> None:
    q = self.queues[name]
    self.ops.assign(q, self.ops.cat([q[1:], value.reshape(1, -1)], 0))

  def _sampled(self, name: str):
    """Every fs-th queue entry ending at the newest, as the model's (1, L, N) input."""
    q = self.queues[name]
    if name == self.desire: return self.ops.amax(q.reshape(-1, self.fs, q.shape[-1]), 1)[None]
    return q[::self.fs][None]

  def _run(self, key: str, feeds: dict) -> dict:
    return self.run_model(key, {n: self.ops.cast(feeds[n], self.dtypes[n]) for n in self.inputs[key]})

  def _head(self, key: str, out, head: str): return out[:, slice(*self.slices[key][head])]

  def step(self):
    new_img = self.ops.cat([self.warp(self.frames[i], self.m_inv[i])[None] for i in range(2)], 0)
    if self.native:
      out = self._run("onnx", {"new_img": new_img} | self.host | self.states)
      for n, v in self.states.items(): self.ops.assign(v, out[next_name(n)])
      return self.ops.cast(out[self.output["onnx"]], self.f32)
    for name, q in self.images.items(): self.ops.assign(q, self.ops.cat([q[1:], new_img[self.camera[name]][None]], 0))
    feeds = dict(self.host) | {n: q[::self.fs].reshape(self.input_shape(n)) for n, q in self.images.items()}
    if self.desire:
      self._push(self.desire, self.host["desire"])
      feeds[self.desire] = self._sampled(self.desire)
    if self.curvature: feeds[self.curvature] = self._sampled(self.curvature)
    outs = {}
    if self.features and len(self.keys) == 1: feeds[self.features] = self._sampled(self.features)
    for key in self.keys:
      if self.features and len(self.keys) > 1 and key != "vision": feeds[self.features] = self._sampled(self.features)
      outs[key] = self.ops.cast(self._run(key, feeds)[self.output[key]], self.f32)
      if self.features and key == "vision": self._push(self.features, self._head(key, outs[key], "hidden_state"))
    if self.features and len(self.keys) == 1: self._push(self.features, self._head("onnx", outs["onnx"], "hidden_state"))
    if self.curvature:
      key = next(k for k in self.keys if "desired_curvature" in self.slices[k])
      self._push(self.curvature, self._head(key, outs[key], "desired_curvature")[:, :self.queues[self.curvature].shape[-1]])
    return self.ops.cat(list(outs.values()), 1)

  def input_shape(self, name: str) -> tuple: return next(spec[name][0] for spec in self.inputs.values() if name in spec)

class DMPeerStep:
  """One frame of the driver-monitoring model as dmonitoringmodeld runs it, for the peers: `step()` warps `frames[0]` (one driver-camera
  buffer) with `m_inv[0]` into the model's input_img (`warp(frame_bytes, m_inv)`: the Y plane, compile_dm_warp's rule), runs the ONNX with
  `host["calib"]` and returns its (1, N) float32 outputs. Buffers are made once and updated in place (one CUDA graph on torch); the
  attribute names are PeerStep's, so the torch peer drives either."""
  def __init__(self, path: str, frame, ops: Any, run_model: Any, warp: Any, cast_dtype: Any = lambda d: d):
    self.ops, self.run_model, self.warp = ops, run_model, warp
    self.f32 = cast_dtype(np.float32)
    info = load_onnx(path)
    self.output, shapes = main_output(path, info), {n: s for n, (s, _) in info["inputs"].items()}
    self.dtypes = {n: cast_dtype(d) for n, (_, d) in info["inputs"].items()}
    self.frames = ops.zeros((1, frame.size), cast_dtype(np.uint8))
    self.m_inv = ops.zeros((1, 3, 3), cast_dtype(np.float32))
    self.host = {"calib": ops.zeros(shapes["calib"], cast_dtype(np.float32))}
    self.input_shape = shapes["input_img"]
    self.images, self.queues, self.states = {}, {}, {}  # none: every frame stands alone

  def step(self):
    img = self.ops.cast(self.warp(self.frames[0], self.m_inv[0]).reshape(self.input_shape), self.dtypes["input_img"])
    out = self.run_model("onnx", {"input_img": img, "calib": self.ops.cast(self.host["calib"], self.dtypes["calib"])})
    return self.ops.cast(out[self.output], self.f32)
