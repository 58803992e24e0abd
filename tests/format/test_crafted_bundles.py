"""Bundles crafted with a valid content hash (write_bundle recomputes it) over a hostile header or blob: every one is an ArtifactError in
`inspect`, `verify` and `load_bundle` (one line, exit 2 from the CLI), never another exception, a hang, a runaway allocation or a segfault."""
import copy
import hashlib
import json
import os
import re
import threading

import numpy as np
import pytest

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.capture import capture, verify_part
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.format.part import MAX_BUFFER_BYTES, MAX_CPU_CORES
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools.inspect_bundle import main as inspect_main

from conftest import conv_net

@pytest.fixture(scope="module")
def part():
  fn, make = conv_net(3)
  return capture(fn, make).part

def rejected_everywhere(path: str, capsys, message: str) -> None:
  """inspect and verify exit 2 with one line naming the problem; load_bundle raises an ArtifactError."""
  for command in ("inspect", "verify"):
    assert inspect_main([command, path]) == 2, command
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and "Traceback" not in err, f"{command}: {err}"
  with pytest.raises(ArtifactError, match=re.escape(message)): load_bundle(path)

def crafted(path: str, header: dict, blob: bytes, extras: dict | None = None) -> str:
  """A bundle of one part with a recomputed content hash, whatever its header holds (written byte by byte, as an attacker would)."""
  head = {"provenance": bundle.provenance("CPU"), "parts": {"run": {"header": header, "blob": [0, len(blob)]}}, "extras": extras or {}}
  data = json.dumps(head).encode()
  with open(path, "wb") as f: f.write(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + blob).digest()) + data + blob)
  return path

def test_the_untouched_part_passes(part, tmp_bundle, capsys):
  crafted(tmp_bundle, *part)
  assert inspect_main(["verify", tmp_bundle]) == 0 and "verified" in capsys.readouterr().out

def test_kernel_bytes_overwritten(part, tmp_bundle, capsys):
  """The CPU runtime would run bytes without the ELF magic as machine code: a jump into garbage."""
  header, blob = part
  lib = header["programs"][0]["lib"]
  for filler in (b"\x00", b"\xcc"):
    data = bytearray(blob)
    data[lib[0]:lib[1]] = filler * (lib[1] - lib[0])
    rejected_everywhere(crafted(tmp_bundle, header, bytes(data)), capsys, "not an ELF object")

def test_a_cpu_kernel_recording_another_devices_target(part, tmp_bundle, capsys):
  """The part's device picks the runtime: a program of a CPU part that records a CUDA or NULL target, its binary pointed at weights, is still
  checked as a CPU binary (it was run as machine code: a SIGSEGV)."""
  header = copy.deepcopy(part[0])
  init = next(b["init"] for b in header["buffers"] if "init" in b)
  for target in ("CUDA::sm_80", "NULL::"):
    header["programs"][0]["target"], header["programs"][0]["lib"] = target, init
    rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, "not an ELF object")

def test_all_programs_on_one_binary(part, tmp_bundle, capsys):
  header = copy.deepcopy(part[0])
  assert len(header["programs"]) > 1
  for p in header["programs"]: p["lib"] = list(header["programs"][0]["lib"])
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, f"defines no function {header['programs'][1]['name']!r}")

def test_program_name_that_is_not_its_kernels_symbol(part, tmp_bundle, capsys):
  header = copy.deepcopy(part[0])
  header["programs"][0]["name"] = "E_not_this_kernel"
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, "defines no function 'E_not_this_kernel'")

def test_argument_count_that_is_not_the_signatures(part, tmp_bundle, capsys):
  header = copy.deepcopy(part[0])
  header["programs"][0]["globals"] = header["programs"][0]["globals"][:-1]
  n = len(header["programs"][0]["signature"])
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, f"passes {n - 1} buffers to a kernel whose signature takes {n}")

def test_buffer_shrunk_below_its_use(part, tmp_bundle, capsys):
  """Buffer and views shrunk consistently (every view inside its buffer), below what the kernel's signature reads or writes."""
  header = copy.deepcopy(part[0])
  call = next(c for c in header["calls"] if c["kind"] == "program")
  arg = next(a for a in call["args"] if "buffer" in a and "init" not in header["buffers"][a["buffer"]])
  for c in header["calls"]:
    for a in c["args"]:
      if a.get("buffer") == arg["buffer"]: a["nbytes"], a["offset"] = 4, 0
  for r in header["returns"]["tensors"]:
    if r.get("buffer") == arg["buffer"]: r.update(nbytes=4, offset=0, shape=[1])
  header["buffers"][arg["buffer"]]["nbytes"] = 4
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, "which has 4")

@pytest.mark.parametrize("field,value,message", [("global_size", [10**10, 1, 1], "global_size"), ("global_size", [0, 1, 1], "global_size"),
                                                  ("local_size", [1024, 1024, 1], "local_size"), ("local_size", [], "local_size")])
def test_launch_sizes_are_bounded(part, tmp_bundle, capsys, field, value, message):
  """A global size of 10^10 would be 10^10 prepared calls on CPU with core_id (load never finishes, memory grows without end)."""
  header = copy.deepcopy(part[0])
  p = header["programs"][0]
  p[field] = value
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, message)

def test_core_count_is_bounded(part, tmp_bundle, capsys):
  header = copy.deepcopy(part[0])
  p = header["programs"][0]
  p["global_size"], p["runtime_vars"] = [MAX_CPU_CORES + 1, 1, 1], [["core_id", len(p["signature"]), "dtypes.int", 0, MAX_CPU_CORES]]
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, f"of at most {MAX_CPU_CORES} cores")

def test_buffer_bytes_are_bounded(part, tmp_bundle, capsys):
  header = copy.deepcopy(part[0])
  header["buffers"] += [{"nbytes": MAX_BUFFER_BYTES // 2 + 1, "device": "CPU", "dtype": "dtypes.char"}] * 2
  rejected_everywhere(crafted(tmp_bundle, header, part[1]), capsys, "more than")

@pytest.mark.parametrize("slices,message", [({"plan": [0, 10**6]}, "falls outside"), ({"lead_prob": [0, 2]}, "openpilot's layouts have 3"),
                                            ({"meta": [2, 1]}, "falls outside"), ({"meta": "0:4"}, "not [start, stop]"), ([[0, 1]], "expected")])
def test_output_slices_are_checked(part, tmp_bundle, capsys, slices, message):
  """modeld cuts the outputs by output_slices every frame: a bad one fails at inspect, verify and load, not in the middle of a run."""
  n = int(np.prod(part[0]["returns"]["tensors"][0]["shape"]))
  extras = {"output_specs": {"outputs": [[1, n], "<f4", "CPU"]}, "metadata": {"kind": "model", "output_slices": slices}}
  rejected_everywhere(crafted(tmp_bundle, *part, extras), capsys, message)

GOOD_FLOATS = {"version": 1, "fields": [["modelV2", "position.x", 3]], "sources": [0, 1, 2, 5], "published": 3, "reads": {}, "fcw": False, "unchecked": []}

@pytest.mark.parametrize("floats,shape,message", [(GOOD_FLOATS, [5], "its layout has 4 floats"), ({"fields": []}, [4], "not a float block's layout"),
                                                  (GOOD_FLOATS | {"sources": [0, -1, 2, 5]}, [4], "sources are not indices"),
                                                  (GOOD_FLOATS | {"published": 2}, [4], "fields hold 3 floats, it publishes 2"),
                                                  (GOOD_FLOATS | {"fields": [["modelV2", "x", 0]]}, [4], "fields are not")])
def test_the_float_block_is_checked(part, tmp_bundle, capsys, floats, shape, message):
  """modeld takes views of the in-graph parse's block by its recorded layout: one that its output cannot hold is refused when read."""
  n = int(np.prod(part[0]["returns"]["tensors"][0]["shape"]))
  extras = {"output_specs": {"outputs": [[1, n], "<f4", "CPU"], "message_floats": [shape, "<f4", "CPU"]},
            "metadata": {"kind": "model", "message_floats": floats}}
  rejected_everywhere(crafted(tmp_bundle, *part, extras), capsys, message)

def test_a_fifo_is_refused_before_reading(tmp_path, capsys):
  """Opening a FIFO for reading blocks until a writer comes: refused at once instead, in the CLI and the loader."""
  fifo = str(tmp_path / "model.bin")
  os.mkfifo(fifo)
  result = {}
  worker = threading.Thread(target=lambda: result.update(code=inspect_main(["inspect", fifo])), daemon=True)
  worker.start()
  worker.join(30)
  if worker.is_alive():  # unblock the reader before failing
    with open(fifo, "wb"): pass
  assert result.get("code") == 2 and "is a FIFO, not a regular file" in capsys.readouterr().err
  with pytest.raises(ArtifactError, match="is a FIFO"): read_parts(fifo)

def hostile_values(value):
  if isinstance(value, bool): return [None, 1]
  if isinstance(value, int): return [-1, 10**30, value + 1, 2**63, "1", 1.5]
  if isinstance(value, str): return ["", "dtypes.__class__", 7, "CPU" * 40]
  if isinstance(value, list): return [[], value + value, None, {}]
  return [None, [], 0]

def leaves(node, path=()):
  """Every (path, value) in a JSON tree, containers included."""
  yield path, node
  children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
  for key, child in children: yield from leaves(child, path + (key,))

def test_every_field_mutated_is_an_artifact_error_or_still_works(part, tmp_bundle):
  """Each field of the header replaced by hostile values of other types and sizes, hash recomputed: reading, inspecting, building the
  replay and running the recorded check either work or raise an ArtifactError. Nothing else escapes (IndexError, KeyError, TypeError,
  OverflowError, a segfault)."""
  from sunnypilot.modeld_v2.runtime.kernel_replay import replay_part
  from sunnypilot.modeld_v2.tools.inspect_bundle import describe
  header, blob = part
  outcomes = {"rejected": 0, "works": 0}
  for path, value in list(leaves(header))[1:]:
    if path[0] == "check" and path[1:2] == ("outputs",): continue  # digests: a mismatch is verify's FAIL, tested in test_inspect_bundle
    for bad in hostile_values(value):
      mutated = copy.deepcopy(header)
      target = mutated
      for key in path[:-1]: target = target[key]
      target[path[-1]] = bad
      try:
        crafted(tmp_bundle, mutated, blob)
        describe(tmp_bundle)
        read_header, read_blob = read_parts(tmp_bundle)[0]["run"]
        replay_part(read_header, read_blob)
        if read_header.check is not None: verify_part(read_header, read_blob)
        outcomes["works"] += 1
      except ArtifactError: outcomes["rejected"] += 1
      except Exception as e: pytest.fail(f"header{''.join(f'[{k!r}]' for k in path)} = {bad!r:.60}: {type(e).__name__}: {e}")
  assert outcomes["rejected"] > 100, outcomes

@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"provenance": {}, "parts": {"run": {"blob": [' + "9" * 5000 + "]}}}"],
                         ids=["deeply nested", "5000-digit integer"])
def test_json_that_python_cannot_hold_is_an_artifact_error(tmp_bundle, capsys, text):
  """json.loads raises RecursionError on deep nesting and ValueError on integers past 4300 digits: both one line, exit 2."""
  data = text.encode()
  with open(tmp_bundle, "wb") as f: f.write(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data).digest()) + data)
  rejected_everywhere(tmp_bundle, capsys, "header is not valid JSON")

def with_metadata(src: str, dst: str, path: tuple, value) -> str:
  """`src` rewritten with one metadata field replaced (or removed, for value ...), content hash recomputed."""
  head, blob = bundle.read_bundle(src)
  target = head["extras"]["metadata"]
  for key in path[:-1]: target = target[key]
  if value is ...: del target[path[-1]]
  else: target[path[-1]] = value
  data = json.dumps(head).encode()
  with open(dst, "wb") as f: f.write(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + blob).digest()) + data + blob)
  return dst

def test_every_metadata_field_mutated_is_an_artifact_error_or_still_works(native_artifacts, tmp_path):
  """The metadata inspect prints and the loader, fusion and modeld read: a warp's frame, model size and split flag, a model's layout,
  roles and output_slices. Each field replaced or removed: inspect and the fused load work or raise an ArtifactError, nothing else."""
  from sunnypilot.modeld_v2.runtime.loader import load_fused
  from sunnypilot.modeld_v2.tools.inspect_bundle import describe
  model, warp = os.path.join(native_artifacts, "model.bin"), os.path.join(native_artifacts, "warp_split.bin")
  rejected = 0
  for which, src in (("model", model), ("warp", warp)):
    meta = bundle.read_bundle(src)[0]["extras"]["metadata"]
    fields = [(k,) for k in meta] + [(k, sub) for k, v in meta.items() if isinstance(v, dict) for sub in list(v)[:2]]  # and tables' first entries
    for path in fields:
      for bad in (..., None, -1, "1928", [[0, 1]]):
        dst = with_metadata(src, str(tmp_path / f"{which}.bin"), path, bad)
        try:
          describe(dst)
          load_fused(*((dst, warp) if which == "model" else (model, dst)))
        except ArtifactError: rejected += 1
        except Exception as e: pytest.fail(f"{which} metadata{''.join(f'[{k!r}]' for k in path)} = {bad!r:.40}: {type(e).__name__}: {e}")
  assert rejected > 50

def test_warp_discovery_skips_a_warp_for_the_reason_the_reader_refuses_it(native_artifacts, tmp_path):
  """modeld's warp discovery and read_parts apply one set of warp rules: each warp the reader refuses is skipped with the reader's own
  message, a frame input of another size included (the frame it declares would read past the buffer)."""
  from sunnypilot.modeld_v2.daemon.artifacts import warp_bundles
  warp = os.path.join(native_artifacts, "warp_split.bin")
  head, blob = bundle.read_bundle(warp)
  size = head["extras"]["input_specs"]["frame"][0][0]
  cases = {"frame_inputs": (("input_specs", "big_frame"), [[size + 1], "|u1", "CPU"], "frame inputs"),
           "frame_number": (("metadata", "frame"), 7, "warp frame is int"), "frame_short": (("metadata", "frame"), "1344,760", "warp frame: --frame"),
           "split_flag": (("metadata", "split_frames"), 1, "warp split_frames is int"), "size_odd": (("metadata", "model_size"), [511, 256], "warp model_size")}
  for name, ((table, key), value, _) in cases.items():
    edited = copy.deepcopy(head)
    edited["extras"][table][key] = value
    data = json.dumps(edited).encode()
    with open(tmp_path / f"{name}.bin", "wb") as f:
      f.write(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data + blob).digest()) + data + blob)
  lines = []
  assert warp_bundles(str(tmp_path), report=lines.append) == [] and len(lines) == len(cases), lines
  for name, (_, _, message) in cases.items():
    with pytest.raises(ArtifactError, match=re.escape(message)) as refused: read_parts(str(tmp_path / f"{name}.bin"))
    assert f"skipping {refused.value}" in lines, f"{name}: {lines}"
