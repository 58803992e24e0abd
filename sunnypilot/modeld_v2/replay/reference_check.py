"""The reference checks of a replay: a reference (onnxruntime on the ONNX files, or a second bundle) fed what the daemon is fed, frame by
frame in a thread beside it, its outputs filled into messages by openpilot's formulas and compared with what the daemon published, per
output head and per published field. ReferenceCheck checks modeld, DriverCheck dmonitoringmodeld; checked_report makes one report of both."""
from __future__ import annotations

import argparse
import queue
import threading
from typing import Any, cast

import numpy as np

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.compile.model_plan import model_files
from sunnypilot.modeld_v2.compile.onnx_model import ModelError
from sunnypilot.modeld_v2.daemon.bus_inputs import BusInputs
from sunnypilot.modeld_v2.daemon.device_params import Delays
from sunnypilot.modeld_v2.daemon.driving_state import DrivingState
from sunnypilot.modeld_v2.daemon.frame_inputs import FrameInputs, HostInputs
from sunnypilot.modeld_v2.daemon.messaging import new_message, set_fields
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.fill_driver_state import driver_state_fields
from sunnypilot.modeld_v2.model.fill_model_msg import FrameInfo, frame_fields
from sunnypilot.modeld_v2.model.generations import GENERATIONS, of_bundle
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.parsed_reads import ParsedReads
from sunnypilot.modeld_v2.replay.log_state import LogState
from sunnypilot.modeld_v2.replay.model_daemons import DRIVER_SERVICE, OUTPUT_SERVICES
from sunnypilot.modeld_v2.replay.onnx_reference import DMOnnxReference, OnnxReference
from sunnypilot.modeld_v2.replay.route_segment import CameraFrame, RouteError, Segment
from sunnypilot.modeld_v2.runtime.frame_feeds import CAMERA_BUFFERS
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

TOLERANCE = {"float32": 1e-3, "float16": 1e-2}  # per output dtype of the reference: float16 rounding alone reaches 1e-3 on values near 1
# a float16 bundle is checked as a float16 reference is, its differences relative to the value above 1 (half rounds relatively: an exp'd
# std of 100 moves by 0.1 where a logit near 1 moves by 1e-3): 1e-2 is 3 roundings of 2^-11 per layer through about 7 layers, the
# stand-ins' depth; a deeper model needs --tolerance 3 * layers * 2^-11 (docs/ARCHITECTURE.md, "Precision")
# timing and the raw vector (compared head by head)
NOT_COMPARED = ("modelExecutionTime", "rawPredictions")
DRIVER_NOT_COMPARED = ("modelExecutionTime", "gpuExecutionTime", "rawPredictions")

class BundleReference:
  """A second bundle (unsearched vs searched, CPU vs CUDA) with the artifacts' warp for this camera, run as modeld runs its model."""
  def __init__(self, model: str, warp: str):
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
    self.heads: dict[str, dict[str, Any]] = {name: {"max": 0.0, "sum": 0.0, "frame": None} for name in slices}
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
  def __init__(self, reference, metadata: dict, segment: Segment, args: argparse.Namespace):
    self.reference, self.segment = reference, segment
    self.state, self.parser = DrivingState(GENERATIONS[of_bundle(metadata)[0]]), OutputParser(metadata["output_slices"])
    self.reads = ParsedReads.of(self.parser.parsed)  # views of the parser's buffer, refilled by each call
    self.inputs = FrameInputs(BusInputs(Episodes(lambda s: None)), args.rhd, args.camera_offset)
    self.inputs.use_cameras(segment.sensor, main_wide=False)  # the replay serves the road camera as the main stream
    self.delays = Delays(args.lat_delay, args.long_delay, "route_replay's --lat-delay/--long-delay")
    super().__init__(metadata["output_slices"], metadata.get("precision") == "float16")

  def submit(self, state: LogState, cam: CameraFrame, road: np.ndarray, wide: np.ndarray) -> None: super().submit(state.snapshot(), cam, road, wide)

  def step(self, state: LogState, cam: CameraFrame, road: np.ndarray, wide: np.ndarray) -> None:
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
    self.reference, self.segment, self.m_inv = reference, segment, m_inv
    self.parser, self.bus = DMOutputParser(slices), BusInputs(Episodes(lambda s: None))
    super().__init__(slices, relative)

  def submit(self, state: LogState, cam: CameraFrame, buf: np.ndarray) -> None: super().submit(state.snapshot(), cam, buf)

  def step(self, state: LogState, cam: CameraFrame, buf: np.ndarray) -> None:
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

# *** making the checks ***

def make_reference(args: argparse.Namespace, warp: str) -> OnnxReference | BundleReference | None:
  """The reference from --onnx/--vision/... or --against (a second bundle, run with `warp`); None without either."""
  files = model_files(args)
  try:
    if files: return OnnxReference(files)
    if args.against: return BundleReference(args.against, warp)
  except (ModelError, ArtifactError) as e: raise RouteError(str(e)) from None
  except Exception as e: raise RouteError(f"the reference does not load: {type(e).__name__}: {e}") from None  # onnxruntime's own errors
  return None

def make_driver_check(args: argparse.Namespace, segment: Segment, dm: tuple[str, str] | None) -> DriverCheck | None:
  """The driver-monitoring check from --dm-onnx, on the dm_warp's model size and border fill and openpilot's M_inv for the sensor."""
  if not args.dm_onnx or dm is None: return None
  warp = read_bundle(dm[1])[0]["extras"]["metadata"]
  try: reference = DMOnnxReference(args.dm_onnx, tuple(warp["model_size"]), warp.get("border_fill"))
  except (ModelError, ValueError) as e: raise RouteError(str(e)) from None
  except Exception as e: raise RouteError(f"the driver-monitoring reference does not load: {type(e).__name__}: {e}") from None
  meta = read_bundle(dm[0])[0]["extras"]["metadata"]
  return DriverCheck(reference, meta["output_slices"], segment, dm_warp_matrix(segment.sensor, tuple(warp["model_size"])), meta.get("precision") == "float16")

def check_tolerance(args: argparse.Namespace, reference, driver_check: DriverCheck | None, check: ReferenceCheck | None = None) -> float | None:
  """--tolerance, else the default for the reference's output dtype (the driving model's reference's, else the driver-monitoring one's),
  float16's for a float16 bundle (`check`, `driver_check` relative)."""
  checked = reference if reference is not None else driver_check.reference if driver_check is not None else None
  if args.tolerance is not None or checked is None: return args.tolerance
  if any(c is not None and c.relative for c in (check, driver_check)): return TOLERANCE["float16"]
  return TOLERANCE.get(checked.output_dtype.name, 1e-3)

UNCHECKED = {"modeld": "no driving-model reference: --onnx, --vision with --policy or the off/on-policy files, or --against",
             "dmonitoringmodeld": "no driver-monitoring reference: --dm-onnx"}  # why a daemon that ran went unchecked

def checked_report(check: ReferenceCheck | None, driver_check: DriverCheck | None, by_frame: dict[str, dict[int, Any]], driver_ids: list[int],
                   tolerance: float | None) -> dict | None:
  """Each check's reference finished and compared with what was published (`by_frame`: service -> frame id -> message; modeld's every
  published frame, every driver frame sent: none when dmonitoringmodeld did not run), one report (merged_report when both ran) that
  says which daemons it checked and which ran unchecked, and why; None without a check."""
  reports = []
  models, drivers = by_frame["modelV2"], by_frame.get(DRIVER_SERVICE, {})
  for c, ids, compare in ((check, sorted(models), lambda f: {s: by_frame[s].get(f) for s in OUTPUT_SERVICES}),
                          (driver_check, driver_ids, drivers.get)):
    if c is None: continue
    c.finish()
    assert tolerance is not None, "a check has a tolerance"
    for frame_id in ids: c.compare(frame_id, cast(Any, compare(frame_id)))  # each check with its own reader of what was published
    reports.append(c.report(tolerance))
  if not reports: return None
  ran = {"modeld": check is not None, **({"dmonitoringmodeld": driver_check is not None} if driver_ids else {})}
  return (merged_report(*reports) if len(reports) == 2 else reports[0]) | {"checked": [d for d, c in ran.items() if c],
                                                                           "unchecked": {d: UNCHECKED[d] for d, c in ran.items() if not c}}
