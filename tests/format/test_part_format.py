"""Part records: the JSON written by capture and fusion reads back into records that write the same JSON, field for field; the builder
keeps every blob range pointing at the same bytes; a bad field is a one-line ArtifactError naming it."""
import copy
import dataclasses
import hashlib
import os

import numpy as np
import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.capture import capture, capture_part
from sunnypilot.modeld_v2.format.bundle import read_bundle, read_parts, write_bundle
from sunnypilot.modeld_v2.format.part import BufferView, Call, InputArg, Part
from sunnypilot.modeld_v2.format.part_builder import PartBuilder
from sunnypilot.modeld_v2.runtime.frame_fusion import fuse
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay

from conftest import realized

def fixture_parts(native_artifacts: str) -> dict[str, tuple[dict, object]]:
  """The `run` part's JSON as it is on disk, of each fixture bundle and of the model fused with each warp."""
  parts, model = {}, read_parts(os.path.join(native_artifacts, "model.bin"))
  for name in ("model.bin", "warp_split.bin", "warp_packed.bin"):
    head, blob = read_bundle(os.path.join(native_artifacts, name))
    parts[name] = head["parts"]["run"]["header"], blob[slice(*head["parts"]["run"]["blob"])]
  for warp in ("warp_split.bin", "warp_packed.bin"):
    fused, blob = fuse(model, read_parts(os.path.join(native_artifacts, warp)))[0]["run"]
    parts[f"model+{warp}"] = fused.to_json(), blob
  return parts

def captured_parts(captured=capture) -> dict[str, tuple[dict | Part, bytes]]:
  """Captures with what the fixtures lack: one-time calls (weight preparation), a dict return, a returned input (by `captured`: capture
  gives the JSON, capture_part the record)."""
  rng = np.random.default_rng(3)
  weights = realized(rng.standard_normal((8, 8)).astype(np.float32))
  x = lambda: {"x": realized(rng.standard_normal((4, 8)).astype(np.float32))}
  return {"onetime": captured(lambda x: (x @ (weights * 2 + 1).contiguous()).relu(), x).part,
          "dict": captured(lambda x: {"y": (x * 2).realize(), "z": (x + 1).realize()}, x).part,
          "returns input": captured(lambda x: (x, (x - 1).realize()), x).part}

def test_json_round_trip_of_fixture_and_captured_parts(native_artifacts):
  parts = fixture_parts(native_artifacts) | captured_parts()
  assert any(h["onetime_calls"] for h, _ in parts.values()) and any(h["returns"]["kind"] == "dict" for h, _ in parts.values())
  for name, (header, blob) in parts.items():
    assert Part.from_json(header, blob).to_json() == header, name

def test_capture_part_gives_the_record_reading_its_json_gives():
  """The compilers write and summarize capture_part's record without reading its JSON back: it must be the record that read checks and builds."""
  for name, (record, blob) in captured_parts(capture_part).items():
    assert isinstance(record, Part) and Part.from_json(record.to_json(), blob) == record, name

def test_bundle_rewritten_from_records_is_byte_identical(native_artifacts, tmp_path):
  """The format is unchanged: a fixture bundle written again from its parts read as records and back is the same file, byte for byte."""
  for name in ("model.bin", "warp_split.bin"):
    src = os.path.join(native_artifacts, name)
    head, blob = read_bundle(src)
    parts = {k: (Part.from_json(p["header"], blob[p["blob"][0]:p["blob"][1]]).to_json(), blob[p["blob"][0]:p["blob"][1]]) for k, p in head["parts"].items()}
    write_bundle(out := str(tmp_path / name), parts, head["extras"], head["provenance"]["flags"])
    with open(src, "rb") as a, open(out, "rb") as b: assert hashlib.sha256(a.read()).digest() == hashlib.sha256(b.read()).digest(), name

def test_builder_include_keeps_every_range_on_its_bytes(native_artifacts):
  parts = fixture_parts(native_artifacts)
  first, second = (Part.from_json(*parts[k]) for k in ("model.bin", "warp_split.bin"))
  builder = PartBuilder()
  assert builder.include(first, parts["model.bin"][1]) == (0, 0)
  assert builder.include(second, parts["warp_split.bin"][1]) == (len(first.buffers), len(first.programs))
  blob = bytes(builder.blob())
  for part, (_, own) in ((first, parts["model.bin"]), (second, parts["warp_split.bin"])):
    start = len(parts["model.bin"][1]) if part is second else 0
    own = bytes(own)
    for p in part.programs:
      moved = builder.programs[part.programs.index(p) + (len(first.programs) if part is second else 0)]
      assert blob[moved.lib[0]:moved.lib[1]] == own[p.lib[0]:p.lib[1]] and moved.lib[0] == p.lib[0] + start
    for i, b in enumerate(part.buffers):
      moved = builder.buffers[i + (len(first.buffers) if part is second else 0)]
      assert (moved.init is None) == (b.init is None) and (b.init is None or blob[moved.init[0]:moved.init[1]] == own[b.init[0]:b.init[1]])

def test_call_relocated_moves_buffers_and_programs_and_binds_slots():
  call = Call("program", (InputArg(0), BufferView(2, 16, 8, "dtypes.float"), InputArg(1)), 3)
  moved = call.relocated(10, 5, {0: BufferView(0, 0, 4, "dtypes.uchar"), 1: InputArg(7)})
  assert moved == Call("program", (BufferView(0, 0, 4, "dtypes.uchar"), BufferView(12, 16, 8, "dtypes.float"), InputArg(7)), 8)
  assert Call("copy", (BufferView(1, 0, 4, "dtypes.uchar"), InputArg(0))).relocated(3, 9, {0: InputArg(2)}).program is None

@pytest.mark.parametrize("path,value,message", [
  (("buffers", 0, "nbytes"), "1", "buffer nbytes is str '1'"),
  (("programs", 0, "global_size"), [0], "global_size [0] is not 1 to 3 sizes"),
  (("inputs", 0, "slot"), 5, "input slots are not 0..n-1 in order"),
  (("calls", 0, "kind"), "jump", "unknown call kind 'jump'"),
  (("calls", 0, "program"), 99, "call of program 99 of"),
  (("returns", "kind"), "set", "unknown return kind 'set'"),
  (("check",), {"seed": -1, "outputs": {}}, "check seed -1 is not a 63-bit seed"),
  (("programs", 0, "estimates"), {"ops": "many"}, "estimate ops is str"),
])
def test_a_bad_field_is_one_line_naming_it(native_artifacts, path, value, message):
  header, blob = fixture_parts(native_artifacts)["warp_split.bin"]
  header = copy.deepcopy(header)
  target = header
  for key in path[:-1]: target = target[key]
  target[path[-1]] = value
  with pytest.raises(ArtifactError) as e: Part.from_json(header, blob)
  assert message in str(e.value) and "\n" not in str(e.value), str(e.value)

def test_one_binary_given_buffers_of_other_sizes_is_a_program_per_signature(tmp_path):
  """tinygrad compiles one binary for `a[:8] * 2` (a of 16 floats) and `b * 2` (b of 8): the part keeps a program per signature, sharing the
  stored binary, so the loader checks each call against the extent its own kernel was built for (merged, the second call's 8-float input
  was checked against the first's 16 and the bundle refused at load). 138fb4a names the second kernel apart (E_2_4n1): its stored ELF
  object defines that name, so it is a binary of its own."""
  fn = lambda a, b: ((a[:8] * 2).contiguous() + (b * 2).contiguous()).realize()
  inputs = lambda: {"a": realized(np.arange(16, dtype=np.float32)), "b": realized(np.arange(8, dtype=np.float32))}
  part, blob = capture_part(fn, inputs).part
  first, second = part.calls[0].program, part.calls[1].program
  named_alike = part.programs[first].name == part.programs[second].name
  assert first != second and (part.programs[first].lib == part.programs[second].lib) == named_alike, "two programs, one stored binary per name"
  assert [p.shape for p in part.programs[first].signature] == [(8,), (16,)] and [p.shape for p in part.programs[second].signature] == [(8,), (8,)]
  write_bundle(path := str(tmp_path / "b.bin"), {"run": (part, blob)}, {})
  (loaded, loaded_blob), = read_parts(path)[0].values()
  assert loaded == part
  out = Replay(loaded, loaded_blob)(**inputs()).numpy()
  np.testing.assert_equal(out, np.arange(8) * 2 + np.arange(8) * 2)

def test_a_bundle_the_loader_would_refuse_is_never_written(tmp_path):
  """write_bundle reads the written bytes back through the loader's checks before the file takes its name: a part whose call passes an
  argument smaller than its kernel's view is refused with one line, and nothing is left behind."""
  part, blob = capture_part(lambda a: (a * 2).realize(), lambda: {"a": realized(np.arange(8, dtype=np.float32))}).part
  program = part.programs[0]
  small = dataclasses.replace(program, signature=tuple(p._replace(shape=(16,)) for p in program.signature))
  bad = dataclasses.replace(part, programs=(small,))
  with pytest.raises(ArtifactError, match=r"^the bundle as written would be refused at load, so it was not written: .*b\.bin: malformed part 'run': "
                     r"program E_\w+ reads or writes 64 bytes of argument \d, which has 32$"):
    write_bundle(str(tmp_path / "b.bin"), {"run": (bad, blob)}, {})
  assert os.listdir(tmp_path) == []
