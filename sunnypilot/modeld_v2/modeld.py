"""The model daemon: VisionIPC camera frames in, one fused warp+model run per frame, modelV2 / drivingModelData / cameraOdometry out.

  python -m sunnypilot.modeld_v2.modeld --artifacts out/artifacts [--max-frames N] [--rhd]

`--artifacts` holds `model.bin` (compile_modeld) and warp bundles (compile_warp) for the camera geometries it may meet; the daemon
picks the warp whose frame layout matches the live camera buffers (a --split-frames warp first: it reads them in place).
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

import numpy as np

from sunnypilot.modeld_v2.calibration import DEFAULT_RPY, SENSOR_CAMERAS, get_warp_matrix, sensor_for_size
from sunnypilot.modeld_v2.model_outputs import DESIRE_LEN, fill_model_msgs, parse_outputs

DT_MDL = 0.05  # 20 Hz
SYNC_NS = 25_000_000  # main and extra frames belong together when their starts are within 25 ms
OUT_OF_SYNC_NS = 10_000_000
RECONNECT_AFTER_S = 0.5  # no frame for this long: camerad may have restarted

class VisionStreamType(enum.IntEnum):  # msgq-ipc has no enum for these
  ROAD = 0
  DRIVER = 1
  WIDE_ROAD = 2

class Desire(enum.IntEnum):
  NONE, TURN_LEFT, TURN_RIGHT, LANE_CHANGE_LEFT, LANE_CHANGE_RIGHT, KEEP_LEFT, KEEP_RIGHT = range(7)

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

class DesirePulse:
  """One-hot desire, index 0 (none) zeroed, and only on the rising edge: the model sees a lane change start once."""
  def __init__(self): self.prev = np.zeros(DESIRE_LEN, np.float32)

  def update(self, desire: int) -> np.ndarray:
    now = np.zeros(DESIRE_LEN, np.float32)
    if 0 < desire < DESIRE_LEN: now[desire] = 1
    pulse = np.where(now > self.prev, now, 0).astype(np.float32)
    self.prev = now
    return pulse

def desire_from_car_state(car_state, v_min: float = 8.9) -> int:
  """A minimal stand-in for openpilot's DesireHelper: a blinker above ~20 mph asks for a lane change that way."""
  if car_state.vEgo < v_min: return Desire.NONE
  if car_state.leftBlinker and not car_state.rightBlinker: return Desire.LANE_CHANGE_LEFT
  if car_state.rightBlinker and not car_state.leftBlinker: return Desire.LANE_CHANGE_RIGHT
  return Desire.NONE

@dataclass
class FrameMeta:
  frame_id: int = 0
  timestamp_sof: int = 0
  timestamp_eof: int = 0

  @staticmethod
  def of(client) -> FrameMeta: return FrameMeta(client.frame_id, client.timestamp_sof, client.timestamp_eof)

def find_warp(artifacts: str, width: int, height: int, stride: int, uv_offset: int, size: int) -> str:
  """The warp bundle in `artifacts` built for this live buffer layout; split-frames first."""
  from sunnypilot.modeld_v2.bundle import read_bundle
  from sunnypilot.modeld_v2.warp import parse_frame
  seen, matches = [], []
  for path in sorted(glob.glob(os.path.join(artifacts, "*.bin"))):
    meta = read_bundle(path)[0].get("extras", {}).get("metadata", {})
    if meta.get("kind") != "warp": continue
    frame = parse_frame(meta["frame"])
    seen.append(meta["frame"])
    if (frame.width, frame.height, frame.stride, frame.uv_offset) == (width, height, stride, uv_offset) and frame.size <= size:
      matches.append((not meta.get("split_frames"), path))
  if not matches:
    raise FileNotFoundError(f"no warp bundle in {artifacts} for {width}x{height} frames (stride {stride}, uv_offset {uv_offset}, {size} bytes); "
                            f"have {seen}. Build one: python -m sunnypilot.modeld_v2.compile_warp --frame {width},{height},{stride},"
                            f"{uv_offset // stride},<uv_height>,{size} --warp-to 512x256 --split-frames --output ...")
  return min(matches)[1]

class ModelD:
  def __init__(self, artifacts: str, rhd: bool = False, lat_delay: float = 0.2, long_delay: float = 0.0, send_raw: bool = False):
    self.artifacts, self.rhd, self.lat_delay, self.long_delay, self.send_raw = artifacts, rhd, lat_delay, long_delay, send_raw
    self.exit = threading.Event()
    self.adapter = None

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
    return True

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
  def load(self) -> None:
    from sunnypilot.modeld_v2.model_adapters import NativeTinygradAdapter
    c = self.client_main
    warp = find_warp(self.artifacts, c.width, c.height, c.stride, c.uv_offset, c.buffer_len)
    model_path = os.path.join(self.artifacts, "model.bin")
    t = time.perf_counter()
    self.adapter = NativeTinygradAdapter(model_path, warp)
    self.slices = self.adapter.jits["metadata"]["output_slices"]
    road, wide = SENSOR_CAMERAS[sensor_for_size(c.width, c.height)]
    self.cameras = (wide, wide) if self.main_wide else (road, wide)
    self._rpy: tuple | None = None  # the calibration transforms() last computed M_inv for
    log(f"loaded {model_path} + {os.path.basename(warp)} in {(time.perf_counter() - t) * 1e3:.0f} ms "
        f"({'camera buffers read in place' if self.adapter.in_place else 'frames copied'})")
    for _ in range(3):  # warm up on zero frames, then forget them
      self.adapter.copy_frames({"img": np.zeros(self.adapter.warp_frame_size, np.uint8), "big_img": np.zeros(self.adapter.warp_frame_size, np.uint8)})
      self.adapter.run()
    self.adapter.reset_warmup_buffers()

  def transforms(self, rpy) -> np.ndarray:
    """M_inv for both cameras, recomputed only when the calibration changes."""
    if self._rpy != (rpy := tuple(rpy)):
      self._rpy, self._m_inv = rpy, np.stack([get_warp_matrix(rpy, self.cameras[0].intrinsics),
                                              get_warp_matrix(rpy, self.cameras[1].intrinsics, bigmodel_frame=True)])
    return self._m_inv

  def run(self, max_frames: int | None = None) -> int:
    from sunnypilot.modeld_v2.messaging import pub_master, sub_master
    pm = pub_master(["modelV2", "drivingModelData", "cameraOdometry"])
    sm = sub_master(["deviceState", "carState", "roadCameraState", "liveCalibration", "driverMonitoringState", "carControl", "liveDelay"])
    if not self.wait_for_camerad(): return 0
    self.meta_extra = FrameMeta()
    self.load()
    drops, desire, published, last_frame = FrameDrops(), DesirePulse(), 0, time.monotonic()
    log(f"running: main {'wide' if self.main_wide else 'road'} camera{', extra wide camera' if self.use_extra else ''}")
    while not self.exit.is_set() and (max_frames is None or published < max_frames):
      frames = self.recv_frames()
      if frames is None:
        if time.monotonic() - last_frame > RECONNECT_AFTER_S: self.reconnect()
        continue
      last_frame = time.monotonic()
      buf_main, meta_main, buf_extra, meta_extra = frames
      sm.update(0)
      cal = sm["liveCalibration"]
      rpy = list(cal.rpyCalib) if sm.seen.get("liveCalibration") and len(cal.rpyCalib) == 3 else DEFAULT_RPY
      inputs = self.adapter.numpy_inputs
      inputs["tfm"][:] = self.transforms(rpy)
      inputs["desire"][:] = desire.update(desire_from_car_state(sm["carState"]))
      rhd = self.rhd or (sm.seen.get("driverMonitoringState") and sm["driverMonitoringState"].isRHD)
      inputs["traffic_convention"][:] = [0, 1] if rhd else [1, 0]
      inputs["action_t"][:] = [self.lat_delay + 1.5 * DT_MDL, self.long_delay + 0.3 + 1.5 * DT_MDL]
      dropped, drop_perc = drops.update(meta_main.frame_id)
      t0 = time.perf_counter()
      self.adapter.copy_frames({"img": buf_main, "big_img": buf_extra})
      self.adapter.run()
      outputs = self.adapter.output_array()
      execution_time = time.perf_counter() - t0
      if dropped > 0: continue  # prepare-only: the frame went through the model's queues, nothing is published
      self.publish(pm, parse_outputs(outputs, self.slices), outputs, meta_main, meta_extra, sm, drop_perc, execution_time)
      published += 1
    log(f"exiting after {published} published frames")
    return 0

  def publish(self, pm, parsed, outputs, meta_main, meta_extra, sm, drop_perc, execution_time) -> None:
    from sunnypilot.modeld_v2.messaging import new_message
    msgs = {s: new_message(s) for s in ("modelV2", "drivingModelData", "cameraOdometry")}
    model_v2, driving, odometry = msgs["modelV2"].modelV2, msgs["drivingModelData"].drivingModelData, msgs["cameraOdometry"].cameraOdometry
    fill_model_msgs(parsed, model_v2, driving, odometry)
    camera_frame = sm["roadCameraState"].frameId if sm.seen.get("roadCameraState") else meta_main.frame_id
    model_v2.frameId, model_v2.frameIdExtra, model_v2.timestampEof = meta_main.frame_id, meta_extra.frame_id, meta_main.timestamp_eof
    model_v2.frameAge = max(0, camera_frame - meta_main.frame_id)
    model_v2.frameDropPerc, model_v2.modelExecutionTime = drop_perc, execution_time
    if self.send_raw: model_v2.rawPredictions = np.ascontiguousarray(outputs, np.float32).tobytes()
    driving.frameId, driving.frameIdExtra, driving.frameDropPerc, driving.modelExecutionTime = meta_main.frame_id, meta_extra.frame_id, drop_perc, \
      execution_time
    odometry.frameId, odometry.timestampEof = meta_main.frame_id, meta_main.timestamp_eof
    for service, msg in msgs.items(): pm.send(service, msg)

  def reconnect(self) -> None:
    """camerad went away or restarted: its buffers are gone, so drop every mapping and binding before touching a frame again."""
    from msgq.visionipc import VisionIpcClient
    if not VisionIpcClient.available_streams("camerad", False): return
    log("no frames: reconnecting to camerad")
    if self.connect():
      self.adapter.drop_camera_buffers()
      self.meta_extra = FrameMeta()
      log("reconnected to camerad")

def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--artifacts", required=True, help="folder with model.bin and warp bundles")
  parser.add_argument("--max-frames", type=int, help="exit after publishing this many frames")
  parser.add_argument("--rhd", action="store_true", help="right-hand drive traffic convention (else driverMonitoringState.isRHD decides)")
  parser.add_argument("--lat-delay", type=float, default=0.2, help="steering actuator delay in seconds (liveDelay when published)")
  parser.add_argument("--long-delay", type=float, default=0.0, help="longitudinal actuator delay in seconds")
  parser.add_argument("--send-raw", action="store_true", default=bool(os.environ.get("SEND_RAW_PRED")), help="put raw outputs in modelV2.rawPredictions")
  args = parser.parse_args(argv)
  if not os.path.isfile(os.path.join(args.artifacts, "model.bin")): parser.error(f"{args.artifacts}/model.bin not found (build it with compile_modeld)")
  daemon = ModelD(args.artifacts, args.rhd, args.lat_delay, args.long_delay, args.send_raw)
  for sig in (signal.SIGINT, signal.SIGTERM): signal.signal(sig, lambda *_: daemon.exit.set())
  return daemon.run(args.max_frames)

if __name__ == "__main__":
  sys.exit(main())
