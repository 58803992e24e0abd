"""CUDA: the generic replay path (graph batches) and camera buffers registered with the driver. Skipped where no CUDA device exists."""
import threading

import numpy as np
import pytest
from tinygrad import Device

from benchmarks.frame_inputs import CameraBuffer
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.compile_warp import compile_warp
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import conv_net

def _cuda_present() -> bool:
  try: return Device.DEFAULT.startswith("CUDA") or bool(Device["CUDA"])
  except Exception: return False

pytestmark = pytest.mark.skipif(not _cuda_present(), reason="no CUDA device here (run with DEV=CUDA on a GPU machine)")


def test_cuda_round_trip_replays_through_a_graph():
  assert Device.DEFAULT.startswith("CUDA"), "run this file with DEV=CUDA"
  fn, make = conv_net()
  jit, part, _ = capture(fn, make)
  plain = Replay(*part)
  assert not plain.outputs_in_place and "graph" in plain.call_kinds
  for _ in range(3):
    img = make()["img"]
    assert jit(img=img).numpy().tobytes() == plain(img=img).numpy().tobytes()

@pytest.mark.parametrize("instances", [36, 3], ids=["a graph instance per buffer pair", "instances re-pointed past the cap"])
def test_registered_camera_buffers_match_the_upload_path(tmp_path, monkeypatch, request, instances):
  from sunnypilot.modeld_v2.runtime import replay_backends
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  monkeypatch.setattr(replay_backends, "MAX_GRAPH_INSTANCES", instances)
  frame = camerad_frame(1344, 760)
  stand_in_models.write("native", "tiny", str(tmp_path / "m.onnx"), seed=5)
  compile_model(str(tmp_path / "m.bin"), onnx=str(tmp_path / "m.onnx"), log=lambda s: None)
  compile_warp(frame.spec, "512x256", str(tmp_path / "w.bin"), split_frames=True)
  registered = ModelRunner(str(tmp_path / "m.bin"), str(tmp_path / "w.bin"))
  uploaded = ModelRunner(str(tmp_path / "m.bin"), str(tmp_path / "w.bin"), map_camera_buffers=False)
  request.addfinalizer(registered.close)
  request.addfinalizer(uploaded.close)
  assert registered.in_place and registered.registered_camera_buffers == 0 and not uploaded.in_place
  rng = np.random.default_rng(0)
  bufs = [{k: CameraBuffer(rng.integers(0, 256, frame.size, dtype=np.uint8)) for k in ("img", "big_img")} for _ in range(5)]
  for step in range(12):
    outs = []
    for adapter in (registered, uploaded):
      adapter.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2) * [[2, 2, 1]] + [[0, 0, 100], [0, 0, 80], [0, 0, 0]]
      adapter.numpy_inputs["traffic_convention"][:] = [1, 0]
      adapter.copy_frames(bufs[step % len(bufs)])
      adapter.run()
      outs.append(adapter.output_array().tobytes())
    assert outs[0] == outs[1], f"step {step}: registered camera buffers differ from uploaded frames"
  assert registered.registered_camera_buffers == 10, "each camera buffer registered once"
  batches = registered.replay.call_kinds.count("graph")
  assert min(instances, 5) <= registered.replay.graph_instances <= min(instances, 5) * batches, "a graph per buffer pair, up to the cap"
  registered.reset_warmup_buffers()
  assert registered.registered_camera_buffers == 0 and registered.frame_feed.camera_tensors == {}
  assert registered.replay.graph_instances <= batches, "the instances built on camera buffers go with them"

def test_closing_one_runner_leaves_the_camera_buffers_another_reads(tmp_path, request):
  """The switch's case: the next model maps the same camera buffers, the previous one closes; the next keeps reading them in place."""
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  frame = camerad_frame(1344, 760)
  stand_in_models.write("native", "tiny", str(tmp_path / "m.onnx"), seed=5)
  compile_model(str(tmp_path / "m.bin"), onnx=str(tmp_path / "m.onnx"), log=lambda s: None)
  compile_warp(frame.spec, "512x256", str(tmp_path / "w.bin"), split_frames=True)
  rng = np.random.default_rng(1)
  bufs = {k: CameraBuffer(rng.integers(0, 256, frame.size, dtype=np.uint8)) for k in ("img", "big_img")}
  runners = [ModelRunner(str(tmp_path / "m.bin"), str(tmp_path / "w.bin")) for _ in range(2)]
  runners.append(ModelRunner(str(tmp_path / "m.bin"), str(tmp_path / "w.bin"), map_camera_buffers=False))
  for r in runners: request.addfinalizer(r.close)
  for r in runners:
    r.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2)
    r.copy_frames(bufs)
    r.run()
  runners[0].close()
  for r in runners[1:]:
    r.run()
  assert runners[1].output_array().tobytes() == runners[2].output_array().tobytes(), "the camera buffers stayed registered for the other runner"
  runners[1].close()

def test_a_copy_in_stages_nothing_another_threads_synchronize_frees():
  """tinygrad's CUDA copy-in staged each copy in pinned memory freed by the device's next synchronize, from any thread: a load on the model
  switch's thread racing the frame thread's readback synchronize wrote (or copied from) freed memory. copy_in is the driver's synchronous
  copy now: nothing is left on tinygrad's list of staged copies (ops_cuda's CUDADevice.pending_copyin), the caller's memory may be reused at
  once, and the bytes arrive while another thread synchronizes all along."""
  from tinygrad.device import Buffer
  from tinygrad.dtype import dtypes

  from sunnypilot.modeld_v2.runtime.tinygrad_internals import copy_in, copy_out, stages_copies
  device, size = Device["CUDA"], 1 << 20
  buf, out = Buffer("CUDA", size, dtypes.uint8).allocate(), np.empty(size, np.uint8)
  assert not stages_copies(buf)
  data = np.full(size, 7, np.uint8)
  copy_in(buf, memoryview(data))
  assert device.pending_copyin == [], "nothing staged for a synchronize to free"
  stop = threading.Event()
  def frame_thread() -> None:
    while not stop.is_set(): device.synchronize()
  thread = threading.Thread(target=frame_thread)
  thread.start()
  try:
    for i in range(64):
      data = np.full(size, i, np.uint8)
      copy_in(buf, memoryview(data))
      data[:] = 255  # the caller's memory, reused as soon as copy_in returned
      copy_out(buf, memoryview(out))
      assert (out == i).all(), f"copy {i} arrived damaged"
  finally:
    stop.set()
    thread.join()
