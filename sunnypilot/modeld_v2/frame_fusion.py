"""Fuse the camera warp into the driving model: one part, one host upload, then the warp's kernels and the model's.

The fused part takes `host` (one packed uint8 NPY buffer: the warp's M_inv as `tfm`, every non-state model input and, for a
packed warp, both camera frames), each state, `output_buffers`, and with a --split-frames warp `frame` and `big_frame`, which
modeld binds to the camera buffers by pointer. `fuse` is a pure data transform on two parts (no files, nothing recompiled); `frame_part`
is the seed's name for reading a warp bundle and fusing it.
"""
from __future__ import annotations

import os

import numpy as np

from sunnypilot.modeld_v2.bundle import ArtifactError, TensorSpec, np_dtype, read_parts, state_names

SPLIT_FRAMES = ("big_frame", "frame")  # a --split-frames warp: one input per camera, bound by pointer, not packed into host
HOST_ALIGN = 64  # every slot of the packed host buffer starts on a cache line, so float views are aligned on any device
TFM = ("tfm", (2, 3, 3))  # the warp's M_inv (road, wide), first in the host buffer

def pack_layout(shapes: dict[str, tuple], frame_size: int) -> tuple[dict[str, int], int]:
  """Byte offsets of `tfm` and each float32 host input in the packed host buffer, then `frames` (two camera frames) if frame_size.

  Returns (offsets, total bytes). A split warp passes frame_size 0: its frames are bound by pointer, not packed."""
  offsets, offset = {}, 0
  for name, shape in (dict([TFM]) | shapes).items():
    offsets[name] = offset
    offset += -(-int(np.prod(shape)) * 4 // HOST_ALIGN) * HOST_ALIGN
  if frame_size: offsets["frames"] = offset
  return offsets, offset + 2 * frame_size

class _Blobs:
  """The model's and the warp's blobs as one address space, for a part whose ranges span both files."""
  def __init__(self, *blobs):
    self.blobs, self.starts = blobs, np.cumsum([0] + [len(b) for b in blobs]).tolist()

  def __len__(self) -> int: return self.starts[-1]

  def __getitem__(self, span: slice) -> memoryview | bytes:
    start, stop, _ = span.indices(len(self))
    for blob, base, end in zip(self.blobs, self.starts, self.starts[1:]):
      if base <= start and stop <= end: return memoryview(blob)[start - base:stop - base]  # inside one blob: a view, no copy
    return b"".join(bytes(memoryview(blob)[max(start, base) - base:min(stop, end) - base])
                    for blob, base, end in zip(self.blobs, self.starts, self.starts[1:]) if start < end and stop > base)

  def __bytes__(self) -> bytes: return bytes(self[0:len(self)])

def frame_part(warp_path: str, parts: dict, extras: dict, device: str | None = None, allow_device: bool = False) -> tuple[dict, dict]:
  """The seed's extension: read the warp bundle at `warp_path` for `device` and fuse it in front of the model's part."""
  return fuse((parts, extras), read_parts(warp_path, device, allow_device), os.path.basename(warp_path))

def fuse(model_bundle: tuple[dict, dict], warp_bundle: tuple[dict, dict], warp_name: str = "warp") -> tuple[dict, dict]:
  """`(parts, extras)` of a model bundle and of a warp bundle -> `(parts, extras)` of the fused part. Pure: reads no files."""
  (parts, extras), (warp_parts, warp_extras) = model_bundle, warp_bundle
  (model, model_blob), (warp, warp_blob) = parts["run"], warp_parts["run"]
  meta, warp_meta = extras["metadata"], warp_extras["metadata"]
  if meta.get("kind") != "model" or warp_meta.get("kind") != "warp":
    raise ArtifactError(f"fusion takes a model bundle and a warp bundle ({warp_name}), got a {meta.get('kind')} and a {warp_meta.get('kind')}")
  if model["device"] != warp["device"]: raise ArtifactError(f"the model is for {model['device']} and the warp {warp_name} for {warp['device']}")
  if any("input" in r for r in model["returns"]["tensors"]): raise ArtifactError("a model part that returns one of its inputs cannot be fused")
  states = state_names(extras["input_specs"], extras["output_specs"])
  host = {name: spec.shape for name, spec in extras["input_specs"].items() if name not in states and name != "new_img"}
  if bad := [n for n, spec in extras["input_specs"].items() if n in host and np.dtype(spec.dtype) != np.float32]:
    raise ArtifactError(f"host inputs must be float32 to be packed, {bad} are not")
  returned = warp["returns"]["tensors"][0]
  if tuple(returned["shape"]) != extras["input_specs"]["new_img"].shape:
    raise ArtifactError(f"the warp makes {returned['shape']} planes, the model takes new_img {extras['input_specs']['new_img'].shape}")
  frame_specs = {s["name"]: s for s in warp["inputs"] if s["name"] in SPLIT_FRAMES}
  frame_size = next(int(np.prod(s["shape"])) for s in warp["inputs"] if s["name"] in ("input_frame", "frame")) // (1 if frame_specs else 2)
  offsets, packed = pack_layout(host, 0 if frame_specs else frame_size)
  n_model_buffers, upload, u8 = len(model["buffers"]), len(model["buffers"]) + len(warp["buffers"]), "dtypes.uchar"

  def view(name: str, nbytes: int, dtype: str) -> dict: return {"buffer": upload, "offset": offsets[name], "nbytes": nbytes, "dtype": dtype}
  def nbytes(spec: dict) -> int: return int(np.prod(spec["shape"])) * np_dtype(spec["dtype"]).itemsize
  inputs = [("host", None, {"dtype": u8, "shape": [packed], "device": "NPY", "written": False})]
  inputs += [(s["name"], s["key"], s) for s in model["inputs"] if s["name"] in states or s["key"] is not None] + [(n, None, s) for n, s in frame_specs.items()]
  inputs.sort(key=lambda x: (x[1] is not None, x[0], x[1] or ""))
  slot_of = {(name, key): i for i, (name, key, _) in enumerate(inputs)}
  model_args = {s["slot"]: {"input": slot_of[(s["name"], s["key"])]} if (s["name"], s["key"]) in slot_of else
                {k: v for k, v in returned.items() if k != "shape"} | {"buffer": returned["buffer"] + n_model_buffers} if s["name"] == "new_img" else
                view(s["name"], nbytes(s), s["dtype"]) for s in model["inputs"]}
  warp_args = {s["slot"]: {"input": slot_of[(s["name"], None)]} if s["name"] in frame_specs else
               view("frames" if s["name"] == "input_frame" else "tfm", nbytes(s), s["dtype"]) for s in warp["inputs"]}

  def remap(calls: list, args: dict, buffers: int, programs: int) -> list:
    return [call | ({"program": call["program"] + programs} if "program" in call else {}) |
            {"args": [dict(args[a["input"]]) if "input" in a else a | {"buffer": a["buffer"] + buffers} for a in call["args"]]} for call in calls]
  shift = len(model_blob)
  header = {"device": model["device"], "input_names": sorted(n for n, k, _ in inputs if k is None),
            "kwargs": sorted({n for n, _, _ in inputs}), "check": None,
            "inputs": [{"slot": i, "name": n, "key": k, "dtype": s["dtype"], "shape": s["shape"], "device": s["device"], "written": s["written"]}
                       for i, (n, k, s) in enumerate(inputs)],
            "buffers": model["buffers"] + [b | ({"init": [b["init"][0] + shift, b["init"][1] + shift]} if "init" in b else {}) for b in warp["buffers"]] +
                       [{"nbytes": packed, "device": model["device"], "dtype": u8}],
            "programs": model["programs"] + [p | {"lib": [p["lib"][0] + shift, p["lib"][1] + shift]} for p in warp["programs"]],
            "calls": [{"kind": "copy", "args": [{"buffer": upload, "offset": 0, "nbytes": packed, "dtype": u8}, {"input": slot_of[("host", None)]}]}] +
                     remap(warp["calls"], warp_args, n_model_buffers, len(model["programs"])) + remap(model["calls"], model_args, 0, 0),
            "onetime_calls": remap(model.get("onetime_calls", []), {}, 0, 0) +
                             remap(warp.get("onetime_calls", []), {}, n_model_buffers, len(model["programs"])),
            "returns": model["returns"]}
  fused_specs = {"host": TensorSpec((packed,), "|u1", "NPY")} | {n: extras["input_specs"][n] for n in states} | \
                {n: TensorSpec((frame_size,), "|u1", model["device"]) for n in frame_specs}
  fused_meta = meta | {"fused": {"warp": warp_name, "frame": warp_meta["frame"], "split_frames": bool(frame_specs),
                                 "host_layout": offsets, "host_bytes": packed, "host_shapes": {"tfm": list(TFM[1])} | {k: list(v) for k, v in host.items()},
                                 "frame_size": frame_size}}
  return {"run": (header, _Blobs(model_blob, warp_blob))}, extras | {"input_specs": fused_specs, "metadata": fused_meta}
