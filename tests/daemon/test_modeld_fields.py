"""modeld end to end on today's layout: every published field from rawPredictions by openpilot's and sunnypilot's formulas (float32
and float16 bundles); each actuator delay counted once, from the flags on a PC and from CarParams on a device."""
import os

import numpy as np
import pytest

from sunnypilot.modeld_v2.model.constants import DT_MDL

import modeld_daemon
from modeld_daemon import LAT_DELAY, V_EGO, Daemon, reference, stand_in_artifacts
from openpilot_reference import T, openpilot_plan_t_idxs, sig

# the daemon tests' fixtures, by name
artifacts, split_current = modeld_daemon.artifacts, modeld_daemon.split_current
split_09, split_action = modeld_daemon.split_09, modeld_daemon.split_action

class Expected:
  """Every field of today's single-hypothesis layout from rawPredictions, by openpilot's and sunnypilot's formulas written out here, with the
  history they keep: FCW's last 5/2 hard-brake probabilities, the 2 s confidence buffer. An mlsim generation: curvature from the plan."""
  def __init__(self, slices: dict, lat_t: float):
    self.slices, self.lat_t = slices, lat_t
    self.brake5, self.brake3, self.buffer = np.zeros(5), np.zeros(2), np.zeros(25)

  def check(self, msgs: dict) -> None:
    m, d, o = msgs["modelV2"], msgs["drivingModelData"], msgs["cameraOdometry"]
    raw = np.frombuffer(bytes(m.rawPredictions), np.float32).astype(np.float64)
    head = lambda name: raw[self.slices[name][0]:self.slices[name][1]]
    exp = lambda x: np.exp(np.minimum(x, 11))  # safe_exp
    def eq(got, want, rtol=1e-5, atol=1e-6): np.testing.assert_allclose(np.asarray(list(got), np.float64), want, rtol=rtol, atol=atol)
    assert head("plan").size == 990 and head("lead").size == 144, "one mean/std pair each: no hypotheses"
    plan, plan_std = head("plan")[:495].reshape(33, 15), exp(head("plan")[495:]).reshape(33, 15)
    for field, cols in (("position", slice(0, 3)), ("velocity", slice(3, 6)), ("acceleration", slice(6, 9)), ("orientation", slice(9, 12)),
                        ("orientationRate", slice(12, 15))):
      xyz = getattr(m, field)
      for axis, col in zip("xyz", range(cols.start, cols.stop)): eq(getattr(xyz, axis), plan[:, col])
      eq(xyz.t, T)
    for axis, col in zip("xyz", range(3)): eq(getattr(m.position, f"{axis}Std"), plan_std[:, col])
    eq(m.temporalPose.trans, plan[0, 3:6]), eq(m.temporalPose.transStd, plan_std[0, 3:6]), eq(m.temporalPose.rot, plan[0, 12:15])
    lanes, lanes_std = head("lane_lines")[:264].reshape(4, 33, 2), exp(head("lane_lines")[264:]).reshape(4, 33, 2)
    edges, edges_std = head("road_edges")[:132].reshape(2, 33, 2), exp(head("road_edges")[132:]).reshape(2, 33, 2)
    t = openpilot_plan_t_idxs(plan[:, 0])
    for lines, values in ((m.laneLines, lanes), (m.roadEdges, edges)):
      assert len(lines) == len(values)
      for line, value in zip(lines, values):
        eq(line.x, [192.0 * (i / 32) ** 2 for i in range(33)]), eq(line.y, value[:, 0]), eq(line.z, value[:, 1]), eq(line.t, t)
    eq(m.laneLineStds, lanes_std[:, 0, 0]), eq(m.roadEdgeStds, edges_std[:, 0, 0])
    line_probs = sig(head("lane_lines_prob"))[1::2]
    eq(m.laneLineProbs, line_probs)
    lead, lead_std, lead_prob = head("lead")[:72].reshape(3, 6, 4), exp(head("lead")[72:]).reshape(3, 6, 4), sig(head("lead_prob"))
    for i, lv3 in enumerate(m.leadsV3):
      for k, name in enumerate("xyva"): eq(getattr(lv3, name), lead[i, :, k]), eq(getattr(lv3, f"{name}Std"), lead_std[i, :, k])
      assert lv3.prob == pytest.approx(lead_prob[i], rel=1e-5) and lv3.probTime == [0.0, 2.0, 4.0][i]
      eq(lv3.t, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0])
    softmax = lambda x: np.exp(x - x.max(-1, keepdims=True)) / np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)
    eq(m.meta.desireState, softmax(head("desire_state"))), eq(m.meta.desirePrediction, softmax(head("desire_pred").reshape(4, 8)).reshape(-1))
    meta = sig(head("meta"))  # the 55-entry layout: engaged, then gas/brake/steer/hard-brake 3/4/5 interleaved by 2 s step, then presses
    dp = m.meta.disengagePredictions
    assert m.meta.engagedProb == pytest.approx(meta[0], rel=1e-5)
    for field, start in (("gasDisengageProbs", 1), ("brakeDisengageProbs", 2), ("steerOverrideProbs", 3), ("brake3MetersPerSecondSquaredProbs", 4),
                         ("brake4MetersPerSecondSquaredProbs", 5), ("brake5MetersPerSecondSquaredProbs", 6)): eq(getattr(dp, field), meta[start:31:6])
    eq(dp.gasPressProbs, meta[31:55:4]), eq(dp.brakePressProbs, meta[32:55:4]), eq(dp.t, [2.0, 4.0, 6.0, 8.0, 10.0])
    self.brake5 = np.append(self.brake5[1:], np.float32(meta[6]))
    self.brake3 = np.append(self.brake3[1:], np.float32(meta[4]))
    assert m.meta.hardBrakePredicted == bool((self.brake5 > [0.05, 0.05, 0.15, 0.15, 0.15]).all() and (self.brake3 > [0.7, 0.7]).all())
    if m.frameId % 40 == 0:
      any_p = 1 - (1 - meta[2:31:6]) * (1 - meta[1:31:6]) * (1 - meta[3:31:6])
      self.buffer = np.concatenate([self.buffer[5:], [any_p[0], *(np.diff(any_p) / (1 - any_p[:-1]))]])
    score = sum(self.buffer[i * 5 + 4 - i] for i in range(5)) / 5
    assert str(m.confidence) == ("green" if score < 0.01165 else "yellow" if score < 0.06157 else "red")
    curvature = 2 * np.interp(self.lat_t, T, plan[:, 11]) / (V_EGO * self.lat_t) - plan[0, 14] / V_EGO  # mlsim: the plan, no smoothing
    assert m.action.desiredCurvature == pytest.approx(curvature, rel=1e-4, abs=1e-7) == d.action.desiredCurvature
    coeffs = np.linalg.lstsq(np.stack([T ** k for k in range(5)], axis=1), plan[:, 0:3], rcond=None)[0]
    for i, axis in enumerate("xyz"): eq(getattr(d.path, f"{axis}Coefficients"), coeffs[:, i], rtol=1e-3, atol=1e-4)
    meta_d = d.laneLineMeta
    assert (meta_d.leftY, meta_d.rightY) == pytest.approx((lanes[1, 0, 0], lanes[2, 0, 0]), rel=1e-5)
    assert (meta_d.leftProb, meta_d.rightProb) == pytest.approx((line_probs[1], line_probs[2]), rel=1e-5)
    pose, pose_std = head("pose")[:6], exp(head("pose")[6:])
    eq(o.trans, pose[:3]), eq(o.rot, pose[3:]), eq(o.transStd, pose_std[:3]), eq(o.rotStd, pose_std[3:])
    eq(o.wideFromDeviceEuler, head("wide_from_device_euler")[:3]), eq(o.wideFromDeviceEulerStd, exp(head("wide_from_device_euler")[3:]))
    eq(o.roadTransformTrans, head("road_transform")[:3]), eq(o.roadTransformTransStd, exp(head("road_transform")[6:9]))

def test_todays_layout_every_field_from_raw_predictions(split_current, openpilot_prefix):
  """openpilot's current vision + policy layout end to end: every published field equals the reference computed from rawPredictions."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  meta = load_bundle(os.path.join(split_current, "model.bin")).metadata
  assert (meta["generation"], meta["generation_source"]) == ("split_current", "onnx")
  daemon, expected = Daemon(split_current), Expected(meta["output_slices"], LAT_DELAY + 1.5 * DT_MDL)
  for frame_id in range(45):  # past frame 40: a confidence update
    daemon.send(frame_id)
    expected.check(daemon.receive(frame_id))
  assert daemon.stop() == 0 and daemon.published == list(range(45))
  assert any("generation split_current (recorded, from the ONNX)" in line for line in daemon.lines)
  assert [daemon.raw(i) for i in range(45)] == reference(split_current, list(range(45))), "the same inputs as openpilot's modeld"

def test_a_float16_bundle_end_to_end(artifacts, tmp_path_factory, openpilot_prefix):
  """openpilot's current layout built in float16 (what a device builds), fused with the float32-built warp: modeld on CPU publishes every
  frame, every field from its own rawPredictions by openpilot's formulas (the in-graph parse reads the half model's float32 outputs), and
  the outputs the adapter gives run directly on the same frames."""
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  folder = stand_in_artifacts("split_current", artifacts, tmp_path_factory, precision="float16")
  meta = load_bundle(os.path.join(folder, "model.bin")).metadata
  assert meta["precision"] == "float16"
  daemon, expected = Daemon(folder), Expected(meta["output_slices"], LAT_DELAY + 1.5 * DT_MDL)
  for frame_id in range(45):
    daemon.send(frame_id)
    expected.check(daemon.receive(frame_id))
  assert daemon.stop() == 0 and daemon.published == list(range(45))
  assert [daemon.raw(i) for i in range(45)] == reference(folder, list(range(45))), "the same inputs as openpilot's modeld"

def fake_openpilot_params(folder, steer: float, long: float) -> dict:
  """An `openpilot.common.params` whose Params hands out a CarParams with these actuator delays: modeld's device path on a PC."""
  from openpilot_logging.cereal import car
  (folder / "openpilot" / "common").mkdir(parents=True)
  (folder / "openpilot" / "__init__.py").write_text(""), (folder / "openpilot" / "common" / "__init__.py").write_text("")
  (folder / "car_params.bin").write_bytes(car.CarParams.new_message(steerActuatorDelay=steer, longitudinalActuatorDelay=long).to_bytes())
  (folder / "openpilot" / "common" / "params.py").write_text(f"""
class Params:
  def get(self, key, block=False, return_default=False):
    return open({str(folder / 'car_params.bin')!r}, 'rb').read() if key == 'CarParams' else None
""")
  return {"PYTHONPATH": os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")])}

@pytest.mark.parametrize("source", ["flags", "CarParams"])
def test_each_delay_counts_once(split_action, split_09, openpilot_prefix, tmp_path, source):
  """action_t = [lat + 1.5 DT, long + 0.3 + 1.5 DT], lateral_control_params [vEgo, lat] (lat holds lagd's 0.2 once) and the published
  curvature at lat + 1.5 DT: from the flags on a PC, from CarParams (steerActuatorDelay + 0.2, longitudinalActuatorDelay) on a device."""
  f32 = lambda x: float(np.float32(x))  # CarParams holds float32s
  lat, long = (0.41, 0.27) if source == "flags" else (f32(0.17) + 0.2, f32(0.33))
  args, env = (("--lat-delay", "0.41", "--long-delay", "0.27"), None) if source == "flags" else ((), fake_openpilot_params(tmp_path, 0.17, 0.33))
  from sunnypilot.modeld_v2.runtime.loader import load_bundle
  for folder in (split_action, split_09):
    slices = load_bundle(os.path.join(folder, "model.bin")).metadata["output_slices"]
    daemon = Daemon(folder, args=args, env=env)
    assert any(f"delays from {'--lat-delay/--long-delay' if source == 'flags' else 'CarParams'}: lateral {lat:.3f} s" in line for line in daemon.lines)
    for frame_id in range(12):
      daemon.send(frame_id)
      m = daemon.receive(frame_id)["modelV2"]
      raw = np.frombuffer(bytes(m.rawPredictions), np.float32)
      if "desired_curvature" not in slices:  # split_action is mlsim: the plan at lat_action_t, once
        plan = raw[slices["plan"][0]:slices["plan"][1]].reshape(5, -1)
        plan = plan[np.argmax(plan[:, -1])][:495].reshape(33, 15)
        lat_t = lat + 1.5 * DT_MDL
        assert m.action.desiredCurvature == pytest.approx(2 * np.interp(lat_t, T, plan[:, 11]) / (V_EGO * lat_t) - plan[0, 14] / V_EGO, rel=1e-4)
    assert daemon.stop() == 0
    assert [daemon.raw(i) for i in range(12)] == reference(folder, list(range(12)), lat_delay=lat, long_delay=long), \
      f"{folder}: action_t and lateral_control_params with each delay once"
