"""Driver-monitoring benchmark: the fused DM frame side by side with onnxruntime and the PyTorch peers, on this machine's device.

  python -m benchmarks.bench_dm [--model tiny|full|PATH.onnx] [--camera 1928x1208] [--beam N] [--frames 200] [--json out/bench_dm.json]

In one process and interleaved frame by frame (each frame starting at the next path), it times copy_frames + run + readback of
  fused DM frame   the driver camera's warp (compile_dm_warp: Y plane, openpilot's dmonitoringmodel_intrinsics, border 16) fused with the
                   DM model (compile_modeld), the camera buffer bound in place (on CUDA registered with the driver), camerad's 18 driver
                   buffers rotating: what dmonitoringmodeld runs per frame
and its peers on the same ONNX, frames, transform and calib: onnxruntime's CPU EP fed the numpy warp (replay/onnx_reference.dm_input),
and on a GPU PyTorch eager, a CUDA-graph replay and torch.compile max-autotune inside a CUDA graph (benchmarks/torch_peer.TorchDMPeer,
the machinery of the driving-model peers: peers.py). The kernel-only floor is the fused part's calls on its last bindings with no Python
per input (kernel_floor.device_floor_ms; on CPU each call's own kernel time). Every path's outputs are compared with the fused frame's on every
frame. Frames are the synthetic cabin (replay/cabin_scene: a face that sways, turns and blinks).

--model tiny (default) is the random-weight DM stand-in with a two-layer backbone, full the stand-in's realistic-depth backbone; both
take openpilot's DM input (1440x960 Y, calib) and give its output layout. --beam N searches the model's and the warp's kernels (BEAM=N).
--precision float16 builds the DM model in half and runs the peers on the float16 ONNX it computes (peers.peer_models: onnxruntime
only where its CPU EP runs it); outputs are checked against the fused frame's within peers.py's precision-aware tolerance.
"""
from __future__ import annotations

import os
import resource
import sys
import time

import numpy as np

from benchmarks.common import check_outputs, logger, markdown_table, percentiles, write_json
from benchmarks.frame_inputs import BUFFERS_PER_STREAM, cabin_buffers, set_dm_inputs
from benchmarks.kernel_floor import device_floor_ms
from benchmarks.peers import TORCH_PEERS, OrtDMPeer, PeerAdapter, make_peers, output_difference
from benchmarks.stand_ins import build_dm
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.runtime.frame_feeds import DRIVER_BUFFER

FUSED = "fused DM frame (camera buffer in place)"
WARMUP = 20

def bench_frames(built: dict, size: tuple[int, int], frames: int, log, peers: bool, torch_modes: list[str]) -> dict:
  """Every path on the same frames, interleaved; per path percentiles (ms), the ratio to the fused frame, and the largest output difference."""
  from tinygrad import Device

  from benchmarks.torch_peer import TorchDMPeer
  from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix, sensor_for_size
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  frame = camerad_frame(*size)
  bufs, m_inv = cabin_buffers(frame), dm_warp_matrix(sensor_for_size(*size), built["model_size"])
  fused = ModelRunner(built["model"], built["warps"][size])
  adapters: dict = {FUSED: fused}
  models = built["peers"]
  if peers:
    shape, fill = built["model_size"], built["border_fill"]
    adapters |= make_peers({}, frame, torch_modes, log, ort_peer=OrtDMPeer(models["ort"]["onnx"], frame, shape, fill), ort_label=models["ort_label"],
                           torch_peer=lambda mode: TorchDMPeer(models["torch"]["onnx"], frame, shape, fill, mode), cameras=(DRIVER_BUFFER,),
                           transform=(3, 3))
  times: dict[str, list[float]] = {p: [] for p in adapters}
  kernels, max_diff = [], dict.fromkeys(adapters, 0.0)
  log(f"{size[0]}x{size[1]} driver camera: {frames} frames per path, interleaved ...")
  for step in range(frames + WARMUP):
    order, outputs = list(adapters.items()), {}
    for path, adapter in order[step % len(order):] + order[:step % len(order)]:
      set_dm_inputs(adapter, step, m_inv)
      t0 = time.perf_counter()
      adapter.copy_frames(bufs[step % BUFFERS_PER_STREAM])
      try:
        adapter.run()
        outputs[path] = np.array(adapter.output_array())  # a copy: the adapter's own buffer is rewritten by its next run
      except Exception as e:
        if not isinstance(adapter, PeerAdapter): raise
        log(f"dropping the {path} peer: {type(e).__name__}: {e}")  # a peer must not sink the run
        del adapters[path], times[path]
        continue
      if step >= WARMUP:
        times[path].append((time.perf_counter() - t0) * 1e3)
        if path == FUSED: kernels.append(fused.replay.replay_s * 1e3)
    for path, out in outputs.items(): max_diff[path] = max(max_diff[path], output_difference(out, outputs[FUSED], models["relative"]))
  if fused.replay.outputs_in_place: floors, floor_how = kernels, "the fused part's kernel calls, timed inside each call"
  else: floors, floor_how = device_floor_ms(fused), "the fused part's graph run back to back with wait=True"
  floor, fused_p50 = float(np.percentile(floors, 50)), float(np.percentile(times[FUSED], 50))
  rows = {p: percentiles(t) | {"x_fused": float(np.percentile(t, 50)) / fused_p50, "max_abs_diff_vs_fused": max_diff[p],
                               "within_tolerance": max_diff[p] <= models["tolerance"],
                               "camera_frame_in_place": fused.frame_feed.reads_in_place if p == FUSED else False} for p, t in times.items()}
  bindings = fused.replay.bindings_made
  for adapter in adapters.values():
    if hasattr(adapter, "close"): adapter.close()  # unregister the camera buffers before they are freed
  return {"camera": f"{size[0]}x{size[1]}", "device": Device.DEFAULT, "frames": frames, "floor_ms": floor, "floor": floor_how, "paths": rows,
          "fused_bindings_made": bindings, "precision": built["precision"], "tolerance": models["tolerance"], "relative": models["relative"]}

def table(r: dict) -> str:
  rows = ((path, *(f"{row[k]:.3f}" for k in ("p10", "p50", "p95", "p99")), f"{row['x_fused']:.2f}x", "yes" if row["camera_frame_in_place"] else "no (copied)",
           f"{row['max_abs_diff_vs_fused']:.2g}") for path, row in r["paths"].items())
  lines = [f"\n{r['camera']} driver camera on {r['device']}, {r['frames']} frames, {r['precision']}; kernel-only floor {r['floor_ms']:.3f} ms "
           f"({r['floor']})", "",
           markdown_table(("path", "p10 ms", "p50 ms", "p95 ms", "p99 ms", "p50 / fused", "camera frame read in place", "max abs diff vs fused (every frame)"),
                          rows)]
  past = [p for p, row in r["paths"].items() if not row["within_tolerance"]]
  lines.append(f"\noutputs vs the fused DM frame: tolerance {r['tolerance']:.2g}{' relative above 1' if r['relative'] else ''}: "
               + (f"PAST IT: {', '.join(past)}" if past else "every path within it"))
  fused = r["paths"][FUSED]["p50"]
  lines.append(f"\nfused DM frame p50 {fused:.3f} ms = {fused / r['floor_ms']:.2f}x its kernel-only floor; {r['fused_bindings_made']} bindings made "
               f"(the fixed slots once, each of the {BUFFERS_PER_STREAM} rotating driver buffers once)")
  if (compiled := r["paths"].get(TORCH_PEERS["compile"])) is not None:
    lines.append(f"fused DM frame vs torch.compile max-autotune (CUDA graph): {compiled['p50'] / fused:.2f}x faster at p50")
  return "\n".join(lines)

def main(argv: list[str] | None = None) -> int:
  from tinygrad import Device
  parser = cli_parser("benchmarks.bench_dm", __doc__)
  parser.add_argument("--model", default="tiny", help="tiny, full (the random-weight DM stand-in's backbones) or a path to a DM ONNX")
  parser.add_argument("--camera", default="1928x1208", help="driver camera sizes, comma separated (1928x1208: comma 3/3X, 1344x760: comma 4)")
  parser.add_argument("--frames", type=int, default=200, help="timed frames per path and camera size")
  parser.add_argument("--beam", type=int, default=0, help="build the DM model and its warps with BEAM-searched kernels (0: no search)")
  parser.add_argument("--precision", choices=("float32", "float16"), default="float32", help="build the DM model in this precision and run the "
                      "peers in it (float16: torch and onnxruntime on the float16 ONNX the bundle computes)")
  parser.add_argument("--no-peers", action="store_true", help="skip onnxruntime and PyTorch")
  parser.add_argument("--torch-modes", default="eager,graph,compile", help=f"PyTorch peers on a GPU, comma separated: {', '.join(TORCH_PEERS)}")
  parser.add_argument("--workdir", default="out/bench_dm", help="where the stand-in and the bundles are built (an artifacts folder)")
  parser.add_argument("--json", help="write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  try: cameras = [tuple(int(x) for x in c.split("x")) for c in args.camera.split(",")]
  except ValueError: parser.error(f"--camera wants WxH sizes, comma separated, got {args.camera!r}")
  from sunnypilot.modeld_v2.model.calibration import sensor_for_size
  for size in cameras:
    try: sensor_for_size(*size)
    except ValueError as e: parser.error(f"--camera {size[0]}x{size[1]}: {e}")
  torch_modes = [m for m in args.torch_modes.split(",") if m]
  if bad := [m for m in torch_modes if m not in TORCH_PEERS]: parser.error(f"unknown --torch-modes {bad}: choose from {', '.join(TORCH_PEERS)}")
  if args.frames < 1 or args.beam < 0: parser.error("--frames must be positive and --beam not negative")
  if args.model not in ("tiny", "full") and not os.path.isfile(args.model): parser.error(f"--model {args.model}: not tiny, full or an ONNX file")
  log = logger()
  built = build_dm(args.model, cameras, args.workdir, log, args.beam, args.precision)
  results = [bench_frames(built, size, args.frames, log, not args.no_peers, torch_modes) for size in cameras]
  print(f"driver-monitoring model {args.model}{' (random-weight stand-in)' if args.model in ('tiny', 'full') else ''}, {built['kernels']} model "
        f"kernels, BEAM={args.beam}, {args.precision}, device {Device.DEFAULT}, compile {built['compile_s']:.1f} s, peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
  for r in results: print(table(r))
  write_json(args.json, {"model": args.model, "beam": args.beam, "precision": args.precision, "device": Device.DEFAULT, "kernels": built["kernels"],
                         "compile_s": built["compile_s"],
                         "results": results, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
  return 0

if __name__ == "__main__":
  sys.exit(main())
