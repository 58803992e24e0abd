"""modeld's check of what it publishes: non-finite outputs, and finite outputs whose computed values are not, published invalid with the
recurrent states reset. Each test reproduces a failure seen before the fix (the check of the bus's inputs switched off to reach it)."""
import numpy as np

import modeld_daemon
from modeld_daemon import Daemon, finite_and_valid, reference

artifacts, split_09 = modeld_daemon.artifacts, modeld_daemon.split_09  # the daemon tests' fixtures, by name

# the carState check switched off: a NaN speed reaches the model, and only the output check stands between it and the bus
UNCHECKED_SPEED = ("-c", "import sys; from sunnypilot.modeld_v2 import modeld; from sunnypilot.modeld_v2.daemon import bus_inputs; "
                   "bus_inputs.BusInputs.car_state = lambda self, sm: bus_inputs.CarInputs(float(sm['carState'].vEgo)); sys.exit(modeld.main())")

def test_non_finite_outputs_are_published_invalid_and_reset_the_states(split_09, openpilot_prefix):
  daemon = Daemon(split_09, command=UNCHECKED_SPEED)
  for frame_id in range(40):
    daemon.send(frame_id, float("nan") if frame_id == 25 else 20.0)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  assert all(not valid for _, valid in daemon.messages[25].values()), "the NaN run is published with valid=False on every service"
  assert all(finite_and_valid(daemon, i) for i in range(26, 40)), "the next frame is finite and valid again"
  assert [daemon.raw(i) for i in range(26, 40)] == reference(split_09, list(range(26, 40))), "from zeroed states, as a fresh start"
  assert sum("non-finite model outputs: recurrent states reset" in line for line in daemon.lines) == 1, daemon.lines

# outputs near float32's maximum on one frame: finite, so the raw check passes, but the curvature a slow car's plan gives (2 yaw / (v t))
# and the path fitted to the plan overflow float32, the message's type. The graph's parse of them is the host parse's (test_output_parse
# holds the one to the other), written into the block's array as the graph would
HUGE_OUTPUTS = ("-c", """import sys, numpy as np
from sunnypilot.modeld_v2 import modeld
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, reference_block, trace
from sunnypilot.modeld_v2.runtime import model_runner
calls, read = [0], model_runner.ModelRunner.output_array
def huge(self, name="outputs"):
  calls[0] += name == "outputs"
  out = read(self, name)
  if calls[0] != 30: return out
  raw = np.clip(read(self) * 1e38, -3e38, 3e38)
  if name == "outputs": return raw
  out[:] = reference_block(OutputParser(self.output_slices), trace(self.output_slices), raw)
  return out
model_runner.ModelRunner.output_array = huge
sys.exit(modeld.main())""")

def test_values_computed_from_finite_outputs_are_checked_too(artifacts, openpilot_prefix):
  """Outputs finite but near float32's maximum made modeld publish action.desiredCurvature = -inf with valid=True: the check covered the
  raw outputs, not what is computed from them. Now that frame is invalid and the next ones, smoothed against a fresh action, valid."""
  daemon = Daemon(artifacts, command=HUGE_OUTPUTS)
  for frame_id in range(40):
    daemon.send(frame_id, v_ego=1.0)
    daemon.receive(frame_id)
  assert daemon.stop() == 0
  huge = [i for i in range(40) if np.abs(np.frombuffer(daemon.raw(i), np.float32)).max() > 1e37]
  assert len(huge) == 1 and huge[0] > 21 and np.isfinite(np.frombuffer(daemon.raw(huge[0]), np.float32)).all(), "one frame, its outputs finite"
  assert not any(valid for _, valid in daemon.messages[huge[0]].values()), "what was computed from them is not: every message invalid"
  assert all(finite_and_valid(daemon, i) and np.isfinite(daemon.messages[i]["modelV2"][0].action.desiredCurvature) for i in range(huge[0] + 1, 40))
  assert sum("values computed from the outputs are not finite" in line for line in daemon.lines) == 1, daemon.lines
