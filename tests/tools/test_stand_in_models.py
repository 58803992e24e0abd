"""The stand-ins carry each generation's openpilot input names, shapes and dtypes (from the history of selfdrive/modeld/modeld.py, written out here by hand) and
comma's output_slices; the CLI's errors are one line."""
import base64
import pickle

import onnx
import onnxruntime as ort
import pytest

from sunnypilot.modeld_v2.tools import stand_in_models
from sunnypilot.modeld_v2.tools.stand_in_models import main

U8, F16, F32 = "tensor(uint8)", "tensor(float16)", "tensor(float)"
IMGS = lambda road, wide, t=U8: {road: ((1, 12, 128, 256), t), wide: ((1, 12, 128, 256), t)}
TC, ACT = {"traffic_convention": ((1, 2), F32)}, {"action_t": ((1, 2), F32)}
POLICY_0X = {"desire_pulse": ((1, 25, 8), F32), "features_buffer": ((1, 25, 512), F32)} | TC
INPUTS = {
  "native": {"onnx": {"new_img": ((2, 6, 128, 256), U8), "desire": ((1, 8), F32), "state_feat_q": ((4, 1, 512), F32)} | TC | ACT},
  "supercombo_20hz": {"onnx": IMGS("input_imgs", "big_input_imgs", F16) | {
    "desire": ((1, 100, 8), F16), "traffic_convention": ((1, 2), F16), "lateral_control_params": ((1, 2), F16), "prev_desired_curv": ((1, 100, 1), F32),
    "features_buffer": ((1, 99, 512), F32), "nav_features": ((1, 256), F16), "nav_instructions": ((1, 150), F16)}},
  "split_09": {"vision": IMGS("input_imgs", "big_input_imgs"),
               "policy": {"desire": ((1, 25, 8), F32), "lateral_control_params": ((1, 2), F32), "prev_desired_curv": ((1, 25, 1), F32),
                          "features_buffer": ((1, 25, 512), F32)} | TC},
  "split_010": {"vision": IMGS("img", "big_img"), "policy": {"desire_pulse": ((1, 25, 8), F32), "features_buffer": ((1, 24, 512), F32)} | TC},
  "split_action": {"vision": IMGS("img", "big_img"), "policy": POLICY_0X | ACT},
  "supercombo_action": {"onnx": IMGS("img", "big_img") | {"desire_pulse": ((1, 25, 8), F32), "features_buffer": ((1, 24, 512), F32)} | TC | ACT},
  "multi_policy": {"vision": IMGS("img", "big_img"), "off_policy": POLICY_0X, "on_policy": POLICY_0X},
  "split_current": {"vision": IMGS("img", "big_img"), "policy": POLICY_0X},  # openpilot compile_modeld.py @55cac784
}

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_openpilots_names_shapes_and_slices(tmp_path, generation):
  stand_in = stand_in_models.write(generation, "tiny", str(tmp_path / f"{generation}.onnx"), seed=2)
  assert set(stand_in["files"]) == set(INPUTS[generation]) and stand_in["params"] > 0
  for key, path in stand_in["files"].items():
    session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    assert {i.name: (tuple(i.shape), i.type) for i in session.get_inputs()} == INPUTS[generation][key], f"{generation} {key}"
    outputs = {o.name: tuple(o.shape) for o in session.get_outputs()}
    slices = pickle.loads(base64.b64decode({p.key: p.value for p in onnx.load(path).metadata_props}["output_slices"]))
    bounds = sorted((s.start, s.stop) for s in slices.values())
    assert bounds[0][0] == 0 and all(a[1] == b[0] for a, b in zip(bounds, bounds[1:])) and bounds[-1][1] == outputs["outputs"][1], "slices tile outputs"
    if key in ("onnx", "vision"): assert slices["hidden_state"].stop - slices["hidden_state"].start == 512, "features_buffer's source"
    if generation == "split_current":  # single-hypothesis heads where openpilot's current models have them: lead 917:1061 of the vision
      size = {k: v.stop - v.start for k, v in slices.items()}
      if key == "policy": assert size == {"plan": 990, "desire_state": 8, "pad": 2}
      else: assert (size["lead"], slices["lead"], size["hidden_state"]) == (144, slice(917, 1061), 512)
    if generation in ("supercombo_20hz", "split_09") and key != "vision":
      assert slices["desired_curvature"].stop - slices["desired_curvature"].start == 2, "prev_desired_curv's source: a mean and a std"

def run_cli(capsys, argv: list[str]) -> tuple[int, str, str]:
  try: code = main(argv)
  except SystemExit as e: code = e.code
  out = capsys.readouterr()
  return code, out.out, out.err

def test_cli_writes_every_model_and_errors_are_one_line(tmp_path, capsys):
  code, out, _ = run_cli(capsys, ["--generation", "split_09", "--output", str(tmp_path / "split.onnx")])
  assert code == 0 and (tmp_path / "split_vision.onnx").exists() and (tmp_path / "split_policy.onnx").exists()
  assert f"compile_modeld --vision {tmp_path}/split_vision.onnx --policy {tmp_path}/split_policy.onnx" in out
  (tmp_path / "folder.onnx").mkdir()
  for argv, message in ((["--output", str(tmp_path / "missing" / "x.onnx")], "does not exist"),
                        (["--output", str(tmp_path / "folder.onnx")], "is a folder")):
    code, _, err = run_cli(capsys, ["--generation", "native", *argv])
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
  assert not (tmp_path / "x.onnx").exists()
