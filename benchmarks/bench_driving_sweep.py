"""Driving frame sweep: the fused split frame (both road cameras' warp + the native stand-in, one graph) against torch.compile max-autotune
alone, at float32 and float16, outputs checked; the goal: torch.compile alone at least 8x slower at p50, at each precision.

  python -m benchmarks.bench_driving_sweep --list
  DEV=CUDA python -m benchmarks.bench_driving_sweep --budget-s 480 --json out/driving_sweep.json   # f32_b2, f16_b2, each also as one graph
  python -m benchmarks.bench_driving_sweep --model tiny --variants f32,f16 --frames 5 --torch-modes none   # CPU: the machinery only

The variants (benchmarks/sweep_variants.py) build in fresh processes as bench_dm_sweep's do; `*_1graph` replays another variant's bundles
as one CUDA graph (JIT_BATCH_SIZE=0 at load: no build). Per camera size and precision every variant's fused split frame (camerad's 18
rotating buffer pairs read in place) and the torch peers of that precision (benchmarks/torch_peer.TorchPeer: the same ONNX, warp and
queues) run interleaved, then each alone (sweep_timing.py): the goal is reckoned on the alone p50s, as modeld runs.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from benchmarks.frame_inputs import set_inputs, synthetic_buffers
from benchmarks.sweep_timing import FrameKind, sweep_main
from benchmarks.sweep_variants import DRIVING_DEFAULT, DRIVING_VARIANTS

def sources(model: str, workdir: str) -> dict[str, str]:
  """The native stand-in (tiny, full: written into workdir, seeded) or the given native ONNX."""
  if model not in ("tiny", "full"): return {"onnx": model}
  from sunnypilot.modeld_v2.tools import stand_in_models
  return stand_in_models.write("native", model, os.path.join(workdir, f"native_{model}.onnx"))["files"]

def load(record: dict, size: tuple[int, int]):
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  return ModelRunner(record["model"], record["warps"][f"{size[0]}x{size[1]}"])

def torch_peer(files: dict[str, str], frame, mode: str, wrap):
  from benchmarks.peers import PeerAdapter
  from benchmarks.torch_peer import TorchPeer
  return PeerAdapter(wrap(lambda: TorchPeer(files, frame, mode)))

def transform(size: tuple[int, int]) -> np.ndarray:
  from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, sensor_for_size, warp_matrices
  return warp_matrices(SENSOR_CAMERAS[sensor_for_size(*size)])

DRIVING = FrameKind("driving", DRIVING_VARIANTS, sources, load, torch_peer, synthetic_buffers, set_inputs, transform, compile_s=90.0, goal=8.0,
                    goal_on="alone")

def main(argv: list[str] | None = None) -> int: return sweep_main(DRIVING, "benchmarks.bench_driving_sweep", __doc__, DRIVING_DEFAULT, argv)

if __name__ == "__main__":
  sys.exit(main())
