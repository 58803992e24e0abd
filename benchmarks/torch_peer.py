"""The PyTorch peers of the benchmarks: the same ONNX graphs, the same warp math and openpilot's input queues (peer_step) run by torch on
a GPU: eagerly, as a CUDA-graph replay, and compiled by torch.compile (max-autotune: Triton kernels, autotuned) inside a CUDA graph.
TorchPeer runs a driving model's frame (two cameras), TorchDMPeer the driver-monitoring model's (the driver camera, benchmarks.bench_dm).

A small interpreter of the ONNX ops the driving models use (the stand-ins' set), with the ONNX's own weights: no converter needed. It walks
plain Python node records made once from the protobuf, so torch.compile's tracer (dynamo) sees only lists, tuples, strings and ints.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from benchmarks.peer_step import DMPeerStep, PeerStep, clear
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM

MODES = ("eager", "graph", "compile")
ONNX_TYPES = {1: "float32", 2: "uint8", 10: "float16"}  # TensorProto element types the stand-ins cast to

class Node(NamedTuple):
  """One ONNX node as plain data: constant operands (shapes, axes, slice bounds) already read as int tuples into `attrs`."""
  op: str
  inputs: tuple[str, ...]
  output: str
  attrs: dict

def plain_nodes(model, consts: dict[str, np.ndarray]) -> list[Node]:
  from onnx import helper
  ints = lambda name: tuple(int(x) for x in np.asarray(consts[name]).reshape(-1))
  nodes = []
  for node in model.graph.node:
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs = {k: tuple(v) if isinstance(v, list) else v for k, v in attrs.items()}
    inputs = tuple(node.input)
    if node.op_type == "Reshape": attrs["shape"], inputs = ints(inputs[1]), inputs[:1]
    elif node.op_type in ("Squeeze", "Unsqueeze"): attrs["axis"], inputs = ints(inputs[1])[0], inputs[:1]
    elif node.op_type == "Slice": attrs["bounds"], inputs = tuple(zip(*(ints(n) for n in inputs[1:4]))), inputs[:1]
    nodes.append(Node(node.op_type, inputs, node.output[0], attrs))
  return nodes

class TorchOnnx:
  """Runs an ONNX graph with torch ops on `device`; returns every graph output by name."""
  def __init__(self, path: str, device: str):
    import onnx
    import torch
    from onnx import numpy_helper
    self.torch, model = torch, onnx.load(path)
    consts = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    self.values = {k: torch.from_numpy(np.array(v)).to(device) for k, v in consts.items()}
    self.nodes = plain_nodes(model, consts)
    self.outputs = tuple(o.name for o in model.graph.output)

  def __call__(self, feeds: dict) -> dict:
    env = dict(self.values) | feeds
    for op, inputs, output, a in self.nodes:
      if (fn := TORCH_OPS.get(op)) is None: raise NotImplementedError(f"the torch peer does not implement ONNX {op}")
      env[output] = fn(self.torch, [env[i] for i in inputs], a)
    return {k: env[k] for k in self.outputs}

def _slice(x, a: dict):
  index = [slice(None)] * x.ndim
  for s, e, ax in a["bounds"]: index[ax] = slice(s, e)
  return x[tuple(index)]

# ONNX op -> (torch, its inputs, its attributes) -> its output, for the ops the stand-ins use
TORCH_OPS = {
  "Identity": lambda torch, x, a: x[0],
  "Cast": lambda torch, x, a: x[0].to(getattr(torch, ONNX_TYPES[a["to"]])),
  **{op: (lambda name: lambda torch, x, a: getattr(torch, name)(x[0], x[1]))(op.lower()) for op in ("Add", "Sub", "Mul", "Div")},
  **{op: (lambda name: lambda torch, x, a: getattr(torch, name)(x[0]))(op.lower()) for op in ("Relu", "Sigmoid", "Tanh")},
  "MatMul": lambda torch, x, a: x[0] @ x[1],
  "Conv": lambda torch, x, a: torch.nn.functional.conv2d(x[0], x[1], x[2] if len(x) > 2 else None, stride=a.get("strides", 1),
                                                          padding=a.get("pads", (0, 0))[:2]),
  "GlobalAveragePool": lambda torch, x, a: x[0].mean(dim=(2, 3), keepdim=True),
  "Flatten": lambda torch, x, a: x[0].flatten(a.get("axis", 1)),
  "Concat": lambda torch, x, a: torch.cat(x, dim=a["axis"]),
  "Reshape": lambda torch, x, a: x[0].reshape(a["shape"]),
  "Squeeze": lambda torch, x, a: x[0].squeeze(a["axis"]),
  "Unsqueeze": lambda torch, x, a: x[0].unsqueeze(a["axis"]),
  "ReduceMean": lambda torch, x, a: x[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1))),
  "Slice": lambda torch, x, a: _slice(x[0], a),
}

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

class TorchDMWarp:
  """The driver camera's warp of warp.make_dm_warp in torch: (size,) uint8 + (3, 3) -> (1, W*H) uint8, the Y plane, the nearest source
  pixel (round half to even), `border_fill` outside the image (a NaN coordinate too), or clamped (None)."""
  def __init__(self, frame, device: str, size: tuple[int, int], border_fill: int | None):
    import torch
    (w, h), self.torch, self.frame, self.fill = size, torch, frame, border_fill
    self.y, self.x = (g.float() for g in torch.meshgrid(torch.arange(h, device=device), torch.arange(w, device=device), indexing="ij"))

  def __call__(self, frame_bytes, m_inv):
    torch, f = self.torch, self.frame
    sx, sy, sw = (m_inv[r, 0] * self.x + m_inv[r, 1] * self.y + m_inv[r, 2] for r in range(3))
    fx, fy = torch.round(sx / sw), torch.round(sy / sw)
    ix = torch.clamp(torch.nan_to_num(fx, nan=0.0), 0, f.width - 1).long()
    iy = torch.clamp(torch.nan_to_num(fy, nan=0.0), 0, f.height - 1).long()
    out = frame_bytes[iy * f.stride + ix]
    if self.fill is not None: out = torch.where((fx >= 0) & (fx <= f.width - 1) & (fy >= 0) & (fy <= f.height - 1), out, self.fill)
    return out.reshape(1, -1)

class TorchOps:
  """peer_step's array operations on torch (in-place updates with copy_, so a CUDA graph replays them)."""
  def __init__(self, device: str):
    import torch
    self.torch, self.device = torch, device

  def zeros(self, shape, dtype): return self.torch.zeros(shape, dtype=dtype, device=self.device)
  def cat(self, xs: list, axis: int): return self.torch.cat(xs, dim=axis)
  def amax(self, x, axis: int): return self.torch.amax(x, dim=axis)
  def assign(self, dst, src) -> None: dst.copy_(src)
  def cast(self, x, dtype): return x.to(dtype)

class TorchPeer:
  """A generation's model(s) + warp + queues in torch: `step(road, wide, host)` copies both frames and the host inputs up, runs (eager, one
  CUDA-graph replay, or torch.compile's kernels in one CUDA graph), reads the outputs. Every mode starts from zeroed queues and states:
  warm-up and capture run the step, and what they pushed is cleared before the first timed frame."""
  def __init__(self, files: dict[str, str], frame, mode: str = "eager", device: str = "cuda"):
    import torch
    if mode not in MODES: raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    self.torch, self.frame, self.device = torch, frame, device
    previous = self._primary_context() if device == "cuda" else None
    models = {k: TorchOnnx(p, device) for k, p in files.items()}
    self.peer = self.make_step(files, frame, lambda key, feeds: models[key](feeds), lambda d: getattr(torch, np.dtype(d).name))
    self.pinned = torch.zeros(tuple(self.peer.frames.shape), dtype=torch.uint8).pin_memory() if device == "cuda" else None
    compute = self.peer.step
    if mode == "compile": compute = torch.compile(self.peer.step, mode="max-autotune-no-cudagraphs", dynamic=False)
    self.graph = None
    if mode in ("graph", "compile"):
      stream = torch.cuda.Stream()
      stream.wait_stream(torch.cuda.current_stream())
      with torch.cuda.stream(stream):
        for _ in range(3): compute()  # warm up (and compile) outside the graph, as CUDA graphs require
      torch.cuda.current_stream().wait_stream(stream)
      self.graph = torch.cuda.CUDAGraph()
      with torch.cuda.graph(self.graph): self.out = compute()
    self.compute = compute
    self.reset()
    self._restore(previous)

  def make_step(self, files: dict[str, str], frame, run_model, torch_dtype) -> PeerStep:
    """The frame's computation over torch buffers: a driving model's (PeerStep, with the road warp)."""
    return PeerStep(files, frame, TorchOps(self.device), run_model, TorchWarp(frame, self.device), torch_dtype)

  def reset(self) -> None:
    """Zero every queue and state in place (the CUDA graph keeps their addresses): the next step starts where the other paths start."""
    clear(self.peer)
    if self.device == "cuda": self.torch.cuda.synchronize()

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

  def step(self, *frames_and_host) -> np.ndarray:
    """step(road, wide, host) for a driving model, step(driver, host) for TorchDMPeer: each camera buffer (uint8), then the host inputs."""
    previous = self._primary_context() if self.device == "cuda" else None
    try: return self._step(frames_and_host[:-1], frames_and_host[-1])
    finally: self._restore(previous)

  @staticmethod
  def _restore(previous: Any) -> None:
    """Put back the context the caller had current (tinygrad's): a peer must not move tinygrad's next launches into torch's context."""
    if previous is not None:
      from tinygrad.runtime.autogen import cuda
      cuda.cuCtxSetCurrent(previous)

  def _step(self, frames: tuple[np.ndarray, ...], host: dict[str, np.ndarray]) -> np.ndarray:
    torch, peer = self.torch, self.peer
    staging = self.pinned if self.pinned is not None else torch.empty(tuple(peer.frames.shape), dtype=torch.uint8)
    for k, buf in enumerate(frames): staging[k].numpy()[:] = buf[:self.frame.size]
    peer.frames.copy_(staging, non_blocking=True)
    peer.m_inv.copy_(torch.from_numpy(host[HOST_TRANSFORM]).view(peer.m_inv.shape))
    for k, v in peer.host.items(): v.copy_(torch.from_numpy(host[k]).view(v.shape))
    if self.graph is not None: self.graph.replay()
    else: self.out = self.compute()
    return self.out.cpu().numpy()

class TorchDMPeer(TorchPeer):
  """The driver-monitoring frame in torch (DMPeerStep with TorchDMWarp for the dm_warp's model `size` and `border_fill`): `step(driver,
  host)`, host holding "tfm" (3, 3) and "calib"; eager, one CUDA-graph replay, or torch.compile's kernels in one CUDA graph."""
  def __init__(self, path: str, frame, size: tuple[int, int], border_fill: int | None, mode: str = "eager", device: str = "cuda"):
    self.size, self.border_fill = size, border_fill
    super().__init__({"onnx": path}, frame, mode, device)

  def make_step(self, files: dict[str, str], frame, run_model, torch_dtype) -> DMPeerStep:
    return DMPeerStep(files["onnx"], frame, TorchOps(self.device), run_model, TorchDMWarp(frame, self.device, self.size, self.border_fill), torch_dtype)
