"""The bundles a frame benchmark builds into its workdir: of a random-weight stand-in (tools/stand_in_models: tiny, full) or of a given
ONNX, with their warps per camera size, and the ONNX files its peers run (peers.peer_models)."""
from __future__ import annotations

import os
from collections.abc import Callable

from benchmarks.peers import peer_models
from sunnypilot.modeld_v2 import compile_dm_warp
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING
from sunnypilot.modeld_v2.model.calibration import DM_INPUT_SIZE
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.tools import stand_in_models

def build(model: str, generation: str, cameras: list[tuple[int, int]], workdir: str, log: Callable[[str], None], beam: int = 0,
          host_parse: bool = False, precision: str = "float32") -> dict:
  """Stand-in ONNX files (or the given one), model bundle in `precision` (`host_parse`: without the output parse in its graph) and warp
  bundles per camera size; compile times; the peers' models (peer_models)."""
  os.makedirs(workdir, exist_ok=True)
  if model in ("tiny", "full"): files = stand_in_models.write(generation, model, os.path.join(workdir, f"{generation}_{model}.onnx"))["files"]
  else: files = {"onnx": model}
  bundle = os.path.join(workdir, "model.bin")
  log(f"compiling {', '.join(files.values())} ...")
  summary = compile_model(bundle, **files, log=lambda s: None, beam=beam, host_parse=host_parse, precision=precision)
  out = {"files": files, "model": bundle, "compile_s": summary["compile_s"], "kernels": summary["kernels"], "warps": {}, "precision": precision,
         "peers": peer_models(files, precision, workdir, log)}
  for w, h in cameras:
    frame = camerad_frame(w, h)
    out["warps"][(w, h)] = {split: compile_warp(frame.spec, "512x256", os.path.join(workdir, f"warp_{w}x{h}_{split}.bin"), split, beam=beam)["output"]
                            for split in (False, True)} | {"frame": frame}
  return out

def build_dm(model: str, cameras: list[tuple[int, int]], workdir: str, log: Callable[[str], None], beam: int = 0, precision: str = "float32") -> dict:
  """The DM stand-in's ONNX (tiny, full) or the given one, its bundle dmonitoring_model.bin in `precision` and a dm_warp_<w>x<h>.bin per
  camera size in `workdir` (an artifacts folder dmonitoringmodeld reads), with `beam`; what was built, with the peers' models (peer_models)."""
  os.makedirs(workdir, exist_ok=True)
  onnx = stand_in_models.write("dmonitoring", model, os.path.join(workdir, f"dmonitoring_{model}.onnx"))["files"]["onnx"] \
    if model in ("tiny", "full") else model
  bundle = os.path.join(workdir, DRIVER_MONITORING.model_name)
  log(f"compiling {onnx}{f' with BEAM={beam}' if beam else ''} ...")
  summary = compile_model(bundle, onnx=onnx, log=lambda s: None, beam=beam, precision=precision)
  warps = {}
  for w, h in cameras:
    log(f"compiling the driver camera's warp for {w}x{h} ...")
    warps[(w, h)] = compile_dm_warp.compile_dm_warp(camerad_frame(w, h).spec, os.path.join(workdir, f"dm_warp_{w}x{h}.bin"), beam=beam,
                                                    log=lambda s: None)["output"]
  return {"onnx": onnx, "model": bundle, "compile_s": summary["compile_s"], "kernels": summary["kernels"], "warps": warps,
          "model_size": DM_INPUT_SIZE, "border_fill": compile_dm_warp.BORDER_FILL, "precision": precision,
          "peers": peer_models({"onnx": onnx}, precision, workdir, log)}

def build_split_current(workdir: str, size: str, log: Callable[[str], None]) -> tuple[str, str]:
  """The split_current stand-in of `size` and a 1928x1208 split warp in workdir/<device>_<size>/ (built when missing): what the load
  benchmarks stream."""
  from tinygrad import Device
  folder = os.path.join(workdir, f"{Device.DEFAULT.lower()}_{size}")
  model, warp = os.path.join(folder, "model.bin"), os.path.join(folder, "warp.bin")
  os.makedirs(folder, exist_ok=True)
  if not os.path.exists(model):
    log(f"building the {size} split_current stand-in in {folder} ...")
    files = stand_in_models.write("split_current", size, os.path.join(folder, "stand_in.onnx"))["files"]
    compile_model(model, **files, log=log)
    for path in files.values(): os.remove(path)  # hundreds of MB that only the build needed
  if not os.path.exists(warp): compile_warp(camerad_frame(1928, 1208).spec, "512x256", warp, split_frames=True, log=lambda s: None)
  return model, warp
