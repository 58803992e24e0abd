"""The peers a frame benchmark runs beside the bundle, on the same ONNX and frames: onnxruntime on CPU (fed a numpy warp) always, PyTorch
(torch_peer) where torch sees a GPU; each behind the adapter interface the timing loops drive, and the tolerance its outputs are held to.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.peer_step import DMPeerStep, NumpyOps, PeerStep, clear
from sunnypilot.modeld_v2.compile.precision import FLOAT16, float16_bound, write_float16
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM
from sunnypilot.modeld_v2.replay.onnx_reference import dm_input
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

ORT_PEER = "onnxruntime (CPU EP, numpy warp)"
FLOAT32_TOLERANCE = 1e-3  # between float32 paths: other kernels and sum orders, far under it
TORCH_PEERS = {"eager": "torch eager (CUDA)", "graph": "torch CUDA graph", "compile": "torch.compile max-autotune (CUDA graph)"}

def peer_models(files: dict[str, str], precision: str, workdir: str, log: Callable[[str], None]) -> dict:
  """The ONNX files the peers run in `precision` and how far their outputs may be from the fused path's: {"torch": files, "ort": files,
  "ort_label", "tolerance", "relative"}. float16: each ONNX converted by compile/precision.to_float16 (the model the bundle computes), for
  onnxruntime only where its CPU EP runs it."""
  if precision != FLOAT16: return {"torch": files, "ort": files, "ort_label": ORT_PEER, "tolerance": FLOAT32_TOLERANCE, "relative": False}
  import onnxruntime as ort
  half = {k: write_float16(p, os.path.join(workdir, f"{os.path.splitext(os.path.basename(p))[0]}_float16.onnx")) for k, p in files.items()}
  try:
    for p in half.values(): ort.InferenceSession(p, providers=["CPUExecutionProvider"])
    ort_files, label = half, f"{ORT_PEER}, float16"
  except Exception as e:
    log(f"onnxruntime's CPU EP does not run the float16 ONNX ({type(e).__name__}: {str(e).splitlines()[0][:120]}): its peer runs float32")
    ort_files, label = files, f"{ORT_PEER}, float32 only"
  return {"torch": half, "ort": ort_files, "ort_label": label, "tolerance": 2 * float16_bound(files), "relative": True}

def output_difference(out: np.ndarray, ref: np.ndarray, relative: bool) -> float:
  """The largest difference of two paths' outputs: absolute, or relative to the reference above 1 (float16 rounds relatively)."""
  d = np.abs(out.astype(np.float64) - ref)
  return float((d / np.maximum(1.0, np.abs(ref)) if relative else d).max())

def numpy_warp(buf: np.ndarray, frame: Any, m_inv: np.ndarray, w: int = 512, h: int = 256) -> np.ndarray:
  """The warp in numpy, for the onnxruntime peer: the six (h/2, w/2) planes of one NV12 buffer."""
  def gather(m, out_w, out_h, in_w, in_h, base, step, dx, dy, every):
    ys, xs = np.mgrid[0:out_h, 0:out_w].astype(np.float32)
    xs, ys = xs * every + dx, ys * every + dy
    sw = m[2, 0] * xs + m[2, 1] * ys + m[2, 2]
    ix = np.clip(np.round((m[0, 0] * xs + m[0, 1] * ys + m[0, 2]) / sw), 0, in_w - 1).astype(np.int64)
    iy = np.clip(np.round((m[1, 0] * xs + m[1, 1] * ys + m[1, 2]) / sw), 0, in_h - 1).astype(np.int64)
    return buf[base + iy * frame.stride + ix * step]
  m_uv = m_inv * np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], np.float32)
  ys = [gather(m_inv, w // 2, h // 2, frame.width, frame.height, 0, 1, dx, dy, 2) for dx, dy in ((0, 0), (0, 1), (1, 0), (1, 1))]
  uv = [gather(m_uv, w // 2, h // 2, frame.width // 2, frame.height // 2, frame.uv_offset + c, 2, 0, 0, 1) for c in (0, 1)]
  return np.stack(ys + uv)

class OrtPeer:
  """onnxruntime (CPU execution provider) on the same ONNX files, fed by the numpy warp, with openpilot's queues in numpy (peer_step)."""
  def __init__(self, files: dict[str, str], frame: Any):
    import onnxruntime as ort
    sessions = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in files.items()}
    run = lambda key, feeds: dict(zip((o.name for o in sessions[key].get_outputs()), sessions[key].run(None, feeds)))
    self.peer = PeerStep(files, frame, NumpyOps(), run, lambda buf, m: numpy_warp(buf, frame, m))

  def reset(self) -> None: clear(self.peer)

  def step(self, road: np.ndarray, wide: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
    self.peer.frames[0], self.peer.frames[1] = road[:self.peer.frames.shape[1]], wide[:self.peer.frames.shape[1]]
    self.peer.m_inv[:] = host[HOST_TRANSFORM]
    for k, v in self.peer.host.items(): v.reshape(-1)[:] = host[k].reshape(-1)
    return self.peer.step()

class OrtDMPeer:
  """onnxruntime (CPU execution provider) on the DM ONNX, fed the numpy warp (onnx_reference.dm_input) through peer_step.DMPeerStep."""
  def __init__(self, path: str, frame: Any, size: tuple[int, int], border_fill: int | None):
    import onnxruntime as ort
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    run = lambda key, feeds: dict(zip((o.name for o in session.get_outputs()), session.run(None, feeds)))
    self.peer = DMPeerStep(path, frame, NumpyOps(), run, lambda buf, m: dm_input(buf, frame, m, size, border_fill))

  def reset(self) -> None: clear(self.peer)

  def step(self, buf: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
    self.peer.frames[0] = buf[:self.peer.frames.shape[1]]
    self.peer.m_inv[0] = host[HOST_TRANSFORM]
    self.peer.host["calib"][:] = host["calib"].reshape(self.peer.host["calib"].shape)
    return self.peer.step()

class PeerAdapter:
  """A peer (onnxruntime or torch) behind the adapter interface the timing loop drives: host inputs by the ONNX's names, the camera
  buffers of `cameras` passed to its step in that order (a driving model's road and wide; the driver-monitoring model's driver) with the
  warp's transform of `transform` shape."""
  def __init__(self, peer: Any, cameras: tuple[str, ...] = CAMERA_BUFFERS, transform: tuple[int, ...] = (2, 3, 3)):
    self.peer, self.cameras = peer, cameras
    self.numpy_inputs = {HOST_TRANSFORM: np.zeros(transform, np.float32)} | {k: np.zeros(tuple(v.shape), np.float32) for k, v in peer.peer.host.items()}

  def reset_states(self) -> None: self.peer.reset()

  def copy_frames(self, bufs: dict) -> None: self.bufs = bufs

  def run(self) -> None:
    self.out = self.peer.step(*(np.frombuffer(self.bufs[k].data, np.uint8) for k in self.cameras), self.numpy_inputs)

  def output_array(self) -> np.ndarray: return self.out

def make_peers(files: dict[str, str], frame: Any, torch_modes: list[str], log: Callable[[str], None], ort_peer: Any = None,
               torch_peer: Callable[[str], Any] | None = None, ort_label: str = ORT_PEER, **adapter: Any) -> dict:
  """onnxruntime on CPU always; the PyTorch peers in `torch_modes` where torch sees a GPU. Each starts from zeroed states and queues.
  A driving model's peers (OrtPeer, TorchPeer on `files`), or `ort_peer` and `torch_peer(mode)`'s (another model's, such as
  bench_dm's), each behind a PeerAdapter(peer, **adapter)."""
  peers = {ort_label: PeerAdapter(ort_peer or OrtPeer(files, frame), **adapter)}
  try:
    import torch
  except ImportError: return peers
  from benchmarks.torch_peer import TorchPeer
  if torch.cuda.is_available():
    for mode in torch_modes:
      log(f"building the {TORCH_PEERS[mode]} peer ...")
      t = time.perf_counter()
      try: peers[TORCH_PEERS[mode]] = PeerAdapter(torch_peer(mode) if torch_peer else TorchPeer(files, frame, mode), **adapter)
      except Exception as e: log(f"bench: skipping the {TORCH_PEERS[mode]} peer: {type(e).__name__}: {e}")  # a peer must not sink the run
      else: log(f"  ready in {time.perf_counter() - t:.1f} s")
  return peers
