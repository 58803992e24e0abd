"""Hand-written output vectors for the model tests: openpilot's constants and activations written out (not imported from the package),
a current model's raw heads (`heads`; `todays_heads`: single-hypothesis plan and lead) packed with their output_slices (`pack`), a frame's
info, and modeld's output path on one frame of them (`Publisher`: parse, driving state, fill, pycapnp)."""
import numpy as np

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon import messaging
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.messaging import new_message
from sunnypilot.modeld_v2.model.fill_model_msg import FrameInfo, frame_fields
from sunnypilot.modeld_v2.model.generations import GENERATIONS, Rules
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads

from openpilot_reference import T, car

# openpilot's constants, written out
DT = 0.05
OFF, PRE, STARTING, FINISHING = 0, 1, 2, 3  # LaneChangeState
NONE, LEFT, RIGHT = 0, 1, 2  # LaneChangeDirection
LANE_CHANGE_LEFT, LANE_CHANGE_RIGHT = 3, 4  # Desire

def softmax(x):
  e = np.exp(np.asarray(x, np.float64) - np.max(x))
  return e / e.sum()
def logit(p): return np.log(np.asarray(p, np.float64) / (1 - np.asarray(p, np.float64))).astype(np.float32)
def close(a, b, rtol=1e-5, atol=1e-6): np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol, atol=atol)

def plan_mean(v0=20.0, a0=0.5, yaw_rate=0.02, yaw_accel=0.001) -> np.ndarray:
  """(33, 15): position, velocity, acceleration, orientation, orientation rate at T; a car speeding up while turning left."""
  m = np.zeros((33, 15), np.float32)
  m[:, 0], m[:, 3], m[:, 6] = v0 * T + 0.5 * a0 * T ** 2, v0 + a0 * T, a0
  m[:, 1] = 0.1 * T ** 2
  m[:, 11], m[:, 14] = yaw_rate * T + 0.5 * yaw_accel * T ** 2, yaw_rate + yaw_accel * T
  return m

def heads(rng, plan=None, winner=3, meta_p=None) -> dict[str, np.ndarray]:
  """Raw heads of a current model: the plan's hypothesis `winner` carries `plan` (the largest selection logit), the others noise."""
  plan_raw = rng.standard_normal((5, 991)).astype(np.float32)
  plan_raw[winner, :495] = (plan_mean() if plan is None else plan).reshape(-1)
  plan_raw[:, 990] = [0.1, -0.3, 0.2, 0.0, -1.0]
  plan_raw[winner, 990] = 2.0
  meta = logit(np.full(55, 0.001) if meta_p is None else meta_p)
  return {"pose": rng.standard_normal(12), "wide_from_device_euler": rng.standard_normal(6), "road_transform": rng.standard_normal(12),
          "plan": plan_raw.reshape(-1), "lane_lines": rng.standard_normal(528), "lane_lines_prob": rng.standard_normal(8) * 3,
          "road_edges": rng.standard_normal(264), "lead": rng.standard_normal(102), "lead_prob": rng.standard_normal(3),
          "desire_state": np.array([4.0, 0, 0, 0, 0, 0, 0, 0]), "meta": meta, "desire_pred": rng.standard_normal(32)}

def todays_heads(rng) -> dict[str, np.ndarray]:
  """Raw heads of openpilot's current models: a single-hypothesis plan (990 = one mean/std pair of 33x15) and lead (144 = one pair of
  3x6x4), in the vision/policy split's order."""
  plan = np.concatenate([plan_mean().reshape(-1), rng.standard_normal(495).astype(np.float32) - 2])
  return {"pose": rng.standard_normal(12), "wide_from_device_euler": rng.standard_normal(6), "road_transform": rng.standard_normal(12),
          "lane_lines": rng.standard_normal(528), "lane_lines_prob": rng.standard_normal(8) * 3, "road_edges": rng.standard_normal(264),
          "desire_pred": rng.standard_normal(32), "meta": logit(np.full(55, 0.01)), "lead": rng.standard_normal(144), "lead_prob": rng.standard_normal(3),
          "plan": plan, "desire_state": rng.standard_normal(8)}

def pack(raws: dict[str, np.ndarray]) -> tuple[np.ndarray, dict[str, list[int]]]:
  vec, slices, start = [], {}, 0
  for name, raw in raws.items():
    slices[name] = [start, start + raw.size]
    start += raw.size
    vec.append(np.asarray(raw, np.float32).reshape(-1))
  return np.concatenate(vec)[None], slices

def frame(frame_id=1, lat_t=0.275, long_t=0.675, calib=True, dropped=0) -> FrameInfo:
  return FrameInfo(frame_id=frame_id, frame_id_extra=frame_id, timestamp_eof=10**9 + frame_id, road_frame_id=frame_id + 2,
                   frame_drop_perc=1.5, dropped_frames=dropped, model_execution_time=0.02, live_calib_seen=calib, lat_action_t=lat_t, long_action_t=long_t)

class Publisher:
  """modeld's output path on one frame of raw heads: parse, the driving state advanced, the fields filled and written through pycapnp;
  the fields a model leaves default said once each on `log`, as modeld says them."""
  def __init__(self, log=lambda line: None, rules: Rules = GENERATIONS["split_09"]):
    self.state, self.lines = DrivingState(rules), Episodes(log)

  def __call__(self, raws: dict[str, np.ndarray], info: FrameInfo | None = None, car_state=None, lat_active=True):
    info, vec, slices = info or frame(), *pack(raws)
    parsed, missing = OutputParser(slices)(vec), {}
    values = frame_fields(parsed, self.state.update(ParsedReads.of(parsed), info, car_state or car(), lat_active), info, missing=missing)
    msgs = {}
    for service, fields in values.items():
      msgs[service] = new_message(service, valid=info.valid[service])
      for path in messaging.set_fields(getattr(msgs[service], service), fields):
        self.lines.once(f"{service}.{path} is not published: this cereal schema has no such field")
    for path, reason in missing.items(): self.lines.once(f"{path} stays default: {reason}")
    return msgs, values

def publish(publisher: Publisher, raws: dict[str, np.ndarray], info: FrameInfo | None = None, car_state=None, lat_active=True):
  return publisher(raws, info, car_state, lat_active)
