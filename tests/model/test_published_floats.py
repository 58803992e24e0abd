"""The float block's layout (model/published_floats.py), traced from the fill functions: on every generation's layout the block holds each
field the fill functions take from the parse, in their order, with their values; the rest of each message is the host's fields (host_fields)
and constants; the driving state's reads are views of the same values; a fill function computing a published value from the outputs
without the parse is refused."""
import numpy as np
import pytest

from sunnypilot.modeld_v2.model import fill_model_msg
from sunnypilot.modeld_v2.model.drive_helpers import Action
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES, FrameInfo, FrameState, frame_fields, host_fields
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.model.published_floats import reference_block, trace
from sunnypilot.modeld_v2.tools.stand_in_models import NAMES, output_layout

FRAME = FrameInfo(7, 6, 10**9, 9, 1.5, 0, 0.02, True, 0.3, 0.7)

@pytest.mark.parametrize("generation", NAMES)
def test_the_block_is_the_fill_functions_fields_from_the_parse(generation):
  slices = output_layout(generation)
  layout, parser, rng = trace(slices), OutputParser(slices), np.random.default_rng(len(generation))
  outputs = (rng.standard_normal((1, max(b for _, b in slices.values()))) * 3).astype(np.float32)
  block = reference_block(parser, layout, outputs)
  state = FrameState(Action(0.01, -0.5, False), True, "yellow", 1, 2)
  fields, host = frame_fields(parser.parsed, state, FRAME), host_fields(state, FRAME, None, layout.fcw)
  at, traced = 0, {(service, path) for service, path, _ in layout.fields}
  for service, path, n in layout.fields:
    np.testing.assert_array_equal(block[at:at + n], np.asarray(fields[service][path], np.float32).reshape(-1), err_msg=f"{service}.{path}")
    at += n
  assert at == layout.published and [s for s, _, _ in layout.fields] == sorted((s for s, _, _ in layout.fields), key=SERVICES.index)
  for service in SERVICES:
    in_block = [p for p in fields[service] if (service, p) in traced]
    assert in_block == [p for s, p, _ in layout.fields if s == service], f"{service}: the fill functions' order"
    assert set(host[service]) <= set(fields[service]) and not set(host[service]) & set(in_block)
    for path in set(fields[service]) - set(host[service]) - set(in_block):  # constants: the time and distance axes, the leads' times
      assert path.endswith((".t", ".x", "probTime")), f"{service}.{path} is neither parsed, the host's nor an axis"
  plan_t = np.flatnonzero([path.endswith(".t") for _, path, n in layout.fields for _ in range(n)])
  assert np.array_equal(layout.unchecked, plan_t), "only the lane lines' and road edges' times escape the finite check"

@pytest.mark.parametrize("generation", ["native", "split_09", "split_current"])
def test_the_driving_states_reads_are_the_parse_s(generation):
  slices = output_layout(generation) | {"lat_planner_solution": [10**5, 10**5 + 264]}
  layout, parser = trace(slices), OutputParser(slices)
  outputs = np.random.default_rng(2).standard_normal((1, 10**5 + 264)).astype(np.float32)
  from_block, from_parse = layout.reads_of(reference_block(parser, layout, outputs)), ParsedReads.of(parser.parsed)
  for name in ParsedReads._fields:
    a, b = getattr(from_block, name), getattr(from_parse, name)
    assert (a is None) == (b is None), name
    if a is not None: np.testing.assert_array_equal(a, b, err_msg=name)
  assert layout.reads["lat_planner"][0] >= layout.published, "no message publishes it: read from the tail"

def test_a_published_value_not_from_the_parse_is_refused(monkeypatch):
  """A fill function that computes a value from the parse instead of publishing a view of it cannot be put in the graph: one line."""
  fill_leads = fill_model_msg.fill_leads
  def doubled(f, p, missing):
    fill_leads(f, p, missing)
    f["leadsV3.0.x"] = p["lead"][0, :, 0] * 2
  monkeypatch.setattr(fill_model_msg, "fill_leads", doubled)
  with pytest.raises(ValueError, match=r"modelV2.leadsV3.0.x depends on the model's outputs but reads no parsed value"):
    trace(output_layout("native"))
