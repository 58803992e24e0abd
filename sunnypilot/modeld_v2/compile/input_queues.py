"""openpilot's input queues, kept inside the compiled graph as states: what a queued driving model (supercombo, vision + policy,
vision + off-policy + on-policy) sees of the past.

Followed, in this project's words: commaai/openpilot selfdrive/modeld/compile_modeld.py @009b0d6b (the queues as tinygrad states:
image, feature and desire queues and how each is sampled), selfdrive/modeld/modeld.py @6c6be47b (0.9.7-0.9.9 vision + policy:
desire max-pooled per window, the vision's hidden_state pushed before the policy runs, prev_desired_curv pushed after it) and
@00731a68 (0.9.x supercombo at 20 Hz: features and prev_desired_curv pushed after the run, seen on the next step).

- images: a uint8 queue of frame_skip*(n-1)+1 warped frames per camera; the model sees every frame_skip-th, this frame last.
- desire: frame_skip*L one-hot pulses; the model sees the max of each frame_skip window (a one-frame pulse survives), this one included.
- features: frame_skip*(L-1)+1 hidden states, every frame_skip-th seen. A single model sees them before its own hidden_state of this
  step is pushed; a policy sees them after the vision model's push.
- prev_desired_curv: like a single model's features, fed back from the desired_curvature head's mean after the step; the generations
  that are not fed it see zeros (generations.py).
- a prepare-only frame (the one after a drop: `prepare_only` above 0.5) pushes the images, and the desire where the generation does
  (generations.py); the features and prev_desired_curv keep theirs.

InputQueues.step builds one frame's graph in this order.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt

from sunnypilot.modeld_v2.model.generations import Rules

if TYPE_CHECKING:
  from tinygrad import Tensor

FRAME_PLANES = 6  # uint8 planes of one warped camera frame
POLICY_INPUTS = ("img_q", "big_img_q", "desire_q", "feat_q", "curv_q")  # the queue states a queued bundle may keep, in this order
IMAGE_QUEUES = ("img_q", "big_img_q")  # the queues of new_img's two frames, road then wide
ROAD_IMAGE, WIDE_IMAGE, DESIRE_HISTORY, FEATURES, CURVATURE = "road_image", "wide_image", "desire_history", "features", "prev_curvature"
QUEUE_OF = {ROAD_IMAGE: "img_q", WIDE_IMAGE: "big_img_q", DESIRE_HISTORY: "desire_q", FEATURES: "feat_q", CURVATURE: "curv_q"}
FULL_RATE_HISTORY = 99  # a features_buffer this long holds every frame (openpilot 0.9.x at 20 Hz): frame_skip 1
DEFAULT_FRAME_SKIP = 4  # 20 Hz frames per 5 Hz sample of the models since 0.9.7

class QueueError(ValueError):
  """A queue the inputs or settings cannot make, with the reason."""

class Queue(NamedTuple):
  """One queue state: the ONNX input it feeds, and its shape and dtype in the bundle."""
  feeds: str
  shape: tuple[int, ...]
  dtype: npt.DTypeLike

def is_history(shape: tuple[int, ...]) -> bool:
  """(1, L, N) with L > 1: a time series (sunnypilot's test for a temporal input)."""
  return len(shape) == 3 and shape[1] > 1

def queue_role(name: str, shape: tuple[int, ...]) -> str | None:
  """What a queued model's input is by openpilot's names: an image (names with `img`, wide with `big`, (1, 6n, H, W)), the desire history
  (3-D, name starting with `desire`), `features_buffer`, `prev_desired_curv*`; None for anything else (a host input, or nothing)."""
  if "img" in name: return (WIDE_IMAGE if "big" in name else ROAD_IMAGE) if len(shape) == 4 and shape[1] % FRAME_PLANES == 0 else None
  if len(shape) != 3: return None
  if name.startswith("desire"): return DESIRE_HISTORY
  if name == "features_buffer": return FEATURES
  if name.startswith("prev_desired_curv"): return CURVATURE
  return None

def check_frame_skip(value: str | int | float, source: str) -> int:
  """The one frame_skip rule: an integer of at least 1."""
  try: frame_skip = int(value)
  except (TypeError, ValueError): raise QueueError(f"{source} must be an integer, got {value!r}") from None
  if isinstance(value, float | bool) or frame_skip < 1: raise QueueError(f"{source} must be an integer of at least 1, got {value!r}")
  return frame_skip

def derive_frame_skip(metadata: Mapping[str, str | int], input_shapes: Mapping[str, tuple[int, ...]]) -> int:
  """The ONNX's own `frame_skip` if it says, else 1 when features_buffer holds a full-rate history (>= 99 entries), else 4."""
  if "frame_skip" in metadata: return check_frame_skip(metadata["frame_skip"], "frame_skip metadata")
  features = input_shapes.get("features_buffer")
  return 1 if features is not None and len(features) == 3 and features[1] >= FULL_RATE_HISTORY else DEFAULT_FRAME_SKIP

def make_supercombo_input_queues(input_shapes: dict[str, tuple], frame_skip: int) -> dict[str, Queue]:
  """The queue states of a queued model's inputs {name: shape}: {state name: Queue}, in POLICY_INPUTS order."""
  check_frame_skip(frame_skip, "frame_skip")
  queues: dict[str, Queue] = {}
  for name, shape in input_shapes.items():
    if (role := queue_role(name, shape)) is None: continue
    if (state := QUEUE_OF[role]) in queues: raise QueueError(f"two inputs are the {role.replace('_', ' ')}: {queues[state].feeds} and {name}")
    if role in (ROAD_IMAGE, WIDE_IMAGE):
      queues[state] = Queue(name, (frame_skip * (shape[1] // FRAME_PLANES - 1) + 1, FRAME_PLANES, *shape[2:]), np.uint8)
    elif role == DESIRE_HISTORY: queues[state] = Queue(name, (frame_skip * shape[1], shape[2]), np.float32)
    else: queues[state] = Queue(name, (frame_skip * (shape[1] - 1) + 1, shape[2]), np.float32)
  return {state: queues[state] for state in POLICY_INPUTS if state in queues}

def make_split_input_queues(vision_shapes: dict[str, tuple], policy_shapes: dict[str, tuple], frame_skip: int) -> dict[str, Queue]:
  """A split model keeps the same queues; the policy reads the feature queue after the vision model's hidden_state joins it."""
  return make_supercombo_input_queues(vision_shapes | policy_shapes, frame_skip)

# *** in the graph ***

def push(queue: Tensor, item: Tensor) -> Tensor:
  """Drop the oldest entry, append the newest."""
  return queue[1:].cat(item, dim=0)

def every(queue: Tensor, frame_skip: int) -> Tensor:
  """Every frame_skip-th entry, the newest last, as one batch: (frame_skip*(L-1)+1, N) -> (1, L, N)."""
  return queue[::frame_skip].unsqueeze(0)

def planes(queue: Tensor, frame_skip: int) -> Tensor:
  """Every frame_skip-th frame of an image queue stacked on channels: (frame_skip*(n-1)+1, 6, H, W) -> (1, n*6, H, W)."""
  frames = queue[::frame_skip]
  return frames.reshape(1, frames.shape[0] * frames.shape[1], *frames.shape[2:])

def pooled(queue: Tensor, frame_skip: int) -> Tensor:
  """The max of each frame_skip window of a desire queue: (frame_skip*L, D) -> (1, L, D)."""
  return queue.reshape(queue.shape[0] // frame_skip, frame_skip, -1).max(axis=1).unsqueeze(0)

@dataclass(frozen=True)
class InputQueues:
  """A queued bundle's queue states and the order one frame moves them in."""
  queues: dict[str, Queue]  # {state name: Queue}, in POLICY_INPUTS order
  frame_skip: int
  feedback: dict[str, list[int]]  # feat_q and curv_q, where kept: [start, stop] of the outputs each is pushed from (hidden_state lies in the
  # first model's output, which leads the bundle's; curvature: the desired_curvature head's mean)
  rules: Rules  # the generation's: which queues a prepare-only frame pushes, whether prev_desired_curv sees its history

  @property
  def held_on_prepare_only(self) -> set[str]:
    """The queues a prepare-only frame leaves as they were: all but the images, and the desire where the generation pushes it then."""
    return {"feat_q", "curv_q"} | (set() if self.rules.prepare_pushes_desire else {"desire_q"})

  def step(self, state: dict[str, Tensor], new_img: Tensor, prepare_only: Tensor, values: dict[str, Tensor],
           runs: Sequence[Callable[[dict[str, Tensor]], Tensor]]) -> tuple[Tensor, dict[str, Tensor]]:
    """One frame in the graph. `state`: {state name: queue}; `values`: the host inputs and `desire` by name; `runs`: each model's run on
    its input values by ONNX name, in order (the first makes the features). Returns the outputs (the models' concatenated) and the next
    states {state name: queue}."""
    queues, fs = self.queues, self.frame_skip
    skip = prepare_only.reshape(1, 1) > 0.5
    new = {name: push(state[name], new_img[i:i + 1]) for i, name in enumerate(IMAGE_QUEUES)}
    values = values | {queues[name].feeds: planes(new[name], fs) for name in new}
    if "desire_q" in queues:
      new["desire_q"] = push(state["desire_q"], values.pop("desire").reshape(1, -1))
      values[queues["desire_q"].feeds] = pooled(new["desire_q"], fs)
    if "curv_q" in queues:  # this step's curvature joins after the run; zeros where the generation is not fed it
      curv = every(state["curv_q"], fs)
      values[queues["curv_q"].feeds] = curv if self.rules.feeds_prev_curvature else curv.zeros_like()
    if len(runs) == 1:
      if "feat_q" in queues: values[queues["feat_q"].feeds] = every(state["feat_q"], fs)  # a single model sees past features only
      out = producer = runs[0](values)
    else:  # the vision model's hidden_state of this frame is the newest feature the policies see
      producer = runs[0](values)
      if "feat_q" in queues:
        new["feat_q"] = push(state["feat_q"], producer[:, slice(*self.feedback["feat_q"])])
        values[queues["feat_q"].feeds] = every(new["feat_q"], fs)
      out = producer.cat(*(run(values) for run in runs[1:]), dim=1)
    if "feat_q" in queues and "feat_q" not in new: new["feat_q"] = push(state["feat_q"], producer[:, slice(*self.feedback["feat_q"])])
    if "curv_q" in queues: new["curv_q"] = push(state["curv_q"], out[:, slice(*self.feedback["curv_q"])])
    held = self.held_on_prepare_only
    return out, {name: skip.where(state[name], new[name]) if name in held else new[name] for name in queues}
