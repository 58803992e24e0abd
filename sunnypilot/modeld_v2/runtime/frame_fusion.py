"""Fuse a camera warp into its model: one part, one host upload, then the warp's kernels and the model's.

The fused part takes `host` (one packed uint8 NPY buffer: the warp's M_inv as `tfm`, every non-state model input and, for a
packed warp, both camera frames), each state, `output_buffers`, and with a --split-frames warp `frame` and `big_frame`, which
modeld binds to the camera buffers by pointer. The same holds for the driver-monitoring pair (a `dmonitoring_model` and a `dm_warp`): its
one camera input `frame` is bound by pointer, `tfm` is the driver camera's (3, 3) M_inv and `calib` a host input. `fuse` is a pure data
transform on two parts (no files, nothing recompiled); `frame_part` is the seed's name for reading a warp bundle and fusing it.
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import Extras, Metadata, Parts, TensorSpec, read_parts, state_names
from sunnypilot.modeld_v2.format.part import Arg, BufferSpec, BufferView, Call, InputArg, InputSlot, Part
from sunnypilot.modeld_v2.format.part_builder import Blobs, PartBuilder
from sunnypilot.modeld_v2.format.warp_inputs import HOST_TRANSFORM, PACKED_FRAMES, WARP_FRAMES, WARP_TRANSFORM

SPLIT_FRAMES = tuple(sorted(WARP_FRAMES))  # the seed's name for a --split-frames warp's frame inputs, in the replay's (sorted) input order
HOST_ALIGN = 64  # every slot of the packed host buffer starts on a cache line, so float views are aligned on any device
TFM = (HOST_TRANSFORM, (2, 3, 3))  # the warp's M_inv (road, wide), first in the host buffer; a driver-monitoring warp's is (3, 3)
WARP_KINDS = {"model": "warp", "dmonitoring_model": "dm_warp"}  # a model bundle's metadata kind -> the kind of warp fused in front of it

@dataclass(frozen=True)
class FusedLayout:
  """What a fused part records under metadata["fused"] (written by `fuse`, read by the loader): where each float32 host input sits in the
  packed host buffer."""
  warp: str  # the warp bundle's file name
  frame: str  # the NV12 geometry the warp reads: "width,height,stride,y_height,uv_height,buffer_size"
  split_frames: bool  # frames are inputs bound by pointer (True) or packed into the host buffer (False)
  host_layout: dict[str, int]  # name -> byte offset in the host buffer; `frames` (two camera frames) too when packed
  host_bytes: int
  host_shapes: dict[str, tuple[int, ...]]  # every float32 host input, `tfm` first
  frame_size: int  # bytes the warp reads of one camera frame

  def to_json(self) -> dict:
    return {"warp": self.warp, "frame": self.frame, "split_frames": self.split_frames, "host_layout": dict(self.host_layout), "host_bytes": self.host_bytes,
            "host_shapes": {k: list(v) for k, v in self.host_shapes.items()}, "frame_size": self.frame_size}

  @staticmethod
  def from_json(fused: Any) -> FusedLayout:
    try:
      return FusedLayout(str(fused["warp"]), str(fused["frame"]), bool(fused["split_frames"]), {k: int(v) for k, v in fused["host_layout"].items()},
                         int(fused["host_bytes"]), {k: tuple(int(d) for d in v) for k, v in fused["host_shapes"].items()}, int(fused["frame_size"]))
    except (KeyError, TypeError, ValueError, AttributeError) as e: raise ArtifactError(f"the fused part's layout is malformed: {e!r}") from None

Fused = tuple[dict[str, tuple[Part, Blobs]], Extras]  # the fused bundle: its one part `run` (on the two bundles' blobs) and its extras

def pack_layout(shapes: dict[str, tuple], frame_size: int, tfm: tuple[int, ...] = TFM[1]) -> tuple[dict[str, int], int]:
  """Byte offsets of `tfm` (of shape `tfm`) and each float32 host input in the packed host buffer, then `frames` (two camera frames) if
  frame_size.

  Returns (offsets, total bytes). A split warp passes frame_size 0: its frames are bound by pointer, not packed."""
  offsets, offset = {}, 0
  for name, shape in ({HOST_TRANSFORM: tfm} | shapes).items():
    offsets[name] = offset
    offset += -(-int(np.prod(shape)) * 4 // HOST_ALIGN) * HOST_ALIGN  # its bytes, rounded up to a cache line
  if frame_size: offsets["frames"] = offset
  return offsets, offset + 2 * frame_size

def frames_input(metadata: Metadata) -> str:
  """The model input a warp's output feeds: the one compile_modeld gave the `frames` role (new_img, the DM model's input_img)."""
  roles = metadata.get("input_roles")
  frames = [name for name, role in roles.items() if role == "frames"] if isinstance(roles, dict) else []
  return frames[0] if len(frames) == 1 else "new_img"

def frame_part(warp_path: str, parts: Parts, extras: Extras, device: str | None = None, allow_device: bool = False) -> Fused:
  """The seed's extension: read the warp bundle at `warp_path` for `device` and fuse it in front of the model's part."""
  return fuse((parts, extras), read_parts(warp_path, device, allow_device), os.path.basename(warp_path))

def fuse(model_bundle: tuple[Parts, Extras], warp_bundle: tuple[Parts, Extras], warp_name: str = "warp") -> Fused:
  """`(parts, extras)` of a model bundle and of a warp bundle (as read_parts returns them: Part records, or a part's JSON) -> `(parts,
  extras)` of the fused part, a Part record. Pure: reads no files. The fused part's buffers are the model's, then the warp's, in their
  order, then the upload buffer: a streamed load's filled buffers line up with them (loader.load_fused)."""
  (parts, extras), (warp_parts, warp_extras) = model_bundle, warp_bundle
  (model_header, model_blob), (warp_header, warp_blob) = parts["run"], warp_parts["run"]
  meta, warp_meta = extras["metadata"], warp_extras["metadata"]
  if warp_meta.get("kind") != WARP_KINDS.get(kind if isinstance(kind := meta.get("kind"), str) else ""):
    raise ArtifactError(f"fusion takes a model bundle and a warp bundle, or a dmonitoring_model bundle and a dm_warp bundle ({warp_name}), got a "
                        f"{meta.get('kind')} and a {warp_meta.get('kind')}")
  model, warp = Part.of(model_header, model_blob), Part.of(warp_header, warp_blob)
  if model.device != warp.device: raise ArtifactError(f"the model is for {model.device} and the warp {warp_name} for {warp.device}")
  if any(isinstance(r.arg, InputArg) for r in model.returns.tensors): raise ArtifactError("a model part that returns one of its inputs cannot be fused")
  if len(warp.returns.tensors) != 1 or isinstance(warp.returns.tensors[0].arg, InputArg):
    raise ArtifactError(f"the warp {warp_name} must return one tensor it computes")
  states, images = state_names(extras["input_specs"], extras["output_specs"]), frames_input(meta)
  if images not in extras["input_specs"]: raise ArtifactError(f"the model has no {images} input for the warp's output")
  host = {name: spec.shape for name, spec in extras["input_specs"].items() if name not in states and name != images}
  if bad := [n for n, spec in extras["input_specs"].items() if n in host and np.dtype(spec.dtype) != np.float32]:
    raise ArtifactError(f"host inputs must be float32 to be packed, {bad} are not")
  returned = warp.returns.tensors[0]
  assert isinstance(returned.arg, BufferView), "checked above: the warp returns a tensor it computes"
  if returned.shape != extras["input_specs"][images].shape:
    raise ArtifactError(f"the warp makes {list(returned.shape)} planes, the model takes {images} {extras['input_specs'][images].shape}")
  frame_specs = {s.name: s for s in warp.inputs if s.name in SPLIT_FRAMES}
  frame_size = next(int(np.prod(s.shape)) for s in warp.inputs if s.name in (PACKED_FRAMES, WARP_FRAMES[0])) // (1 if frame_specs else 2)
  if (tfm := next((s.shape for s in warp.inputs if s.name == WARP_TRANSFORM), None)) is None:
    raise ArtifactError(f"the warp {warp_name} takes no {WARP_TRANSFORM}")
  offsets, packed = pack_layout(host, 0 if frame_specs else frame_size, tfm)

  builder, u8 = PartBuilder(), "dtypes.uchar"
  builder.include(model, model_blob)
  warp_buffers, warp_programs = builder.include(warp, warp_blob)
  upload = builder.add_buffer(BufferSpec(packed, model.device, u8))
  def view(name: str, spec: InputSlot) -> BufferView: return BufferView(upload, offsets[name], spec.nbytes, spec.dtype)
  inputs = [InputSlot(0, "host", None, u8, (packed,), "NPY", False)]
  inputs += [s for s in model.inputs if s.name in states or s.key is not None] + list(frame_specs.values())
  inputs = [dataclasses.replace(s, slot=i) for i, s in enumerate(sorted(inputs, key=lambda s: (s.key is not None, s.name, s.key or "")))]
  slot_of = {(s.name, s.key): InputArg(s.slot) for s in inputs}
  new_img = dataclasses.replace(returned.arg, buffer=returned.arg.buffer + warp_buffers)
  def model_arg(s: InputSlot) -> Arg:
    if (s.name, s.key) in slot_of: return slot_of[(s.name, s.key)]
    return new_img if s.name == images else view(s.name, s)
  model_args = {s.slot: model_arg(s) for s in model.inputs}
  def warp_arg(s: InputSlot) -> Arg:  # a split warp's frames stay inputs; its packed frames and M_inv are views of host
    return slot_of[(s.name, None)] if s.name in frame_specs else view("frames" if s.name == PACKED_FRAMES else HOST_TRANSFORM, s)
  warp_args = {s.slot: warp_arg(s) for s in warp.inputs}
  calls = [Call("copy", (BufferView(upload, 0, packed, u8), slot_of[("host", None)]))]
  calls += [c.relocated(warp_buffers, warp_programs, warp_args) for c in warp.calls] + [c.relocated(0, 0, model_args) for c in model.calls]
  onetime = list(model.onetime_calls) + [c.relocated(warp_buffers, warp_programs, {}) for c in warp.onetime_calls]
  part = builder.part(model.device, [s.name for s in inputs], inputs, calls, onetime, model.returns)
  fused_specs = {"host": TensorSpec((packed,), "|u1", "NPY")} | {n: extras["input_specs"][n] for n in states} | \
                {n: TensorSpec((frame_size,), "|u1", model.device) for n in frame_specs}
  layout = FusedLayout(warp_name, warp_meta["frame"], bool(frame_specs), offsets, packed, {HOST_TRANSFORM: tfm} | host, frame_size)
  fused_meta = meta | {"fused": layout.to_json()}
  return {"run": (part, builder.blob())}, extras | {"input_specs": fused_specs, "metadata": fused_meta}
