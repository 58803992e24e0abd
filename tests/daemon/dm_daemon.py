"""dmonitoringmodeld in a subprocess for the daemon tests: a driver-camera server and a subscriber in this process, the artifacts folder
of both daemons (`folder`, module-scoped: each test module imports it by name), and the pair run directly as the reference."""
import os
import shutil
import signal
import time

import numpy as np
import pytest

from sunnypilot.modeld_v2.daemon.camera_sync import VisionStreamType
from sunnypilot.modeld_v2.model.calibration import dm_warp_matrix
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame
from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner

from daemon_process import DaemonProcess

FRAME, BIG_FRAME = camerad_frame(1344, 760), camerad_frame(1928, 1208)
SENSORS = {FRAME: "os04c10", BIG_FRAME: "ar0231"}
SOF0 = 10**9
RPY = (0.01, 0.05, -0.02)

@pytest.fixture(scope="module")
def folder(dm_artifacts, native_artifacts, tmp_path_factory) -> str:
  """One artifacts folder with both daemons' files: the driver-monitoring model and its warps, the driving model and its warp."""
  folder = tmp_path_factory.mktemp("both")
  for name in ("dmonitoring_model.bin", "dm_warp_1344x760.bin", "dm_warp_1928x1208.bin"): shutil.copy(os.path.join(dm_artifacts, name), folder / name)
  for name in ("model.bin", "warp_split.bin"): shutil.copy(os.path.join(native_artifacts, name), folder / name)
  return str(folder)

def driver_frame(frame_id: int, frame: NV12Frame) -> np.ndarray:
  return np.random.default_rng(frame_id).integers(0, 256, frame.size, dtype=np.uint8)

class DriverCamerad:
  """camerad's VisionIPC server with a driver stream of `frame` buffers (18, as camerad allocates), and a road stream with `road`."""
  def __init__(self, frame: NV12Frame, driver: bool = True, road: bool = False):
    from msgq.visionipc import VisionIpcServer

    from sunnypilot.modeld_v2.daemon.messaging import ensure_prefix_dir
    ensure_prefix_dir()
    self.frame, self.server = frame, VisionIpcServer("camerad")
    self.streams = [VisionStreamType.DRIVER] * driver + [VisionStreamType.ROAD] * road
    for stream in self.streams: self.server.create_buffers_with_sizes(stream, 18, frame.width, frame.height, frame.size, frame.stride, frame.uv_offset)
    self.server.start_listener()

  def send(self, frame_id: int) -> None:
    sof = SOF0 + frame_id * 50_000_000
    for stream in self.streams: self.server.send(stream, driver_frame(frame_id, self.frame).tobytes(), frame_id, sof, sof + 20_000_000)

  def close(self) -> None:
    del self.server

class DMDaemon(DaemonProcess):
  """dmonitoringmodeld (--send-raw) with a DriverCamerad, a liveCalibration publisher and a driverStateV2 subscriber here."""
  def __init__(self, artifacts: str, frame: NV12Frame = FRAME, args: tuple[str, ...] = (), command: tuple[str, ...] | None = None,
               ready: str | None = "running:", **camera):
    from sunnypilot.modeld_v2.daemon.messaging import pub_master, sub_master
    self.camera = DriverCamerad(frame, **camera)
    self.sm, self.calibration = sub_master(["driverStateV2"]), pub_master(["liveCalibration"])
    self.messages: dict[int, tuple] = {}  # frameId -> (driverStateV2, valid)
    self.published: list[int] = []
    super().__init__(command or ("-m", "sunnypilot.modeld_v2.dmonitoringmodeld"), ("--artifacts", artifacts, "--send-raw", *args), ready=ready)

  def send(self, frame_id: int, rpy: tuple | None = None) -> None:
    """A frame, after the calibration it is to run with, if any (published first, so the daemon's next update sees it)."""
    from sunnypilot.modeld_v2.daemon.messaging import new_message
    if rpy is not None:
      msg = new_message("liveCalibration")
      msg.liveCalibration.rpyCalib = list(rpy)
      self.calibration.send("liveCalibration", msg)
    self.camera.send(frame_id)

  def receive(self, frame_id: int, timeout: float = 10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      self.sm.update(20)
      if self.sm.updated["driverStateV2"]:
        state = self.sm["driverStateV2"]
        self.messages[state.frameId] = (state, self.sm.valid["driverStateV2"])
        self.published.append(state.frameId)
      if frame_id in self.messages: return self.messages[frame_id][0]
    raise AssertionError(f"no driverStateV2 for frame {frame_id}: {''.join(self.lines)}")

  def exchange(self, frame_ids, rpy: tuple | None = None) -> None:
    for frame_id in frame_ids:
      self.send(frame_id, rpy)
      self.receive(frame_id)

  def restart_camerad(self, frame: NV12Frame, **camera) -> None:
    self.camera.close()
    self.camera = DriverCamerad(frame, **camera)

  def raw(self, frame_id: int) -> np.ndarray: return np.frombuffer(bytes(self.messages[frame_id][0].rawPredictions), np.float32)

  def stop(self, signum: int = signal.SIGTERM) -> int:
    code = super().stop(signum)
    self.camera.close()
    return code

def reference(artifacts: str, frame_ids, frame: NV12Frame = FRAME, calibs: dict | None = None) -> list[bytes]:
  """The pair run directly on the same frames, with openpilot's transform for the frame's camera and the calibration each frame ran with."""
  w, h = frame.width, frame.height
  runner = ModelRunner(os.path.join(artifacts, "dmonitoring_model.bin"), os.path.join(artifacts, f"dm_warp_{w}x{h}.bin"))
  runner.numpy_inputs["tfm"][:] = dm_warp_matrix(SENSORS[frame])
  outs = []
  for frame_id in frame_ids:
    runner.numpy_inputs["calib"][:] = (calibs or {}).get(frame_id, (0.0, 0.0, 0.0))
    runner.copy_frames({"driver": driver_frame(frame_id, frame)})
    runner.run()
    outs.append(runner.output_array().tobytes())
  runner.close()
  return outs
