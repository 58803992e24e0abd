"""One compile into a bundle, as every compiler (compile_modeld, compile_onnx, compile_warp) runs it: the output and BEAM checks before any
work, random inputs, a realize point per layer while tinygrad's ONNX runners trace, the capture inside a compile session, and the bundle
written with a summary of what it holds."""
from __future__ import annotations

import argparse
import contextlib
import functools
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
from tinygrad import Tensor
from tinygrad.helpers import Context

from sunnypilot.modeld_v2.common.cli import non_negative_int
from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
from sunnypilot.modeld_v2.compile.precision import FLOAT16, FLOAT32, OnnxRun, check_precision, default_precision, onnx_runner
from sunnypilot.modeld_v2.format.bundle import PRECISIONS, Metadata, write_bundle
from sunnypilot.modeld_v2.format.part import Part, PartJSON
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad, unsupported
from sunnypilot.modeld_v2.runtime.tinygrad_internals import onnx_ops, patched_onnx_ops

if TYPE_CHECKING:
  from sunnypilot.modeld_v2.compile.capture import Captured, JitInputs

LAYER_OPS = ("Conv", "MatMul", "Gemm")

@contextlib.contextmanager
def layer_boundaries(on: bool = True) -> Iterator[None]:
  """Realize the output of every convolution and matrix product while ONNX runners trace. Left free, tinygrad 0.14.0's scheduler fuses a
  convolution into the next one and recomputes it for every tap of the second (supercombo's backbones) and nests the GRU's matrix
  products the same way; a boundary per layer computes each once."""
  def realized(op: Callable[..., Tensor]) -> Callable[..., Tensor]:
    return functools.wraps(op)(lambda *args, **kwargs: op(*args, **kwargs).contiguous())
  with patched_onnx_ops({name: realized(onnx_ops()[name]) for name in LAYER_OPS if on}): yield

Specs = Mapping[str, tuple[tuple[int, ...], npt.DTypeLike]]  # what a compiler declares of a bundle's inputs or outputs: {name: (shape, numpy dtype)}

def random_value(rng: np.random.Generator, shape: tuple[int, ...], dtype: npt.DTypeLike) -> np.ndarray:
  """A capture input: uint8 (camera planes) over 0-255, floats standard normal, other integers (indices, flags) 0 or 1."""
  dtype = np.dtype(dtype)
  if dtype == np.uint8: return rng.integers(0, 256, shape, dtype=np.uint8)
  return rng.standard_normal(shape).astype(dtype) if np.issubdtype(dtype, np.floating) else rng.integers(0, 2, shape).astype(dtype)

class BundleCompile:
  """A compile into a bundle at `output`. The constructor fails before any work when `output` cannot be written (or is one of `sources`),
  `beam` cannot search here, or no runtime would replay what this tinygrad builds (format/tinygrad_identity): a compiler makes it first
  thing, so its library call and its CLI check alike. `capture` then captures a step, `write` writes the bundle.

  `precision` (a model's compile; compile/precision.py): the ONNX runners `onnx_runner` makes compute in it, tinygrad's FLOAT16 is set to
  match while the step is captured (half image buffers where IMAGE convolutions make them) and the bundle records both; "" keeps the
  environment's FLOAT16 and records no precision (a warp: uint8 in and out, its coordinates in float32). None: default_precision()."""
  def __init__(self, output: str, sources: Iterable[str | None], beam: int | None, precision: str | None = ""):
    from tinygrad import Device

    from sunnypilot.modeld_v2.compile.capture import search_level
    self.t0, self.device, self.output = time.perf_counter(), Device.DEFAULT, output
    try: self.precision = default_precision() if precision is None else precision and check_precision(precision)
    except ValueError as e: raise ArtifactError(str(e)) from None
    check_output_path(output, inputs=sources)
    if (why := unsupported(imported_tinygrad())) is not None: raise ArtifactError(f"not compiling: {why}")
    self.level = search_level(beam)
    self.rng = np.random.default_rng(0)
    self.workdir: str | None = None  # a float16 compile's converted ONNX files, for the capture's duration

  def onnx_runner(self, path: str) -> OnnxRun:
    """tinygrad's ONNX runner of `path` in the compile's precision (inside `capture`'s make_step)."""
    if self.precision == FLOAT16 and self.workdir is None: self.workdir = tempfile.mkdtemp(prefix="compile-float16-")
    return onnx_runner(path, self.precision or FLOAT32, self.workdir or "")

  @property
  def flags(self) -> dict[str, int]:
    """The build flags this compile sets itself: BEAM, and FLOAT16 when it has a precision."""
    return {"BEAM": self.level} | ({"FLOAT16": int(self.precision == FLOAT16)} if self.precision else {})

  def random_inputs(self, specs: Specs) -> dict[str, Tensor]:
    """Fresh realized tensors for specs {name: (shape, numpy dtype)} on the compile's device."""
    return {k: Tensor(random_value(self.rng, shape, dtype), device=self.device).realize() for k, (shape, dtype) in specs.items()}

  def capture(self, make_step: Callable[[], Callable], make_inputs: Callable[[], JitInputs], fuse_layers: bool, log: Callable[[str], None]) -> Captured:
    """capture.capture_part of the step `make_step()` builds (its ONNX runners load their weights inside the compile session: into host-backed
    buffers on NULL). `fuse_layers`: no realize point per layer (see layer_boundaries); a step without ONNX runners has no layers."""
    from sunnypilot.modeld_v2.compile.capture import capture_part, compile_session
    float16 = Context(FLOAT16=self.flags["FLOAT16"]) if self.precision else contextlib.nullcontext()
    try:
      with compile_session() as null_holds_data, layer_boundaries(not fuse_layers), float16:
        step = make_step()
        log("capturing (call 0 runs eagerly and compiles the kernels, call 1 captures), then self-checking against the TinyJit replay ...")
        try: return capture_part(step, make_inputs, null_holds_data=null_holds_data, beam=self.level, log=log)
        except OSError as e: raise ArtifactError(f"compiling for {self.device} failed: {e}") from e  # e.g. the CPU backend's clang is missing
    finally:
      if self.workdir is not None: shutil.rmtree(self.workdir, ignore_errors=True)
      self.workdir = None

  def write(self, part: tuple[Part | PartJSON, bytes], input_specs: Specs, output_specs: Specs, metadata: Metadata) -> dict:
    """Write the bundle of one part `run` with its specs {name: (shape, numpy dtype)} and metadata; a summary of it."""
    specs = lambda s: {k: (list(shape), np.dtype(dtype).str, self.device) for k, (shape, dtype) in s.items()}
    metadata = metadata | ({"precision": self.precision} if self.precision not in ("", FLOAT32) else {})
    size = write_bundle(self.output, {"run": part}, {"input_specs": specs(input_specs), "output_specs": specs(output_specs), "metadata": metadata},
                        flags=self.flags)
    record = Part.of(*part)
    return {"output": self.output, "kernels": sum(c.kind == "program" for c in record.calls), "calls": len(record.calls),
            "programs": len(record.programs), "onetime": len(record.onetime_calls),
            "weight_bytes": sum(b.init[1] - b.init[0] for b in record.buffers if b.init is not None), "bytes": size,
            "compile_s": time.perf_counter() - self.t0}

def add_compile_flags(parser: argparse.ArgumentParser, layers: bool = True) -> None:
  """--beam, as every compiler takes it, and --fuse-layers and --precision for a compiler of ONNX models (`layers`)."""
  parser.add_argument("--beam", type=non_negative_int, help="search each kernel's optimizations with tinygrad's BEAM of this width on this device (slow "
                      "once: tinygrad caches the searches in ~/.cache/tinygrad/cache.db); the bundle ships the searched kernels. Refused on NULL. "
                      "Default: the BEAM environment setting, else 0")
  if not layers: return
  parser.add_argument("--precision", choices=PRECISIONS, help="what the model computes in: float16 stores weights and activations in half and "
                      "accumulates sums in float32, as a comma device's build does; inputs and outputs keep the ONNX's dtypes either way. Default: "
                      "float16 when the environment sets FLOAT16=1 (openpilot's device build), else float32")
  parser.add_argument("--fuse-layers", action="store_true", help="leave tinygrad free to fuse across layers (no realize point after each "
                      "Conv/MatMul/Gemm); slower for supercombo-style models, kept for comparison")
