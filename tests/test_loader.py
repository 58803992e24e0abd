import builtins
import functools
import os
import shutil

import numpy as np
import pytest

from sunnypilot.modeld_v2 import loader
from sunnypilot.modeld_v2.bundle import ArtifactError, read_parts, read_verified, write_bundle
from sunnypilot.modeld_v2.frame_fusion import frame_part, fuse
from sunnypilot.modeld_v2.loader import cache_entry, fused_key, load_fused, load_model
from sunnypilot.modeld_v2.model_adapters import NativeTinygradAdapter
from sunnypilot.modeld_v2.warp import camerad_frame

from conftest import run_python

FRAME = camerad_frame(1344, 760)

def drive(adapter, steps: int = 3, seed: int = 4) -> list[bytes]:
  rng, outs = np.random.default_rng(seed), []
  for step in range(steps):
    adapter.numpy_inputs["tfm"][:] = np.stack([np.eye(3)] * 2) + rng.standard_normal((2, 3, 3)) * [[0.01, 0.01, 5], [0.01, 0.01, 5], [0, 0, 0]]
    adapter.numpy_inputs["desire"][:] = np.eye(8)[step % 8]
    frames = rng.integers(0, 256, (2, FRAME.size), dtype=np.uint8)
    adapter.copy_frames({"img": frames[0], "big_img": frames[1]})
    adapter.run()
    outs.append(adapter.output_array().tobytes())
  return outs

def relabelled(src: str, dst: str, note: str) -> str:
  """The same bundle with other metadata: other content, so another content hash and cache key."""
  parts, extras = read_parts(src)
  write_bundle(dst, {k: (h, bytes(b)) for k, (h, b) in parts.items()}, extras | {"metadata": extras["metadata"] | {"note": note}})
  return dst

@pytest.fixture
def cache(tmp_path, monkeypatch) -> str:
  folder = str(tmp_path / "cache")
  monkeypatch.setenv("MODELD_V2_CACHE", folder)
  return folder

def key_of(model: str, warp: str) -> dict:
  """The cache key of a model and warp file, from their verified content hashes."""
  return fused_key(read_verified(model)[2], read_verified(warp)[2], "CPU")

def entries(folder: str) -> list[str]: return sorted(os.listdir(folder)) if os.path.isdir(folder) else []

def test_cache_hit_equals_miss_and_content_changes_invalidate_it(native_artifacts, tmp_path, cache, monkeypatch):
  model, warp = str(tmp_path / "model.bin"), str(tmp_path / "warp.bin")
  shutil.copy(os.path.join(native_artifacts, "model.bin"), model), shutil.copy(os.path.join(native_artifacts, "warp_packed.bin"), warp)
  miss = drive(NativeTinygradAdapter(model, warp))
  assert len(entries(cache)) == 1 and (os.stat(cache).st_mode & 0o777) == 0o700, "the cache folder is made for this user alone"
  assert drive(NativeTinygradAdapter(model, warp)) == miss and len(entries(cache)) == 1, "a hit replays the same part"
  assert drive(NativeTinygradAdapter(model, warp, cache=False)) == miss
  shutil.copy(os.path.join(native_artifacts, "warp_split.bin"), warp)  # another warp at the same path: a new entry, following the file
  assert NativeTinygradAdapter(model, warp).split and len(entries(cache)) == 2
  relabelled(os.path.join(native_artifacts, "model.bin"), model, "v2")
  NativeTinygradAdapter(model, warp)
  monkeypatch.setattr(loader, "MAX_CACHE_ENTRIES", 2)
  shutil.copy(os.path.join(native_artifacts, "warp_packed.bin"), warp)
  assert not NativeTinygradAdapter(model, warp).split, "the packed warp again"
  assert len(entries(cache)) == 2, "the cache keeps the newest entries only"

def test_seed_spelling_is_the_fused_load(native_artifacts, cache):
  from sunnypilot.modeld_v2.helpers import PlainJit, _Jit
  from sunnypilot.modeld_v2.helpers import load_model as seed_load_model
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  seed = seed_load_model(model, cache=False, extend=functools.partial(frame_part, warp))
  assert isinstance(seed["run"], PlainJit) and PlainJit is _Jit
  assert seed["run"].part == load_fused(model, warp, cache=False)["run"].part
  parts, extras = frame_part(warp, *read_parts(model))  # the seed's extension on its own: read the warp, fuse
  assert parts["run"][0] == seed["run"].part and extras["metadata"]["fused"]["warp"] == "warp_split.bin"
  with pytest.raises(TypeError, match="partial\\(frame_part"): load_model(model, extend=lambda parts, extras: (parts, extras))

def test_fuse_is_pure(native_artifacts, monkeypatch):
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  bundles = read_parts(model), read_parts(warp)
  def no_files(*args, **kwargs): raise AssertionError(f"fuse touched a file: {args}")
  with monkeypatch.context() as m:
    for target, name in ((builtins, "open"), (os, "stat"), (os, "listdir"), (os, "scandir")): m.setattr(target, name, no_files)
    parts, extras = fuse(*bundles, "warp_split.bin")
  assert parts["run"][0] == load_fused(model, warp, cache=False)["run"].part

@pytest.mark.skipif(os.getuid() != 0, reason="handing the folder to another user needs root")
def test_cache_folder_others_can_write_is_not_used(native_artifacts, cache, capfd):
  os.makedirs(cache, mode=0o777)
  os.chmod(cache, 0o777)
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  load_fused(model, warp)
  err = capfd.readouterr().err
  assert "not using the load cache" in err and "writable by no one else" in err and entries(cache) == []
  os.chmod(cache, 0o700)
  os.chown(cache, 65534, 65534)  # another user's folder (nobody)
  load_fused(model, warp)
  assert "must belong to this user" in capfd.readouterr().err and entries(cache) == []

def test_planted_entry_for_other_bundles_is_not_loaded(native_artifacts, tmp_path, cache, capfd):
  """Another user's (or an old) fused part put under this key's file name is rebuilt, never run."""
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  other = relabelled(model, str(tmp_path / "other.bin"), "another model")
  load_fused(other, warp)
  planted = entries(cache)[0]
  target = cache_entry(cache, key_of(model, warp))
  os.rename(os.path.join(cache, planted), target)
  got = load_fused(model, warp)
  assert "not built from these bundles" in capfd.readouterr().err
  assert got["metadata"]["fused"]["key"]["model"] == key_of(model, warp)["model"] and "note" not in got["metadata"]
  assert read_parts(target)[1]["metadata"]["fused"]["key"] == key_of(model, warp), "the entry was rebuilt for these bundles"

def test_unreadable_entry_is_rebuilt_and_never_a_temp_file(native_artifacts, cache, capfd):
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  target = cache_entry(cache, key_of(model, warp))
  os.makedirs(target)  # a folder where the entry should be: it cannot be read, nor replaced
  expected = load_fused(model, warp, cache=False)["run"].part
  assert load_fused(model, warp)["run"].part == expected
  err = capfd.readouterr().err
  assert "ignoring a bad cache entry" in err and "cannot write the load cache" in err
  assert [e for e in entries(cache) if ".tmp" in e] == [], "a failed write leaves no temporary file"

def test_load_needs_no_writable_home(native_artifacts, tmp_path):
  out = run_python(f"""
from sunnypilot.modeld_v2.loader import load_fused
print(load_fused({os.path.join(native_artifacts, 'model.bin')!r}, {os.path.join(native_artifacts, 'warp_split.bin')!r})["run"].call_kinds[0])
""", env={"HOME": "/dev/null", "XDG_CACHE_HOME": "/dev/null/cache", "MODELD_V2_CACHE": str(tmp_path / "cache")})
  assert out.strip() == "COPY"

def test_fused_load_for_another_device(native_artifacts, cache):
  """The device reaches both reads: a CPU process loads the fused pair for NULL (mock execution), with the adapter too."""
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  fused = load_fused(model, warp, device="NULL", allow_device=True)
  assert fused["run"].device == "NULL" and fused["run"].call_kinds[0] == "COPY"
  adapter = NativeTinygradAdapter(model, warp, device="NULL", allow_device=True)
  frames = np.zeros((2, FRAME.size), np.uint8)
  for _ in range(2):  # NULL runs no kernels and holds no data: the calls go through, there is nothing to read back
    adapter.copy_frames({"img": frames[0], "big_img": frames[1]})
    adapter.run()
  assert adapter.model_device == "NULL" and adapter.run_model.bindings_made == len(adapter.run_model.inputs)

def test_the_key_is_the_hash_of_the_bytes_read(native_artifacts, tmp_path, cache, monkeypatch):
  """A model.bin replaced while a load reads it (a compile finishing at that moment) is fused and cached under its own hash: a later load
  of the old bytes gets the old model, never the new one stored under the old key."""
  from sunnypilot.modeld_v2 import bundle
  model, old_copy, warp = str(tmp_path / "model.bin"), str(tmp_path / "old.bin"), os.path.join(native_artifacts, "warp_split.bin")
  shutil.copy(os.path.join(native_artifacts, "model.bin"), model), shutil.copy(model, old_copy)
  new = relabelled(model, str(tmp_path / "new.bin"), "new")
  real_open, swapped = bundle.open_regular, []
  def swap_then_open(path):
    if path == model and not swapped: swapped.append(os.replace(new, model))  # the swap lands while the load is reading the model
    return real_open(path)
  monkeypatch.setattr(bundle, "open_regular", swap_then_open)
  got = load_fused(model, warp)
  assert swapped and got["metadata"].get("note") == "new" and got["metadata"]["fused"]["key"] == key_of(model, warp)
  monkeypatch.undo()
  assert "note" not in load_fused(old_copy, warp)["metadata"], "the old bytes load the old model"
  assert load_fused(model, warp)["metadata"].get("note") == "new"

def test_truncated_or_changed_model_fails_on_a_cache_hit(native_artifacts, tmp_path, cache):
  """A hit used to read only the model's preamble: a truncated model.bin still loaded, and a reload for another camera did not check it."""
  model = str(tmp_path / "model.bin")
  shutil.copy(os.path.join(native_artifacts, "model.bin"), model)
  warps = [os.path.join(native_artifacts, w) for w in ("warp_split.bin", "warp_packed.bin")]
  for warp in warps: load_fused(model, warp)
  assert len(entries(cache)) == 2
  data = open(model, "rb").read()
  open(model, "wb").write(data[:-100])
  for warp in warps:
    with pytest.raises(ArtifactError, match="truncated"): load_fused(model, warp)
  edited = bytearray(data)
  edited[-5] ^= 1
  open(model, "wb").write(edited)
  for warp in warps:
    with pytest.raises(ArtifactError, match="content hash mismatch"): load_fused(model, warp)
