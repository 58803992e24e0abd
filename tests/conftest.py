import os
import subprocess
import sys

import numpy as np
import pytest
from tinygrad import Device, Tensor, dtypes

from sunnypilot.modeld_v2.model.camera_frame import NV12Frame

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def realized(a: np.ndarray, device: str | None = None) -> Tensor: return Tensor(a, device=device or Device.DEFAULT).realize()

def conv_net(seed: int = 0):
  """A uint8-image conv+relu net, the shape of a driving model's first layers."""
  rng = np.random.default_rng(seed)
  w1, w2 = realized(rng.standard_normal((8, 6, 3, 3)).astype(np.float32) * 0.1), realized(rng.standard_normal((4, 8, 3, 3)).astype(np.float32) * 0.1)
  def fn(img):
    x = (img.cast(dtypes.float32) / 255.0).conv2d(w1, stride=2).relu()
    return x.conv2d(w2).relu().mean(axis=(2, 3))
  return fn, lambda: {"img": realized(rng.integers(0, 256, (1, 6, 32, 64), dtype=np.uint8))}

def run_python(code: str, env: dict | None = None, timeout: int = 300) -> str:
  """Run `code` in a fresh interpreter; fail with its output when it fails."""
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env={**os.environ, **(env or {})})
  assert proc.returncode == 0, f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout

def reference_warp(buf: np.ndarray, frame: NV12Frame, m_inv: np.ndarray, w: int = 512, h: int = 256,
                   nan_to: float | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Independent numpy warp, after openpilot selfdrive/modeld/compile_warp.py @8f13b107 (nearest pixel, round half to even, clamped):
  returns the (6, h/2, w/2) planes and a mask of pixels within 1e-3 of a rounding tie.
  `nan_to`: what a NaN source coordinate becomes (the runtime's rule for broken transforms), before clamping."""
  def sample(m, out_w, out_h, in_w, in_h, plane):
    xs, ys = np.meshgrid(np.arange(out_w, dtype=np.float32), np.arange(out_h, dtype=np.float32))
    sx, sy, sw = (m[r, 0] * xs + m[r, 1] * ys + m[r, 2] for r in range(3))
    fx, fy = sx / sw, sy / sw
    if nan_to is not None: fx, fy = np.where(np.isnan(fx), nan_to, fx), np.where(np.isnan(fy), nan_to, fy)
    near = lambda f, hi: (np.abs(f - np.floor(f) - 0.5) < 1e-3) & (np.clip(np.floor(f), 0, hi) != np.clip(np.floor(f) + 1, 0, hi))
    tie = near(fx, in_w - 1) | near(fy, in_h - 1)  # a tie only matters where the two candidates are different pixels
    ix, iy = np.clip(np.round(fx), 0, in_w - 1).astype(np.int64), np.clip(np.round(fy), 0, in_h - 1).astype(np.int64)
    return plane[iy, ix], tie
  y_plane, uv = frame.planes(buf)
  y, y_tie = sample(m_inv, w, h, frame.width, frame.height, y_plane)
  m_uv = m_inv * np.array([[1, 1, 0.5], [1, 1, 0.5], [2, 2, 1]], np.float32)
  u, u_tie = sample(m_uv, w // 2, h // 2, frame.width // 2, frame.height // 2, uv[:, 0::2])
  v, _ = sample(m_uv, w // 2, h // 2, frame.width // 2, frame.height // 2, uv[:, 1::2])
  planes = np.stack([y[0::2, 0::2], y[1::2, 0::2], y[0::2, 1::2], y[1::2, 1::2], u, v])
  ties = np.stack([y_tie[0::2, 0::2], y_tie[1::2, 0::2], y_tie[0::2, 1::2], y_tie[1::2, 1::2], u_tie, u_tie])
  return planes, ties

def reference_dm_warp(buf: np.ndarray, frame: NV12Frame, m_inv: np.ndarray, w: int, h: int, fill: int | None = 16) -> tuple[np.ndarray, np.ndarray]:
  """Independent numpy driver-camera warp, after openpilot selfdrive/modeld/compile_dm_warp.py (warp_perspective_tinygrad with
  border_fill_val=16): the Y plane, the nearest source pixel (round half to even) of M_inv @ (x, y, 1) in float32, `fill` where that pixel
  is outside the image (a NaN coordinate too: openpilot's bounds compares are false for it), else (fill None) clamped. Returns the (1, w*h)
  model input and a mask of the pixels within 1e-3 of a rounding tie."""
  y_plane, _ = frame.planes(buf)
  xs, ys = np.meshgrid(np.arange(w, dtype=np.float32), np.arange(h, dtype=np.float32))
  m = m_inv.astype(np.float32)
  sx, sy, sw = (m[r, 0] * xs + m[r, 1] * ys + m[r, 2] for r in range(3))
  with np.errstate(divide="ignore", invalid="ignore"): fx, fy = sx / sw, sy / sw
  tie = (np.abs(fx - np.floor(fx) - 0.5) < 1e-3) | (np.abs(fy - np.floor(fy) - 0.5) < 1e-3)
  rx, ry = np.round(fx), np.round(fy)
  with np.errstate(invalid="ignore"): inside = (rx >= 0) & (rx <= frame.width - 1) & (ry >= 0) & (ry <= frame.height - 1)
  ix = np.clip(np.nan_to_num(rx, nan=0.0), 0, frame.width - 1).astype(np.int64)
  iy = np.clip(np.nan_to_num(ry, nan=0.0), 0, frame.height - 1).astype(np.int64)
  out = y_plane[iy, ix]
  if fill is not None: out = np.where(inside, out, np.uint8(fill))
  return out.reshape(1, w * h), tie.reshape(1, w * h)

def warp_in_fresh_process(path: str, bufs: np.ndarray, m_inv: np.ndarray, folder) -> np.ndarray:
  """A --split-frames warp bundle replayed in a fresh process with the compiler disabled: its flat uint8 output."""
  np.save(folder / "bufs.npy", bufs), np.save(folder / "m.npy", m_inv)
  run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
bufs, m = np.load({str(folder / 'bufs.npy')!r}), np.load({str(folder / 'm.npy')!r})
frame, big, m_inv = Tensor(bufs[0]).realize(), Tensor(bufs[1]).realize(), Tensor(m).realize()
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.runtime.loader import load_bundle
out = load_bundle({path!r}).run(frame=frame, big_frame=big, M_inv=m_inv)
np.save({str(folder / 'out.npy')!r}, np.frombuffer(out.uop.base.buffer.as_memoryview(force_zero_copy=True), np.uint8))
""")
  return np.load(folder / "out.npy")

NO_COMPILE = """
import tinygrad.engine.realize as realize, tinygrad.device as device
def _forbidden(*a, **k): raise AssertionError("compile or schedule after the device was opened")
realize.compile_linear = realize.lower_and_compile = realize.to_program = device.Compiler.compile = device.Compiler.compile_cached = _forbidden
"""

@pytest.fixture(scope="session")
def native_artifacts(tmp_path_factory) -> str:
  """One tiny native stand-in and its warps (1344x760, --split-frames and packed), built once per test run: an artifacts folder as modeld
  reads it (model.bin + warp_*.bin). Tests copy what they change."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.compile_warp import compile_warp
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  folder = tmp_path_factory.mktemp("native_artifacts")
  stand_in_models.write("native", "tiny", str(folder / "native.onnx"), seed=4)
  compile_model(str(folder / "model.bin"), onnx=str(folder / "native.onnx"), log=lambda s: None)
  compile_warp(camerad_frame(1344, 760).spec, "512x256", str(folder / "warp_split.bin"), split_frames=True)
  compile_warp(camerad_frame(1344, 760).spec, "512x256", str(folder / "warp_packed.bin"))
  return str(folder)

@pytest.fixture(scope="session")
def dm_artifacts(tmp_path_factory) -> str:
  """The driver-monitoring stand-in (openpilot's inputs and the current output layout), its bundle dmonitoring_model.bin and a dm_warp per
  comma driver camera (1344x760, 1928x1208), built once per test run: the driver-monitoring half of an artifacts folder."""
  from sunnypilot.modeld_v2.compile_dm_warp import compile_dm_warp
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.model.camera_frame import camerad_frame
  from sunnypilot.modeld_v2.tools import stand_in_models
  folder = tmp_path_factory.mktemp("dm_artifacts")
  stand_in_models.write("dmonitoring", "tiny", str(folder / "dmonitoring_model.onnx"), seed=3)
  compile_model(str(folder / "dmonitoring_model.bin"), onnx=str(folder / "dmonitoring_model.onnx"), log=lambda s: None)
  for w, h in ((1344, 760), (1928, 1208)): compile_dm_warp(camerad_frame(w, h).spec, str(folder / f"dm_warp_{w}x{h}.bin"), log=lambda s: None)
  return str(folder)

@pytest.fixture(scope="session")
def stand_in_bundles(tmp_path_factory):
  """Each generation's tiny stand-in (seed 7) and compile_model's summary of its bundle (the capture's TinyJit and inputs among it), built
  the first time a test of the run asks for that generation."""
  from sunnypilot.modeld_v2.compile_modeld import compile_model
  from sunnypilot.modeld_v2.tools import stand_in_models
  tmp, cache = tmp_path_factory.mktemp("generations"), {}
  def get(generation: str) -> tuple[dict, dict]:
    if generation not in cache:
      files = stand_in_models.write(generation, "tiny", str(tmp / f"{generation}.onnx"), seed=7)["files"]
      cache[generation] = files, compile_model(str(tmp / f"{generation}.bin"), **files, log=lambda s: None)
    return cache[generation]
  return get

@pytest.fixture
def tmp_bundle(tmp_path):
  return str(tmp_path / "bundle.bin")

@pytest.fixture
def openpilot_prefix(monkeypatch):
  """A private msgq namespace per test: /dev/shm/msgq_<prefix>, removed afterwards."""
  import shutil
  import uuid
  prefix = f"sp_test_{uuid.uuid4().hex[:10]}"
  path = f"/dev/shm/msgq_{prefix}"
  os.makedirs(path)
  monkeypatch.setenv("OPENPILOT_PREFIX", prefix)
  yield prefix
  shutil.rmtree(path, ignore_errors=True)
