"""What the model daemon carries from frame to frame to turn raw outputs into messages: the lane-change state machine and the desire it
feeds back, the previous action (smoothing), the FCW history, the confidence buffer, and which defaulted fields were already logged.

One PublishState per daemon. Per frame: `desire_input()` before the model runs (every frame, published or not), then on frames that
are published `fill(...)`, or as modeld does it `fill_model_v2(...)`, modelV2 sent, then `fill_rest()`. The order follows openpilot
selfdrive/modeld/modeld.py (commaai/openpilot @6c6be47b): action from this frame's plan, messages filled, then DesireHelper updated from
the desire state just published; its desire is the next frame's input.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.message_template import Serializer
from sunnypilot.modeld_v2.daemon.messaging import set_fields
from sunnypilot.modeld_v2.model.constants import DESIRE_LEN, DT_MDL, LAT_PLANNER_SOLUTION_WIDTH, Plan
from sunnypilot.modeld_v2.model.desire_helper import CarStateLike, Desire, DesireHelper
from sunnypilot.modeld_v2.model.drive_helpers import LAT_SMOOTH_SECONDS, LONG_SMOOTH_SECONDS, T_AXIS64, Action, get_action
from sunnypilot.modeld_v2.model.fill_model_msg import (
  LANE_CHANGE_FIELDS,
  POLY_PATH_LIMIT,
  Confidence,
  Fields,
  HardBrake,
  camera_odometry_fields,
  driving_model_data_fields,
  model_v2_fields,
)
from sunnypilot.modeld_v2.model.generations import GENERATIONS, Rules
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser

SERVICES = ("modelV2", "drivingModelData", "cameraOdometry")
FLOAT32_MAX = float(np.finfo(np.float32).max)  # the messages' floats: a finite float64 past this is published as inf
DESIRE_PULSES = np.eye(DESIRE_LEN, dtype=np.float32)  # row d: the desire input on the frame desire d starts; row 0 (none): all zero
DESIRE_PULSES[0] = 0
DESIRE_PULSES.flags.writeable = False

@dataclass(frozen=True)
class FrameInfo:
  """What the daemon knows about a published frame besides the model's outputs."""
  frame_id: int  # main camera's VisionIPC frame id
  frame_id_extra: int  # extra (wide) camera's
  timestamp_eof: int
  road_frame_id: int  # roadCameraState.frameId: frameAge is how far the model lags the camera
  frame_drop_perc: float
  dropped_frames: int  # frames dropped right before this one: cameraOdometry is invalid then
  model_execution_time: float  # seconds
  live_calib_seen: bool  # every message is invalid until a calibration arrived
  lat_action_t: float  # drive_helpers.action_times: the same times as the model's action_t input
  long_action_t: float
  outputs_finite: bool = True  # False: the model's outputs, or what was computed from them, had NaN or inf: every message is invalid
  clock_ok: bool = True  # False: a camera's timestamps stopped (frames paired by frame id): every message is invalid

  @property
  def valid(self) -> dict[str, bool]:
    """Event.valid per service: openpilot marks cameraOdometry invalid on frames that follow dropped ones as well."""
    ok = self.live_calib_seen and self.outputs_finite and self.clock_ok
    return {"modelV2": ok, "drivingModelData": ok, "cameraOdometry": ok and self.dropped_frames < 1}


class FrameParts(NamedTuple):
  """What the frame's other messages need from fill_model_v2: the parsed outputs, the action and lane-change state it computed."""
  parsed: dict[str, np.ndarray]
  action: Action | None
  lane_change: dict[str, int]
  frame: FrameInfo

class PublishState:
  def __init__(self, lat_smooth_s: float = LAT_SMOOTH_SECONDS, long_smooth_s: float = LONG_SMOOTH_SECONDS, send_raw: bool = False,
               log: Callable[[str], None] | None = None, rules: Rules = GENERATIONS["split_09"]):
    self.lat_smooth_s, self.long_smooth_s, self.send_raw, self.rules = lat_smooth_s, long_smooth_s, send_raw, rules
    self.log = log or logging.getLogger(__name__).warning
    self.desire_helper = DesireHelper()
    self.hard_brake, self.confidence = HardBrake(), Confidence()
    self.action = Action()  # the last published action: the next one is smoothed against it
    self.prev_desire = 0  # the desire of the last frame the model saw (0: none)
    self.lat_planner_state = np.zeros(LAT_PLANNER_SOLUTION_WIDTH, np.float32)  # the lat_planner_state input of models that have one
    self.lines = Episodes(self.log)  # what this daemon said once
    self.serializer = Serializer()  # a byte template per service: serialize()
    self._parser: tuple[dict, tuple, OutputParser] | None = None  # (the slices last asked for, their layout, its parser): parser()
    self.views: dict[str, dict] = {}  # per service, the `views` parts fill_model_msg made from the parser's arrays: made once per parser
    self.static: dict[str, list[str]] = {}  # per service, the fields the last fill took from `views`: the template gathers them
    self.frame_parts: FrameParts | None = None  # what fill_model_v2 leaves for fill_rest

  def desire_input(self) -> np.ndarray:
    """The model's desire input for this frame: DesireHelper's desire one-hot, index 0 (none) zeroed, and only on its rising edge (the
    model decides when the manoeuvre is done). Call it on every frame the model sees, prepare-only ones included, as openpilot does.
    openpilot keeps the one-hot vectors and takes where(now - previous > 0.99, now, 0): a desire's row on the frame it differs from the
    last one, else zeros. The result is a read-only row of DESIRE_PULSES: copy it to change it."""
    now = self.desire_helper.desire if 0 < self.desire_helper.desire < DESIRE_LEN else 0
    pulse = DESIRE_PULSES[now if now != self.prev_desire else 0]
    self.prev_desire = now
    return pulse

  def fill(self, msgs: dict[str, Any] | None, outputs: np.ndarray, slices: dict[str, Sequence[int]], frame: FrameInfo, car_state: CarStateLike,
           lateral_active: bool, parsed: dict[str, np.ndarray] | None = None) -> dict[str, dict[str, Any]]:
    """Fill the Event builders msgs[s] for s in SERVICES, Event.valid included (msgs None: only return the values), from the raw output
    vector and its `output_slices` (or `parsed`, the daemon's parse_outputs of them), advancing the action, FCW, confidence, lane-change
    and lat_planner_state by one frame. `car_state`: carState (a reader or any CarStateLike); `lateral_active`: carControl.latActive.
    Returns the values written, {service: {field path: value}}, including fields this schema lacks. fill_model_v2 then fill_rest, in one.
    The values are shared with later frames (views of the parser's buffer, parts made once): copy what must outlive the frame, change none."""
    values = {"modelV2": self.fill_model_v2(outputs, slices, frame, car_state, lateral_active, parsed)} | self.fill_rest()
    for service in SERVICES if msgs is not None else ():
      msgs[service].valid = frame.valid[service]
      for path in set_fields(getattr(msgs[service], service), values[service]): self._report_skipped(f"{service}.{path}")
    return values

  def fill_model_v2(self, outputs: np.ndarray, slices: dict[str, Sequence[int]], frame: FrameInfo, car_state: CarStateLike, lateral_active: bool,
                    parsed: dict[str, np.ndarray] | None = None) -> dict[str, Any]:
    """modelV2's values of this frame, advancing the frame's state (as fill says); fill_rest() then gives the other two messages' values of
    the same frame. modeld sends modelV2, which controls wait for, in between. Shared with later frames, as fill's values are."""
    if parsed is None: parsed = self.parser(slices)(outputs)
    if "plan" in parsed:
      self.action = get_action(parsed, self.action, frame.lat_action_t, frame.long_action_t, max(float(car_state.vEgo), 0.0), self.rules,
                               self.lat_smooth_s, self.long_smooth_s)
    if "lat_planner_solution" in parsed:  # sunnypilot modeld.py @002f69b0: the solution's yaw and curvature one frame ahead
      solution = parsed["lat_planner_solution"]
      self.lat_planner_state[2:4] = [np.interp(DT_MDL, T_AXIS64, solution[:, 2]), np.interp(DT_MDL, T_AXIS64, solution[:, 3])]
    action = self.action if "plan" in parsed else None
    fields = model_v2_fields(parsed, action, self.hard_brake, self.confidence, frame.frame_id, self._views("modelV2", parsed))
    self.static["modelV2"] = fields.static
    lane_change = self._update_lane_change(parsed, car_state, lateral_active)
    self._report_missing("modelV2", fields)
    self.frame_parts = FrameParts(parsed, action, lane_change, frame)
    return fields.values | lane_change | {
      "frameId": frame.frame_id, "frameIdExtra": frame.frame_id_extra, "frameAge": max(frame.road_frame_id - frame.frame_id, 0),
      "frameDropPerc": frame.frame_drop_perc, "timestampEof": frame.timestamp_eof, "modelExecutionTime": frame.model_execution_time,
    } | ({"rawPredictions": np.ascontiguousarray(outputs, np.float32).tobytes()} if self.send_raw else {})

  def published_finite(self) -> bool:
    """Whether what fill_model_v2 computed from this frame's outputs is finite as published: every parsed value, the action within
    float32 (the message's type: a slow car's curvature, 2 yaw / (v t), overflows it first) and the path fill_rest fits to the plan. When
    not, the action and lat_planner_state start again from zero: the next frame is smoothed against them."""
    action, parsed = self.action, self.frame_parts.parsed if self.frame_parts is not None else {}
    if (self._parser is None or np.isfinite(self._parser[2].buffer).all()) and np.isfinite(self.lat_planner_state).all() \
       and abs(action.desired_curvature) <= FLOAT32_MAX and abs(action.desired_acceleration) <= FLOAT32_MAX \
       and ("plan" not in parsed or np.abs(parsed["plan"][:, Plan.POSITION]).max() < POLY_PATH_LIMIT): return True
    self.action, self.lat_planner_state[:] = Action(), 0.0
    return False

  def fill_rest(self) -> dict[str, dict[str, Any]]:
    """drivingModelData's and cameraOdometry's values of the frame fill_model_v2 last filled."""
    if self.frame_parts is None: raise RuntimeError("fill_rest before fill_model_v2")
    parsed, action, lane_change, frame = self.frame_parts
    fields = {"drivingModelData": driving_model_data_fields(parsed, action),
              "cameraOdometry": camera_odometry_fields(parsed, self._views("cameraOdometry", parsed))}
    self.static["cameraOdometry"] = fields["cameraOdometry"].static
    for service, f in fields.items(): self._report_missing(service, f)
    return {
      "drivingModelData": fields["drivingModelData"].values | lane_change | {
        "frameId": frame.frame_id, "frameIdExtra": frame.frame_id_extra, "frameDropPerc": frame.frame_drop_perc,
        "modelExecutionTime": frame.model_execution_time,
      },
      "cameraOdometry": fields["cameraOdometry"].values | {"frameId": frame.frame_id, "timestampEof": frame.timestamp_eof},
    }

  def serialize(self, values: dict[str, dict[str, Any]], frame: FrameInfo, services: Sequence[str] = SERVICES,
                log_mono_time: int | None = None) -> dict[str, bytes]:
    """The Event bytes of fill's `values` for each of `services`, with frame.valid and logMonoTime (now unless given): what fill(msgs)
    then to_bytes() gives, written into a template of each message's bytes instead of through pycapnp (message_template.py). modeld
    asks for modelV2 alone first and sends it before making the other two."""
    mono, valid = time.monotonic_ns() if log_mono_time is None else log_mono_time, frame.valid  # valid: a property, made once
    source, out = self._parser[2].buffer if self._parser is not None else None, {}
    for service in services:
      out[service], skipped = self.serializer.serialize(service, {"logMonoTime": mono, "valid": valid[service], service: values[service]},
                                                        self.static.get(service, ()), source)
      for path in skipped: self._report_skipped(path)
    return out

  def _report_skipped(self, path: str) -> None: self.lines.once(f"{path} is not published: this cereal schema has no such field")

  def parser(self, slices: dict[str, Sequence[int]]) -> OutputParser:
    """The OutputParser of this layout, planned on the first frame that has it (the same dict again: no comparison at all)."""
    if self._parser is not None and self._parser[0] is slices: return self._parser[2]
    key = tuple((name, tuple(span)) for name, span in slices.items())
    if self._parser is None or self._parser[1] != key: self._parser, self.views = (slices, key, OutputParser(slices)), {}
    else: self._parser = (slices, key, self._parser[2])
    return self._parser[2]

  def _views(self, service: str, parsed: dict[str, np.ndarray]) -> dict | None:
    """The service's cache of fill_model_msg's `views` parts when `parsed` is this layout's parser's own (views of its buffer), else None."""
    return self.views.setdefault(service, {}) if self._parser is not None and parsed is self._parser[2].parsed else None

  def _update_lane_change(self, parsed: dict[str, np.ndarray], car_state: CarStateLike, lateral_active: bool) -> dict[str, int]:
    """DesireHelper sees the lane-change probability the model just published (0 without a desire_state head)."""
    state = parsed.get("desire_state")
    prob = state.item(Desire.laneChangeLeft) + state.item(Desire.laneChangeRight) if state is not None else 0.0
    self.desire_helper.update(car_state, lateral_active, prob)
    return dict(zip(LANE_CHANGE_FIELDS, (int(self.desire_helper.lane_change_state), int(self.desire_helper.lane_change_direction)), strict=True))

  def _report_missing(self, service: str, fields: Fields) -> None:
    for path, reason in fields.missing.items(): self.lines.once(f"{service}.{path} stays default: {reason}")

