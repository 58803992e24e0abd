"""Replay a recorded drive: modeld on a segment's videos and logs (and dmonitoringmodeld on its driver camera), their outputs written as a
log, checked frame by frame against onnxruntime or a second bundle, and drawn over the road.

  python -m sunnypilot.modeld_v2.replay.route_replay SEGMENT [SEGMENT ...] --artifacts DIR [--out out/replay]
      [--onnx driving.onnx | --vision v.onnx --policy p.onnx | --vision v.onnx --off-policy off.onnx --on-policy on.onnx | --against other/model.bin]
      [--dm-onnx dmonitoring_model.onnx] [--tolerance T] [--realtime] [--frames a:b] [--jobs N | --ray [ADDRESS]] [--camera-offset M]

A SEGMENT is a folder with fcamera.hevc, ecamera.hevc and rlog or qlog (plain, .bz2 or .zst), as a device keeps them in
/data/media/0/realdata/<route>--<n> and comma connect downloads them; a folder of such segments replays each. The tool is a camerad and
a log publisher: frames go out over VisionIPC in camerad's padded NV12 layout, the log's liveCalibration, carState, carControl,
deviceState, driverMonitoringState and liveDelay (where the schema has it) on msgq in log-time order, and modeld runs unchanged.
When the segment has dcamera.hevc (its frames named by the log's driverEncodeIdx or driverCameraState) and the artifacts hold
dmonitoring_model.bin and a dm_warp for the camera, its frames go out on the driver stream in log-time order among the road frames and
dmonitoringmodeld runs beside modeld; driverStateV2 joins the log, and --dm-onnx checks it against onnxruntime on the DM ONNX (the
frame warped in numpy as compile_dm_warp warps it, calib from liveCalibration, openpilot's parse and fill on its raw outputs).

Lockstep (default): the next frame goes out when its daemon has published this one, so nothing drops and a run is deterministic.
--realtime sends at 20 Hz and reports the frames modeld dropped. Per segment, OUT/<segment>/ gets modeld_rlog.zst (what modeld
published, readable with openpilot_logging's LogReader), overlay.mp4 (plan path, lane lines, road edges and leads over the road camera),
plots.png (desired curvature, acceleration, lead distance and confidence over time; with the driver camera, the driver's face position and
orientation and the probabilities) and, with a reference, check.json (driverStateV2's heads as driverStateV2:<head>).

Several segments (--jobs N local processes, or --ray: Ray tasks on this machine or a cluster, see fleet_replay) also write OUT/fleet.json
and OUT/fleet.png, one report for all (fleet_report); exit 1 when a segment is past its tolerance, 2 when one could not be replayed.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.common.cli import checked, child_env, end_with_parent, finite_float, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.compile.model_plan import add_model_flags, model_files
from sunnypilot.modeld_v2.daemon.bus_inputs import CAMERA_OFFSET_MAX, parse_camera_offset, parse_delay
from sunnypilot.modeld_v2.daemon.device_params import TYPICAL_CAR
from sunnypilot.modeld_v2.replay.route_segment import INPUT_SERVICES, CameraFrame, EventFeed, FrameDecoder, RouteError, Segment, open_segment, segment_folders
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS

OUTPUT_SERVICES = ("modelV2", "drivingModelData", "cameraOdometry")
LOG_NAME, VIDEO_NAME, PLOT_NAME, CHECK_NAME = "modeld_rlog.zst", "overlay.mp4", "plots.png", "check.json"
TOLERANCE = {"float32": 1e-3, "float16": 1e-2}  # per output dtype of the reference: float16 rounding alone reaches 1e-3 on values near 1
# a float16 bundle is checked as a float16 reference is, its differences relative to the value above 1 (half rounds relatively: an exp'd
# std of 100 moves by 0.1 where a logit near 1 moves by 1e-3): 1e-2 is 3 roundings of 2^-11 per layer through about 7 layers, the
# stand-ins' depth; a deeper model needs --tolerance 3 * layers * 2^-11 (docs/ARCHITECTURE.md, "Precision")
# timing, the raw vector (compared head by head), and which model ran (modeld's bundle identity: the reference runs the ONNX)
NOT_COMPARED = ("modelExecutionTime", "rawPredictions", "locationMonoTimeDEPRECATED")
DRIVER_SERVICE = "driverStateV2"
DRIVER_NOT_COMPARED = ("modelExecutionTime", "gpuExecutionTime", "rawPredictions")
MODELD_START_S, FRAME_TIMEOUT_S = 600.0, 60.0  # modeld's first start fuses and caches the bundle; a frame takes milliseconds

log = logging.getLogger(__name__)

class LogState:
  """What modeld's SubMaster holds after the events published so far: the latest struct per service, which were seen, and which were
  updated by the events sent since the previous frame (modeld reads them all at once when the frame arrives)."""
  def __init__(self):
    from sunnypilot.modeld_v2.daemon.messaging import has_service, new_message
    services = [s for s in INPUT_SERVICES if has_service(s)]
    self.data = {s: getattr(new_message(s), s) for s in services}
    self.seen = dict.fromkeys(services, False)
    self.updated = dict.fromkeys(services, False)

  def update(self, service: str, data: Any) -> None: self.data[service], self.seen[service], self.updated[service] = data, True, True

  def next_frame(self) -> None:
    """The events sent from now on reach modeld with the next frame."""
    self.updated = dict.fromkeys(self.updated, False)

  def snapshot(self) -> LogState:
    """This state as it is now (update replaces entries, never changes them: a shallow copy is enough)."""
    copy = LogState.__new__(LogState)
    copy.data, copy.seen, copy.updated = dict(self.data), dict(self.seen), dict(self.updated)
    return copy
  def __getitem__(self, service: str) -> Any: return self.data[service]

class BundleReference:
  """A second bundle (unsearched vs searched, CPU vs CUDA) with the artifacts' warp for this camera, run as modeld runs its model."""
  def __init__(self, model: str, warp: str):
    from sunnypilot.modeld_v2.daemon.frame_inputs import HostInputs
    from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
    self.adapter = ModelRunner(model, warp)
    self.host_inputs = HostInputs(self.adapter.numpy_inputs, lambda line: None)  # what modeld cannot feed it says itself
    self.output_dtype = np.dtype(np.float32)

  def step(self, road: np.ndarray, wide: np.ndarray, frame, values: dict) -> np.ndarray:
    self.host_inputs.write(values)
    self.adapter.copy_frames(dict(zip(CAMERA_BUFFERS, (road, wide), strict=True)))
    self.adapter.run()
    return np.array(self.adapter.output_array(), np.float32)

class OutputCheck:
  """A reference run in a thread beside the daemon, frame by frame, and its outputs compared with what the daemon published: per head (of
  the published rawPredictions) and per published field, the largest difference and where. Subclasses say how a frame runs (step) and
  what is compared (compare)."""
  def __init__(self, slices: dict, relative: bool = False):
    self.slices, self.relative = slices, relative  # relative: differences measured relative to the value above 1 (a float16 bundle)
    self.heads = {name: {"max": 0.0, "sum": 0.0, "frame": None} for name in slices}
    self.fields: dict[str, dict] = {}
    self.frames = 0
    self.pending: dict[int, tuple[np.ndarray, dict]] = {}  # frame id -> (reference outputs, {service: flat fields}) until the daemon's arrive
    self.queue: queue.Queue = queue.Queue(8)  # frames waiting for the reference
    self.error: BaseException | None = None
    self.thread = threading.Thread(target=self._work, daemon=True)
    self.thread.start()

  def submit(self, *item) -> None:
    if self.error is not None: raise RouteError(f"the reference failed: {self.error}")
    self.queue.put(item)

  def _work(self) -> None:
    while (item := self.queue.get()) is not None:
      if self.error is None:
        try: self.step(*item)
        except Exception as e: self.error = e

  def step(self, *item) -> None: raise NotImplementedError

  def finish(self) -> None:
    """Wait for the frames still queued."""
    self.queue.put(None)
    self.thread.join()
    if self.error is not None: raise RouteError(f"the reference failed: {type(self.error).__name__}: {self.error}")

  def compare_frame(self, frame_id: int, raw: bytes, published: dict[str, Any], not_compared: tuple[str, ...]) -> None:
    """The daemon's messages of a frame (readers by service; `raw` its rawPredictions) against the reference's."""
    outputs, fields = self.pending.pop(frame_id)
    raw_outputs = np.frombuffer(raw, np.float32)
    diff = np.abs(raw_outputs - outputs) if raw_outputs.shape == outputs.shape else np.full(outputs.shape, np.inf)
    if self.relative: diff = diff / np.maximum(1.0, np.abs(outputs))
    for name, (a, b) in self.slices.items():
      head, d = self.heads[name], diff[a:b]
      head["sum"] += float(d.mean())
      if d.max() > head["max"] or head["frame"] is None: head["max"], head["frame"] = float(d.max()), frame_id
    for service, ref in fields.items():
      got = flatten(published[service].to_dict()) if published[service] is not None else {}  # a message that never came differs in every field
      for path, value in ref.items():
        if path.split(".")[0] in not_compared: continue
        d = difference(got.get(path), value, self.relative)
        entry = self.fields.setdefault(f"{service}.{path}", {"max": 0.0, "frame": frame_id})
        if d > entry["max"]: entry["max"], entry["frame"] = d, frame_id
    self.frames += 1

  def report(self, tolerance: float) -> dict:
    heads = {n: {"max": h["max"], "mean": h["sum"] / max(self.frames, 1), "peak_frame": h["frame"]} for n, h in self.heads.items()}
    fields = {p: {"max": f["max"], "peak_frame": f["frame"]} for p, f in sorted(self.fields.items()) if f["max"] > tolerance}
    return {"frames": self.frames, "tolerance": tolerance, "heads": heads, "fields_compared": len(self.fields),
            "field_max": max((f["max"] for f in self.fields.values()), default=0.0), "fields_past_tolerance": fields,
            "passed": all(h["max"] <= tolerance for h in heads.values()) and not fields}

class ReferenceCheck(OutputCheck):
  """The reference fed what modeld is fed (frame_inputs.FrameInputs, modeld's input sequence, on the same log state, with a DrivingState of
  its own with the bundle's generation rules for the desire and the fed-back lat_planner_state), then its outputs filled into messages by
  the fill functions modeld uses, written through pycapnp (not modeld's byte templates); per head and per published field, the largest
  difference and where."""
  def __init__(self, reference, metadata: dict, segment: Segment, args):
    from sunnypilot.modeld_v2.common.logs import Episodes
    from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
    from sunnypilot.modeld_v2.daemon.device_params import Delays
    from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
    from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs
    from sunnypilot.modeld_v2.model.generations import GENERATIONS, of_bundle
    from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
    from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
    self.reference, self.segment = reference, segment
    self.state, self.parser = DrivingState(GENERATIONS[of_bundle(metadata)[0]]), OutputParser(metadata["output_slices"])
    self.reads = ParsedReads.of(self.parser.parsed)  # views of the parser's buffer, refilled by each call
    self.inputs = FrameInputs(BusInputs(Episodes(lambda s: None)), args.rhd, args.camera_offset)
    self.inputs.use_cameras(segment.sensor, main_wide=False)  # the replay serves the road camera as the main stream
    self.delays = Delays(args.lat_delay, args.long_delay, "route_replay's --lat-delay/--long-delay")
    super().__init__(metadata["output_slices"], metadata.get("precision") == "float16")

  def submit(self, state: LogState, cam: CameraFrame, road: np.ndarray, wide: np.ndarray) -> None: super().submit(state.snapshot(), cam, road, wide)

  def step(self, state: LogState, cam: CameraFrame, road: np.ndarray, wide: np.ndarray) -> None:
    from sunnypilot.modeld_v2.daemon.messaging import new_message, set_fields
    from sunnypilot.modeld_v2.model.fill_model_msg import FrameInfo, frame_fields
    fed = self.inputs.step(state, self.delays, self.state)  # lockstep: no frame drops, no prepare-only frames
    outputs = self.reference.step(road, wide, self.segment.frame, fed.host)
    info = FrameInfo(cam.frame_id, cam.frame_id, cam.eof, cam.frame_id, 0.0, 0, 0.0, fed.calibrated, fed.lat_t, fed.long_t)
    parsed = self.parser(outputs)
    msgs = {}
    for service, fields in frame_fields(parsed, self.state.update(self.reads, info, fed.car, fed.lateral_active), info).items():
      set_fields(getattr(msg := new_message(service), service), fields)
      msgs[service] = flatten(getattr(msg, service).to_dict())
    self.pending[cam.frame_id] = outputs.reshape(-1), msgs

  def compare(self, frame_id: int, published: dict[str, Any]) -> None:
    """modeld's messages for a frame (readers by service) against the reference's."""
    self.compare_frame(frame_id, bytes(published["modelV2"].rawPredictions), published, NOT_COMPARED)

class DriverCheck(OutputCheck):
  """The driver-monitoring reference (onnx_reference.DMOnnxReference) fed what dmonitoringmodeld is fed: the driver frame with the
  driver camera's M_inv for the segment's sensor, and calib from liveCalibration as dmonitoringmodeld takes it (BusInputs: refused values
  keep the last good ones) on the same log state; its outputs parsed and filled by openpilot's formulas (parse_dmonitoring_outputs,
  fill_driver_state) and written through pycapnp; compared with driverStateV2 per head and per field."""
  def __init__(self, reference, slices: dict, segment: Segment, m_inv: np.ndarray, relative: bool = False):
    from sunnypilot.modeld_v2.common.logs import Episodes
    from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
    from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser
    self.reference, self.segment, self.m_inv = reference, segment, m_inv
    self.parser, self.bus = DMOutputParser(slices), BusInputs(Episodes(lambda s: None))
    super().__init__(slices, relative)

  def submit(self, state: LogState, cam: CameraFrame, buf: np.ndarray) -> None: super().submit(state.snapshot(), cam, buf)

  def step(self, state: LogState, cam: CameraFrame, buf: np.ndarray) -> None:
    from sunnypilot.modeld_v2.daemon.messaging import new_message, set_fields
    from sunnypilot.modeld_v2.model.fill_driver_state import driver_state_fields
    outputs = self.reference.step(buf, self.segment.frame, self.m_inv, self.bus.calibration(state))
    fields = driver_state_fields(self.parser(outputs), self.parser.probs, cam.frame_id, 0.0, 0.0)
    set_fields((msg := new_message(DRIVER_SERVICE)).driverStateV2, fields)  # fields this schema lacks are left out, as the daemon leaves them
    self.pending[cam.frame_id] = outputs.reshape(-1), {DRIVER_SERVICE: flatten(msg.driverStateV2.to_dict())}

  def compare(self, frame_id: int, published: Any) -> None:
    """dmonitoringmodeld's driverStateV2 for a driver frame (a reader, or None if it never came) against the reference's."""
    self.compare_frame(frame_id, bytes(published.rawPredictions) if published is not None else b"", {DRIVER_SERVICE: published}, DRIVER_NOT_COMPARED)

def merged_report(check: dict, driver: dict) -> dict:
  """modeld's check report with the driver check's folded in: its heads as driverStateV2:<head>, its fields (driverStateV2.*) beside
  modeld's, passed when both passed; the driver frames counted apart."""
  return check | {"heads": check["heads"] | {f"{DRIVER_SERVICE}:{n}": h for n, h in driver["heads"].items()},
                  "fields_compared": check["fields_compared"] + driver["fields_compared"], "field_max": max(check["field_max"], driver["field_max"]),
                  "fields_past_tolerance": check["fields_past_tolerance"] | driver["fields_past_tolerance"],
                  "passed": check["passed"] and driver["passed"], "driver_frames": driver["frames"],
                  "driver_fields_compared": driver["fields_compared"]}

def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
  """A message's to_dict() as {dotted path: leaf}; a list of numbers stays one leaf, a list of structs is indexed (leadsV3.0.prob)."""
  if isinstance(value, dict): return {k: v for key, item in value.items() for k, v in flatten(item, f"{prefix}{key}.").items()}
  if isinstance(value, list) and value and isinstance(value[0], dict):
    return {k: v for i, item in enumerate(value) for k, v in flatten(item, f"{prefix}{i}.").items()}
  return {prefix[:-1]: value}

def difference(a: Any, b: Any, relative: bool = False) -> float:
  """Largest absolute difference of two leaves (`relative`: over max(1, |b|)); inf when they differ in kind or length, 0/inf for equal/unequal
  non-numbers."""
  if a is None or isinstance(b, (bytes, str)) or isinstance(a, (bytes, str)): return 0.0 if a == b else float("inf")
  x, y = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if x.shape != y.shape: return float("inf")
  d = np.abs(x - y) / (np.maximum(1.0, np.abs(y)) if relative else 1.0)
  return float(np.max(np.where(np.isnan(x) & np.isnan(y), 0.0, np.where(np.isnan(d), np.inf, d)), initial=0.0))

# *** modeld ***

def modeld_flags(args: argparse.Namespace, send_raw: bool) -> list[str]:
  """modeld's flags for a replay. In lockstep modeld re-attaches only after FRAME_TIMEOUT_S without frames: frames pause while the
  reference catches up, and a frame sent while modeld re-attached would be lost unseen."""
  return (["--lat-delay", str(args.lat_delay), "--long-delay", str(args.long_delay), "--camera-offset", str(args.camera_offset)]
          + ["--rhd"] * args.rhd + ["--send-raw"] * send_raw + ["--reconnect-after", str(FRAME_TIMEOUT_S)] * (not args.realtime))

def dmonitoringmodeld_flags(args: argparse.Namespace, send_raw: bool) -> list[str]:
  """dmonitoringmodeld's flags for a replay: in lockstep it re-attaches only after FRAME_TIMEOUT_S without frames, as modeld."""
  return ["--send-raw"] * send_raw + ["--reconnect-after", str(FRAME_TIMEOUT_S)] * (not args.realtime)

ECHO_QUIET = ("reconnected to camerad", "modeld: status:", "dmonitoringmodeld: status:")  # modeld's lines the replay does not pass on: it says its own progress

class ModeldKilled(RouteError):
  """modeld ended by a signal the replay did not send (killed, out of memory): not the segment's fault, a retry may get past it."""

class Modeld:
  """modeld (or `daemon`: dmonitoringmodeld) in a subprocess in this process's msgq namespace, with `flags` after --artifacts; its log lines
  are kept (the last ones quoted when it fails) and, with `echo`, passed on. route_replay and benchmarks.bench_daemon run the daemons
  through it. It runs in a session of its own: a Ctrl-C at the terminal reaches the replay, which stops the daemon itself, instead of both
  at once; it ends with the replay (cli.end_with_parent) if the replay is killed."""
  def __init__(self, artifacts: str, flags: list[str], echo: bool = True, daemon: str = "modeld"):
    self.name = daemon
    self.proc = subprocess.Popen([sys.executable, "-m", f"sunnypilot.modeld_v2.{daemon}", "--artifacts", artifacts, *flags], stderr=subprocess.PIPE,
                                 text=True, env=child_env() | {"PYTHONUNBUFFERED": "1"}, start_new_session=True)
    self.lines: list[str] = []
    self.echo = echo
    self.thread = threading.Thread(target=self._read, daemon=True)
    self.thread.start()

  def _read(self) -> None:
    for line in iter(self.proc.stderr.readline, ""):
      self.lines.append(line)
      if self.echo and not any(quiet in line for quiet in ECHO_QUIET): sys.stderr.write(line)  # what it could not use (a host input with no source, ...)

  def check(self) -> None:
    if self.proc.poll() is not None:
      raise (ModeldKilled if self.proc.returncode < 0 else RouteError)(f"{self.name} exited ({self.proc.returncode}): {self.last_line()}")

  def last_line(self) -> str: return "".join(self.lines[-3:]).strip().replace("\n", " | ") if self.lines else "no output"

  def wait_running(self, timeout: float = MODELD_START_S) -> None:
    deadline = time.monotonic() + timeout
    while not any("running:" in line for line in self.lines):
      self.check()
      if time.monotonic() > deadline: raise RouteError(f"{self.name} did not start in {timeout:.0f} s: {self.last_line()}")
      time.sleep(0.01)

  def stop(self) -> None:
    if self.proc.poll() is None: self.proc.send_signal(signal.SIGTERM)
    try: self.proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
      self.proc.kill()
      self.proc.wait()
    self.thread.join(timeout=5)

class Published:
  """What the daemons publish (`services`), every message (no conflation), by service and frame id, and in arrival order for the log."""
  def __init__(self, services: tuple[str, ...] = OUTPUT_SERVICES):
    import msgq
    self.socks = {s: msgq.sub_sock(s, conflate=False, timeout=10) for s in services}
    self.raw: list[bytes] = []
    self.by_frame: dict[str, dict[int, Any]] = {s: {} for s in services}

  def poll(self) -> bool:
    from sunnypilot.modeld_v2.daemon.messaging import log as capnp_log
    got = False
    for service, sock in self.socks.items():
      while (raw := sock.receive(non_blocking=True)) is not None:
        self.raw.append(raw)
        event = next(iter(capnp_log.Event.read_multiple_bytes(raw)))
        self.by_frame[service][getattr(event, service).frameId] = getattr(event, service)
        got = True
    return got

  def wait(self, frame_ids: list[int], modeld: Modeld, timeout: float, services=OUTPUT_SERVICES) -> bool:
    """Until every service in `services` published each of `frame_ids`; False at the timeout."""
    deadline = time.monotonic() + timeout
    while not all(f in self.by_frame[s] for s in services for f in frame_ids):
      if not self.poll():
        modeld.check()
        if time.monotonic() > deadline: return False
        time.sleep(0.0005)
    return True

def lockstep_wait(published: Published, modeld: Modeld, frame_id: int, service: str = "modelV2") -> None:
  """Until `service` (modeld's modelV2, dmonitoringmodeld's driverStateV2) for frame_id arrived."""
  if not published.wait([frame_id], modeld, FRAME_TIMEOUT_S, services=(service,)):
    raise RouteError(f"{modeld.name} published nothing for frame {frame_id} in {FRAME_TIMEOUT_S:.0f} s: {modeld.last_line()}")

def write_log(path: str, raws: list[bytes]) -> None:
  """The messages as a cereal log (openpilot_logging's save_log, zstd by the name): written whole to a temporary name, then renamed."""
  from openpilot_logging.logreader import save_log

  from sunnypilot.modeld_v2.daemon.messaging import log as capnp_log
  tmp = f"{path}.tmp{os.getpid()}.zst"
  try:
    save_log(tmp, list(capnp_log.Event.read_multiple_bytes(b"".join(raws))))
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp): os.remove(tmp)

# *** one segment ***

@dataclass
class Result:
  segment: str
  sent: int = 0
  published: int = 0
  frame_drop_perc_max: float = 0.0
  seconds: float = 0.0
  check: dict | None = None
  files: list[str] = field(default_factory=list)
  driver_sent: int = 0  # driver camera frames, through dmonitoringmodeld
  driver_published: int = 0

  @property
  def fps(self) -> float: return self.sent / self.seconds if self.seconds else 0.0

def artifacts_warp(artifacts: str, segment: Segment, new_img: list | None) -> str:
  """The warp bundle modeld picks for the segment's frames on both cameras and a model taking `new_img` planes (artifacts.find_warp)."""
  from sunnypilot.modeld_v2.daemon.artifacts import find_warp
  if (path := find_warp(artifacts, segment.frame, segment.frame, report=log.warning, new_img=new_img)) is None:
    raise RouteError(f"no warp bundle in {artifacts} for {segment.frame.width}x{segment.frame.height} frames "
                     f"(build one: compile_warp --frame {segment.frame.spec} --warp-to 512x256 --split-frames)")
  return path

def make_reference(args, warp: str):
  """The reference from --onnx/--vision/... or --against (a second bundle, run with `warp`); None without either."""
  from sunnypilot.modeld_v2.common.files import ArtifactError
  from sunnypilot.modeld_v2.compile.onnx_model import ModelError
  from sunnypilot.modeld_v2.replay.onnx_reference import OnnxReference
  files = model_files(args)
  try:
    if files: return OnnxReference(files)
    if args.against: return BundleReference(args.against, warp)
  except (ModelError, ArtifactError) as e: raise RouteError(str(e)) from None
  except Exception as e: raise RouteError(f"the reference does not load: {type(e).__name__}: {e}") from None  # onnxruntime's own errors
  return None

def driver_monitoring(args, segment: Segment, report: Callable[[str], None]) -> tuple[str, str] | None:
  """(dmonitoring_model.bin, its dm_warp for the segment's driver camera) when dmonitoringmodeld replays the segment's dcamera.hevc; None,
  with a line when there is a driver video, when it cannot; RouteError when --dm-onnx asks for a check that cannot run."""
  from sunnypilot.modeld_v2.daemon.artifacts import DRIVER_MONITORING, find_warp, model_planes, warp_command
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  model, why = os.path.join(args.artifacts, DRIVER_MONITORING.model_name), None
  if segment.driver_video is None: why = f"{segment.name} has no driver camera video (dcamera.hevc) with its frames named in the log"
  elif not os.path.isfile(model): why = f"no {DRIVER_MONITORING.model_name} in {args.artifacts} (build one: {DRIVER_MONITORING.build_model})"
  if why is None:
    planes = model_planes(read_bundle(model)[0])
    if (warp := find_warp(args.artifacts, segment.frame, None, report=lambda line: None, new_img=planes, kind=DRIVER_MONITORING)) is not None:
      return model, warp
    why = f"no dm_warp bundle in {args.artifacts} for {segment.frame.width}x{segment.frame.height} frames (build one: " \
          f"{warp_command(segment.frame, DRIVER_MONITORING, planes)})"
  if args.dm_onnx: raise RouteError(f"--dm-onnx: {why}")
  if segment.driver_video is not None: report(f"{segment.name}: the driver camera is not replayed: {why}")
  return None

def make_driver_check(args, segment: Segment, dm: tuple[str, str] | None) -> DriverCheck | None:
  """The driver-monitoring check from --dm-onnx, on the dm_warp's model size and border fill and openpilot's M_inv for the sensor."""
  if not args.dm_onnx or dm is None: return None
  from sunnypilot.modeld_v2.compile.onnx_model import ModelError
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
  from sunnypilot.modeld_v2.replay.onnx_reference import DMOnnxReference
  warp = read_bundle(dm[1])[0]["extras"]["metadata"]
  try: reference = DMOnnxReference(args.dm_onnx, tuple(warp["model_size"]), warp.get("border_fill"))
  except (ModelError, ValueError) as e: raise RouteError(str(e)) from None
  except Exception as e: raise RouteError(f"the driver-monitoring reference does not load: {type(e).__name__}: {e}") from None
  meta = read_bundle(dm[0])[0]["extras"]["metadata"]
  return DriverCheck(reference, meta["output_slices"], segment, dm_warp_matrix(segment.sensor, tuple(warp["model_size"])), meta.get("precision") == "float16")

def check_tolerance(args, reference, driver_check: DriverCheck | None, check: ReferenceCheck | None = None) -> float | None:
  """--tolerance, else the default for the reference's output dtype (the driving model's reference's, else the driver-monitoring one's),
  float16's for a float16 bundle (`check`, `driver_check` relative)."""
  checked = reference if reference is not None else driver_check.reference if driver_check is not None else None
  if args.tolerance is not None or checked is None: return args.tolerance
  if any(c is not None and c.relative for c in (check, driver_check)): return TOLERANCE["float16"]
  return TOLERANCE.get(checked.output_dtype.name, 1e-3)

def intro_line(segment: Segment, args, reference, driver_check: DriverCheck | None, tolerance: float | None, driver_frames: int) -> str:
  """What a segment's replay is about to do, in one line."""
  return (f"{segment.name}: {len(segment.frames)} frames {segment.frame.width}x{segment.frame.height} ({segment.sensor}), {len(segment.events)} "
          f"input events from {os.path.basename(segment.log_path)}, {'realtime 20 Hz' if args.realtime else 'lockstep'}"
          + (f", {driver_frames} driver frames through dmonitoringmodeld" if driver_frames else "")
          + (f", checked against {type(reference).__name__}" if reference is not None else "")
          + (f", driver camera checked against {type(driver_check.reference).__name__}" if driver_check is not None else "")
          + (f" (tolerance {tolerance:g})" if tolerance is not None else ""))

def send_driver(replay, cam: CameraFrame, buf: np.ndarray, state: LogState, driver_check: DriverCheck | None, published: Published,
                lockstep: Modeld | None) -> None:
  """One driver frame out on the driver stream (to the check, if any); with `lockstep` (dmonitoringmodeld), until its driverStateV2 came."""
  replay.send_driver(cam.frame_id, buf, sof=cam.sof, eof=cam.eof)
  if driver_check is not None: driver_check.submit(state, cam, buf)
  if lockstep is None: published.poll()
  else: lockstep_wait(published, lockstep, cam.frame_id, DRIVER_SERVICE)

def start_daemons(args, modeld_raw: bool, dm_raw: bool | None) -> list[Modeld]:
  """modeld, and dmonitoringmodeld unless `dm_raw` is None; each with --send-raw when its check reads the raw outputs."""
  daemons = [Modeld(args.artifacts, modeld_flags(args, modeld_raw))]
  if dm_raw is not None: daemons.append(Modeld(args.artifacts, dmonitoringmodeld_flags(args, dm_raw), daemon="dmonitoringmodeld"))
  return daemons

def wait_for_last(published: Published, daemons: list[Modeld], frames: list[CameraFrame], driver_frames: list[CameraFrame], realtime: bool,
                  report: Callable[[str], None]) -> None:
  """After the last frame went out: modeld's (and dmonitoringmodeld's) messages still on their way. In realtime the frames in flight
  are not drops: up to 2 s for the last one's."""
  if realtime: published.wait([frames[-1].frame_id], daemons[0], 2.0, services=("modelV2",))
  done = sorted(published.by_frame["modelV2"]) if realtime else [f.frame_id for f in frames]
  if not published.wait(done, daemons[0], 10.0, services=OUTPUT_SERVICES): report("warning: some drivingModelData/cameraOdometry messages never arrived")
  if driver_frames and realtime: published.wait([driver_frames[-1].frame_id], daemons[1], 2.0, services=(DRIVER_SERVICE,))

def replay_segment(folder: str, args, report: Callable[[str], None] = log.info, written: list[str] | None = None) -> Result:
  """Replay one segment with a modeld of its own (and a dmonitoringmodeld, for its driver camera) in this process's OPENPILOT_PREFIX; writes
  OUT/<segment>/ and returns what happened. `written`: the files are listed in it as each is complete (what an interrupted replay did write)."""
  from sunnypilot.modeld_v2.common.files import replaced_atomically
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.artifacts import model_planes
  from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
  from sunnypilot.modeld_v2.daemon.messaging import has_service, pub_master
  from sunnypilot.modeld_v2.format.bundle import read_bundle
  from sunnypilot.modeld_v2.replay.fake_camerad import FakeCamerad
  segment = open_segment(folder)
  for line in segment.warnings: report(f"warning: {line}")
  out = os.path.join(args.out, segment.name)
  head = read_bundle(os.path.join(args.artifacts, "model.bin"))[0]
  metadata = head["extras"]["metadata"]
  warp = artifacts_warp(args.artifacts, segment, model_planes(head))  # fail here, not after modeld waited for a warp that is not there
  dm = driver_monitoring(args, segment, report)
  reference = make_reference(args, warp)
  check = ReferenceCheck(reference, metadata, segment, args) if reference is not None else None
  driver_check = make_driver_check(args, segment, dm)
  tolerance = check_tolerance(args, reference, driver_check, check)
  frames, driver_frames = segment.frames, segment.driver_frames if dm else []
  if not args.no_pictures and args.frames[0] >= len(frames): raise RouteError(f"--frames starts at {args.frames[0]}: {segment.name} has {len(frames)} frames")
  report(intro_line(segment, args, reference, driver_check, tolerance, len(driver_frames)))
  replay = FakeCamerad(segment.frame, wide=True, rpy=None, driver=dm is not None)
  inputs = pub_master([s for s in INPUT_SERVICES if has_service(s)])
  published = Published(OUTPUT_SERVICES + (DRIVER_SERVICE,) * (dm is not None))
  decoders = [FrameDecoder(segment)] + ([FrameDecoder(segment, driver=True)] if dm else [])
  daemons = start_daemons(args, check is not None, driver_check is not None if dm else None)
  modeld = daemons[0]
  state, result, calibrations = LogState(), Result(segment.name, files=[] if written is None else written), {}
  accepted = BusInputs(Episodes(lambda line: None))  # the calibration and camera height modeld takes from the log, for the overlay
  # road and driver frames in log-time order: each goes out after the events logged before it (the driver camera runs on its own clock)
  timeline = sorted([(f.log_time, 0, k) for k, f in enumerate(frames)] + [(f.log_time, 1, j) for j, f in enumerate(driver_frames)])
  try:
    for daemon in daemons: daemon.wait_running()
    published.poll()  # a msgq reader re-registers on its first receive after the publisher appeared, skipping what was sent before
    feed, t0, (roads, drivers) = EventFeed(segment.events), time.monotonic(), [iter(d) for d in decoders] + [None] * (2 - len(decoders))
    for _, is_driver, k in timeline:
      cam = (driver_frames if is_driver else frames)[k]
      for event in feed.until(cam.log_time):
        if event.service in state.seen:
          inputs.send(event.service, event.raw)
          state.update(event.service, event.data)
      if is_driver:
        send_driver(replay, cam, next(drivers), state, driver_check, published, None if args.realtime else daemons[1])
        result.driver_sent += 1
        continue
      road, wide = next(roads)
      calibrations[cam.frame_id] = accepted.calibration(state), accepted.camera_height(state)
      replay.send(cam.frame_id, road, wide, sof=cam.sof, eof=cam.eof)
      result.sent += 1
      if check is not None: check.submit(state, cam, road, wide)  # computed while modeld runs
      state.next_frame()  # the events sent from now on reach modeld with the next frame
      if args.realtime:
        published.poll()
        time.sleep(max(0.0, t0 + k * 0.05 + 0.05 - time.monotonic()))
      else: lockstep_wait(published, modeld, cam.frame_id)
      if (k + 1) % 200 == 0: report(f"{segment.name}: {k + 1}/{len(frames)} frames, {(k + 1) / (time.monotonic() - t0):.1f} frames/s")
    result.seconds = time.monotonic() - t0
    wait_for_last(published, daemons, frames, driver_frames, args.realtime, report)
  finally:
    for d in decoders: d.close()
    for daemon in daemons: daemon.stop()
    replay.close()
  models = published.by_frame["modelV2"]
  result.published, result.driver_published = len(models), len(published.by_frame.get(DRIVER_SERVICE, {}))
  result.frame_drop_perc_max = max((m.frameDropPerc for m in models.values()), default=0.0)
  os.makedirs(out, exist_ok=True)
  write_log(log_path := os.path.join(out, LOG_NAME), published.raw)
  result.files.append(log_path)
  result.check = checked_report(check, driver_check, published, [f.frame_id for f in driver_frames], tolerance)
  if result.check is not None:
    with replaced_atomically(check_path := os.path.join(out, CHECK_NAME)) as (tmp,), open(tmp, "w") as f: json.dump(result.check, f, indent=1)
    result.files.append(check_path)
  if not args.no_pictures: result.files.extend(draw(args, segment, out, metadata, published, calibrations, driver_frames, report))
  return result

def checked_report(check: ReferenceCheck | None, driver_check: DriverCheck | None, published: Published, driver_ids: list[int],
                   tolerance: float | None) -> dict | None:
  """Each check's reference finished and compared with what was published (modeld's every published frame, every driver frame sent), one
  report (merged_report when both ran); None without a check."""
  reports = []
  models, drivers = published.by_frame["modelV2"], published.by_frame.get(DRIVER_SERVICE, {})
  for c, ids, compare in ((check, sorted(models), lambda f: {s: published.by_frame[s].get(f) for s in OUTPUT_SERVICES}),
                          (driver_check, driver_ids, drivers.get)):
    if c is None: continue
    c.finish()
    for frame_id in ids: c.compare(frame_id, compare(frame_id))
    reports.append(c.report(tolerance))
  return merged_report(*reports) if len(reports) == 2 else reports[0] if reports else None

def draw(args, segment: Segment, out: str, metadata: dict, published: Published, calibrations: dict, driver_frames: list[CameraFrame],
         report: Callable[[str], None]) -> list[str]:
  """overlay.mp4 and plots.png of the --frames range (the driver's plots over the same time, when its camera was replayed); their paths."""
  from sunnypilot.modeld_v2.replay.route_overlay import plot_drive, write_overlay
  frames, models, drivers = segment.frames, published.by_frame["modelV2"], published.by_frame.get(DRIVER_SERVICE, {})
  a, b = args.frames
  picked = [(k, f) for k, f in enumerate(frames) if a <= k < (b or len(frames)) and f.frame_id in models]
  report(f"{segment.name}: drawing {len(picked)} frames over the road camera ...")
  stand_in = metadata.get("stand_in")  # a random-weight stand-in: the pictures say so
  write_overlay(video := os.path.join(out, VIDEO_NAME), segment, [(k, models[f.frame_id], *calibrations[f.frame_id]) for k, f in picked], stand_in)
  seconds = lambda f: (f.log_time - frames[0].log_time) / 1e9
  start, end = (frames[picked[0][0]].log_time, frames[picked[-1][0]].log_time) if picked else (0, 0)
  states = [(seconds(f), drivers[f.frame_id]) for f in driver_frames if f.frame_id in drivers and start <= f.log_time <= end]
  plot_drive(plot := os.path.join(out, PLOT_NAME), segment.name, [(seconds(f), models[f.frame_id]) for _, f in picked], stand_in,
             states if driver_frames else None, args.rhd)
  return [video, plot]

def summarize(result: Result) -> str:
  lines = [f"{result.segment}: {result.sent} frames sent, {result.published} published, {result.sent - result.published} dropped "
           f"(frameDropPerc max {result.frame_drop_perc_max:.2f}%), {result.fps:.1f} frames/s"]
  if result.driver_sent:
    lines.append(f"  driver camera: {result.driver_sent} frames sent, {result.driver_published} driverStateV2 published by dmonitoringmodeld")
  if result.check is not None:
    c = result.check
    worst = sorted(c["heads"].items(), key=lambda kv: -kv[1]["max"])[:5]
    over = f"{c['frames']} frames" + (f" and {c['driver_frames']} driver frames" if "driver_frames" in c else "")
    lines.append(f"  reference check over {over}, tolerance {c['tolerance']:g}: {'PASSED' if c['passed'] else 'FAILED'}")
    lines += [f"    {name:24s} max {h['max']:.3g} (frame {h['peak_frame']}), mean {h['mean']:.3g}" for name, h in worst]
    lines += [f"    field {p}: max {f['max']:.3g} (frame {f['peak_frame']})" for p, f in list(c["fields_past_tolerance"].items())[:10]]
  lines += [f"  wrote {p}" for p in result.files]
  return "\n".join(lines)

# *** CLI ***

def parse_range(spec: str) -> tuple[int, int | None]:
  """`"a:b"` (either side may be empty) -> (a, b)."""
  parts = spec.split(":")
  if len(parts) != 2 or not all(p.strip().isdigit() or not p.strip() for p in parts): raise ValueError(f"--frames wants a:b (e.g. 0:200 or 600:), got {spec!r}")
  a, b = (int(p) if p.strip() else None for p in parts)
  if b is not None and b <= (a or 0): raise ValueError(f"--frames {spec}: the range is empty")
  return a or 0, b

def parser() -> argparse.ArgumentParser:
  p = cli_parser("route_replay", __doc__)
  p.add_argument("segments", nargs="+", help="segment folders (fcamera.hevc, ecamera.hevc, rlog or qlog), or folders of segments")
  p.add_argument("--artifacts", required=True, help="modeld's artifacts folder: model.bin and a warp for the route's camera")
  p.add_argument("--out", default=os.path.join("out", "replay"), help="where OUT/<segment>/ goes (default out/replay)")
  add_model_flags(p, ": check against onnxruntime on these ONNX files")
  p.add_argument("--dm-onnx", metavar="ONNX", help="check dmonitoringmodeld's driverStateV2 on the segment's dcamera.hevc against onnxruntime on "
                 "this driver-monitoring ONNX (the artifacts then need dmonitoring_model.bin and a dm_warp for the camera)")
  p.add_argument("--against", help="check against a second bundle (e.g. unsearched vs searched, CPU vs CUDA), run with the artifacts' warp")
  p.add_argument("--tolerance", type=finite_float(0, 1e6), help="largest absolute difference allowed per output and published field (default: 1e-3 for float32 "
                 "references, 1e-2 for float16 references and float16 bundles, whose differences count relative to the value above 1)")
  p.add_argument("--realtime", action="store_true", help="send at 20 Hz instead of lockstep and report drops (no reference check)")
  p.add_argument("--frames", default=":", help="the frames drawn in overlay.mp4 and plots.png, a:b (default: all)")
  p.add_argument("--no-pictures", action="store_true", help="skip overlay.mp4 and plots.png")
  p.add_argument("--jobs", type=positive_int, default=1, help="segments replayed at once, each in its own process with its own modeld and msgq prefix")
  p.add_argument("--ray", nargs="?", const="local", type=checked(ray_address), metavar="ADDRESS", help="each segment a Ray task: on a local Ray "
                 "instance started for the run, or on the cluster at ADDRESS (auto: the one `ray start` joined this machine to; or the head's HOST:PORT); "
                 "needs the fleet extra")
  p.add_argument("--replay-cpus", type=finite_float(0, 4096, low_open=True), default=1.0, metavar="N", help="with --ray: the CPUs a replay reserves "
                 "(default 1), so a node runs at most its CPUs / N at once")
  p.add_argument("--result", metavar="FILE", help="write this segment's record (status, reason, frames, seconds, the check) as JSON here: how --jobs and --ray "
                 "collect their fleet report")
  p.add_argument("--rhd", action="store_true", help="passed to modeld (else driverMonitoringState.isRHD decides)")
  p.add_argument("--lat-delay", type=checked(parse_delay), default=TYPICAL_CAR.lateral, help="passed to modeld: the lateral delay in seconds until liveDelay "
                 f"says (default {TYPICAL_CAR.lateral:g}, modeld's: a typical car's steerActuatorDelay + 0.2)")
  p.add_argument("--long-delay", type=checked(parse_delay), default=TYPICAL_CAR.longitudinal, help="passed to modeld: the longitudinal actuator delay in "
                 f"seconds (default {TYPICAL_CAR.longitudinal:g}, modeld's)")
  p.add_argument("--camera-offset", type=checked(parse_camera_offset), default=0.0, help="passed to modeld: sunnypilot's "
                 f"CameraOffset in metres, at most {CAMERA_OFFSET_MAX:g} either way (default 0); the reference check applies it as modeld does")
  return p

def ray_address(text: str) -> str:
  from sunnypilot.modeld_v2.replay.fleet_replay import RAY_ADDRESS
  if not RAY_ADDRESS.match(text): raise ValueError(f"expected a Ray address (auto, HOST:PORT or ray://HOST:PORT), got {text!r} (segments go before --ray)")
  return text

def fail(p: argparse.ArgumentParser, problem: str) -> None: p.exit(2, f"route_replay: error: {problem}\n")

def check_args(p: argparse.ArgumentParser, args) -> None:
  """Bad flags and paths in one line, exit 2, before any work."""
  try: args.frames = parse_range(args.frames)
  except ValueError as e: fail(p, str(e))
  models = list(model_files(args))
  if models and args.against: fail(p, "give one reference: ONNX file(s) or --against, not both")
  if (models or args.against or args.dm_onnx) and args.realtime: fail(p, "--realtime drops frames by design: the reference check runs in lockstep only")
  if args.ray and args.jobs > 1: fail(p, "give --jobs (local processes) or --ray (Ray tasks), not both")
  for path in [getattr(args, k) for k in models] + [args.against] * bool(args.against) + [args.dm_onnx] * bool(args.dm_onnx):
    if not os.path.isfile(path): fail(p, f"{path}: no such file")
  from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
  from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts
  try:
    check_artifacts(args.artifacts)
    if args.result: check_output_path(args.result)
  except ArtifactError as e: fail(p, str(e))

def interrupted(*_) -> None:
  """SIGINT or SIGTERM: stop, once. Signals after the first are ignored, so the clean-up they interrupt (stopping modeld, removing the
  msgq namespace) runs to its end: a Ctrl-C at the terminal reaches a parallel replay's children, and its parent then tells them too."""
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: None)  # not SIG_IGN: a signal already pending then raises OSError
  raise KeyboardInterrupt

def on_interrupt() -> None:
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, interrupted)

def main(argv: list[str] | None = None) -> int:
  from sunnypilot.modeld_v2.common.logs import setup
  argv = sys.argv[1:] if argv is None else argv
  p = parser()
  args = p.parse_args(argv)
  setup("route_replay")
  end_with_parent()
  check_args(p, args)
  try: folders = [f for s in args.segments for f in segment_folders(s)]
  except RouteError as e: fail(p, str(e))
  if args.result is None and (len(folders) > 1 or args.ray):
    from sunnypilot.modeld_v2.replay.fleet_replay import replay_fleet
    try: return replay_fleet(folders, [a for a in argv if a not in args.segments], args)
    except RouteError as e: fail(p, str(e))
  if args.result is not None and len(folders) > 1: fail(p, "--result is one segment's record: give one segment")
  prefix = f"route_replay_{uuid.uuid4().hex[:10]}"
  os.environ["OPENPILOT_PREFIX"] = prefix
  on_interrupt()  # stop modeld and remove the namespace on SIGTERM too
  written: list[str] = []
  from sunnypilot.modeld_v2.replay.fleet_report import error_record, result_record, write_record
  try: result = replay_segment(folders[0], args, written=written)
  except RouteError as e:
    if args.result: write_record(args.result, error_record(os.path.basename(os.path.normpath(folders[0])), str(e), lost=isinstance(e, ModeldKilled)))
    fail(p, str(e))
  except KeyboardInterrupt:
    done = f"wrote {', '.join(written)}" if written else "nothing written"
    p.exit(130, f"route_replay: interrupted: {done} for {os.path.basename(os.path.normpath(folders[0]))}\n")
  finally: shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  if args.result: write_record(args.result, result_record(result))
  print(summarize(result), flush=True)
  return 1 if result.check is not None and not result.check["passed"] else 0

if __name__ == "__main__":
  sys.exit(main())
