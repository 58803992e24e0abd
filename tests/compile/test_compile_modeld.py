"""compile_modeld: roles from the ONNX, frame_skip, output slices, the queued step's metadata, and every error as one clear line.
The numerical checks of each generation against onnxruntime are in test_generations.py."""
import base64
import os
import pickle

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.model_plan import QueuedPlan, plan_model
from sunnypilot.modeld_v2.compile.onnx_model import ModelError, read_output_slices
from sunnypilot.modeld_v2.compile_modeld import compile_model, main
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import NO_COMPILE, realized, run_python

quiet = lambda s: None

@pytest.fixture(scope="module")
def onnx_files(tmp_path_factory) -> dict[str, dict[str, str]]:
  """Every generation's tiny stand-in, written once (no compile)."""
  tmp = tmp_path_factory.mktemp("onnx")
  return {g: stand_in_models.write(g, "tiny", str(tmp / f"{g}.onnx"), seed=1)["files"] for g in stand_in_models.NAMES}

IMG = (5, 6, 128, 256)  # frame_skip 4, two frames
# generation -> (layout, frame_skip, host inputs, queue shapes): openpilot's names and shapes (history of selfdrive/modeld/modeld.py), written out by hand
EXPECTED = {
  "native": ("native", None, {"desire", "traffic_convention", "action_t"}, {}),
  "supercombo_20hz": ("supercombo", 1, {"traffic_convention", "lateral_control_params", "nav_features", "nav_instructions"},
                      {"img_q": (2, 6, 128, 256), "big_img_q": (2, 6, 128, 256), "desire_q": (100, 8), "feat_q": (99, 512), "curv_q": (100, 1)}),
  "split_09": ("split", 4, {"traffic_convention", "lateral_control_params"},
               {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (97, 512), "curv_q": (97, 1)}),
  "split_010": ("split", 4, {"traffic_convention"}, {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (93, 512)}),
  "split_action": ("split", 4, {"traffic_convention", "action_t"}, {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (97, 512)}),
  "supercombo_action": ("supercombo", 4, {"traffic_convention", "action_t"}, {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (93, 512)}),
  "multi_policy": ("multi_policy", 4, {"traffic_convention"}, {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (97, 512)}),
  "split_current": ("split", 4, {"traffic_convention"}, {"img_q": IMG, "big_img_q": IMG, "desire_q": (100, 8), "feat_q": (97, 512)}),
}

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_roles_frame_skip_and_queues_of_every_generation(onnx_files, generation):
  layout, frame_skip, host, queues = EXPECTED[generation]
  plan = plan_model(**onnx_files[generation])
  assert isinstance(plan, QueuedPlan) == (layout != "native"), "a queued layout's plan carries its queues; a native one has none"
  kept = plan.queues.queues if isinstance(plan, QueuedPlan) else {}
  assert (plan.layout, plan.queues.frame_skip if isinstance(plan, QueuedPlan) else None) == (layout, frame_skip)
  assert {n for n, r in plan.input_roles.items() if r == "host"} == host
  assert {n: q.shape for n, q in kept.items()} == queues
  expected_roles = {"new_img": "frames"} | ({"state_feat_q": "state"} if layout == "native" else
                                           {"desire": "desire", "prepare_only": "gate"} | dict.fromkeys(queues, "queue"))
  assert plan.input_roles == expected_roles | dict.fromkeys(host, "host")
  assert (plan.generation, plan.generation_source) == (generation, "onnx"), "each stand-in's generation is derived from its inputs and heads"
  assert set(plan.specs) == set(plan.input_roles) and all(np.dtype(plan.specs[n][1]) == np.float32 for n in host), "host inputs are float32"

def test_onnx_roles_name_each_input(onnx_files):
  plan = plan_model(**onnx_files["split_09"])
  assert plan.roles == {"vision": {"input_imgs": "road_image", "big_input_imgs": "wide_image"},
                        "policy": {"desire": "desire_history", "prev_desired_curv": "prev_curvature", "features_buffer": "features",
                                   "traffic_convention": "host", "lateral_control_params": "host"}}
  assert plan.queues.queues["desire_q"].feeds == "desire" and plan.queues.queues["img_q"].feeds == "input_imgs"

def onnx_slices(path: str) -> tuple[dict[str, list[int]], int]:
  model = onnx.load(path)
  slices = pickle.loads(base64.b64decode({p.key: p.value for p in model.metadata_props}["output_slices"]))
  width = next(o for o in model.graph.output if o.name == "outputs").type.tensor_type.shape.dim[1].dim_value
  return {k: [s.start, s.stop] for k, s in slices.items()}, width

def test_pair_and_triple_slices(onnx_files):
  (vision, n_vision), (policy, n_policy) = (onnx_slices(onnx_files["split_action"][k]) for k in ("vision", "policy"))
  pair = plan_model(**onnx_files["split_action"])
  assert pair.out_specs["outputs"][0] == (1, n_vision + n_policy)
  assert pair.slices["pose"] == vision["pose"] and pair.slices["plan"] == [policy["plan"][0] + n_vision, policy["plan"][1] + n_vision]
  assert pair.slices["policy/plan"] == pair.slices["plan"] and pair.queues.feedback["feat_q"] == vision["hidden_state"]
  files = onnx_files["multi_policy"]
  (vision, n_vision), (off, n_off), (on, _) = (onnx_slices(files[k]) for k in ("vision", "off_policy", "on_policy"))
  triple = plan_model(**files)
  shift = lambda r, n: [r[0] + n, r[1] + n]
  assert triple.slices["off_policy/desire_state"] == shift(off["desire_state"], n_vision)
  assert triple.slices["on_policy/desire_state"] == shift(on["desire_state"], n_vision + n_off)
  assert triple.slices["desire_state"] == triple.slices["off_policy/desire_state"], "sunnypilot's runner reads the off-policy's head over the others'"
  assert triple.slices["plan"] == shift(on["plan"], n_vision + n_off) and triple.slices["lead"] == shift(off["lead"], n_vision)
  assert triple.queues.feedback["feat_q"] == vision["hidden_state"] and triple.paths == {k: files[k] for k in ("vision", "off_policy", "on_policy")}

def mutated(tmp_path, files: dict[str, str], key: str, mutate, name: str = "m") -> dict[str, str]:
  model = onnx.load(files[key])
  mutate(model)
  onnx.save(model, path := str(tmp_path / f"{name}_{key}.onnx"))
  return files | {key: path}

def set_meta(key: str, value: str):
  def mutate(model):
    props = {p.key: p.value for p in model.metadata_props} | {key: value}
    del model.metadata_props[:]
    for k, v in props.items(): model.metadata_props.add(key=k, value=v)
  return mutate

def test_frame_skip_rule(onnx_files, tmp_path):
  files = onnx_files["split_010"]
  assert plan_model(**mutated(tmp_path, files, "policy", set_meta("frame_skip", "2"))).queues.frame_skip == 2, "the ONNX's own frame_skip first"
  assert plan_model(**files, frame_skip=3).queues.frame_skip == 3 and plan_model(**onnx_files["supercombo_20hz"], frame_skip=2).queues.frame_skip == 2
  for bad in (0, -3, "x", 1.5):
    with pytest.raises(ModelError, match="frame-skip must be an integer"): plan_model(**files, frame_skip=bad)
  with pytest.raises(ModelError, match="frame-skip must be an integer of at least 1, got 0"): plan_model(**onnx_files["native"], frame_skip=0)
  with pytest.raises(ModelError, match="frame_skip metadata must be an integer of at least 1, got '0'"):
    plan_model(**mutated(tmp_path, files, "policy", set_meta("frame_skip", "0")))
  disagree = mutated(tmp_path, mutated(tmp_path, files, "policy", set_meta("frame_skip", "2")), "vision", set_meta("frame_skip", "3"))
  with pytest.raises(ModelError, match="disagree on frame_skip"): plan_model(**disagree)

def add_input(name: str, shape: tuple, dtype=TensorProto.FLOAT):
  return lambda model: model.graph.input.append(helper.make_tensor_value_info(name, dtype, shape))

def test_errors_name_the_input_and_the_rule(onnx_files, tmp_path):
  files = onnx_files["supercombo_action"]
  cases = [(mutated(tmp_path, files, "onnx", add_input("lane_history", (1, 10, 4)), "h"), "input lane_history \\(1, 10, 4\\) fits no rule: images have 'img'"),
           (mutated(tmp_path, files, "onnx", add_input("imgs_extra", (1, 5, 3)), "i"), "input imgs_extra \\(1, 5, 3\\) fits no rule"),
           (mutated(tmp_path, files, "onnx", add_input("desire_2", (1, 25, 8)), "d"), "two inputs are the desire history: desire_pulse and desire_2"),
           (mutated(tmp_path, onnx_files["native"], "onnx", lambda m: m.graph.output.append(
             helper.make_tensor_value_info("next_state_desire_q", TensorProto.FLOAT, (4, 8))), "o"), "half a state pair: outputs \\['next_state_desire_q'\\]"),
           (mutated(tmp_path, onnx_files["native"], "onnx", lambda m: setattr(
             next(o for o in m.graph.output if o.name == "next_state_feat_q").type.tensor_type.shape.dim[0], "dim_value", 9), "s"), "differ in shape"),
           (mutated(tmp_path, files, "onnx", set_meta("output_slices", base64.b64encode(pickle.dumps({"plan": slice(0, 2.5)})).decode()), "f"),
            "integer \\[start:stop\\] slices"),
           (mutated(tmp_path, files, "onnx", set_meta("output_slices", base64.b64encode(pickle.dumps({"plan": slice("a", 3)})).decode()), "g"),
            "integer \\[start:stop\\] slices"),
           (mutated(tmp_path, files, "onnx", set_meta("output_slices", base64.b64encode(pickle.dumps({"extra": slice(0, 3)})).decode()), "n"),
            "output_slices has no hidden_state: features_buffer is fed back from it"),
           (mutated(tmp_path, onnx_files["split_09"], "policy", set_meta("output_slices", base64.b64encode(pickle.dumps({"x": slice(0, 3)})).decode()), "c"),
            "desired_curvature: prev_desired_curv is fed back from it"),
           (mutated(tmp_path, files, "onnx", set_meta("output_slices", base64.b64encode(pickle.dumps({"plan": slice(0, 3)})).decode()), "p"),
            "p_onnx.onnx: output_slices: plan has 3 values, openpilot's layouts have 4955 or 990$"),  # what the loader would refuse, refused first
           (onnx_files["split_09"] | {"vision": onnx_files["split_010"]["vision"]}, None)]
  for case, message in cases[:-1]:
    with pytest.raises(ModelError, match=message): plan_model(**case)
  assert plan_model(**cases[-1][0]).layout == "split", "roles, not generations: a 0.10 vision model with a 0.9 policy plans"

def test_bad_onnx_is_a_clear_error(tmp_path, onnx_files):
  def rename_input(model):
    for v in model.graph.input:
      if v.name == "new_img": v.name = "camera"
    for n in model.graph.node: n.input[:] = ["camera" if i == "new_img" else i for i in n.input]
  cases = {"rename": (rename_input, "a queued model takes a road and a wide image"),
           "gru": (lambda m: m.graph.node.append(helper.make_node("GRU", ["desire"], ["gru_out"], hidden_size=4)), "GRU.*MatMul/Sigmoid/Tanh"),
           "slices": (lambda m: m.metadata_props.__delitem__(slice(None)), "no output_slices")}
  for name, (mutate, message) in cases.items():
    with pytest.raises(ModelError, match=message): plan_model(**mutated(tmp_path, onnx_files["native"], "onnx", mutate, name))
  corrupt = tmp_path / "corrupt.onnx"
  corrupt.write_bytes(b"\x08\x07garbage" * 100)
  with pytest.raises(ModelError, match="corrupt.onnx"): plan_model(onnx=str(corrupt))
  with pytest.raises(ModelError, match="no such ONNX"): plan_model(onnx=str(tmp_path / "missing.onnx"))
  with pytest.raises(ModelError, match="give --onnx, or --vision with --policy.*got --vision, --on-policy"):
    plan_model(vision=onnx_files["multi_policy"]["vision"], on_policy=onnx_files["multi_policy"]["on_policy"])

def test_stateless_native_output_must_be_named_outputs(tmp_path):
  """modeld and the fused part read `outputs`: a native model's single output under another name is refused at compile time."""
  from sunnypilot.modeld_v2.tools.stand_in_models import output_slices_prop
  graph = helper.make_graph([helper.make_node("Cast", ["new_img"], ["f"], to=TensorProto.FLOAT), helper.make_node("ReduceMean", ["f"], ["vec"],
                             axes=[1, 2, 3], keepdims=0)], "stateless", [helper.make_tensor_value_info("new_img", TensorProto.UINT8, (2, 6, 128, 256))],
                            [helper.make_tensor_value_info("vec", TensorProto.FLOAT, (2,))])
  model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
  model.metadata_props.add(key="output_slices", value=output_slices_prop({"extra": 2}))
  onnx.save(model, str(tmp_path / "stateless.onnx"))
  with pytest.raises(ModelError, match="must be named 'outputs'"): plan_model(onnx=str(tmp_path / "stateless.onnx"))

def test_output_slices_unpickler_admits_only_slices():
  assert read_output_slices(base64.b64encode(pickle.dumps({"a": slice(0, 3), "b": slice(3, 9)})).decode()) == {"a": [0, 3], "b": [3, 9]}
  class Evil:
    def __reduce__(self): return (os.system, ("echo pwned",))
  with pytest.raises(ModelError, match="only hold dicts and slices"): read_output_slices(base64.b64encode(pickle.dumps({"a": Evil()})).decode())
  with pytest.raises(ModelError, match="not comma's base64"): read_output_slices("!!!")
  for bad in (slice(0.5, 3), slice(0, None), slice(0, 4, 2), slice(True, 3)):
    with pytest.raises(ModelError, match="integer \\[start:stop\\] slices"): read_output_slices(base64.b64encode(pickle.dumps({"a": bad})).decode())

def cli(capsys, argv: list[str]) -> tuple[int, str]:
  with pytest.raises(SystemExit) as e: main(argv)
  return e.value.code, capsys.readouterr().err

def test_cli_errors_are_one_line_before_any_compile(tmp_path, capsys, onnx_files):
  native = onnx_files["native"]["onnx"]
  (tmp_path / "folder").mkdir()
  cases = [(["--onnx", str(tmp_path / "none.onnx")], "no such ONNX file"), (["--vision", native], "give --onnx, or --vision with --policy"),
           (["--onnx", native, "--frame-skip", "0"], "--frame-skip must be an integer of at least 1, got '0'"),
           (["--onnx", native, "--frame-skip", "-3"], "--frame-skip must be an integer of at least 1, got '-3'"),
           (["--onnx", native, "--frame-skip", "four"], "--frame-skip must be an integer, got 'four'")]
  for argv, message in cases:
    code, err = cli(capsys, argv + ["--output", str(tmp_path / "x.bin")])
    assert code == 2 and message in err and err.count("\n") == 1, err
  for output, message in ((tmp_path / "folder", "is a folder"), (tmp_path / "missing" / "x.bin", "does not exist")):
    code, err = cli(capsys, ["--onnx", native, "--output", str(output)])
    assert code == 2 and message in err and err.count("\n") == 1 and "capturing" not in err, err
  logged = []
  with pytest.raises(ArtifactError, match="is a folder"): compile_model(str(tmp_path / "folder"), onnx=native, log=logged.append)
  assert logged == [], "nothing compiles before the output is known to be writable"
  assert not (tmp_path / "x.bin").exists()

@pytest.fixture(scope="module")
def supercombo(onnx_files, tmp_path_factory) -> dict:
  return compile_model(str(tmp_path_factory.mktemp("bundle") / "supercombo.bin"), **onnx_files["supercombo_action"], log=quiet)

def test_metadata_says_roles_slices_and_frame_skip(supercombo, onnx_files):
  meta = load_bundle(supercombo["output"]).metadata
  slices, width = onnx_slices(onnx_files["supercombo_action"]["onnx"])
  assert meta["layout"] == "supercombo" and meta["frame_skip"] == 4 and meta["output_slices"] == slices
  assert meta["output_shapes"]["outputs"] == [1, width] and meta["output_shapes"]["next_feat_q"] == [93, 512]
  assert meta["input_roles"] == {"new_img": "frames", "desire": "desire", "traffic_convention": "host", "action_t": "host", "prepare_only": "gate",
                                 "img_q": "queue", "big_img_q": "queue", "desire_q": "queue", "feat_q": "queue"}
  assert (meta["generation"], meta["generation_source"]) == ("supercombo_action", "onnx")
  assert meta["onnx_roles"] == {"model": {"img": "road_image", "big_img": "wide_image", "desire_pulse": "desire_history", "features_buffer": "features",
                                          "traffic_convention": "host", "action_t": "host"}}
  assert "random weights" in meta["stand_in"] and meta["sources"] == {"model": "supercombo_action.onnx"}

def test_fresh_process_without_compiler(supercombo, tmp_path):
  """The bundle replays in a new process with the compiler forbidden, on the inputs the capture was self-checked with."""
  from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
  rng = np.random.default_rng(5)
  model = load_bundle(supercombo["output"])
  values = {n: rng.integers(0, 256, s.shape).astype(s.dtype) if s.dtype == "|u1" else rng.standard_normal(s.shape).astype(s.dtype)
            for n, s in model.input_specs.items()}
  states = {n: realized(v) for n, v in values.items() if n.endswith("_q")}
  outs = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items() if not n.startswith("next_")} | \
    {f"next_{n}": t for n, t in states.items()}  # `outputs` and the in-graph parse's message_floats
  np.savez(tmp_path / "inputs.npz", **values)
  Replay(*supercombo["part"])(**{n: realized(v) for n, v in values.items() if n not in states}, **states, output_buffers=outs)
  expected = {n: t.numpy() for n, t in outs.items() if not n.startswith("next_")}
  out = run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
from sunnypilot.modeld_v2.runtime.loader import load_bundle
d = np.load({str(tmp_path / 'inputs.npz')!r})
inputs = {{k: Tensor(d[k]).realize() for k in d.files}}
model = load_bundle({supercombo['output']!r})
outs = {{n: Tensor(np.zeros(s.shape, s.dtype)).realize() for n, s in model.output_specs.items() if not n.startswith("next_")}}
outs |= {{f"next_{{k}}": v for k, v in inputs.items() if k.endswith("_q")}}
Device[Device.DEFAULT]
{NO_COMPILE}
model.run(**inputs, output_buffers=outs)
for name in {sorted(expected)!r}: print(bytes(outs[name].uop.base.buffer.as_memoryview(force_zero_copy=True)).hex())
""")
  assert [bytes.fromhex(line) for line in out.split()] == [expected[n].tobytes() for n in sorted(expected)]

def test_a_model_no_generation_fits_needs_generation(tmp_path, capsys):
  """One ONNX with a 24-entry features_buffer and no action_t fits no generation: a one-line error, then --generation decides and is recorded."""
  part = stand_in_models.ModelSpec(stand_in_models.VISION_SLICES | stand_in_models.POLICY_SLICES, stand_in_models.IMAGES,
                              histories={"desire_pulse": (1, 25, 8), "features_buffer": (1, 24, 512)}, host=stand_in_models.TRAFFIC)
  onnx.save(stand_in_models.build_model(part, "unknown")[0], path := str(tmp_path / "unknown.onnx"))
  code, err = cli(capsys, ["--onnx", path, "--output", str(tmp_path / "x.bin")])
  assert code == 2 and "fits no known generation: give --generation" in err and err.count("\n") == 1 and not (tmp_path / "x.bin").exists(), err
  assert main(["--onnx", path, "--output", str(tmp_path / "x.bin"), "--generation", "supercombo_action"]) == 0
  meta = load_bundle(str(tmp_path / "x.bin")).metadata
  assert (meta["generation"], meta["generation_source"]) == ("supercombo_action", "--generation")
  code, err = cli(capsys, ["--onnx", path, "--output", str(tmp_path / "y.bin"), "--generation", "split_11"])
  assert code == 2 and "invalid choice" in err
