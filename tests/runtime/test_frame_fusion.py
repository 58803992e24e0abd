import os
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.format.part_builder import Blobs
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.frame_fusion import pack_layout
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
from sunnypilot.modeld_v2.runtime.tinygrad_internals import buffer_address
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import realized

FRAME = camerad_frame(1344, 760)
HOST = {"desire": (1, 8), "traffic_convention": (1, 2), "action_t": (1, 2)}

@pytest.fixture(scope="module")
def bundles(native_artifacts, tmp_path_factory):
  tmp = tmp_path_factory.mktemp("fusion")
  stand_in_models.write("supercombo_action", "tiny", str(tmp / "supercombo.onnx"), seed=3)
  return {"split": os.path.join(native_artifacts, "warp_split.bin"), "packed": os.path.join(native_artifacts, "warp_packed.bin"),
          "native": os.path.join(native_artifacts, "model.bin"),
          "supercombo": compile_model(str(tmp / "supercombo.bin"), onnx=str(tmp / "supercombo.onnx"), log=lambda s: None)["output"]}

def drive(adapter, rng, steps: int, bufs_for=None) -> list[bytes]:
  outs = []
  for step in range(steps):
    adapter.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2) + rng.standard_normal((2, 3, 3)) * [[0.01, 0.01, 5], [0.01, 0.01, 5], [0, 0, 0]]
    adapter.numpy_inputs["desire"][:] = np.eye(8)[step % 8]
    adapter.numpy_inputs["traffic_convention"][:] = [1, 0]
    adapter.numpy_inputs["action_t"][:] = [0.2, 0.5]
    frames = rng.integers(0, 256, (2, FRAME.size), dtype=np.uint8)
    adapter.copy_frames(bufs_for(step, frames) if bufs_for else {"img": frames[0], "big_img": frames[1]})
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def test_pack_layout_aligns_every_slot():
  offsets, total = pack_layout(HOST, FRAME.size)
  assert list(offsets) == ["tfm", "desire", "traffic_convention", "action_t", "frames"] and all(o % 64 == 0 for o in offsets.values())
  assert total == offsets["frames"] + 2 * FRAME.size
  split_offsets, split_total = pack_layout(HOST, 0)
  assert "frames" not in split_offsets and split_total == split_offsets["action_t"] + 64 and split_total <= 768

def test_blobs_are_one_address_space():
  blobs = Blobs(b"abc", b"", b"defg")
  assert len(blobs) == 7 and blobs[2:5] == b"cde" and blobs[0:7] == b"abcdefg" and blobs[3:3] == b"" and bytes(blobs) == b"abcdefg"

@pytest.mark.parametrize("layout", ["native", "supercombo"])
def test_fused_equals_warp_then_model(bundles, layout):
  adapter = ModelRunner(bundles[layout], bundles["packed"])
  warp, model = load_bundle(bundles["packed"]).run, load_bundle(bundles[layout])
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in model.input_specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  calls = adapter.replay.part.calls
  assert [c.kind for c in calls].count("copy") == 1 and calls[0].kind == "copy", "one host upload, first"
  rng = np.random.default_rng(0)
  for step in range(5):
    expected = drive(adapter, rng, 1)[0]
    n = adapter.numpy_inputs
    new_img = warp(input_frame=realized(adapter.frame_feed.frames.copy()), M_inv=realized(n["tfm"].copy()))
    model.run(new_img=new_img, desire=realized(n["desire"].copy()), traffic_convention=realized(n["traffic_convention"].copy()),
                 action_t=realized(n["action_t"].copy()), **({"prepare_only": realized(n["prepare_only"].copy())} if "prepare_only" in n else {}),
                 **states, output_buffers=outs)
    assert outs["outputs"].numpy().tobytes() == expected, f"step {step}: fused differs from the warp bundle then the model bundle"

@pytest.mark.parametrize("layout", ["native", "supercombo"])
def test_split_frames_equal_packed_over_30_steps(bundles, layout):
  packed = ModelRunner(bundles[layout], bundles["packed"])
  split = ModelRunner(bundles[layout], bundles["split"])
  assert split.replay.input_names == sorted(["big_frame", "frame", "host", *split.states])
  assert split.packed_input.nbytes <= 1024 and packed.packed_input.nbytes > 2 * FRAME.size, "split uploads inputs only, packed both frames too"
  a, b = drive(packed, np.random.default_rng(1), 30), drive(split, np.random.default_rng(1), 30)
  assert a == b and len(set(a)) == 30

def test_visionipc_buffers_read_in_place_and_bound_once_each(bundles, openpilot_prefix):
  """camerad's 2 streams x 18 rotating buffers for 100 frames: each buffer mapped and bound once, results bit-identical to the packed path."""
  from msgq.visionipc import VisionIpcClient, VisionIpcServer
  server = VisionIpcServer("camerad")
  for stream in (0, 2): server.create_buffers_with_sizes(stream, 18, FRAME.width, FRAME.height, FRAME.size, FRAME.stride, FRAME.uv_offset)
  server.start_listener()
  clients = [VisionIpcClient("camerad", stream, False) for stream in (0, 2)]
  deadline = time.monotonic() + 5
  while not all(c.connect(False) for c in clients):
    assert time.monotonic() < deadline, "visionipc client did not connect"
    time.sleep(0.01)
  def serve(step: int, frames: np.ndarray) -> dict:
    out = {}
    for (stream, key), client, frame in zip(((0, "img"), (2, "big_img")), clients, frames):
      server.send(stream, frame.tobytes(), step, step * 50_000_000, step * 50_000_000)
      out[key] = client.recv(1000)
      assert out[key] is not None and np.frombuffer(out[key].data, np.uint8)[:FRAME.size].tobytes() == frame.tobytes()
    return out
  split = ModelRunner(bundles["native"], bundles["split"])
  packed = ModelRunner(bundles["native"], bundles["packed"])
  expected = drive(packed, np.random.default_rng(2), 100)
  assert drive(split, np.random.default_rng(2), 100, serve) == expected, "in-place camera buffers give the packed result"
  assert len(split.frame_feed.camera_tensors) == 36, "each of 18 buffers per stream mapped once"
  fixed_slots = len(split.replay.inputs) - 2
  assert split.replay.bindings_made == fixed_slots + 36, "host, states and outputs bound once; each camera buffer once"
  last = serve(99, np.zeros((2, FRAME.size), np.uint8))
  split.copy_frames(last)
  ptr = np.frombuffer(last["img"].data, np.uint8).ctypes.data
  assert buffer_address(split.frame_feed.inputs["frame"].uop.base.buffer) == ptr, "the warp reads the visionipc buffer itself, not a copy"
  split.reset_warmup_buffers()
  assert split.frame_feed.camera_tensors == {} and split.frame_feed.inputs == {} and split.replay.bindings == fixed_slots, "camera bindings go with the buffers"
  assert not split.states["state_feat_q"].numpy().any()
  packed.reset_warmup_buffers()
  assert drive(split, np.random.default_rng(3), 5, serve) == drive(packed, np.random.default_rng(3), 5), "correct again after the reset"


def test_misaligned_or_short_camera_buffer_is_rejected(bundles):
  split = ModelRunner(bundles["native"], bundles["split"])
  raw = np.zeros(FRAME.size + 64, np.uint8)
  start = (-raw.ctypes.data) % 64
  Buf = type("Buf", (), {})
  misaligned, short = Buf(), Buf()
  misaligned.data, short.data = memoryview(raw[start + 4:start + 4 + FRAME.size]), memoryview(raw[start:start + 100])
  with pytest.raises(ValueError, match="not 16-byte aligned"): split.copy_frames({"img": misaligned})
  with pytest.raises(ValueError, match="has 100 bytes"): split.copy_frames({"img": short})

def test_numpy_frames_are_copied_never_read_in_place(bundles):
  """numpy arrays have .data too: they are still uploaded (modeld's warm-up frames are freed right after copy_frames)."""
  split = ModelRunner(bundles["native"], bundles["split"])
  frames = np.random.default_rng(5).integers(0, 256, (2, FRAME.size), dtype=np.uint8)
  split.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2)
  split.copy_frames({"img": frames[0], "big_img": frames[1]})
  frames[:] = 0  # the caller reuses (or frees) its arrays after copy_frames
  split.run()
  got = split.output_array().tobytes()
  fresh = ModelRunner(bundles["native"], bundles["split"])
  fresh.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2)
  kept = np.random.default_rng(5).integers(0, 256, (2, FRAME.size), dtype=np.uint8)
  fresh.copy_frames({"img": kept[0], "big_img": kept[1]})
  fresh.run()
  assert got == fresh.output_array().tobytes() and split.frame_feed.camera_tensors == {}, "the frames as they were at copy_frames, not the array now"
