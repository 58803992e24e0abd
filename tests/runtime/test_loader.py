import builtins
import os
import shutil

import numpy as np
import pytest
from tinygrad import Tensor

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.format.bundle import TensorSpec, read_parts, write_bundle
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.frame_fusion import FusedLayout, fuse
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
from sunnypilot.modeld_v2.runtime.loader import LoadedBundle, load_bundle, load_fused
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from conftest import run_python

FRAME = camerad_frame(1344, 760)

def test_loaded_bundle_is_typed(native_artifacts):
  model = load_bundle(os.path.join(native_artifacts, "model.bin"))
  head = read_parts(os.path.join(native_artifacts, "model.bin"))[1]
  assert isinstance(model, LoadedBundle) and isinstance(model.run, Replay) and model.fused is None
  assert model.input_specs == head["input_specs"] and all(isinstance(s, TensorSpec) for s in model.input_specs.values())
  assert model.state_names == sorted(n for n in head["input_specs"] if f"next_{n}" in head["output_specs"])

def test_fused_layout_is_the_packed_host_buffer(native_artifacts):
  """The typed layout of a fused load against the packed host buffer's offsets, written out here from the model's own host inputs: `tfm`
  first, then each float32 input in order, every slot starting on a 64-byte boundary, then the two camera frames of a packed warp."""
  model = os.path.join(native_artifacts, "model.bin")
  specs = read_parts(model)[1]["input_specs"]
  host = {n: s.shape for n, s in specs.items() if n != "new_img" and f"next_{n}" not in read_parts(model)[1]["output_specs"]}
  for warp, frame_size in (("warp_split.bin", 0), ("warp_packed.bin", FRAME.size)):
    fused = load_fused(model, os.path.join(native_artifacts, warp)).fused
    offsets, at = {}, 0
    for name, shape in ({"tfm": (2, 3, 3)} | host).items():
      offsets[name], at = at, at + (int(np.prod(shape)) * 4 + 63) // 64 * 64
    if frame_size: offsets["frames"] = at
    total = at + 2 * frame_size
    assert isinstance(fused, FusedLayout) and fused.warp == warp and fused.split_frames == (frame_size == 0)
    assert fused.host_layout == offsets and fused.host_bytes == total and fused.frame_size == FRAME.size and fused.frame == FRAME.spec
    assert fused.host_shapes == {"tfm": (2, 3, 3)} | host
    written = load_fused(model, os.path.join(native_artifacts, warp)).metadata["fused"]  # what fuse wrote: plain JSON, read back the same
    assert written == fused.to_json() and written["host_shapes"]["tfm"] == [2, 3, 3] and FusedLayout.from_json(written) == fused
  with pytest.raises(ArtifactError, match="layout is malformed"): FusedLayout.from_json({"warp": "w"})

def test_fuse_is_pure(native_artifacts, monkeypatch):
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  bundles = read_parts(model), read_parts(warp)
  def no_files(*args, **kwargs): raise AssertionError(f"fuse touched a file: {args}")
  with monkeypatch.context() as m:
    for target, name in ((builtins, "open"), (os, "stat"), (os, "listdir"), (os, "scandir")): m.setattr(target, name, no_files)
    parts, extras = fuse(*bundles, "warp_split.bin")
  assert parts["run"][0] == load_fused(model, warp).run.part

def test_load_needs_no_writable_home(native_artifacts):
  out = run_python(f"""
from sunnypilot.modeld_v2.runtime.loader import load_fused
print(load_fused({os.path.join(native_artifacts, 'model.bin')!r}, {os.path.join(native_artifacts, 'warp_split.bin')!r}).run.call_kinds[0])
""", env={"HOME": "/dev/null", "XDG_CACHE_HOME": "/dev/null/cache"})
  assert out.strip() == "COPY"

def test_fused_load_for_another_device(native_artifacts):
  """The device reaches both reads: a CPU process loads the fused pair for NULL (mock execution), with the adapter too."""
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  fused = load_fused(model, warp, device="NULL", allow_device=True)
  assert fused.run.device == "NULL" and fused.run.call_kinds[0] == "COPY"
  adapter = ModelRunner(model, warp, device="NULL", allow_device=True)
  frames = np.zeros((2, FRAME.size), np.uint8)
  for _ in range(2):  # NULL runs no kernels and holds no data: the calls go through, there is nothing to read back
    adapter.copy_frames({"img": frames[0], "big_img": frames[1]})
    adapter.run()
  assert adapter.model_device == "NULL" and adapter.replay.bindings_made == len(adapter.replay.inputs)

def test_every_load_reads_the_model_whole(native_artifacts, tmp_path):
  """A model.bin truncated or edited after a good load fails the next load (a reload for another camera), whichever the warp."""
  model = str(tmp_path / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "model.bin"), model)
  warps = [os.path.join(native_artifacts, w) for w in ("warp_split.bin", "warp_packed.bin")]
  for warp in warps: load_fused(model, warp)
  data = open(model, "rb").read()
  open(model, "wb").write(data[:-100])
  for warp in warps:
    with pytest.raises(ArtifactError, match="truncated"): load_fused(model, warp)
  edited = bytearray(data)
  edited[-5] ^= 1
  open(model, "wb").write(edited)
  for warp in warps:
    with pytest.raises(ArtifactError, match="content hash mismatch"): load_fused(model, warp)

def test_a_bundle_without_run_is_refused(tmp_path):
  path = str(tmp_path / "x.bin")
  write_bundle(path, {"other": ({"device": "CPU"}, b"")}, {}, check=False)  # crafted: the writer would refuse it
  with pytest.raises(ArtifactError): load_bundle(path)

def test_a_streamed_load_runs_as_the_whole_file_read(native_artifacts):
  """The streamed fused load (weights written into the device's buffers chunk by chunk) against the whole-file read of the same pair
  (read_parts, fused, its buffers filled from the blob in memory): the same part and the same outputs (the in-graph parse's block too), bit
  for bit, over 3 frames."""
  import sunnypilot.modeld_v2.format.bundle as bundle
  from sunnypilot.modeld_v2.runtime.frame_fusion import frame_part
  from sunnypilot.modeld_v2.runtime.loader import loaded
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  whole = loaded(*frame_part(warp, *read_parts(model)), "CPU")
  old_chunk, bundle.CHUNK_BYTES = bundle.CHUNK_BYTES, 4099  # small and odd: weights and binaries straddle chunks
  try: streamed = load_fused(model, warp)
  finally: bundle.CHUNK_BYTES = old_chunk
  assert streamed.run.part == whole.run.part
  outputs = []
  for fused in (whole, streamed):
    run_frames = []
    states = {n: Tensor(np.zeros(fused.input_specs[n].shape, fused.input_specs[n].dtype)).realize() for n in fused.state_names}
    out = {n: Tensor(np.zeros(s.shape, s.dtype)).realize() for n, s in fused.output_specs.items()} | {f"next_{n}": t for n, t in states.items()}
    for i in range(3):
      rng = np.random.default_rng(i)
      host = Tensor(np.zeros(fused.fused.host_bytes, np.uint8), device="NPY")  # transforms of zeros: every pixel from the corner
      frames = {n: Tensor(rng.integers(0, 256, FRAME.size, dtype=np.uint8)).realize() for n in ("frame", "big_frame")}
      fused.run(host=host, **states, **frames, output_buffers=out)
      run_frames.append(np.concatenate([out[n].numpy().reshape(-1) for n in sorted(out) if not n.startswith("next_")]))  # outputs, message_floats
    outputs.append(run_frames)
  assert all(np.array_equal(a, b, equal_nan=True) for a, b in zip(*outputs))  # the lane lines' times are NaN past the plan

def test_verify_sees_the_declared_hash_before_the_blob_is_read(native_artifacts, monkeypatch):
  """`verify(path, digest, size)` runs with the hash the preamble declares (sha256 of everything after it, written out here) before a byte of
  the blob is read; a verify that refuses ends the load there."""
  import hashlib

  from sunnypilot.modeld_v2.format.bundle import PREAMBLE, BundleFile
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  seen, streamed = [], []
  real_stream = BundleFile.stream
  monkeypatch.setattr(BundleFile, "stream", lambda self, sinks=(): (streamed.append(self.path), real_stream(self, sinks))[1])
  def verify(path: str, digest: str, size: int) -> None:
    seen.append((path, digest, size, list(streamed)))
  load_fused(model, warp, verify=verify)
  data = {p: open(p, "rb").read() for p in (model, warp)}
  assert seen == [(model, hashlib.sha256(data[model][PREAMBLE.size:]).hexdigest(), len(data[model]), []),
                  (warp, hashlib.sha256(data[warp][PREAMBLE.size:]).hexdigest(), len(data[warp]), [model])]
  def refuse(path: str, digest: str, size: int) -> None: raise ArtifactError(f"{path}: refused")
  streamed.clear()
  with pytest.raises(ArtifactError, match="refused"): load_fused(model, warp, verify=refuse)
  assert streamed == []

def test_a_streamed_load_holds_no_copy_of_the_file(native_artifacts):
  """What a load allocates in Python (tracemalloc sees numpy and bytes, not the device's buffers) stays far below the model's weights:
  they go straight from each chunk (at most 4 MiB) into the device's buffers, where a whole-file read holds them twice."""
  import tracemalloc
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  load_fused(model, warp)  # first-time costs (imports, tinygrad's caches) out of the way
  weights = sum(b.init[1] - b.init[0] for b in read_parts(model)[0]["run"][0].buffers if b.init is not None)
  peaks = []
  for load in (lambda: load_fused(model, warp), lambda: read_parts(model)):
    tracemalloc.start()
    load()
    peaks.append(tracemalloc.get_traced_memory()[1])
    tracemalloc.stop()
  assert weights > 10 << 20 and peaks[0] < 6 << 20 and peaks[1] > weights, (weights, peaks)
