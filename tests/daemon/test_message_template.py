"""The template serializer (message_template.py) against pycapnp: for every generation's output layout, over many frames, the bytes
PublishState.serialize writes decode to exactly the fields that fill(msgs) + to_bytes() give."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon.message_template import Serializer
from sunnypilot.modeld_v2.daemon.messaging import log, new_message
from sunnypilot.modeld_v2.daemon.publish_state import SERVICES, FrameInfo, PublishState
from sunnypilot.modeld_v2.model.parse_model_outputs import parse_outputs
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES
from sunnypilot.modeld_v2.tools.stand_in_models import output_layout as layout

from openpilot_reference import car

def decoded(raw: bytes) -> str:
  """Every field of the Event, NaN included (repr), logMonoTime and valid too."""
  with log.Event.from_bytes(raw) as event: return repr(event.to_dict())

def info(i: int, rng) -> FrameInfo:
  return FrameInfo(frame_id=1000 + i, frame_id_extra=999 + i, timestamp_eof=10**15 + 7 * i, road_frame_id=1000 + i + int(rng.integers(0, 3)),
                   frame_drop_perc=float(rng.random()), dropped_frames=int(rng.random() < 0.2), model_execution_time=float(rng.random()) / 50,
                   live_calib_seen=bool(rng.random() < 0.8), lat_action_t=0.3, long_action_t=0.7, outputs_finite=bool(rng.random() < 0.9))

@pytest.mark.parametrize("generation", NAMES)
@pytest.mark.parametrize("send_raw", [False, True])
def test_template_bytes_decode_to_what_pycapnp_writes(generation, send_raw):
  slices, rng = layout(generation), np.random.default_rng(len(generation))
  width = max(stop for _, stop in slices.values())
  reference, templated = PublishState(send_raw=send_raw, log=lambda s: None), PublishState(send_raw=send_raw, log=lambda s: None)
  for i in range(60):
    outputs = (rng.standard_normal((1, width)) * 3).astype(np.float32)
    frame, car_state, active = info(i, rng), car(v_ego=float(rng.uniform(0, 35)), left=i % 17 > 12), bool(i % 3)
    msgs = {s: new_message(s) for s in SERVICES}
    reference.fill(msgs, outputs, slices, frame, car_state, active, parse_outputs(outputs, slices))  # its own parse: every part made per frame
    data = templated.serialize(templated.fill(None, outputs, slices, frame, car_state, active), frame, log_mono_time=10**12 + i)
    for service in SERVICES:
      msgs[service].logMonoTime = 10**12 + i
      assert decoded(data[service]) == decoded(msgs[service].to_bytes()), f"{generation} frame {i} {service}"
  assert set(templated.serializer.templates) == set(SERVICES) and not templated.serializer.unsupported  # templates, not pycapnp's fallback
  # the fields made of the parser's arrays came from its buffer through one gather, not from the values
  static = {service: set(templated.serializer.templates[service].static) for service in SERVICES}
  assert static["modelV2"] >= ({"position", "temporalPose"} if "plan" in slices else set()) | ({"meta.engagedProb"} if "meta" in slices else set()) | \
    ({"laneLines", "laneLineStds"} if {"lane_lines", "plan"} <= set(slices) else set()) | ({"leadsV3"} if {"lead", "lead_prob"} <= set(slices) else set())
  lines = 4 * ({"lane_lines", "plan"} <= set(slices)) + 2 * ({"road_edges", "plan"} <= set(slices))
  assert templated.serializer.templates["modelV2"].copied == 33 * lines  # each line's times: the plan's, refilled each frame
  assert static["cameraOdometry"] >= ({"trans", "rotStd"} if "pose" in slices else set())
  assert templated.serializer.templates["modelV2"].gathered >= (5 * 3 * 33 + 3 * 33 if "plan" in slices else 0)
  assert templated.lines.said == reference.lines.said  # the same fields reported missing or absent from this schema

def test_a_layout_change_mid_run_makes_a_new_parser_cache_and_template():
  """One PublishState whose output layout changes between frames (a model swapped under it) publishes what pycapnp writes for each frame."""
  layouts = [layout("split_current"), layout("native"), layout("split_current")]
  rng, reference, templated, made = np.random.default_rng(7), PublishState(log=lambda s: None), PublishState(log=lambda s: None), []
  for i in range(12):
    slices = layouts[i // 4]
    outputs = rng.standard_normal((1, max(stop for _, stop in slices.values()))).astype(np.float32)
    frame, msgs = info(i, rng), {s: new_message(s) for s in SERVICES}
    reference.fill(msgs, outputs, slices, frame, car(), True, parse_outputs(outputs, slices))
    data = templated.serialize(templated.fill(None, outputs, slices, frame, car(), True), frame, log_mono_time=i)
    for service in SERVICES:
      msgs[service].logMonoTime = i
      assert decoded(data[service]) == decoded(msgs[service].to_bytes()), f"frame {i} {service}"
    made.append(templated.serializer.templates["modelV2"])
  assert [m is made[0] for m in made] == [True] * 4 + [False] * 8 and made[4] is made[7] and made[8] is made[11] and made[8] is not made[4]
  assert made[11].gathered > 0

def test_a_new_shape_builds_a_new_template_and_absent_fields_are_skipped():
  serializer = Serializer()
  def values(n: int, extra: bool) -> dict:
    model = {"frameId": n, "position": {"t": [0.5] * n, "x": list(range(n))}, "confidence": "yellow", "meta.laneChangeState": 2}
    return {"logMonoTime": 5, "valid": extra, "modelV2": model | ({"noSuchField": 1.0, "meta.noSuchEither": [1.0, 2.0]} if extra else {})}
  built = []
  for n, extra in ((3, False), (3, False), (5, True), (5, True), (3, False)):
    raw, skipped = serializer.serialize("modelV2", values(n, extra))
    msg = new_message("modelV2")
    msg.logMonoTime, msg.valid = 5, extra
    msg.modelV2.frameId, msg.modelV2.confidence, msg.modelV2.meta.laneChangeState = n, "yellow", 2
    msg.modelV2.position.t, msg.modelV2.position.x = [0.5] * n, list(range(n))
    assert decoded(raw) == decoded(msg.to_bytes())
    assert skipped == (["modelV2.noSuchField", "modelV2.meta.noSuchEither"] if extra and not built[-1][1] else [])
    built.append((serializer.templates["modelV2"], extra))
  assert [b[0] is built[0][0] for b in built] == [True, True, False, False, False]  # rebuilt when the shape changed, kept while it did not
  assert built[2][0] is built[3][0]

def test_static_fields_are_gathered_from_the_source_buffer_while_their_objects_stay():
  """A static field's float32 views of the source are read from the buffer each frame, its other float32 arrays copied from them each
  frame, a read-only array is a constant; a field with an array of another type is written from the values; a frame whose static field
  is another object builds a new template."""
  source, serializer = np.zeros(16, np.float32), Serializer()
  const = np.array([0.5, 1.5], np.float32)
  const.flags.writeable = False
  position = {"t": const, "x": source[2:4], "y": source[8:12:2]}  # a strided view too
  stds, prediction = np.zeros(2, np.float32), np.zeros(3, np.float64)  # refilled in place: copied; float64: no float32 slots to gather into
  model = {"frameId": 1, "position": position, "laneLineStds": stds, "meta.desireState": source[12:16], "meta.desirePrediction": prediction}
  def expect(frame_id: int, x: slice) -> str:
    msg = new_message("modelV2")
    msg.logMonoTime, msg.valid, msg.modelV2.frameId = 9, True, frame_id
    msg.modelV2.position.t, msg.modelV2.position.x, msg.modelV2.position.y = [0.5, 1.5], source[x].tolist(), source[8:12:2].tolist()
    msg.modelV2.laneLineStds, msg.modelV2.meta.desireState, msg.modelV2.meta.desirePrediction = stds.tolist(), source[12:16].tolist(), prediction.tolist()
    return decoded(msg.to_bytes())
  templates, static = [], ("position", "laneLineStds", "meta.desireState", "meta.desirePrediction")
  for frame_id in range(3):
    source[:], stds[:], prediction[:] = np.arange(16) * (frame_id + 1), [7 + frame_id, 8], [frame_id, 0, 1]
    values = {"logMonoTime": 9, "valid": True, "modelV2": model | {"frameId": frame_id}}
    assert decoded(serializer.serialize("modelV2", values, static, source)[0]) == expect(frame_id, slice(2, 4))
    templates.append(serializer.templates["modelV2"])
  assert templates[0] is templates[1] is templates[2]
  assert set(templates[0].static) == {"position", "laneLineStds", "meta.desireState"} and (templates[0].gathered, templates[0].copied) == (8, 2)
  moved = {"t": const, "x": source[4:6], "y": source[8:12:2]}  # another object: the frame's values are written, the template rebuilt
  values = {"logMonoTime": 9, "valid": True, "modelV2": model | {"frameId": 3, "position": moved}}
  assert decoded(serializer.serialize("modelV2", values, ("position",), source)[0]) == expect(3, slice(4, 6))
  assert serializer.templates["modelV2"] is not templates[0]

def test_what_a_template_cannot_place_goes_through_pycapnp():
  """A text field (carParams.carFingerprint) has no fixed size: that message is built by pycapnp, and still decodes the same."""
  serializer = Serializer()
  for i in range(3):
    values = {"logMonoTime": i, "valid": True, "carParams": {"carFingerprint": "CAR" * (i + 1), "mass": 1500.5 + i}}
    raw, _ = serializer.serialize("carParams", values)
    msg = new_message("carParams")
    msg.logMonoTime, msg.carParams.carFingerprint, msg.carParams.mass = i, "CAR" * (i + 1), 1500.5 + i
    assert decoded(raw) == decoded(msg.to_bytes())
  assert "carParams" in serializer.unsupported and "carParams" not in serializer.templates
