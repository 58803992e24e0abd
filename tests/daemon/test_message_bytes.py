"""The message bytes seam (daemon/message_bytes.py) against pycapnp: for every generation's output layout, over many frames, what
MessageBytes.to_bytes writes decodes to exactly what pycapnp writes for the same fields (set_fields, then to_bytes); and the in-graph
parse's path (BlockWriter) writes to_bytes' bytes."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.message_bytes import MessageBytes
from sunnypilot.modeld_v2.daemon.messaging import log, new_message, set_fields
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES, FrameInfo, frame_fields, host_fields
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.model.published_floats import reference_block, trace
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES
from sunnypilot.modeld_v2.tools.stand_in_models import output_layout as layout

from openpilot_reference import car

def decoded(raw: bytes) -> str:
  """Every field of the Event, NaN included (repr), logMonoTime and valid too."""
  with log.Event.from_bytes(raw) as event: return repr(event.to_dict())

def pycapnp(service: str, fields: dict, valid: bool, mono: int) -> bytes:
  msg = new_message(service, valid=valid)
  msg.logMonoTime = mono
  set_fields(getattr(msg, service), fields)
  return msg.to_bytes()

def info(i: int, rng) -> FrameInfo:
  return FrameInfo(frame_id=1000 + i, frame_id_extra=999 + i, timestamp_eof=10**15 + 7 * i, road_frame_id=1000 + i + int(rng.integers(0, 3)),
                   frame_drop_perc=float(rng.random()), dropped_frames=int(rng.random() < 0.2), model_execution_time=float(rng.random()) / 50,
                   live_calib_seen=bool(rng.random() < 0.8), lat_action_t=0.3, long_action_t=0.7, outputs_finite=bool(rng.random() < 0.9))

@pytest.mark.parametrize("generation", NAMES)
@pytest.mark.parametrize("send_raw", [False, True])
def test_template_bytes_decode_to_what_pycapnp_writes(generation, send_raw):
  slices, rng = layout(generation), np.random.default_rng(len(generation))
  parser, state, said = OutputParser(slices), DrivingState(), []
  seam = MessageBytes(said.append)
  width = max(stop for _, stop in slices.values())
  made = []
  for i in range(60):
    outputs = (rng.standard_normal((1, width)) * 3).astype(np.float32)
    frame, car_state, active = info(i, rng), car(v_ego=float(rng.uniform(0, 35)), left=i % 17 > 12), bool(i % 3)
    parsed = parser(outputs)
    fields = frame_fields(parsed, state.update(ParsedReads.of(parsed), frame, car_state, active), frame, outputs if send_raw else None)
    for service in SERVICES:
      valid, mono = frame.valid[service], 10**12 + i
      assert decoded(seam.to_bytes(service, fields[service], valid, mono)) == decoded(pycapnp(service, fields[service], valid, mono)), \
        f"{generation} frame {i} {service}"
    made.append(dict(seam.templates))
  assert set(seam.templates) == set(SERVICES) and not seam.unsupported, "templates, not pycapnp's fallback"
  assert all(m[s] is made[0][s] for m in made for s in SERVICES), "one template per service, built on the first frame"
  assert len(said) == len(set(said)), "a template is built once per service: each field this schema lacks said once"

def test_a_layout_change_mid_run_builds_a_new_template():
  """The fields of one layout, then another with other fields (a 0.9.x model, its 48-entry meta has no brakePressProbs, swapped in under
  modeld), then the first again: what pycapnp writes for each frame."""
  layouts = [layout("split_current"), layout("supercombo_20hz"), layout("split_current")]
  rng, seam, state, made = np.random.default_rng(7), MessageBytes(), DrivingState(), []
  for i in range(12):
    slices = layouts[i // 4]
    outputs = rng.standard_normal((1, max(stop for _, stop in slices.values()))).astype(np.float32)
    parsed, frame = OutputParser(slices)(outputs), info(i, rng)
    fields = frame_fields(parsed, state.update(ParsedReads.of(parsed), frame, car(), True), frame)
    for service in SERVICES:
      assert decoded(seam.to_bytes(service, fields[service], True, i)) == decoded(pycapnp(service, fields[service], True, i)), f"frame {i} {service}"
    made.append(seam.templates["modelV2"])
  assert [m is made[0] for m in made] == [True] * 4 + [False] * 8 and made[4] is made[7] and made[8] is made[11] and made[8] is not made[4]
  assert "meta.disengagePredictions.brakePressProbs" not in made[4].keys and "meta.disengagePredictions.brakePressProbs" in made[8].keys

def test_other_lengths_build_a_new_template_and_absent_fields_are_said_once():
  """The same paths with other list or data lengths (a bundle of another width: its rawPredictions) rebuild; fields this schema lacks are
  said once and left out; bools, enums and numbers go where pycapnp puts them."""
  said: list[str] = []
  seam, built = MessageBytes(Episodes(said.append).once), []  # as modeld gives it its one-line mechanism
  for n, raw in ((3, 8), (3, 8), (5, 8), (5, 12), (3, 8)):
    fields = {"frameId": n, "position.t": [0.5] * n, "position.x": np.arange(n, dtype=np.float32), "confidence": "yellow", "meta.laneChangeState": 2,
              "meta.hardBrakePredicted": n == 5, "rawPredictions": bytes(range(raw)), "noSuchField": 1.0, "meta.noSuchEither": [1.0, 2.0]}
    assert decoded(seam.to_bytes("modelV2", fields, n == 3, 5)) == decoded(pycapnp("modelV2", fields, n == 3, 5)), (n, raw)
    built.append(seam.templates["modelV2"])
  assert [b is built[0] for b in built] == [True, True, False, False, False] and built[2] is not built[3], "rebuilt when a length changed"
  assert said == ["modelV2: this cereal schema has no meta.noSuchEither, noSuchField: not published"], "one line for the lot, once"

def test_what_a_template_cannot_place_goes_through_pycapnp():
  """A text field (carParams.carFingerprint) has no fixed size: that message is built by pycapnp, and still decodes the same."""
  seam = MessageBytes()
  for i in range(3):
    fields = {"carFingerprint": "CAR" * (i + 1), "mass": 1500.5 + i}
    assert decoded(seam.to_bytes("carParams", fields, True, i)) == decoded(pycapnp("carParams", fields, True, i))
  assert "carParams" in seam.unsupported and "carParams" not in seam.templates

@pytest.mark.parametrize("generation", NAMES)
@pytest.mark.parametrize("send_raw", [False, True])
def test_the_block_path_writes_the_fill_paths_bytes(generation, send_raw):
  """With the parse in the graph modeld publishes the block (its floats as the host parse gives them here, the in-graph parse being held to
  that in tests/compile/test_output_parse.py) and the host's fields through BlockWriter: byte for byte what the fill functions and
  to_bytes write, on the template the first frame built, frame after frame."""
  slices, rng = layout(generation), np.random.default_rng(3 + len(generation))
  floats, parser, state, seam = trace(slices), OutputParser(slices), DrivingState(), MessageBytes()
  reads, width, writers = ParsedReads.of(parser.parsed), max(stop for _, stop in slices.values()), None
  for i in range(30):
    outputs = (rng.standard_normal((1, width)) * 3).astype(np.float32)
    frame, block = info(i, rng), reference_block(parser, floats, outputs)  # parser's views now hold this frame's parse
    frame_state = state.update(reads, frame, car(v_ego=float(rng.uniform(0, 35))), bool(i % 3))
    raw = outputs if send_raw else None
    fields, host = frame_fields(parser.parsed, frame_state, frame, raw), host_fields(frame_state, frame, raw, floats.fcw)
    expected = {s: seam.to_bytes(s, fields[s], frame.valid[s], 10**12 + i) for s in SERVICES}
    writers = writers or {s: seam.block_writer(s, [(p, n) for t, p, n in floats.fields if t == s], host[s]) for s in SERVICES}
    for service, (start, stop) in floats.services.items():
      got = writers[service].bytes_of(list(host[service].values()), block[start:stop], frame.valid[service], 10**12 + i)
      assert got == expected[service], f"{generation} frame {i} {service}"
