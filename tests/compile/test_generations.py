"""Every driving-model generation, 20 steps of state feedback: the bundle and the fused warp + model adapter (camera buffers read in place)
against onnxruntime driven by openpilot's input handling (openpilot_reference, in numpy, sharing no code with the package's queues)."""
import base64
import pickle

import numpy as np
import onnx
import pytest

from benchmarks.frame_inputs import CameraBuffer
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import realized, reference_warp
from openpilot_reference import GATE, Openpilot, drive_bundle, step_inputs

STEPS = 20
FRAME = camerad_frame(1344, 760)  # the frames of native_artifacts' warps

def integer_transform(rng) -> np.ndarray:
  """A scale-2 warp with an even shift: every source coordinate (Y and UV) is an integer, so no pixel sits on a rounding tie."""
  return np.array([[2, 0, 2 * rng.integers(0, 160)], [0, 2, 2 * rng.integers(0, 124)], [0, 0, 1]], np.float32)

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_bundle_matches_onnxruntime_and_the_tinyjit_replay(stand_in_bundles, generation):
  files, summary = stand_in_bundles(generation)
  reference = Openpilot(files)
  model = load_bundle(summary["output"])
  specs = model.input_specs
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  jit_states = {n: realized(np.zeros(t.shape, t.dtype.fmt)) for n, t in states.items()}
  jit_outs = {n: realized(np.zeros(t.shape, t.dtype.fmt)) for n, t in summary["inputs"]["output_buffers"].items()}  # in the capture's order
  rng = np.random.default_rng(11)
  for step in range(STEPS):
    new_img = rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8)
    desire, host = step_inputs(rng, step, reference.host, reference)
    expected = reference.step(new_img, desire, host)
    inputs = {n: realized(v) for n, v in ({"new_img": new_img, "desire": desire} | GATE | host).items() if n in specs}
    model.run(**inputs, **states, output_buffers=outs)
    summary["jit"](**inputs, **jit_states, output_buffers=jit_outs)
    for n, t in jit_states.items(): t.assign(jit_outs[f"next_{n}"]).realize()
    got = outs["outputs"].numpy()
    assert got.tobytes() == jit_outs["outputs"].numpy().tobytes(), f"{generation} step {step}: the bundle differs from the TinyJit replay"
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"{generation} step {step} vs onnxruntime")
  queued = set() if reference.native else set(GATE)
  assert set(specs) == {"new_img", *reference.host, *states} | ({"desire"} if reference.desire_key else set()) | queued, "every input by its role"

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_fused_adapter_reads_camera_buffers_and_matches_onnxruntime(stand_in_bundles, native_artifacts, generation):
  files, summary = stand_in_bundles(generation)
  reference = Openpilot(files)
  adapter = ModelRunner(summary["output"], f"{native_artifacts}/warp_split.bin")
  assert adapter.in_place, "VisionIPC-shaped buffers are read in place"
  cameras = [[CameraBuffer(np.zeros(FRAME.size, np.uint8)) for _ in range(3)] for _ in range(2)]  # a few rotating buffers per stream, as camerad's
  rng = np.random.default_rng(12)
  for step in range(STEPS):
    frames = rng.integers(0, 256, (2, FRAME.size), dtype=np.uint8)
    m_inv = np.stack([integer_transform(rng), integer_transform(rng)])
    bufs = [cameras[cam][step % 3] for cam in range(2)]
    for buf, frame in zip(bufs, frames): np.frombuffer(buf.data, np.uint8)[:] = frame
    warped = [reference_warp(frames[cam], FRAME, m_inv[cam]) for cam in range(2)]
    assert not any(ties.any() for _, ties in warped), "integer transforms have no rounding ties"
    desire, host = step_inputs(rng, step, reference.host, reference)
    expected = reference.step(np.stack([planes for planes, _ in warped]), desire, host)
    adapter.numpy_inputs["tfm"][:] = m_inv
    for name, value in ({"desire": desire} | host).items():
      if name in adapter.numpy_inputs: adapter.numpy_inputs[name][:] = value
    adapter.copy_frames({"img": bufs[0], "big_img": bufs[1]})
    adapter.run()
    np.testing.assert_allclose(adapter.output_array(), expected, rtol=1e-4, atol=1e-5, err_msg=f"{generation} step {step}: fused vs onnxruntime")
  assert len(adapter.frame_feed.camera_tensors) == 6, "each camera buffer mapped once"
  adapter.drop_camera_buffers()

def test_native_model_with_its_own_host_inputs(tmp_path):
  """No action_t, and an input openpilot never had: every non-state input is a host input under its own name."""
  model, _ = stand_in_models.build_native("tiny", seed=3, host={"desire": (1, 8), "traffic_convention": (1, 2), "driving_style": (1, 12)})
  onnx.save(model, path := str(tmp_path / "native.onnx"))
  summary = compile_model(str(tmp_path / "native.bin"), onnx=path, log=lambda s: None)
  meta = load_bundle(summary["output"]).metadata
  assert meta["input_roles"] == {"new_img": "frames", "desire": "host", "traffic_convention": "host", "driving_style": "host", "state_feat_q": "state"}
  drive_bundle(summary["output"], Openpilot({"onnx": path}), np.random.default_rng(5))

def onnx_model(nodes: list, inputs: dict[str, tuple], outputs: dict[str, tuple], slices: dict[str, slice], inits=(), **metadata):
  """A small ONNX model: inputs and outputs {name: (elem type, shape)}, comma's output_slices and other metadata."""
  from onnx import helper
  info = lambda specs: [helper.make_tensor_value_info(n, t, s) for n, (t, s) in specs.items()]
  model = helper.make_model(helper.make_graph(nodes, "m", info(inputs), info(outputs), list(inits)), opset_imports=[helper.make_opsetid("", 17)],
                            ir_version=8)
  for k, v in ({"output_slices": base64.b64encode(pickle.dumps(slices)).decode()} | metadata).items(): model.metadata_props.add(key=k, value=v)
  return model

def exact_float16_pair(folder) -> dict[str, str]:
  """A vision + policy pair in float16 whose every value is exact in float16 (maxima of uint8 planes / 256, copies), so onnxruntime and the
  bundle must agree bit for bit: float16 outputs, float16 host inputs, frame_skip 2 from the ONNX metadata, a policy with no
  traffic_convention."""
  from onnx import TensorProto, helper, numpy_helper
  f16, images = TensorProto.FLOAT16, ("img", "big_img")
  nodes = [helper.make_node("Cast", [n], [f"{n}_f"], to=TensorProto.FLOAT) for n in images]
  nodes += [helper.make_node("ReduceMax", [f"{n}_f"], [f"{n}_m"], axes=[2, 3], keepdims=0) for n in images]
  nodes += [helper.make_node("Concat", ["img_m", "big_img_m"], ["m"], axis=1), helper.make_node("Mul", ["m", "scale"], ["ms"]),
            helper.make_node("Cast", ["ms"], ["outputs"], to=f16)]
  vision = onnx_model(nodes, {n: (TensorProto.UINT8, (1, 12, 128, 256)) for n in images}, {"outputs": (f16, (1, 24))}, {"hidden_state": slice(0, 24)},
                      [numpy_helper.from_array(np.array(1 / 256, np.float32), "scale")], frame_skip="2")
  inputs = {"features_buffer": (f16, (1, 3, 24)), "desire_pulse": (f16, (1, 3, 8)), "driving_style": (f16, (1, 12))}
  nodes = [helper.make_node("Flatten", [n], [f"{n}_flat"]) for n in inputs] + [helper.make_node("Concat", [f"{n}_flat" for n in inputs], ["outputs"], axis=1)]
  policy = onnx_model(nodes, inputs, {"outputs": (f16, (1, 108))}, {"features": slice(0, 72), "desire": slice(72, 96), "style": slice(96, 108)})
  files = {"vision": str(folder / "vision.onnx"), "policy": str(folder / "policy.onnx")}
  onnx.save(vision, files["vision"]), onnx.save(policy, files["policy"])
  return files

def test_float16_pair_is_exact_and_takes_frame_skip_from_the_onnx(tmp_path):
  files = exact_float16_pair(tmp_path)
  summary = compile_model(str(tmp_path / "pair.bin"), **files, log=lambda s: None)
  model = load_bundle(summary["output"])
  assert model.metadata["frame_skip"] == 2 and model.input_specs["driving_style"].dtype == "<f4" and model.output_specs["outputs"].shape == (1, 132)
  assert {n: s.shape for n, s in model.input_specs.items() if n.endswith("_q")} == {"img_q": (3, 6, 128, 256), "big_img_q": (3, 6, 128, 256),
                                                                                         "desire_q": (6, 8), "feat_q": (5, 24)}
  reference, rng = Openpilot(files, frame_skip=2), np.random.default_rng(6)
  specs = model.input_specs
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if n.endswith("_q")}
  outs = {"outputs": realized(np.zeros((1, 132), np.float32))} | {f"next_{n}": t for n, t in states.items()}
  for step in range(8):
    new_img = rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8)
    desire, host = step_inputs(rng, step, reference.host, reference)
    expected = reference.step(new_img, desire, host)
    model.run(new_img=realized(new_img), desire=realized(desire), **{n: realized(v) for n, v in (host | GATE).items()}, **states, output_buffers=outs)
    assert outs["outputs"].numpy().tobytes() == expected.tobytes(), f"step {step}: float16 values must round the same on both sides"

# What openpilot pushes on a prepare-only frame (the one after a drop), written out: the 0.9.x modeld.py (@00731a68, @6c6be47b) pushes the
# desire before its prepare-only return and features and prev_desired_curv after the run; compile_modeld.py @55cac784 (0.10 on) advances
# only the image queues.
PREPARE_PUSHES_DESIRE = {"supercombo_20hz": True, "split_09": True, "split_010": False, "split_action": False, "supercombo_action": False,
                         "multi_policy": False, "split_current": False}
PREPARE_ONLY_STEPS = (5, 6, 13)  # two drops in a row, then one more

def prepare_only(reference: Openpilot, generation: str, new_img: np.ndarray, desire: np.ndarray) -> None:
  """The reference's prepare-only frame: the warped frames join the image history; the desire too where the generation pushes it."""
  reference.frames.append(new_img)
  if PREPARE_PUSHES_DESIRE[generation] and reference.desire_key: reference.push(reference.desire_key, desire.reshape(-1))

@pytest.mark.parametrize("generation", list(PREPARE_PUSHES_DESIRE))
def test_prepare_only_frames_push_what_the_generation_pushes(stand_in_bundles, generation):
  """Frames after a drop run with the gate on: afterwards the desire and feature queues hold what openpilot's buffers hold, and every
  later frame's outputs equal onnxruntime fed openpilot's inputs."""
  files, summary = stand_in_bundles(generation)
  reference, model = Openpilot(files), load_bundle(summary["output"])
  specs = model.input_specs
  assert model.metadata["generation"] == generation and model.metadata["input_roles"]["prepare_only"] == "gate"
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  rng = np.random.default_rng(13)
  for step in range(STEPS):
    new_img = rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8)
    desire, host = step_inputs(rng, step, reference.host, reference)
    desire[0, 1 + step % 7] = 1  # a pulse on every frame: a dropped desire push shows
    skip = step in PREPARE_ONLY_STEPS
    gate = {"prepare_only": np.full((1, 1), float(skip), np.float32)}
    model.run(**{n: realized(v) for n, v in ({"new_img": new_img, "desire": desire} | gate | host).items() if n in specs}, **states,
                 output_buffers=outs)
    if skip: prepare_only(reference, generation, new_img, desire)
    else: np.testing.assert_allclose(outs["outputs"].numpy(), reference.step(new_img, desire, host), rtol=1e-4, atol=1e-5,
                                     err_msg=f"{generation} step {step} vs onnxruntime")
    if reference.desire_key: assert np.array_equal(states["desire_q"].numpy(), reference.full[reference.desire_key]), f"desire queue, step {step}"
    if "features_buffer" in reference.full:
      feat = states["feat_q"].numpy()
      np.testing.assert_allclose(feat, reference.full["features_buffer"][-len(feat):], rtol=1e-4, atol=1e-5, err_msg=f"feature queue, step {step}")
