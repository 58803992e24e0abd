import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from sunnypilot.modeld_v2 import stand_in_models
from sunnypilot.modeld_v2.bundle import np_dtype
from sunnypilot.modeld_v2.compile_modeld import ModelError, compile_model, read_output_slices
from sunnypilot.modeld_v2.model_outputs import POLICY_SLICES, VISION_SLICES
from sunnypilot.modeld_v2.replay import PlainJit

from conftest import NO_COMPILE, realized, run_python

STEPS = 50

@pytest.fixture(scope="module")
def models(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("models")
  onnx_paths = {layout: str(tmp / f"{layout}.onnx") for layout in stand_in_models.LAYOUTS}
  for layout, path in onnx_paths.items(): stand_in_models.write(layout, "tiny", path, seed=1)
  quiet = lambda s: None
  return {"paths": onnx_paths,
          "native": compile_model(str(tmp / "native.bin"), onnx=onnx_paths["native"], log=quiet),
          "supercombo": compile_model(str(tmp / "supercombo.bin"), onnx=onnx_paths["supercombo"], log=quiet),
          "split": compile_model(str(tmp / "split.bin"), vision=onnx_paths["vision"], policy=onnx_paths["policy"], log=quiet)}

class NumpyReference:
  """openpilot's per-frame input handling written in numpy, driving onnxruntime: the independent reference."""
  def __init__(self, layout: str, paths: dict, frame_skip: int = 4):
    self.layout, self.fs = layout, frame_skip
    self.sessions = {k: ort.InferenceSession(paths[k]) for k in (("native",) if layout == "native" else ("supercombo",) if layout == "supercombo"
                                                                  else ("vision", "policy"))}
    if layout == "native": self.state = np.zeros((stand_in_models.NATIVE_HISTORY["tiny"], 1, 512), np.float32)
    else:
      self.img_q, self.big_img_q = np.zeros((frame_skip + 1, 6, 128, 256), np.uint8), np.zeros((frame_skip + 1, 6, 128, 256), np.uint8)
      self.feat_q, self.desire_q = np.zeros((frame_skip * 23 + 1, 512), np.float32), np.zeros((frame_skip * 25, 8), np.float32)

  @staticmethod
  def push(q: np.ndarray, x: np.ndarray) -> np.ndarray: return np.concatenate([q[1:], x[None]], axis=0)

  def step(self, new_img, desire, traffic, action_t) -> np.ndarray:
    if self.layout == "native":
      out, self.state = self.sessions["native"].run(["outputs", "next_state_feat_q"], {"new_img": new_img, "desire": desire, "traffic_convention": traffic,
                                                                                      "action_t": action_t, "state_feat_q": self.state})
      return out
    self.img_q, self.big_img_q = self.push(self.img_q, new_img[0]), self.push(self.big_img_q, new_img[1])
    self.desire_q = self.push(self.desire_q, desire[0])
    common = {"desire_pulse": self.desire_q.reshape(25, self.fs, 8).max(axis=1)[None], "traffic_convention": traffic, "action_t": action_t}
    images = {"img": self.img_q[::self.fs].reshape(1, 12, 128, 256), "big_img": self.big_img_q[::self.fs].reshape(1, 12, 128, 256)}
    if self.layout == "supercombo":
      out = self.sessions["supercombo"].run(["outputs"], images | common | {"features_buffer": self.feat_q[::self.fs][None]})[0]
      self.feat_q = self.push(self.feat_q, out[0, -512:])
      return out
    vision = self.sessions["vision"].run(["outputs"], images)[0]
    self.feat_q = self.push(self.feat_q, vision[0, -512:])
    policy = self.sessions["policy"].run(["outputs"], common | {"features_buffer": self.feat_q[::self.fs][None]})[0]
    return np.concatenate([vision, policy], axis=1)

def frame_inputs(rng, step: int) -> tuple:
  desire = np.zeros((1, 8), np.float32)
  if step % 7 == 3: desire[0, 1 + step % 7] = 1  # a one-frame pulse the max-pooling must keep
  return (rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8), desire, np.array([[1, 0]], np.float32),
          np.array([[0.2 + 0.01 * step, 0.45]], np.float32))

def bundle_state(summary: dict, in_place: bool) -> dict:
  specs = summary["part"][0]["inputs"]
  zeros = lambda spec: realized(np.zeros(spec["shape"], np_dtype(spec["dtype"])))
  states = {s["name"]: zeros(s) for s in specs if s["key"] is None and s["name"] not in ("new_img", "desire", "traffic_convention", "action_t")}
  outs = {s["key"]: (states[s["key"][5:]] if in_place and s["key"].startswith("next_") else zeros(s)) for s in specs if s["key"] is not None}
  return {"states": states, "output_buffers": outs}

def step_bundle(run, io: dict, new_img, desire, traffic, action_t, in_place: bool) -> np.ndarray:
  run(new_img=realized(new_img), desire=realized(desire), traffic_convention=realized(traffic), action_t=realized(action_t), **io["states"],
      output_buffers=io["output_buffers"])
  if not in_place:
    for name, state in io["states"].items(): state.assign(io["output_buffers"][f"next_{name}"]).realize()
  return io["output_buffers"]["outputs"].numpy().copy()

@pytest.mark.parametrize("layout", ["native", "supercombo", "split"])
def test_50_steps_match_onnxruntime_and_the_tinyjit_replay(models, layout):
  summary = models[layout]
  reference = NumpyReference(layout, models["paths"])
  plain = PlainJit(*summary["part"])
  runs = {"tinyjit": (summary["jit"], bundle_state(summary, False), False), "bundle": (plain, bundle_state(summary, False), False),
          "bundle in place": (plain, bundle_state(summary, True), True)}
  rng = np.random.default_rng(11)
  for step in range(STEPS):
    inputs = frame_inputs(rng, step)
    expected = reference.step(*inputs)
    got = {name: step_bundle(run, io, *inputs, in_place) for name, (run, io, in_place) in runs.items()}
    assert got["bundle"].tobytes() == got["tinyjit"].tobytes(), f"step {step}: bundle differs from the TinyJit replay"
    assert got["bundle in place"].tobytes() == got["bundle"].tobytes(), f"step {step}: next_X written into X changes the trajectory"
    np.testing.assert_allclose(got["bundle"], expected, rtol=1e-4, atol=1e-5, err_msg=f"{layout} step {step} vs onnxruntime")
  assert not np.allclose(expected[0, -512:], 0), "the hidden state moved: the feedback is exercised"

def test_metadata_and_output_slices(models):
  meta = models["split"]["part"][0]
  from sunnypilot.modeld_v2.loader import load_model
  split = load_model(models["split"]["output"])["metadata"]
  n_vision = sum(VISION_SLICES.values())
  assert split["output_slices"]["hidden_state"] == [n_vision - 512, n_vision]
  assert split["output_slices"]["plan"][0] == n_vision and split["layout"] == "split" and split["frame_skip"] == 4
  assert split["output_shapes"]["outputs"] == [1, n_vision + sum(POLICY_SLICES.values())]
  assert "random weights" in split["stand_in"]
  native = load_model(models["native"]["output"])["metadata"]
  assert native["input_shapes"]["new_img"] == [2, 6, 128, 256] and native["output_shapes"]["next_state_feat_q"] == [4, 1, 512]
  assert meta["kwargs"] == sorted(["new_img", "desire", "traffic_convention", "action_t", "img_q", "big_img_q", "feat_q", "desire_q", "output_buffers"])

def test_fresh_process_without_compiler(models, tmp_path):
  summary = models["supercombo"]
  rng = np.random.default_rng(5)
  inputs = frame_inputs(rng, 3)
  expected = step_bundle(PlainJit(*summary["part"]), bundle_state(summary, True), *inputs, True)
  np.savez(tmp_path / "inputs.npz", *inputs)
  out = run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
from sunnypilot.modeld_v2.loader import load_model
d = np.load({str(tmp_path / 'inputs.npz')!r})
new_img, desire, traffic, action_t = (Tensor(d[f"arr_{{i}}"]).realize() for i in range(4))
model = load_model({summary['output']!r})
states = {{k: Tensor(np.zeros(s.shape, s.dtype)).realize() for k, s in model["input_specs"].items() if k.endswith("_q")}}
outs = {{"outputs": Tensor(np.zeros(model["output_specs"]["outputs"].shape, np.float32)).realize()}} | {{f"next_{{k}}": v for k, v in states.items()}}
Device[Device.DEFAULT]
{NO_COMPILE}
model = load_model({summary['output']!r})
model["run"](new_img=new_img, desire=desire, traffic_convention=traffic, action_t=action_t, **states, output_buffers=outs)
print(bytes(outs["outputs"].uop.base.buffer.as_memoryview(force_zero_copy=True)).hex())
""")
  assert np.frombuffer(bytes.fromhex(out.strip()), np.float32).tobytes() == expected.tobytes()

def _onnx_with(tmp_path, name: str, mutate) -> str:
  model, _ = stand_in_models.build("native", "tiny", seed=2)
  mutate(model)
  path = str(tmp_path / f"{name}.onnx")
  onnx.save(model, path)
  return path

def test_bad_onnx_is_a_clear_error(tmp_path):
  def rename_input(model):
    for v in model.graph.input:
      if v.name == "new_img": v.name = "camera"
    for n in model.graph.node:
      n.input[:] = ["camera" if i == "new_img" else i for i in n.input]
  def add_gru(model):
    model.graph.node.append(helper.make_node("GRU", ["desire"], ["gru_out"], hidden_size=4))
  def orphan_state(model):
    model.graph.input.append(helper.make_tensor_value_info("state_desire_q", TensorProto.FLOAT, (4, 8)))
  def bad_next_shape(model):
    out = next(o for o in model.graph.output if o.name == "next_state_feat_q")
    out.type.tensor_type.shape.dim[0].dim_value = 9
  def no_slices(model):
    del model.metadata_props[:]
  cases = {"rename": (rename_input, "unknown layout.*takes \\["), "gru": (add_gru, "GRU.*MatMul/Sigmoid/Tanh"),
           "orphan": (orphan_state, "state input state_desire_q has no next_state_desire_q"), "shape": (bad_next_shape, "differ in shape"),
           "slices": (no_slices, "no output_slices")}
  for name, (mutate, message) in cases.items():
    with pytest.raises(ModelError, match=message): compile_model(str(tmp_path / "x.bin"), onnx=_onnx_with(tmp_path, name, mutate), log=lambda s: None)
  corrupt = tmp_path / "corrupt.onnx"
  corrupt.write_bytes(b"\x08\x07garbage" * 100)
  with pytest.raises(ModelError, match="corrupt.onnx"): compile_model(str(tmp_path / "x.bin"), onnx=str(corrupt), log=lambda s: None)
  with pytest.raises(ModelError, match="no such ONNX"): compile_model(str(tmp_path / "x.bin"), onnx=str(tmp_path / "missing.onnx"), log=lambda s: None)

def test_output_slices_unpickler_admits_only_slices():
  import base64
  import os
  import pickle
  assert read_output_slices(base64.b64encode(pickle.dumps({"a": slice(0, 3), "b": slice(3, 9)})).decode()) == {"a": [0, 3], "b": [3, 9]}
  class Evil:
    def __reduce__(self): return (os.system, ("echo pwned",))
  with pytest.raises(ModelError, match="only hold dicts and slices"): read_output_slices(base64.b64encode(pickle.dumps({"a": Evil()})).decode())
  with pytest.raises(ModelError, match="not comma's base64"): read_output_slices("!!!")

def test_cli_reports_errors_without_a_traceback(tmp_path, capsys):
  from sunnypilot.modeld_v2.compile_modeld import main
  with pytest.raises(SystemExit) as e: main(["--onnx", str(tmp_path / "none.onnx"), "--output", str(tmp_path / "x.bin")])
  assert e.value.code == 2 and "no such ONNX file" in capsys.readouterr().err
  with pytest.raises(SystemExit): main(["--vision", "v.onnx", "--output", "x.bin"])
  assert "needs both --vision and --policy" in capsys.readouterr().err
