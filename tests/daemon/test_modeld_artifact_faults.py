"""modeld and the bundles in its --artifacts folder: refused at start in one line, crafted warps skipped, stray files larger than
memory, bundles of another kind, a model broken for a moment, a load that fails. Each fault test reproduces a failure seen before the fix."""
import hashlib
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError

import modeld_daemon
from conftest import ROOT
from modeld_daemon import BIG_FRAME, FRAME, Daemon

artifacts = modeld_daemon.artifacts  # the daemon tests' fixture, by name

def test_bad_artifacts_fail_at_start_in_one_line(artifacts, tmp_path, monkeypatch):
  """Checked before waiting for camerad: a model for another device, no warp at all, no model."""
  from sunnypilot.modeld_v2.format import bundle
  from sunnypilot.modeld_v2.format.bundle import read_parts, write_bundle
  qcom, no_warp, empty = (tmp_path / n for n in ("qcom", "no_warp", "empty"))
  for folder in (qcom, no_warp, empty): folder.mkdir()
  parts, extras = read_parts(os.path.join(artifacts, "model.bin"))
  real = bundle.provenance
  monkeypatch.setattr(bundle, "provenance", lambda device, flags=None: real(device, flags) | {"device": "QCOM"})
  write_bundle(str(qcom / "model.bin"), {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras)
  monkeypatch.undo()
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), qcom / "warp_split.bin")
  shutil.copy(os.path.join(artifacts, "model.bin"), no_warp / "model.bin")
  for folder, message in ((qcom, "built for device QCOM, this process runs on CPU"), (no_warp, "no warp bundle for this device"),
                          (empty, "model.bin not found")):
    out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.modeld", "--artifacts", str(folder)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and message in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr

def rewrite_header(src: str, dst: str, edit) -> None:
  """A copy of bundle `src` at `dst` with its JSON header text passed through `edit`, the hash recomputed: a crafted file that passes
  the integrity check."""
  from sunnypilot.modeld_v2.format.bundle import PREAMBLE
  data = open(src, "rb").read()
  magic, version, head_len, _ = PREAMBLE.unpack_from(data)
  body = data[PREAMBLE.size:]
  head = edit(body[:head_len].decode()).encode()
  new_body = head + body[head_len:]
  open(dst, "wb").write(PREAMBLE.pack(magic, version, len(head), hashlib.sha256(new_body).digest()) + new_body)

def crafted_warps(artifacts: str, folder) -> dict[str, str]:
  """{file name: what is wrong} for warps built from the good 1344x760 one; and the good one as warp_split.bin."""
  good = os.path.join(artifacts, "warp_split.bin")
  shutil.copy(good, folder / "warp_split.bin")
  edits = {
    "deep.bin": ("deeply nested JSON", lambda h: h.replace('"metadata":{', '"metadata":{"deep":' + "[" * 100_000 + "]" * 100_000 + ",", 1)),
    "huge.bin": ("a 5000-digit integer", lambda h: h.replace('"metadata":{', '"metadata":{"n":' + "9" * 5000 + ",", 1)),
    "frame_short.bin": ("a malformed frame", lambda h: h.replace('"frame":"1344,760,1408,768,384,2428928"', '"frame":"1344,760"')),
    "frame_number.bin": ("a frame that is not a string", lambda h: h.replace('"frame":"1344,760,1408,768,384,2428928"', '"frame":7')),
    "frame_inputs.bin": ("frame inputs of another size", lambda h: h.replace('[[2428928],"|u1"', '[[2428929],"|u1"')),
    "small.bin": ("made for a 256x128 model", lambda h: h.replace('"warped":[[2,6,128,256]', '"warped":[[2,6,64,128]')),
    "no_meta.bin": ("no metadata", lambda h: h.replace('"metadata":', '"other":', 1)),
  }
  for name, (_, edit) in edits.items():
    rewrite_header(good, str(folder / name), edit)
    assert open(folder / name, "rb").read() != open(good, "rb").read(), f"{name}: the edit changed nothing"
  os.mkfifo(folder / "fifo.bin")  # reading it would block for ever
  return {name: why for name, (why, _) in edits.items()} | {"fifo.bin": "a FIFO"}

def test_warp_discovery_skips_every_crafted_warp_in_one_line(artifacts, tmp_path):
  from sunnypilot.modeld_v2.daemon.artifacts import warp_bundles
  crafted = crafted_warps(artifacts, tmp_path)
  lines = []
  found = warp_bundles(str(tmp_path), report=lines.append, new_img=[2, 6, 128, 256])
  assert [os.path.basename(p) for p, _ in found] == ["warp_split.bin"], lines
  for name, why in crafted.items():
    assert sum(f"/{name}: " in line for line in lines) == 1, f"{name} ({why}): {lines}"
  assert len(lines) == len(crafted) and all(line.startswith("skipping ") for line in lines), lines

def test_modeld_with_crafted_warps_runs_and_waits_on_a_geometry_without_a_fitting_warp(artifacts, tmp_path, openpilot_prefix):
  """Deep JSON or a huge integer killed modeld at start; a malformed frame or a warp for another model size crashed it when the camera
  connected. Now each is skipped with one line, at start and on geometry changes alike."""
  crafted = crafted_warps(artifacts, tmp_path)
  shutil.copy(os.path.join(artifacts, "model.bin"), tmp_path / "model.bin")
  big = tmp_path / "warp_big_small.bin"  # the only 1928x1208 warp makes planes for another model size
  rewrite_header(os.path.join(artifacts, "warp_big_split.bin"), str(big), lambda h: h.replace('"warped":[[2,6,128,256]', '"warped":[[2,6,64,128]'))
  daemon = Daemon(str(tmp_path))
  daemon.exchange(range(5))
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("no warp bundle", after=seen)
  seen = len(daemon.lines)
  daemon.restart_camerad(FRAME)
  daemon.wait_for_line("camera geometry changed to 1344x760", after=seen)
  daemon.exchange(range(200, 205))
  assert daemon.stop() == 0
  for name in [*crafted, big.name]: assert sum(f"/{name}: " in line and "skipping" in line for line in daemon.lines) == 1, f"{name}: {daemon.lines}"

def test_a_stray_file_larger_than_memory_costs_its_first_bytes(artifacts, tmp_path):
  """A 12 GB sparse dump.bin in the folder was read and hashed whole before its magic was checked (71 s, 12.7 GB RSS). Now the magic and
  the sizes the header declares are checked first: files larger than this machine's memory are skipped with one line each."""
  from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts, warp_bundles
  from sunnypilot.modeld_v2.format.bundle import read_bundle, read_header
  huge = 64 << 30  # more than the 24 GiB of memory CI machines have: a whole read would fail, not pass slowly
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), tmp_path / "warp_split.bin")
  with open(tmp_path / "dump.bin", "wb") as f: f.truncate(huge)  # sparse: no disk used
  with open(tmp_path / "padded.bin", "wb") as f:  # a real warp's bytes, then a huge sparse tail its header does not declare
    f.write(open(tmp_path / "warp_split.bin", "rb").read())
    f.truncate(huge)
  from sunnypilot.modeld_v2.format.bundle import FORMAT_VERSION, MAGIC, PREAMBLE
  with open(tmp_path / "long_header.bin", "wb") as f:  # the magic, then a header as long as the whole file
    f.write(PREAMBLE.pack(MAGIC, FORMAT_VERSION, huge - PREAMBLE.size, bytes(32)))
    f.truncate(huge)
  lines = []
  found = warp_bundles(str(tmp_path), report=lines.append)
  assert [os.path.basename(p) for p, _ in found] == ["warp_split.bin"], lines
  assert sum("dump.bin: not a modeld_v2 bundle (magic" in line for line in lines) == 1, lines
  assert sum("padded.bin: the header declares a" in line and f"the file has {huge:,} bytes" in line for line in lines) == 1, lines
  assert sum(f"long_header.bin: a {huge - PREAMBLE.size:,} byte header, more than" in line for line in lines) == 1, lines
  for name in ("dump.bin", "padded.bin", "long_header.bin"):
    with pytest.raises(ArtifactError): read_bundle(str(tmp_path / name))
    with pytest.raises(ArtifactError): read_header(str(tmp_path / name))
  os.replace(tmp_path / "dump.bin", tmp_path / "model.bin")
  with pytest.raises(ArtifactError, match="model.bin: not a modeld_v2 bundle"): check_artifacts(str(tmp_path))

def test_other_bundles_and_bad_folders_are_named_as_what_they_are(artifacts, tmp_path):
  """A driving model that is not model.bin was skipped without a line; a missing --artifacts folder, or a file given as one, was reported as
  'model.bin not found'."""
  from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts, warp_bundles
  shutil.copy(os.path.join(artifacts, "warp_split.bin"), tmp_path / "warp_split.bin")
  shutil.copy(os.path.join(artifacts, "model.bin"), tmp_path / "other_model.bin")
  lines = []
  assert len(warp_bundles(str(tmp_path), report=lines.append)) == 1
  assert lines == [f"skipping {tmp_path / 'other_model.bin'}: a model bundle, not a warp (only model.bin is read as the model)"], lines
  with pytest.raises(ArtifactError, match=r"^--artifacts .*/missing: no such folder \(it holds model.bin and warp bundles\)$"):
    check_artifacts(str(tmp_path / "missing"))
  with pytest.raises(ArtifactError, match=r"^--artifacts .*/warp_split.bin: is a file, not a folder"): check_artifacts(str(tmp_path / "warp_split.bin"))

def test_the_no_warp_hint_is_a_command_that_builds_the_warp(artifacts, tmp_path):
  """modeld's hint printed `<uv_height>`; it is camerad's layout, so the whole --frame is known: the command builds a warp modeld then takes."""
  from sunnypilot.modeld_v2.daemon.artifacts import find_warp, warp_command
  from sunnypilot.modeld_v2.daemon.camera_sync import live_frame
  client = SimpleNamespace(width=BIG_FRAME.width, height=BIG_FRAME.height, stride=BIG_FRAME.stride, uv_offset=BIG_FRAME.uv_offset, buffer_len=BIG_FRAME.size)
  live = live_frame(client)  # what modeld knows of the buffers: no uv_height
  assert live.uv_height != BIG_FRAME.uv_height
  lines = []
  assert find_warp(str(tmp_path), live, live, report=lines.append) is None
  assert warp_command(live) in lines[-1] and f"--frame {BIG_FRAME.spec} --warp-to 512x256 --split-frames" in warp_command(live), lines

def overwrite_in_place(path, data: bytes) -> None:
  """Rewrite a file's bytes in place (not renamed): what an editor or a careless copy does; its inode stays."""
  with open(path, "r+b") as f:
    f.write(data)
    f.truncate()

def test_a_model_broken_for_a_moment_refuses_the_pair_not_the_warp(artifacts, tmp_path, openpilot_prefix):
  """model.bin overwritten in place while the camera geometry changed put the good warp on a refused list for good: that camera size was
  never served again until a restart, and the log said to build the warp that was there. Now the pair is refused, and tried again once
  one of its files changes."""
  for name in ("model.bin", "warp_split.bin", "warp_big_split.bin"): shutil.copy(os.path.join(artifacts, name), tmp_path / name)
  good = (tmp_path / "model.bin").read_bytes()
  daemon = Daemon(str(tmp_path))
  daemon.exchange(range(5))
  overwrite_in_place(tmp_path / "model.bin", good[:len(good) // 2])  # broken: truncated mid-write
  seen = len(daemon.lines)
  daemon.restart_camerad(BIG_FRAME)
  daemon.wait_for_line("cannot load", after=seen)
  daemon.wait_for_line("failed to load with model.bin", after=seen)  # the retry sees the same files: said once, not tried again
  overwrite_in_place(tmp_path / "model.bin", good)
  daemon.wait_for_line("running:", after=seen)
  daemon.exchange(range(100, 105))
  assert daemon.stop() == 0
  after = "".join(daemon.lines[seen:])
  assert after.count("cannot load") == 1 and "no warp bundle" not in after and after.count("running:") == 1, after

def test_a_load_that_fails_with_any_exception_closes_its_adapter(artifacts, monkeypatch):
  """prepare() closed the adapter it made only on an ArtifactError: a device error in the warm-up (or Ctrl-C) left it loaded, its memory
  (and on CUDA its host registrations) held by nothing that would close it. Now whatever is raised closes it, and is raised as it was."""
  from sunnypilot.modeld_v2 import modeld
  from sunnypilot.modeld_v2.common.logs import Episodes
  from sunnypilot.modeld_v2.daemon.camera_sync import Geometry
  from sunnypilot.modeld_v2.daemon.frame_daemon import FrameDaemon
  from sunnypilot.modeld_v2.daemon.model_sets import DEFAULT_SET
  from sunnypilot.modeld_v2.runtime.model_runner import ModelRunner
  made, closed, close = [], [], ModelRunner.close
  def closing(self) -> None:
    closed.append(self)
    close(self)
  def broken(self, prepared) -> None:
    made.append(prepared.adapter)
    raise RuntimeError("CUDA error 700 in the warm-up")
  monkeypatch.setattr(ModelRunner, "close", closing)
  monkeypatch.setattr(FrameDaemon, "warm_up", broken)
  episodes = Episodes(print)
  daemon = FrameDaemon(modeld.ModelD(episodes), episodes, artifacts)
  with pytest.raises(RuntimeError, match="CUDA error 700"): daemon.prepare(daemon.sets.open(DEFAULT_SET), Geometry((0,), FRAME, None))
  assert len(made) == 1 and closed == made
