"""Driver-monitoring frame sweep: which tinygrad knobs make the fused DM frame (dm_warp + the DM model over the 1440x960 Y plane) at least
as fast as torch.compile max-autotune, at the same precision, outputs checked.

  python -m benchmarks.bench_dm_sweep --list                                              # the variants and what each answers
  DEV=CUDA python -m benchmarks.bench_dm_sweep --variants f16_tc,f16_b2 --budget-s 480 --json out/dm_sweep_f16.json
  python -m benchmarks.bench_dm_sweep --model tiny --variants f32,f16 --frames 5 --torch-modes none   # CPU: the machinery only

Each variant (a named set of tinygrad knobs and compile options: benchmarks/sweep_variants.py) is built in a fresh process on this device,
into --workdir/<variant> (reused while the same build is there). Then, per camera size and precision, every variant's fused frame (the
camera buffer bound in place, camerad's 18 driver buffers rotating, as dmonitoringmodeld runs it) and the torch peers of that precision
(benchmarks/torch_peer.TorchDMPeer on the same ONNX; float16: the float16 ONNX the bundle computes) run the same frames (a synthetic cabin)
interleaved, then each alone (sweep_timing.py). The goal line: torch.compile's p50 over the fastest variant's within tolerance, interleaved
(as bench_dm measures it), at least 1.0x. A build that fails, a bundle that does not load or replay, a peer that cannot be built: one line
each, the rest go on. --budget-s drops what does not fit and says so.
"""
from __future__ import annotations

import os
import sys

import numpy as np

from benchmarks.frame_inputs import cabin_buffers, set_dm_inputs
from benchmarks.sweep_timing import FrameKind, sweep_main
from benchmarks.sweep_variants import DM_DEFAULT, DM_VARIANTS

def sources(model: str, workdir: str) -> dict[str, str]:
  """The DM ONNX: the stand-in (tiny, full: written into workdir, seeded: the same bytes every time) or the given file."""
  if model not in ("tiny", "full"): return {"onnx": model}
  from sunnypilot.modeld_v2.tools import stand_in_models
  return {"onnx": stand_in_models.write("dmonitoring", model, os.path.join(workdir, f"dmonitoring_{model}.onnx"))["files"]["onnx"]}

def load(record: dict, size: tuple[int, int]):
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  return ModelRunner(record["model"], record["warps"][f"{size[0]}x{size[1]}"])

def torch_peer(files: dict[str, str], frame, mode: str, wrap):
  from benchmarks.peers import PeerAdapter
  from benchmarks.torch_peer import TorchDMPeer
  from sunnypilot.modeld_v2.compile_dm_warp import BORDER_FILL
  from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
  from sunnypilot.modeld_v2.runtime.frame_feeds import DRIVER_BUFFER
  return PeerAdapter(wrap(lambda: TorchDMPeer(files["onnx"], frame, DM_INPUT_SIZE, BORDER_FILL, mode)), cameras=(DRIVER_BUFFER,), transform=(3, 3))

def transform(size: tuple[int, int]) -> np.ndarray:
  from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE, dm_warp_matrix, sensor_for_size
  return dm_warp_matrix(sensor_for_size(*size), DM_INPUT_SIZE)

# torch.compile max-autotune of the full DM stand-in: a run that built it with the other peers did not end in 250 s (docs/BENCHMARKS.md)
DM = FrameKind("dm", DM_VARIANTS, sources, load, torch_peer, cabin_buffers, set_dm_inputs, transform, compile_s=200.0, goal=1.0, goal_on="interleaved")

def main(argv: list[str] | None = None) -> int: return sweep_main(DM, "benchmarks.bench_dm_sweep", __doc__, DM_DEFAULT, argv)

if __name__ == "__main__":
  sys.exit(main())
