"""camerad and the car on a device tree (tests/device_tree.py), run in that tree's environment: VisionIPC road, wide and cabin streams of
1344x760 frames at 20 Hz, and the bus messages modeld and dmonitoringmodeld read under the schema's own names (`--topics`), published
through the device's cereal.messaging; every message the daemons publish is decoded with the device's schema and written as JSON.

  python tests/device_driver.py {today,2025} OUT.json [--frames 80]

The calibration is published from frame CALIBRATED on; carState's speed drops below 0.3 m/s from frame SLOW on (the stop and the held
curvature). Stops after --frames frames once each daemon published at least --want messages, or after --timeout seconds.
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np
from msgq.visionipc import VisionIpcServer

W, H, STRIDE, Y_HEIGHT, UV_HEIGHT, SIZE = 1344, 760, 1408, 768, 384, 2428928  # camerad's NV12 layout of 1344x760 frames
CALIBRATED, SLOW, V_EGO, V_SLOW = 10, 60, 20.0, 0.1
OUTPUTS = ("modelV2", "drivingModelData", "cameraOdometry", "driverStateV2")
# the topics a device publishes, by role (sunnypilot/modeld_v2/daemon/topics.py), per tree layout (tests/device_tree.py); None: none
TOPICS = {"today": {"car_state": "carState", "road_camera_state": "narrowRoadCameraState", "device_state": "deviceState",
                    "driver_monitoring_state": "driverMonitoringState", "car_control": "carControl", "lateral_delay": "lateralDelay",
                    "calibration": "extrinsicsCalibration"}}
TOPICS["2025"] = TOPICS["today"] | {"road_camera_state": "roadCameraState", "lateral_delay": None, "calibration": "liveCalibration"}
CEREAL = {"today": "openpilot.cereal", "2025": "cereal"}

def plain(value):
  """A capnp to_dict value as JSON: bytes as hex."""
  if isinstance(value, bytes): return value.hex()
  if isinstance(value, dict): return {k: plain(v) for k, v in value.items()}
  if isinstance(value, list): return [plain(v) for v in value]
  return value

def main() -> int:
  p = argparse.ArgumentParser()
  p.add_argument("layout", choices=sorted(TOPICS))
  p.add_argument("out")
  p.add_argument("--frames", type=int, default=80)
  p.add_argument("--want", type=int, default=40)
  p.add_argument("--wait", help="a file whose appearance starts the frames (a benchmark's daemon says it runs)")
  p.add_argument("--timeout", type=float, default=240)
  p.add_argument("--car-params", help="the fake Params folder: CarParams are written there first (card's job on a device)")
  args = p.parse_args()
  topics = TOPICS[args.layout]
  messaging = importlib.import_module(f"{CEREAL[args.layout]}.messaging")
  cereal = importlib.import_module(CEREAL[args.layout])
  log = cereal.log
  if args.car_params:
    car = getattr(cereal, "car", None) or importlib.import_module("opendbc.car.structs").car
    with open(f"{args.car_params}/CarParams", "wb") as f: f.write(car.CarParams.new_message(steerActuatorDelay=0.1, longitudinalActuatorDelay=0.25).to_bytes())
  server = VisionIpcServer("camerad")
  for stream in (0, 1, 2): server.create_buffers_with_sizes(stream, 8, W, H, SIZE, STRIDE, STRIDE * Y_HEIGHT)
  server.start_listener()
  pm = messaging.PubMaster([t for t in topics.values() if t])
  socks = {s: messaging.sub_sock(s, conflate=False, timeout=0) for s in OUTPUTS}
  got = {s: [] for s in OUTPUTS}
  rng = np.random.default_rng(0)
  frames = [rng.integers(0, 256, SIZE, dtype=np.uint8).tobytes() for _ in range(4)]
  start, frame_id, t0 = time.monotonic(), 0, time.monotonic_ns()
  open(args.out + ".ready", "w").close()
  while args.wait and not os.path.exists(args.wait) and time.monotonic() - start < args.timeout: time.sleep(0.05)
  start, t0 = time.monotonic(), time.monotonic_ns()
  while time.monotonic() - start < args.timeout:
    if frame_id >= args.frames and all(len(got[s]) >= args.want for s in OUTPUTS): break
    sof = t0 + frame_id * 50_000_000
    v_ego = V_SLOW if frame_id >= SLOW else V_EGO
    msgs = {"car_state": {"vEgo": v_ego}, "road_camera_state": {"frameId": frame_id}, "device_state": {},
            "driver_monitoring_state": {"isRHD": False}, "car_control": {"latActive": True}, "lateral_delay": {"lateralDelay": 0.32}}
    if frame_id >= CALIBRATED: msgs["calibration"] = {"rpyCalib": [0.0, 0.02, -0.01], "height": [1.3]}
    for role, fields in msgs.items():
      if not topics.get(role): continue
      msg = messaging.new_message(topics[role])
      msg.valid = True
      for k, v in fields.items(): setattr(getattr(msg, topics[role]), k, v)
      pm.send(topics[role], msg)
    for stream in (0, 2, 1): server.send(stream, frames[frame_id % 4], frame_id, sof, sof + 20_000_000)
    frame_id += 1
    deadline = time.monotonic() + 0.05
    while time.monotonic() < deadline:
      for service, sock in socks.items():
        while (raw := sock.receive(non_blocking=True)) is not None:
          with log.Event.from_bytes(raw) as event:
            got[service].append({"valid": event.valid, "fields": plain(getattr(event, service).to_dict())})
      time.sleep(0.002)
  with open(args.out, "w") as f: json.dump({"frames_sent": frame_id, "messages": got}, f)
  return 0

if __name__ == "__main__":
  sys.exit(main())
