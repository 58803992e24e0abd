"""A model warming up in the shadow of the running one: it runs on the same frames with the same inputs after the running model's messages
went out, publishing nothing, until its temporal context is its own, and only then takes over between two frames.

A model switched to between two frames would otherwise start from empty recurrent state: for today's generations the features history
(24 entries one every 4 frames) and the desire queue are zeros, and for its first ~5 s it plans from a past it never saw. openpilot's
modeld met the same with its big model (#38632: shadow-run the new model until its temporal context is filled).

Its context is full after as many frames as its longest fed-back input holds (`context_frames`: every next_<state> output's rows are one
frame each); a model that keeps nothing between frames (driver monitoring, a generation without queues) needs none. Its outputs must be
finite on every frame of the warm-up; one that is not is dropped, and so is one whose context has not filled in `timeout_s` (frames stopped
coming). The running model's frame is untouched by it: the shadow reads what the frame computed (its host inputs, its camera buffers) and
writes only its own buffers.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.daemon.topics import TOPICS
from sunnypilot.modeld_v2.model.constants import DT_MDL

WARM_UP_MARGIN_S = 10.0  # a warm-up's slack over its frames at 20 Hz: a loaded machine, a camera that pauses
SHADOW_ROLES = ("queue", "state")  # a fused bundle's input roles fed back from its own outputs

# what a set asked for while openpilot is engaged waits for (--switch-while-engaged): the safe one first, the default
WHILE_ENGAGED = {"defer": "it warms up in the shadow, then takes over only once openpilot disengages",
                 "shadow": "it warms up in the shadow, then takes over between two frames, engaged or not"}

def engaged(sm: Any) -> bool:
  """Whether openpilot is engaged: the selfdrive state topic's `enabled` (selfdriveState today, controlsState in older schemas)."""
  topic = TOPICS.selfdrive_state
  return bool(topic is not None and sm.seen.get(topic) and sm[topic].enabled)

def context_frames(metadata: dict) -> int:
  """The frames a model's temporal context holds: the rows of its longest fed-back input (a bundle records each next_<input>'s shape in
  output_shapes; one row a frame), 0 for a model that keeps nothing between frames."""
  return max((int(shape[0]) for name, shape in metadata.get("output_shapes", {}).items() if name.startswith("next_") and shape), default=0)

@dataclass
class Warming:
  """A model warming in the shadow: `candidate` (the switch's Candidate of a Loaded), the frames it needs and has run."""
  candidate: Any
  needed: int
  done: int = 0
  limit_s: float | None = None  # how long its context may take to fill (None: its frames at a third of 20 Hz, plus WARM_UP_MARGIN_S)
  started: float = field(default_factory=time.monotonic)
  deferred: bool = False  # its changeover waits for the driver to disengage (said once)

  @property
  def name(self) -> str: return self.candidate.model_set.name

  @property
  def full(self) -> bool: return self.done >= self.needed

  @property
  def timeout_s(self) -> float: return self.limit_s if self.limit_s is not None else self.needed * DT_MDL * 3 + WARM_UP_MARGIN_S

  def timed_out(self) -> bool: return not self.full and time.monotonic() - self.started > self.timeout_s

  def progress(self) -> str: return f"{min(self.done, self.needed)}/{self.needed} frames"

def run_shadow(loaded: Any, host_values: dict[str, Any], bufs: dict[str, Any]) -> bool:
  """One frame on the shadow's model (a frame_daemon.Loaded), fed what the running model was fed; whether its outputs are finite."""
  loaded.host.write(host_values)
  loaded.adapter.copy_frames(bufs)
  loaded.adapter.run()
  return bool(np.isfinite(loaded.adapter.output_array()).all())
