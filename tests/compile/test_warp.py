import os

import numpy as np
import pytest

from sunnypilot.modeld_v2.compile_warp import compile_warp, main
from sunnypilot.modeld_v2.model.camera_frame import NV12Frame, camerad_frame, parse_frame, parse_size, unpadded_frame
from sunnypilot.modeld_v2.runtime.loader import load_bundle

from conftest import realized, reference_warp, warp_in_fresh_process

MODEL_W, MODEL_H = 512, 256

def transforms(frame: NV12Frame, rng) -> dict[str, np.ndarray]:
  s = frame.width / MODEL_W
  out = {"identity": np.eye(3), "translation": np.array([[1, 0, 300.3], [0, 1, 200.7], [0, 0, 1]]),
         "scale": np.array([[s, 0, 0.3], [0, s, 0.3], [0, 0, 1]]),
         "outside": np.array([[3, 0.53, -2000], [0.21, 4, 5000], [0, 0, 1]]),  # mostly clamped to the borders
         "behind": np.array([[1, 0, 0], [0, 1, 0], [0, 0.001, -1]])}  # negative w: samples land far away and clamp
  jitter = np.array([[0.1, 0.1, 20], [0.1, 0.1, 20], [1e-4, 1e-4, 0.01]])
  for i in range(3):
    out[f"perspective{i}"] = np.array([[s, 0, frame.width / 4], [0, s, frame.height / 4], [0, 0, 1]]) + rng.standard_normal((3, 3)) * jitter
  return {k: v.astype(np.float32) for k, v in out.items()}

@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("warps")
  frames = {"camerad 1928x1208": camerad_frame(1928, 1208), "camerad 1344x760": camerad_frame(1344, 760), "unpadded 1344x760": unpadded_frame(1344, 760)}
  out = {}
  for name, frame in frames.items():
    paths = {split: str(tmp / f"{name.replace(' ', '_')}_{split}.bin") for split in (False, True)}
    for split, path in paths.items(): compile_warp(frame.spec, f"{MODEL_W}x{MODEL_H}", path, split_frames=split)
    out[name] = (frame, paths)
  return out

def test_camerad_layouts():
  assert camerad_frame(1928, 1208) == NV12Frame(1928, 1208, 2048, 1216, 608, 4804608)
  assert camerad_frame(1344, 760) == NV12Frame(1344, 760, 1408, 768, 384, 2428928)
  assert camerad_frame(1928, 1208).uv_offset == 2490368 and camerad_frame(1344, 760).uv_offset == 1081344
  assert parse_frame("1928,1208,2048,1216,608,4804608") == camerad_frame(1928, 1208) and parse_size("512x256") == (512, 256)

def test_planes_are_views_of_the_visible_rows():
  """Byte k of the buffer holds k (mod 256): the Y pixel (r, c) is byte r*stride + c, the UV pair (r, c) byte y_height*stride + r*stride + c."""
  frame = NV12Frame(6, 4, 8, 5, 3, 8 * 9)
  buf = (np.arange(frame.size) % 256).astype(np.uint8)
  y, uv = frame.planes(buf)
  rows, cols = np.mgrid[0:4, 0:6]
  assert (y == rows * 8 + cols).all() and (uv == 5 * 8 + rows[:2] * 8 + cols[:2]).all()
  y[:], uv[:] = 255, 254
  assert (buf == 255).sum() == 24 and (buf == 254).sum() == 12, "the planes are views: writing them writes the buffer"

@pytest.mark.parametrize("spec,message", [("1928,1208,1024,1216,608,4804608", "stride 1024 is smaller than the width"),
                                          ("1928,1208,2048,1216,608,1000", "size 1000 is smaller than the planes"),
                                          ("1927,1208,2048,1216,608,4804608", "must be even"), ("1928,1208,2048", "six integers"),
                                          ("1928,1208,2048,1000,608,4804608", "y_height 1000"), ("1928,1208,2048,1216,100,4804608", "uv_height 100")])
def test_impossible_geometry_is_rejected(spec, message):
  with pytest.raises(ValueError, match=message): parse_frame(spec)

def test_bad_flags_are_friendly(capsys, tmp_path):
  for argv, message in ((["--frame", "1,2", "--warp-to", "512x256", "--output", "x"], "six integers"),
                        (["--frame", camerad_frame(1344, 760).spec, "--warp-to", "512by256", "--output", "x"], "WIDTHxHEIGHT"),
                        (["--frame", camerad_frame(1344, 760).spec, "--warp-to", "512x256", "--output", str(tmp_path / "no" / "x.bin")], "does not exist")):
    with pytest.raises(SystemExit) as e: main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err

@pytest.mark.parametrize("camera", ["camerad 1928x1208", "camerad 1344x760", "unpadded 1344x760"])
def test_warp_matches_the_numpy_reference(bundles, camera):
  frame, paths = bundles[camera]
  packed, split = load_bundle(paths[False]), load_bundle(paths[True])
  assert packed.metadata["frame"] == frame.spec and packed.output_specs["warped"].shape == (2, 6, MODEL_H // 2, MODEL_W // 2)
  rng = np.random.default_rng(0)
  items = list(transforms(frame, rng).items())
  for (name_a, m_a), (name_b, m_b) in zip(items, items[1:] + items[:1]):
    bufs = rng.integers(0, 256, (2, frame.size), dtype=np.uint8)
    m_inv = np.stack([m_a, m_b])
    out = packed.run(input_frame=realized(bufs), M_inv=realized(m_inv)).numpy()
    out_split = split.run(frame=realized(bufs[0]), big_frame=realized(bufs[1]), M_inv=realized(m_inv)).numpy()
    assert out.shape == (2, 6, MODEL_H // 2, MODEL_W // 2) and out.dtype == np.uint8
    assert out.tobytes() == out_split.tobytes(), f"split-frames differs from packed for {name_a}/{name_b}"
    for cam, name in ((0, name_a), (1, name_b)):
      expected, ties = reference_warp(bufs[cam], frame, m_inv[cam])
      bad = (out[cam] != expected) & ~ties
      assert not bad.any(), f"{camera} {name}: {bad.sum()} pixels differ from the numpy reference, first at {np.argwhere(bad)[0]}"
      assert ties.mean() < 0.1, f"{name}: the tie exclusion must not hide the comparison"

def test_bundle_replays_in_a_fresh_process_without_compiler(bundles, tmp_path):
  frame, paths = bundles["camerad 1344x760"]
  rng = np.random.default_rng(3)
  bufs, m_inv = rng.integers(0, 256, (2, frame.size), dtype=np.uint8), np.stack(list(transforms(frame, rng).values())[5:7])
  got = warp_in_fresh_process(paths[True], bufs, m_inv, tmp_path).reshape(2, 6, MODEL_H // 2, MODEL_W // 2)
  for cam in range(2):
    expected, ties = reference_warp(bufs[cam], frame, m_inv[cam])
    assert not ((got[cam] != expected) & ~ties).any()
  assert os.path.getsize(paths[True]) < 1 << 20, "a warp bundle is kernels and index constants, not frames"

def test_preview_of_a_synthetic_road_scene(bundles, tmp_path):
  import zlib

  from sunnypilot.modeld_v2.model.calibration import SENSOR_CAMERAS, warp_matrices
  from sunnypilot.modeld_v2.replay.road_scene import road_scene
  from sunnypilot.modeld_v2.tools.preview import layout
  from sunnypilot.modeld_v2.tools.preview import main as preview_main
  frame, paths = bundles["camerad 1928x1208"]
  out = tmp_path / "preview.png"
  assert preview_main(["--warp", paths[True], "--output", str(out)]) == 0
  data = out.read_bytes()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
  boxes = layout(MODEL_H // 2, MODEL_W // 2)  # the planes lie between the labels' strips
  assert (width, height) == boxes["size"][3:1:-1]
  idat = data.index(b"IDAT")
  pixels = np.frombuffer(zlib.decompress(data[idat + 4:idat + 4 + int.from_bytes(data[idat - 4:idat], "big")]), np.uint8)
  image = pixels.reshape(height, width + 1)[:, 1:]
  # what the model sees of the road camera equals the numpy reference warp of the same synthetic frame
  road = road_scene(frame, SENSOR_CAMERAS["ar0231"][0].focal_length)
  planes, ties = reference_warp(road, frame, warp_matrices(SENSOR_CAMERAS["ar0231"])[0])
  box = lambda name: image[boxes[name][0]:boxes[name][0] + boxes[name][2], boxes[name][1]:boxes[name][1] + boxes[name][3]]
  y = box("road Y")
  assert ((y[0::2, 0::2] == planes[0]) | ties[0]).all() and ((box("road U") == planes[4]) | ties[4]).all()
  # and it shows a road: bright lane-line pixels below the horizon (model row 47.6), sky above it
  assert (y[60:] > 200).sum() > 100 and y[:40].mean() > y[60:].mean()

def test_any_transform_reads_inside_the_frame(bundles):
  """A zero, NaN, infinite or huge M_inv (a broken calibration) is defined: a non-finite coordinate reads pixel 0 of its plane, an infinite
  or huge one clamps to the image. Before, NaN coordinates became int32 INT_MIN gather indices."""
  frame, paths = bundles["camerad 1344x760"]
  run = load_bundle(paths[True]).run
  bufs = np.random.default_rng(4).integers(0, 256, (2, frame.size), dtype=np.uint8)
  for m in (np.zeros((3, 3)), np.full((3, 3), np.nan), np.full((3, 3), np.inf), np.full((3, 3), -np.inf), np.full((3, 3), 1e30),
            np.array([[1e30, 0, 0], [0, -1e30, 0], [0, 0, 1]]), np.array([[1, 0, 0], [0, 1, 0], [0, 0, np.nan]])):
    m_inv = np.stack([m, m]).astype(np.float32)
    out = run(frame=realized(bufs[0]), big_frame=realized(bufs[1]), M_inv=realized(m_inv)).numpy()
    for cam in range(2):
      with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        expected, _ = reference_warp(bufs[cam], frame, m_inv[cam], nan_to=0.0)
      assert out[cam].tobytes() == expected.tobytes(), f"M_inv {m.tolist()}: camera {cam} differs from the clamped reference"

def test_geometry_beyond_int32_indices_is_rejected(capsys):
  with pytest.raises(ValueError, match="int32 indices"): parse_frame("100000,100000,100000,100000,50000,15000000000")
  with pytest.raises(ValueError, match="int32 indices"): camerad_frame(100000, 100000)
  with pytest.raises(SystemExit) as e: main(["--frame", "100000,100000,100000,100000,50000,15000000000", "--warp-to", "512x256", "--output", "x.bin"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and "int32 indices" in err and "Traceback" not in err

def test_preview_errors_are_one_line_and_write_nothing(bundles, tmp_path, capsys):
  from sunnypilot.modeld_v2.tools.preview import main as preview_main
  frame, paths = bundles["camerad 1344x760"]
  corrupt, model, short = tmp_path / "corrupt.bin", tmp_path / "model.bin", tmp_path / "short.nv12"
  corrupt.write_bytes(open(paths[True], "rb").read()[:-10])
  short.write_bytes(b"\x00" * 1000)
  from sunnypilot.modeld_v2.format.bundle import read_parts, write_bundle
  (part, blob), = read_parts(paths[True])[0].values()  # the warp's part, in memory (a load keeps only kernel binaries)
  write_bundle(str(model), {"run": (part, bytes(blob))}, {"metadata": {"kind": "model"}})
  out = tmp_path / "p.png"
  cases = {"missing": (["--warp", str(tmp_path / "none.bin")], "cannot read"), "corrupt": (["--warp", str(corrupt)], "truncated"),
           "model": (["--warp", str(model)], "not a warp bundle"), "short frames": (["--warp", paths[True], "--road", str(short), "--wide", str(short)],
                                                                               "has 1,000 bytes"),
           "nan rpy": (["--warp", paths[True], "--rpy", "nan,inf,0"], "three finite numbers"),
           "output folder": (["--warp", paths[True], "--output", str(tmp_path / "no" / "p.png")], "does not exist")}
  for name, (argv, message) in cases.items():
    with pytest.raises(SystemExit) as e: preview_main(["--output", str(out)] + argv if "--output" not in argv else argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err.strip().splitlines()[-1] and "Traceback" not in err, f"{name}: {err}"
    assert not out.exists(), f"{name}: a PNG was written"
