"""What a model daemon is to the frame-daemon skeleton (daemon/frame_daemon.py): a `DaemonSpec` (what it subscribes to and publishes, how a
frame becomes its model's inputs, how outputs become messages) and the records the two pass each other: the `Loaded` model a set runs on, a
received `Frame`, the `Clock` around a model step and what a publish did (`Published`)."""
from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

import numpy as np

from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon.artifacts import DaemonBundles
from sunnypilot.modeld_v2.daemon.camera_sync import CameraLink, Frames
from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs

if TYPE_CHECKING:  # the runtime is imported when a model is loaded, not at start
  from sunnypilot.modeld_v2.runtime.model_adapter import ModelAdapter

P = TypeVar("P")

@dataclass(frozen=True)
class Loaded(Generic[P]):
  """A set's model fused with the warp for one camera geometry, loaded and warmed up: what frames run on (a model switch's handle)."""
  adapter: ModelAdapter  # a runtime.model_runner.ModelRunner (benchmarks stub it)
  host: HostInputs  # its host inputs, written each frame
  sensor: str  # the camera sensor of the geometry it was loaded for
  warp: str
  digest: str  # the model bundle's content hash: which model runs
  planes: list | None  # the model's frames input shape: what a warp must make for it
  own: P  # what the daemon keeps with it (modeld: its output parse; dmonitoringmodeld: its parser and the warp's transform)
  big: bool = False  # the big model of its set's big/small pair (daemon/big_model.py)

  @property
  def model_id(self) -> int:
    """The first 64 bits of the model's content hash."""
    return int(self.digest[:16], 16)

@dataclass(frozen=True)
class Frame:
  """One frame as the loop received it: the camera frames, their metadata and what openpilot's drop accounting made of its frame id."""
  frames: Frames
  dropped: int  # frames dropped right before this one
  drop_perc: float  # openpilot's filtered frameDropPerc

class Clock(NamedTuple):
  """perf_counter seconds around a frame's model step: before its host inputs are written, after, and after the outputs are read back."""
  start: float
  inputs: float
  readback: float

class Published(NamedTuple):
  """What a spec's publish did: the modelExecutionTime it published, and the monotonic ns after its first message was filled, made and sent."""
  execution_time: float
  fill: int
  serialize: int
  send: int

class DaemonSpec(Protocol[P]):
  """What a model daemon says; FrameDaemon does the rest."""
  name: str  # the process: "modeld", "dmonitoringmodeld"
  services: tuple[str, ...]  # what it publishes, the one consumers wait for first
  subscribed: tuple[str, ...]  # what its frames read of the bus
  bundles: DaemonBundles  # its model's and warps' roles, names and kinds in a set
  device_core: int  # on a device: openpilot's config_realtime_process(core, priority) for this daemon
  realtime_priority: int
  last_ran: str  # its record of the last set that ran, in the model sets folder
  fresh: str  # what a model switched to starts from, for the switch's line
  warm_up_runs: int  # runs on zero frames before a loaded model counts as warmed up
  camera_name: str  # "" or "driver camera: ", before the camera's lines

  def camera(self, exit_event: threading.Event, episodes: Episodes) -> CameraLink: ...
  def start(self, params: Any, stop: threading.Event) -> None: ...
  def own(self, adapter: ModelAdapter, sensor: str, warp: str, report: Callable[[str], None]) -> P: ...
  def warm_up_inputs(self, loaded: Loaded[P], camera: Any) -> None: ...
  def use(self, loaded: Loaded[P], camera: Any, fresh: bool) -> None: ...
  def inputs(self, sm: Any, frame: Frame, loaded: Loaded[P]) -> Any: ...
  def host_values(self, inputs: Any) -> dict[str, Any]: ...
  def read_outputs(self, loaded: Loaded[P]) -> np.ndarray: ...
  def non_finite(self) -> str: ...
  def publish(self, pm: Any, loaded: Loaded[P], outputs: np.ndarray, finite: bool, frame: Frame, inputs: Any, clock: Clock) -> Published | None:
    """This frame's messages from its `outputs` (non-finite values zeroed when not `finite`), or None when it publishes none."""
  def running(self, camera: Any) -> str: ...
  def about(self, loaded: Loaded[P]) -> str:
    """What the load's line says of the model besides its files ("" or " (its layout)")."""
    ...

