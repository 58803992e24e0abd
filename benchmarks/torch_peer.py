"""The PyTorch peer of the benchmark: the same ONNX graph and the same warp math run by torch, eagerly and as a CUDA-graph replay.

A small interpreter of the ONNX ops the driving models use (the stand-ins' set), with the ONNX's own weights: no converter needed.
"""
from __future__ import annotations

from typing import Any

import numpy as np

def _attrs(node) -> dict:
  from onnx import helper
  return {a.name: helper.get_attribute_value(a) for a in node.attribute}

class TorchOnnx:
  """Runs an ONNX graph with torch ops on `device`."""
  def __init__(self, path: str, device: str):
    import onnx
    import torch
    from onnx import numpy_helper
    self.torch, self.model = torch, onnx.load(path)
    self.consts = {i.name: numpy_helper.to_array(i) for i in self.model.graph.initializer}
    self.values = {k: torch.from_numpy(np.array(v)).to(device) for k, v in self.consts.items()}
    self.outputs = [o.name for o in self.model.graph.output]

  def _ints(self, name: str) -> list[int]: return [int(x) for x in np.asarray(self.consts[name]).reshape(-1)]

  def __call__(self, feeds: dict) -> dict:
    torch, F = self.torch, self.torch.nn.functional
    env = dict(self.values) | feeds
    for node in self.model.graph.node:
      x, a, op = [env[i] for i in node.input], _attrs(node), node.op_type
      if op == "Identity": y = x[0]
      elif op == "Cast": y = x[0].float() if a["to"] == 1 else x[0]
      elif op in ("Add", "Sub", "Mul", "Div"): y = getattr(torch, op.lower())(x[0], x[1])
      elif op in ("Relu", "Sigmoid", "Tanh"): y = getattr(torch, op.lower())(x[0])
      elif op == "MatMul": y = x[0] @ x[1]
      elif op == "Conv": y = F.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1), padding=a.get("pads", [0, 0])[:2])
      elif op == "GlobalAveragePool": y = x[0].mean(dim=(2, 3), keepdim=True)
      elif op == "Flatten": y = x[0].flatten(a.get("axis", 1))
      elif op == "Concat": y = torch.cat(x, dim=a["axis"])
      elif op == "Reshape": y = x[0].reshape(self._ints(node.input[1]))
      elif op == "Squeeze": y = x[0].squeeze(self._ints(node.input[1])[0])
      elif op == "Unsqueeze": y = x[0].unsqueeze(self._ints(node.input[1])[0])
      elif op == "ReduceMean": y = x[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1)))
      elif op == "Slice":
        starts, ends, axes = (self._ints(n) for n in node.input[1:4])
        index = [slice(None)] * x[0].ndim
        for s, e, ax in zip(starts, ends, axes): index[ax] = slice(s, e)
        y = x[0][tuple(index)]
      else: raise NotImplementedError(f"the torch peer does not implement ONNX {op}")
      env[node.output[0]] = y
    return {k: env[k] for k in self.outputs}

class TorchWarp:
  """The warp of warp.make_frame_prepare in torch: (size,) uint8 + (3, 3) -> (6, H/2, W/2) uint8. Constants are made once, so a call
  holds only tensor ops (CUDA-graph capturable)."""
  def __init__(self, frame, device: str, model_w: int = 512, model_h: int = 256):
    import torch
    h2, w2, dev = model_h // 2, model_w // 2, device
    self.chroma = torch.tensor([0, 0, 0, 0, 1, 1], device=dev, dtype=torch.bool).view(6, 1, 1)
    self.scale = torch.ones(6, 3, 3, device=dev)
    self.scale[4:] = torch.tensor([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], device=dev)
    every = torch.where(self.chroma, 1.0, 2.0)
    self.x = torch.arange(w2, device=dev, dtype=torch.float32).view(1, 1, w2) * every + torch.tensor([0, 0, 1, 1, 0, 0.], device=dev).view(6, 1, 1)
    self.y = torch.arange(h2, device=dev, dtype=torch.float32).view(1, h2, 1) * every + torch.tensor([0, 1, 0, 1, 0, 0.], device=dev).view(6, 1, 1)
    self.max_x = torch.where(self.chroma, frame.width // 2 - 1, frame.width - 1).float()
    self.max_y = torch.where(self.chroma, frame.height // 2 - 1, frame.height - 1).float()
    self.base = torch.tensor([0, 0, 0, 0, frame.uv_offset, frame.uv_offset + 1], device=dev).view(6, 1, 1)
    self.step = torch.where(self.chroma, 2, 1)
    self.stride, self.torch = frame.stride, torch

  def __call__(self, frame_bytes, m_inv):
    torch = self.torch
    m = m_inv.view(1, 3, 3) * self.scale
    sx, sy, sw = (m[:, r, 0].view(6, 1, 1) * self.x + m[:, r, 1].view(6, 1, 1) * self.y + m[:, r, 2].view(6, 1, 1) for r in range(3))
    coord = lambda v, hi: torch.minimum(torch.clamp(torch.nan_to_num(torch.round(v / sw)), min=0), hi).long()  # NaN/inf stay in the image
    return frame_bytes[self.base + coord(sy, self.max_y) * self.stride + coord(sx, self.max_x) * self.step]

class TorchPeer:
  """Native-layout model + warp in torch: `step(road, wide, host)` copies both frames up, runs, feeds the state back, reads outputs."""
  def __init__(self, onnx_path: str, frame, device: str = "cuda", graph: bool = False):
    import torch
    self.torch, self.frame, self.device = torch, frame, device
    self.model = TorchOnnx(onnx_path, device)
    inputs = {i.name: i for i in self.model.model.graph.input if i.name not in self.model.consts}
    shape = lambda name: [d.dim_value for d in inputs[name].type.tensor_type.shape.dim]
    self.frames = torch.zeros(2, frame.size, dtype=torch.uint8, device=device)
    self.host = {k: torch.zeros(shape(k), device=device) for k in ("desire", "traffic_convention", "action_t")}
    self.m_inv = torch.eye(3, device=device).repeat(2, 1, 1)
    self.states = {k: torch.zeros(shape(k), device=device) for k in inputs if k.startswith("state_")}
    self.pinned = torch.zeros(2, frame.size, dtype=torch.uint8).pin_memory() if device == "cuda" else None
    self.warp = TorchWarp(frame, device)
    self.graph = None
    previous = self._primary_context() if device == "cuda" else None
    if graph:
      stream = torch.cuda.Stream()
      stream.wait_stream(torch.cuda.current_stream())
      with torch.cuda.stream(stream):
        for _ in range(3): self._compute()  # warm up outside the graph, as CUDA graphs require
      torch.cuda.current_stream().wait_stream(stream)
      self.graph = torch.cuda.CUDAGraph()
      with torch.cuda.graph(self.graph): self.out = self._compute()
    self._restore(previous)

  def _compute(self):
    new_img = self.torch.stack([self.warp(self.frames[i], self.m_inv[i]) for i in range(2)])
    out = self.model({"new_img": new_img} | self.host | self.states)
    for k, v in self.states.items(): v.copy_(out[f"next_{k}"])
    return out["outputs"]

  def _primary_context(self) -> Any:
    """tinygrad runs CUDA in a context of its own and leaves it current; torch expects the device's primary context. Returns the context
    that was current, for step() to put back: tinygrad's graphs launch in whatever context is current."""
    import ctypes

    from tinygrad.runtime.autogen import cuda
    if not hasattr(self, "_ctx"):
      self._ctx = cuda.CUcontext()
      cuda.cuDevicePrimaryCtxRetain(ctypes.byref(self._ctx), 0)
    previous = cuda.CUcontext()
    cuda.cuCtxGetCurrent(ctypes.byref(previous))
    cuda.cuCtxSetCurrent(self._ctx)
    return previous

  def step(self, road: np.ndarray, wide: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
    previous = self._primary_context() if self.device == "cuda" else None
    try: return self._step(road, wide, host)
    finally: self._restore(previous)

  @staticmethod
  def _restore(previous: Any) -> None:
    """Put back the context the caller had current (tinygrad's): a peer must not move tinygrad's next launches into torch's context."""
    if previous is not None:
      from tinygrad.runtime.autogen import cuda
      cuda.cuCtxSetCurrent(previous)

  def _step(self, road: np.ndarray, wide: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
    torch = self.torch
    staging = self.pinned if self.pinned is not None else torch.empty(2, self.frame.size, dtype=torch.uint8)
    staging[0].numpy()[:] = road[:self.frame.size]
    staging[1].numpy()[:] = wide[:self.frame.size]
    self.frames.copy_(staging, non_blocking=True)
    self.m_inv.copy_(torch.from_numpy(host["tfm"]))
    for k, v in self.host.items(): v.copy_(torch.from_numpy(host[k]).view(v.shape))
    if self.graph is not None: self.graph.replay()
    else: self.out = self._compute()
    return self.out.cpu().numpy()
