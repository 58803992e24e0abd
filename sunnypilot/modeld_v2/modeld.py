"""The model daemon: VisionIPC camera frames in, one fused warp+model run per frame, modelV2 / drivingModelData / cameraOdometry out.

  python -m sunnypilot.modeld_v2.modeld --artifacts out/artifacts [--max-frames N] [--rhd]

`--artifacts` holds `model.bin` (compile_modeld) and warp bundles (compile_warp) for the camera geometries it may meet; the daemon
picks the warp whose frame layout matches the live camera buffers (a --split-frames warp first: it reads them in place). When camerad
comes back with another geometry, the daemon switches to that geometry's warp and intrinsics, or waits, publishing nothing, until one is built.
"""
from __future__ import annotations

import argparse
import enum
import glob
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from sunnypilot.modeld_v2.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix, sensor_for_size
from sunnypilot.modeld_v2.drive_helpers import action_times
from sunnypilot.modeld_v2.model_constants import DT_MDL
from sunnypilot.modeld_v2.publish_state import SERVICES, FrameInfo, PublishState

# what --timings records per published frame, in monotonic ns: frames received and synced, host inputs filled, camera frames bound, model
# launched, outputs read back (the device done), outputs parsed and messages filled, messages serialized, messages sent
STAGE_STAMPS = ("received", "inputs", "copy", "run", "readback", "parse_fill", "serialize", "send")
SYNC_NS = 25_000_000  # main and extra frames belong together when their starts are within 25 ms
OUT_OF_SYNC_NS = 10_000_000
RECONNECT_AFTER_S = 0.5  # no frame for this long: camerad may have restarted
# lateral_control_params = [vEgo, steering delay]: openpilot's 0.9.x supercombo (modeld.py @00731a68) fed steerActuatorDelay + 0.2, its
# 0.9.7-0.9.9 vision+policy pairs (modeld.py @6c6be47b) liveDelay's lateral delay as it is
STEER_DELAY_EXTRA = {"supercombo": 0.2}
ZERO_HOST_INPUTS = ("nav_features", "nav_instructions")  # openpilot left navigation inputs at zero once nav was gone
DRIVING_STYLE = [1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]  # sunnypilot's default driving_style input (modeld.py @002f69b0)

class VisionStreamType(enum.IntEnum):  # msgq-ipc has no enum for these
  ROAD = 0
  DRIVER = 1
  WIDE_ROAD = 2

def log(msg: str) -> None: print(f"modeld: {msg}", file=sys.stderr, flush=True)

class FirstOrderFilter:
  def __init__(self, x0: float, rc: float, dt: float):
    self.x, self.k = x0, dt / (rc + dt)

  def update(self, x: float) -> float:
    self.x = (1 - self.k) * self.x + self.k * x
    return self.x

class FrameDrops:
  """openpilot's drop accounting: dropped = frame ids skipped since the last one; filtered with rc=10 s; 0 for the first 10 runs."""
  def __init__(self):
    self.filter, self.runs, self.last_frame_id = FirstOrderFilter(0.0, 10.0, DT_MDL), 0, None

  def update(self, frame_id: int) -> tuple[int, float]:
    """(frames dropped before this one, frameDropPerc)."""
    dropped = 0 if self.last_frame_id is None else max(0, frame_id - self.last_frame_id - 1)
    self.last_frame_id = frame_id
    filtered = self.filter.update(min(dropped, 10))
    if self.runs < 10: self.filter.x = filtered = 0.0
    self.runs += 1
    return dropped, 100 * filtered / (1 + filtered)

@dataclass
class FrameMeta:
  frame_id: int = 0
  timestamp_sof: int = 0
  timestamp_eof: int = 0

  @staticmethod
  def of(client) -> FrameMeta: return FrameMeta(client.frame_id, client.timestamp_sof, client.timestamp_eof)

@dataclass(frozen=True)
class Geometry:
  """What the warp and the intrinsics depend on: which camera streams exist and the live buffers' layout."""
  streams: tuple[int, ...]
  width: int
  height: int
  stride: int
  uv_offset: int
  buffer_len: int
  extra: tuple[int, ...] | None  # the extra (wide) stream's (width, height, stride, uv_offset, buffer_len), if one is used

  def __str__(self) -> str:
    return f"{self.width}x{self.height} frames (stride {self.stride}, uv_offset {self.uv_offset}, {self.buffer_len} bytes, streams {list(self.streams)})"

def warp_bundles(artifacts: str, device: str | None = None, report=log) -> list[tuple[str, dict]]:
  """(path, metadata) of every warp bundle in `artifacts` this process can load; each unreadable or foreign bundle is skipped with a line."""
  from sunnypilot.modeld_v2.bundle import ArtifactError, check_provenance, read_bundle
  out = []
  for path in sorted(p for p in glob.glob(os.path.join(artifacts, "*.bin")) if os.path.basename(p) != "model.bin"):  # the model is big: not a warp
    try:
      head, _ = read_bundle(path)
      if (meta := head["extras"].get("metadata", {})).get("kind") != "warp": continue
      check_provenance(head["provenance"], device, path)
      out.append((path, meta))
    except ArtifactError as e: report(f"skipping {e}")
  return out

def find_warp(artifacts: str, geometry: Geometry, device: str | None = None, report=log) -> str | None:
  """The warp bundle in `artifacts` built for this live buffer layout, split-frames first; None (with a line saying what to build) if none."""
  from sunnypilot.modeld_v2.warp import parse_frame
  matches, seen = [], []
  for path, meta in warp_bundles(artifacts, device, report):
    frame = parse_frame(meta["frame"])
    seen.append(meta["frame"])
    if (frame.width, frame.height, frame.stride, frame.uv_offset) == (geometry.width, geometry.height, geometry.stride, geometry.uv_offset) \
       and frame.size <= geometry.buffer_len and (geometry.extra is None or frame.size <= geometry.extra[4]):
      matches.append((not meta.get("split_frames"), path))
  if not matches:
    g = geometry
    report(f"no warp bundle in {artifacts} for {g}; have {seen}. Waiting; build one: python -m sunnypilot.modeld_v2.compile_warp --frame "
        f"{g.width},{g.height},{g.stride},{g.uv_offset // g.stride},<uv_height>,{g.buffer_len} --warp-to 512x256 --split-frames --output ...")
    return None
  return min(matches)[1]

def check_artifacts(artifacts: str, device: str | None = None) -> str | None:
  """Before waiting for camerad: the problem with the artifacts folder in one line (no model for this device, no warp at all), or None."""
  from sunnypilot.modeld_v2.bundle import ArtifactError, check_provenance, read_bundle
  model = os.path.join(artifacts, "model.bin")
  if not os.path.isfile(model): return f"{model} not found (build it with compile_modeld)"
  try:
    head, _ = read_bundle(model)
    check_provenance(head["provenance"], device, model)
    if head["extras"].get("metadata", {}).get("kind") != "model": return f"{model} is not a driving model bundle"
  except ArtifactError as e: return str(e)
  if not warp_bundles(artifacts, device): return f"no warp bundle for this device in {artifacts} (build one with compile_warp --split-frames)"
  return None

class ModelD:
  def __init__(self, artifacts: str, rhd: bool = False, lat_delay: float = 0.2, long_delay: float = 0.0, send_raw: bool = False,
               timings: list | None = None):
    self.artifacts, self.rhd, self.lat_delay, self.long_delay = artifacts, rhd, lat_delay, long_delay
    self.timings = timings  # if a list: per published frame, [frame_id, *STAGE_STAMPS in monotonic ns] (benchmarks.bench_daemon reads them)
    self.exit = threading.Event()
    self.adapter: Any = None
    self.geometry: Geometry | None = None
    self.publish_state = PublishState(send_raw=send_raw, log=log)
    self.reported: set[str] = set()

  def log_once(self, msg: str) -> None:
    """Lines that would repeat while the daemon waits or runs (a bad bundle, an input with no source): once each."""
    if msg not in self.reported:
      self.reported.add(msg)
      log(msg)

  # *** VisionIPC ***
  def connect(self) -> bool:
    from msgq.visionipc import VisionIpcClient
    streams = VisionIpcClient.available_streams("camerad", False)
    if not streams: return False
    self.main_wide = VisionStreamType.ROAD not in streams
    self.use_extra = not self.main_wide and VisionStreamType.WIDE_ROAD in streams
    main = VisionStreamType.WIDE_ROAD if self.main_wide else VisionStreamType.ROAD
    self.client_main = VisionIpcClient("camerad", main, True)
    self.client_extra = VisionIpcClient("camerad", VisionStreamType.WIDE_ROAD, False) if self.use_extra else None
    for client in filter(None, (self.client_main, self.client_extra)):
      if not client.connect(False): return False
    self.streams = tuple(sorted(int(s) for s in streams))
    self.meta_extra = FrameMeta()
    return True

  def live_geometry(self) -> Geometry:
    c, e = self.client_main, self.client_extra
    return Geometry(self.streams, c.width, c.height, c.stride, c.uv_offset, c.buffer_len,
                    (e.width, e.height, e.stride, e.uv_offset, e.buffer_len) if e is not None else None)

  def wait_for_camerad(self) -> bool:
    while not self.exit.is_set():
      if self.connect(): return True
      self.exit.wait(0.05)
    return False

  def recv_frames(self):
    """openpilot's sync: main frames until at least one past the last extra, then extra frames until they match main."""
    buf_main = self.client_main.recv(100)
    if buf_main is None: return None
    meta_main = FrameMeta.of(self.client_main)
    while meta_main.timestamp_sof < self.meta_extra.timestamp_sof + SYNC_NS:
      buf_main = self.client_main.recv(100)
      if buf_main is None: return None
      meta_main = FrameMeta.of(self.client_main)
    buf_extra, meta_extra = buf_main, meta_main
    if self.use_extra:
      while True:
        buf_extra = self.client_extra.recv(100)
        if buf_extra is None: return None
        meta_extra = FrameMeta.of(self.client_extra)
        if meta_main.timestamp_sof < meta_extra.timestamp_sof + SYNC_NS: break
      if abs(meta_main.timestamp_sof - meta_extra.timestamp_sof) > OUT_OF_SYNC_NS:
        log(f"frames out of sync! main {meta_main.frame_id} ({meta_main.timestamp_sof / 1e9:.5f}), extra {meta_extra.frame_id} "
            f"({meta_extra.timestamp_sof / 1e9:.5f})")
    self.meta_extra = meta_extra
    return buf_main, meta_main, buf_extra, meta_extra

  # *** model ***
  def load(self) -> bool:
    """Load the model with the warp (and intrinsics) of the live camera geometry and warm it up; False when no warp fits (then wait)."""
    from sunnypilot.modeld_v2.model_adapters import NativeTinygradAdapter
    geometry = self.live_geometry()
    if geometry == self.geometry and self.adapter is not None:
      self.adapter.drop_camera_buffers()
      return True
    if self.adapter is not None: self.adapter.close()  # e.g. unregister its memory from CUDA before the adapter goes
    self.adapter, self.geometry = None, geometry
    try: road, wide = SENSOR_CAMERAS[sensor_for_size(geometry.width, geometry.height)]
    except ValueError as e:
      self.log_once(f"{e}: waiting for a known camera")
      return False
    if (warp := find_warp(self.artifacts, geometry, report=self.log_once)) is None: return False
    model_path = os.path.join(self.artifacts, "model.bin")
    t = time.perf_counter()
    self.adapter = NativeTinygradAdapter(model_path, warp)
    self.slices, self.layout = self.adapter.jits["metadata"]["output_slices"], self.adapter.jits["metadata"]["layout"]
    self.cameras = (wide, wide) if self.main_wide else (road, wide)
    self.rpy: tuple | None = None  # the calibration transforms() last computed M_inv for
    log(f"loaded {model_path} + {os.path.basename(warp)} for {geometry} in {(time.perf_counter() - t) * 1e3:.0f} ms "
        f"({'camera buffers read in place' if self.adapter.in_place else 'frames copied'})")
    self.adapter.numpy_inputs["tfm"][:] = self.transforms(DEFAULT_RPY)  # warm up on a valid transform and zero frames, then forget them
    zeros = np.zeros(self.adapter.warp_frame_size, np.uint8)
    for _ in range(3):
      self.adapter.copy_frames({"img": zeros, "big_img": zeros})
      self.adapter.run()
    self.adapter.reset_warmup_buffers()
    return True

  def transforms(self, rpy) -> np.ndarray:
    """M_inv for both cameras, recomputed only when the calibration changes."""
    if self.rpy != (rpy := tuple(rpy)):
      self.rpy, self.m_inv = rpy, np.stack([get_warp_matrix(rpy, self.cameras[0].intrinsics),
                                            get_warp_matrix(rpy, self.cameras[1].intrinsics, bigmodel_frame=True)])
    return self.m_inv

  def fill_inputs(self, sm, lat_delay: float, lat_t: float, long_t: float) -> None:
    """Every host input by name, as openpilot's modeld filled it for the model generation that has it; an unknown one stays zero (logged once)."""
    inputs, car_state = self.adapter.numpy_inputs, sm["carState"]
    rhd = self.rhd or (sm.seen.get("driverMonitoringState") and sm["driverMonitoringState"].isRHD)
    cal = sm["liveCalibration"]
    values = {"tfm": self.transforms(list(cal.rpyCalib) if sm.seen.get("liveCalibration") and len(cal.rpyCalib) == 3 else DEFAULT_RPY),
              "desire": self.publish_state.desire_input(), "traffic_convention": [0, 1] if rhd else [1, 0], "action_t": [lat_t, long_t],
              "lateral_control_params": [max(float(car_state.vEgo), 0.0), lat_delay + STEER_DELAY_EXTRA.get(self.layout, 0.0)],
              "driving_style": DRIVING_STYLE}
    for name, view in inputs.items():
      if name in values: view.reshape(-1)[:] = np.reshape(values[name], -1)
      elif name not in ZERO_HOST_INPUTS: self.log_once(f"host input {name} {view.shape} has no source here: it stays zero")

  def run(self, max_frames: int | None = None) -> int:
    from sunnypilot.modeld_v2.messaging import lateral_delay, new_message, pub_master, sub_master
    pm = pub_master(list(SERVICES))
    sm = sub_master(["deviceState", "carState", "roadCameraState", "liveCalibration", "driverMonitoringState", "carControl", "liveDelay"])
    if not self.wait_for_camerad(): return 0
    loaded = self.load()
    drops, published, last_frame = FrameDrops(), 0, time.monotonic()
    log(f"running: main {'wide' if self.main_wide else 'road'} camera{', extra wide camera' if self.use_extra else ''}")
    while not self.exit.is_set() and (max_frames is None or published < max_frames):
      frames = self.recv_frames() if loaded else None
      t_recv = time.monotonic_ns()
      if frames is None:
        if time.monotonic() - last_frame > RECONNECT_AFTER_S and self.reconnect():  # a new stream: new buffers, frame ids from its own start
          previous, loaded, drops, last_frame = self.geometry, self.load(), FrameDrops(), time.monotonic()
          if loaded: log("reconnected to camerad" if self.geometry == previous else f"camera geometry changed to {self.geometry}: reloaded")
        if not loaded: self.exit.wait(0.1)
        continue
      last_frame = time.monotonic()
      buf_main, meta_main, buf_extra, meta_extra = frames
      sm.update(0)
      lat_delay = lateral_delay(sm, self.lat_delay)
      lat_t, long_t = action_times(lat_delay, self.long_delay)
      self.fill_inputs(sm, lat_delay, lat_t, long_t)
      dropped, drop_perc = drops.update(meta_main.frame_id)
      t0 = time.perf_counter()
      t_inputs = time.monotonic_ns()
      self.adapter.copy_frames({"img": buf_main, "big_img": buf_extra})
      t_copy = time.monotonic_ns()
      self.adapter.run()
      t_run = time.monotonic_ns()
      outputs = self.adapter.output_array()
      execution_time = time.perf_counter() - t0
      t_readback = time.monotonic_ns()
      if dropped > 0:  # prepare-only: the frame went through the model's queues, nothing is published
        log(f"frame {meta_main.frame_id}: {dropped} frame(s) dropped before it: prepare-only, nothing published")
        continue
      road_frame = sm["roadCameraState"].frameId if sm.seen.get("roadCameraState") else meta_main.frame_id
      frame = FrameInfo(meta_main.frame_id, meta_extra.frame_id, meta_main.timestamp_eof, road_frame, drop_perc, dropped, execution_time,
                        bool(sm.seen.get("liveCalibration")), lat_t, long_t)
      msgs = {s: new_message(s) for s in SERVICES}
      self.publish_state.fill(msgs, outputs, self.slices, frame, sm["carState"], bool(sm.seen.get("carControl") and sm["carControl"].latActive))
      t_fill = time.monotonic_ns()
      data = {service: msg.to_bytes() for service, msg in msgs.items()}
      t_serialize = time.monotonic_ns()
      for service, raw in data.items(): pm.send(service, raw)
      if self.timings is not None:
        self.timings.append([meta_main.frame_id, t_recv, t_inputs, t_copy, t_run, t_readback, t_fill, t_serialize, time.monotonic_ns()])
      published += 1
    log(f"exiting after {published} published frames")
    return 0

  def reconnect(self) -> bool:
    """No frames for a while: camerad went away or restarted, and its buffers with it. True once connected to it again; load() then picks
    the warp for its geometry (the same one: only the camera mappings and their bindings are dropped)."""
    from msgq.visionipc import VisionIpcClient
    return bool(VisionIpcClient.available_streams("camerad", False)) and self.connect()

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--artifacts", required=True, help="folder with model.bin and warp bundles")
  parser.add_argument("--max-frames", type=int, help="exit after publishing this many frames")
  parser.add_argument("--rhd", action="store_true", help="right-hand drive traffic convention (else driverMonitoringState.isRHD decides)")
  parser.add_argument("--lat-delay", type=float, default=0.2, help="steering actuator delay in seconds (liveDelay.lateralDelay when published)")
  parser.add_argument("--long-delay", type=float, default=0.0, help="longitudinal actuator delay in seconds")
  parser.add_argument("--send-raw", action="store_true", default=bool(os.environ.get("SEND_RAW_PRED")), help="put raw outputs in modelV2.rawPredictions")
  parser.add_argument("--timings", help="on exit, write per published frame [frame_id, monotonic ns at each of STAGE_STAMPS] as JSON here (benchmarks)")
  args = parser.parse_args(argv)
  if problem := check_artifacts(args.artifacts): parser.exit(2, f"modeld: error: {problem}\n")
  daemon = ModelD(args.artifacts, args.rhd, args.lat_delay, args.long_delay, args.send_raw, [] if args.timings else None)
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: daemon.exit.set())
  code = daemon.run(args.max_frames)
  if args.timings:
    import json
    with open(args.timings + ".tmp", "w") as f: json.dump({"stamps": ["frame_id", *STAGE_STAMPS], "frames": daemon.timings}, f)
    os.replace(args.timings + ".tmp", args.timings)
  return code

if __name__ == "__main__":
  sys.exit(main())
