"""The adapter's frame feeds and output readbacks: which one each layout and device gets, and that every feed gives the packed path's
outputs bit for bit (the packed path copies both frames into the host buffer: the reference the other two must match)."""
import os
import shutil
from collections.abc import Iterator

import numpy as np
import pytest
from tinygrad import Device, Tensor

from benchmarks.frame_inputs import CameraBuffer
from benchmarks.stubbed_loop import StubModel
from sunnypilot.modeld_v2.format.bundle import TensorSpec
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.frame_feeds import InPlaceFrames, PackedFrames, UploadFrames
from sunnypilot.modeld_v2.runtime.model_adapter import ModelAdapter
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
from sunnypilot.modeld_v2.runtime.output_readbacks import CopiedOutput, PinnedOutput, ViewedOutput

FRAME = camerad_frame(1344, 760)


@pytest.fixture(scope="module")
def adapters(native_artifacts) -> Iterator[dict[str, ModelRunner]]:
  model, split, packed = (os.path.join(native_artifacts, f) for f in ("model.bin", "warp_split.bin", "warp_packed.bin"))
  adapters = {"packed": ModelRunner(model, packed), "in place": ModelRunner(model, split),
              "upload": ModelRunner(model, split, map_camera_buffers=False)}
  yield adapters
  for adapter in adapters.values(): adapter.close()  # on CUDA: no host registration outlives the module

def drive(adapter: ModelRunner, bufs: list[dict], steps: int) -> list[bytes]:
  rng, outs = np.random.default_rng(5), []
  for step in range(steps):
    adapter.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2) + rng.standard_normal((2, 3, 3)) * [[0.01, 0.01, 5], [0.01, 0.01, 5], [0, 0, 0]]
    adapter.numpy_inputs["desire"][:] = np.eye(8)[step % 8]
    adapter.copy_frames(bufs[step % len(bufs)])
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def test_each_layout_gets_its_feed_and_readback(adapters):
  assert [type(a.frame_feed) for a in adapters.values()] == [PackedFrames, InPlaceFrames, UploadFrames]
  assert [a.in_place for a in adapters.values()] == [False, True, False]
  kind = Device.DEFAULT.split(":")[0]
  if kind == "CPU": expected = [ViewedOutput] * 3  # the direct CPU replay writes the outputs in place
  elif kind == "CUDA": expected = [PinnedOutput, PinnedOutput, CopiedOutput]  # the graph writes registered host memory, unless mapping is off
  else: pytest.skip(f"no expectation written for {kind}")
  assert [type(a.readbacks["outputs"]) for a in adapters.values()] == expected
  assert all(type(a.readbacks["message_floats"]) is type(a.readbacks["outputs"]) for a in adapters.values()), "the in-graph parse's block alike"
  packed = adapters["packed"]
  assert np.shares_memory(packed.frame_feed.frames, packed.packed_input) and packed.frame_feed.frames.shape == (2, FRAME.size), "in the host buffer"

def test_every_feed_gives_the_packed_result(adapters):
  rng = np.random.default_rng(6)
  bufs = [{k: CameraBuffer(rng.integers(0, 256, FRAME.size, dtype=np.uint8)) for k in ("img", "big_img")} for _ in range(3)]
  for a in adapters.values(): a.reset_warmup_buffers()
  expected = drive(adapters["packed"], bufs, 6)
  for name in ("in place", "upload"): assert drive(adapters[name], bufs, 6) == expected, name
  in_place, upload = adapters["in place"].frame_feed, adapters["upload"].frame_feed
  assert in_place.reads_in_place and len(in_place.camera_tensors) == 6 and not in_place.uploads, "each camera buffer mapped once, none uploaded"
  assert not upload.reads_in_place and len(upload.uploads) == 2 and upload.tensors == list(upload.uploads.values()), "one upload buffer per input"
  in_place.feed("img", np.zeros(FRAME.size, np.uint8))
  assert not in_place.reads_in_place, "a numpy frame is uploaded, not read in place"

def test_the_runner_and_the_benchmark_stub_are_model_adapters(adapters):
  """What the daemons hold: every member of the protocol, on the runner and on the stub the benchmarks run the frame loop with."""
  members = [name for name in dir(ModelAdapter) if not name.startswith("_")]
  assert len(members) == 14, members
  stub = StubModel({"plan": [0, 4]}, 4, "v1")
  for held in (*adapters.values(), stub):
    assert isinstance(held, ModelAdapter), [name for name in members if not hasattr(held, name)]

def test_dropping_the_feed_drops_its_bindings(adapters):
  for a in adapters.values():
    drive(a, [{"img": np.zeros(FRAME.size, np.uint8), "big_img": np.zeros(FRAME.size, np.uint8)}], 1)
    fixed = len(a.replay.inputs) - len(a.split)
    a.drop_camera_buffers()
    assert a.frame_feed.tensors == [] and a.frame_feed.inputs == {} and a.replay.bindings == fixed
    if a.split:
      with pytest.raises(RuntimeError, match="has not been given both camera frames"): a.run()

@pytest.mark.skipif(shutil.which("clang") is None, reason="its CPU buffers are written by a kernel tinygrad's CPU backend compiles with clang")
def test_copied_readback_reads_the_device_buffer():
  spec = TensorSpec((1, 5), "<f4", "CPU")
  out = CopiedOutput(spec, "CPU")
  values = np.arange(5, dtype=np.float32).reshape(1, 5)
  out.tensor.assign(Tensor(values)).realize()
  got = out.read()
  assert got is out.read() and np.array_equal(got, values), "one preallocated array, holding the buffer's values"
  viewed = ViewedOutput(spec, "CPU")
  viewed.tensor.assign(Tensor(values * 2)).realize()
  assert np.array_equal(viewed.read(), values * 2)
