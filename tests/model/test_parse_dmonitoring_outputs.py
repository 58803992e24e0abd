"""The driver-monitoring parse and driverStateV2's fields against openpilot's dmonitoringmodeld formulas, written out here: sigmoid is
1 / (1 + exp(-x)) with the exponent clipped at 11 (parse_model_outputs' safe_exp), the face_descs' last 6 values exp(x) clipped the same way;
fill_driver_data takes [:3] of the means and stds as the orientation, [3:5] as the position, and each probability's one value."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.model.fill_driver_state import driver_state_fields
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser, check_dm_heads, dm_layout
from sunnypilot.modeld_v2.tools.stand_in_models import dm_output_sizes

# per layout, openpilot's (prob head, DriverData field) in the order fill_driver_data sets them: sunnypilot @41dea5d4, openpilot @084747c
# (today's: sleep_prob -> sleepProb, phoneProb from using_phone_prob) and @63cf2e70
FIELDS = {"current": [("face_prob", "faceProb"), ("eyes_visible_prob", "eyesVisibleProb"), ("eyes_closed_prob", "eyesClosedProb"),
                      ("using_phone_prob", "phoneProb")],
          "previous": [("face_prob", "faceProb"), ("left_eye_prob", "leftEyeProb"), ("right_eye_prob", "rightEyeProb"),
                       ("left_blink_prob", "leftBlinkProb"), ("right_blink_prob", "rightBlinkProb"), ("sunglasses_prob", "sunglassesProb"),
                       ("using_phone_prob", "phoneProb")],
          "sleep": [("face_prob", "faceProb"), ("left_eye_prob", "leftEyeProb"), ("right_eye_prob", "rightEyeProb"),
                    ("left_blink_prob", "leftBlinkProb"), ("right_blink_prob", "rightBlinkProb"), ("sunglasses_prob", "sunglassesProb"),
                    ("using_phone_prob", "phoneProb"), ("sleep_prob", "sleepProb")]}

def openpilot_sigmoid(x): return 1.0 / (1.0 + np.exp(np.clip(-np.float32(x), -np.inf, 11)))

def openpilot_exp(x): return np.exp(np.clip(np.float32(x), -np.inf, 11))

def layout_slices(layout: str, shuffle: int) -> dict[str, list[int]]:
  """A model's output_slices with the layout's heads in a shuffled order and unread heads between them: the parse must go by the slices."""
  sizes = {f"{key}_{side}": 1 for side in ("lhd", "rhd") for key, _ in FIELDS[layout]} | {"face_descs_lhd": 12, "face_descs_rhd": 12}
  sizes |= {"wheel_on_right": 1, "poor_vision": 1, "features": 512} | ({} if layout == "sleep" else {"sleep_prob_lhd": 1})  # an unread head
  names = list(np.random.default_rng(shuffle).permutation(list(sizes)))
  out, at = {}, 0
  for name in names:
    out[name] = [at, at + sizes[name]]
    at += sizes[name]
  return out

@pytest.mark.parametrize("layout", ["current", "sleep", "previous"])
def test_every_field_is_openpilots(layout):
  slices = layout_slices(layout, shuffle=len(layout))
  n = max(stop for _, stop in slices.values())
  raw = np.random.default_rng(3).standard_normal((1, n)).astype(np.float32) * 4
  raw[0, slices["face_descs_lhd"][0] + 6] = 30.0  # an orientation log-std past the clip
  raw[0, slices["face_prob_rhd"][0]] = -40.0  # a logit whose exp(-x) the clip keeps finite
  parser = DMOutputParser(slices)
  assert parser.layout == layout
  f = driver_state_fields(parser(raw), parser.probs, 42, 0.025, 0.021, raw.tobytes())
  head = lambda name: raw[0, slices[name][0]:slices[name][1]]
  assert (f["frameId"], f["modelExecutionTime"], f["gpuExecutionTime"], f["rawPredictions"]) == (42, 0.025, 0.021, raw.tobytes())
  assert f["wheelOnRightProb"] == pytest.approx(openpilot_sigmoid(head("wheel_on_right")[0]), rel=1e-6)
  expected_paths = ["frameId", "modelExecutionTime", "gpuExecutionTime", "rawPredictions", "wheelOnRightProb"]
  for side, data in (("lhd", "leftDriverData"), ("rhd", "rightDriverData")):
    descs = head(f"face_descs_{side}")
    np.testing.assert_array_equal(f[f"{data}.faceOrientation"], descs[0:3])
    np.testing.assert_allclose(f[f"{data}.faceOrientationStd"], [openpilot_exp(x) for x in descs[6:9]], rtol=1e-6)
    np.testing.assert_array_equal(f[f"{data}.facePosition"], descs[3:5])
    np.testing.assert_allclose(f[f"{data}.facePositionStd"], [openpilot_exp(x) for x in descs[9:11]], rtol=1e-6)
    expected_paths += [f"{data}.{k}" for k in ("faceOrientation", "faceOrientationStd", "facePosition", "facePositionStd")]
    for key, field in FIELDS[layout]:
      assert f[f"{data}.{field}"] == pytest.approx(openpilot_sigmoid(head(f"{key}_{side}")[0]), rel=1e-6), f"{data}.{field}"
      expected_paths.append(f"{data}.{field}")
  assert list(f) == expected_paths, "openpilot's fields, in its order, nothing else"
  assert f["leftDriverData.faceOrientationStd"][0] == pytest.approx(np.exp(11), rel=1e-6) and np.isfinite(f["rightDriverData.faceProb"])

def test_no_raw_predictions_is_empty_bytes():
  slices = layout_slices("current", 0)
  parser = DMOutputParser(slices)
  assert driver_state_fields(parser(np.zeros(600, np.float32)), parser.probs, 0, 0.0, 0.0)["rawPredictions"] == b""

@pytest.mark.parametrize("layout", ["current", "sleep", "previous"])
def test_the_stand_ins_layout_is_a_layout_openpilot_parses(layout):
  sizes = dm_output_sizes(layout)
  at, slices = 0, {}
  for name, size in sizes.items(): slices[name], at = [at, at + size], at + size
  assert dm_layout(slices) == layout and list(sizes)[-1] == "features" and sizes["features"] == 512
  check_dm_heads(slices)
  # every head openpilot's parse reads, at the size it reads, written out here (FIELDS), not taken from the parse under test
  read = {f"{key}_{side}": 1 for side in ("lhd", "rhd") for key, _ in FIELDS[layout]} | {"face_descs_lhd": 12, "face_descs_rhd": 12, "wheel_on_right": 1}
  assert {name: sizes[name] for name in read if name in sizes} == read

@pytest.mark.parametrize("change,message", [
  (lambda s: s.pop("wheel_on_right"), "wheel_on_right missing"),
  (lambda s: s.pop("eyes_closed_prob_rhd"), "eyes_closed_prob_rhd missing"),
  (lambda s: s.__setitem__("face_descs_lhd", [s["face_descs_lhd"][0], s["face_descs_lhd"][0] + 11]), "face_descs_lhd has 11 values"),
  (lambda s: s.__setitem__("face_prob_lhd", [0, 2]), "face_prob_lhd has 2 values")])
def test_heads_missing_or_of_the_wrong_size_are_refused(change, message):
  slices = layout_slices("current", 1)
  change(slices)
  with pytest.raises(ValueError, match=message): check_dm_heads(slices)
  with pytest.raises(ValueError, match=message): DMOutputParser(slices)
