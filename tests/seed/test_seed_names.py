"""The seed's names, from helpers.py (and compile_modeld's queue names at the seed's import path): each is the package's own thing under
the seed's spelling, checked against the package's own spelling."""
import functools
import json
import os

import pytest
from tinygrad import TinyJit

from sunnypilot.modeld_v2.compile.capture import capture, record_kernel_linear
from sunnypilot.modeld_v2.format.bundle import read_parts, write_bundle
from sunnypilot.modeld_v2.runtime.frame_fusion import frame_part
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
from sunnypilot.modeld_v2.runtime.loader import load_bundle, load_fused

from conftest import conv_net

def same(a, b) -> bool: return a.numpy().tobytes() == b.numpy().tobytes()

def test_the_seeds_import_path_keeps_the_queue_names():
  """sunnypilot's adapter imports the queue names from compile_modeld: they are input_queues' own."""
  from sunnypilot.modeld_v2 import compile_modeld
  from sunnypilot.modeld_v2.compile import input_queues
  for name in ("POLICY_INPUTS", "derive_frame_skip", "make_split_input_queues", "make_supercombo_input_queues"):
    assert getattr(compile_modeld, name) is getattr(input_queues, name), name

def test_seed_spelling_serialize_jit_gives_captures_json(tmp_bundle):
  """The seed's compile_warp: two calls inside record_kernel_linear, serialize_jit -> (header JSON, blob), PlainJit(*part)."""
  from sunnypilot.modeld_v2.helpers import PlainJit, serialize_jit
  fn, make = conv_net()
  run, inputs = TinyJit(fn, prune=True), make()
  with record_kernel_linear() as recorded:
    run(**inputs)
    run(**inputs)
  assert len(recorded) == 1 and not recorded.onetime
  part = serialize_jit(run, recorded[0], inputs)
  assert json.loads(json.dumps(part[0])) == part[0] and len(part[0]["calls"]) >= 2
  assert part == capture(*conv_net()).part, "the seed's spelling and capture write the same part"
  img = make()["img"]
  assert same(run(img=img), PlainJit(*part)(img=img))
  write_bundle(tmp_bundle, {"run": part}, {"metadata": {}})
  assert same(run(img=img), Replay(*read_parts(tmp_bundle)[0]["run"])(img=img))

def test_the_seeds_load_model_is_indexed_as_its_dict(native_artifacts):
  from sunnypilot.modeld_v2.helpers import load_model
  model = load_model(os.path.join(native_artifacts, "model.bin"))
  with pytest.raises(KeyError): model["fused"]  # the seed's dict keys only
  seed = {"run": model.run, "input_specs": model.input_specs, "output_specs": model.output_specs, "metadata": model.metadata}  # its load_model's
  for key in ("run", "input_specs", "output_specs", "metadata", "fused", "state_names", "other"):
    assert (key in model) == (key in seed) and model.get(key) is seed.get(key) and model.get(key, "absent") is seed.get(key, "absent"), key

def test_seed_spelling_is_the_fused_load(native_artifacts):
  from sunnypilot.modeld_v2.helpers import PlainJit, _Jit
  from sunnypilot.modeld_v2.helpers import load_model as seed_load_model
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  seed = seed_load_model(model, cache=False, extend=functools.partial(frame_part, warp))
  assert isinstance(seed["run"], PlainJit) and PlainJit is _Jit is Replay
  fused = load_fused(model, warp)
  assert seed["run"].part == fused.run.part and seed["input_specs"] == fused.input_specs and seed["output_specs"] == fused.output_specs
  assert seed["metadata"] == fused.metadata and seed_load_model(model)["metadata"] == load_bundle(model).metadata
  parts, extras = frame_part(warp, *read_parts(model))  # the seed's extension on its own: read the warp, fuse
  assert parts["run"][0] == seed["run"].part and extras["metadata"]["fused"]["warp"] == "warp_split.bin"
  with pytest.raises(TypeError, match="partial\\(frame_part"): seed_load_model(model, extend=lambda parts, extras: (parts, extras))

def test_seed_adapter_names(native_artifacts):
  from sunnypilot.modeld_v2.helpers import NativeTinygradAdapter
  adapter = NativeTinygradAdapter(os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin"))
  assert adapter.jits is adapter.bundle and adapter.run_model is adapter.bundle.run and adapter.input_queues is adapter.states
  assert sorted(adapter.states) == adapter.bundle.state_names
  assert adapter.output_slices == read_parts(os.path.join(native_artifacts, "model.bin"))[1]["metadata"]["output_slices"]

def test_helpers_holds_every_name_the_seed_calls():
  """The seed's code imports these from helpers.py: each is the package's own object."""
  from sunnypilot.modeld_v2 import helpers
  from sunnypilot.modeld_v2.runtime import frame_fusion
  assert helpers.frame_part is frame_part and helpers.pack_layout is frame_fusion.pack_layout and helpers.SPLIT_FRAMES == ("big_frame", "frame")
  assert helpers._Jit is helpers.PlainJit is Replay and callable(helpers.NativeTinygradAdapter.copy_frames)
