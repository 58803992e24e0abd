import json
import struct

import numpy as np
import pytest
from tinygrad import Device, Tensor, TinyJit, dtypes

from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.format import bundle
from sunnypilot.modeld_v2.format.bundle import read_parts, write_bundle
from sunnypilot.modeld_v2.runtime import kernel_replay as replay
from sunnypilot.modeld_v2.runtime.kernel_replay import InputError, Replay

from conftest import NO_COMPILE, conv_net, realized, run_python

def same(a: Tensor, b: Tensor) -> bool: return a.numpy().tobytes() == b.numpy().tobytes()

def test_conv_net_round_trip_is_bit_identical(tmp_bundle):
  fn, make = conv_net()
  jit, part, _ = capture(fn, make)
  write_bundle(tmp_bundle, {"run": part}, {"metadata": {}})
  plain = Replay(*read_parts(tmp_bundle)[0]["run"])
  for _ in range(5):
    img = make()["img"]
    assert same(jit(img=img), plain(img=img))
  assert part[0]["check"]["outputs"], "the self-check recorded the TinyJit replay's outputs"

def test_multi_output_returns_the_same_structure():
  rng = np.random.default_rng(1)
  fn = lambda a, b: {"sum": (a + b).contiguous(), "prod": (a * b).sum(axis=1), "neg": (-a).exp2()}
  make = lambda: {"a": realized(rng.standard_normal((4, 8)).astype(np.float32)), "b": realized(rng.standard_normal((4, 8)).astype(np.float32))}
  jit, part, _ = capture(fn, make)
  plain = Replay(*part)
  inputs = make()
  expected, got = jit(**inputs), plain(**inputs)
  assert list(got) == ["sum", "prod", "neg"]
  for k in expected: assert same(expected[k], got[k]), k
  assert got["prod"].shape == (4,)

def stateful(weights: Tensor):
  """next_state and outputs written into caller buffers; both computed before either is written, so next_state may alias state."""
  def fn(x, state, output_buffers):
    new = (state * 0.9 + (x @ weights).tanh()).contiguous().realize()
    out = (new.sum(axis=1, keepdim=True) * 2).contiguous().realize()
    output_buffers["next_state"].assign(new)
    output_buffers["outputs"].assign(out)
    Tensor.realize(output_buffers["next_state"], output_buffers["outputs"])
  return fn

def test_output_buffers_and_in_place_state_for_20_steps():
  rng = np.random.default_rng(2)
  weights = realized(rng.standard_normal((16, 32)).astype(np.float32) * 0.3)
  def make(in_place: bool) -> dict:
    state = realized(np.zeros((1, 32), np.float32))
    return {"x": realized(rng.standard_normal((1, 16)).astype(np.float32)), "state": state,
            "output_buffers": {"outputs": realized(np.zeros((1, 1), np.float32)), "next_state": state if in_place else realized(np.zeros((1, 32), np.float32))}}
  jit_separate, part_separate, _ = capture(stateful(weights), lambda: make(False))
  jit_in_place, part_in_place, _ = capture(stateful(weights), lambda: make(True))
  xs = [rng.standard_normal((1, 16)).astype(np.float32) for _ in range(20)]
  def trajectory(replay, in_place: bool) -> list[bytes]:
    inputs, steps = make(in_place), []
    for x in xs:
      replay(**inputs | {"x": realized(x)})
      if not in_place: inputs["state"].assign(inputs["output_buffers"]["next_state"]).realize()
      steps.append(inputs["output_buffers"]["outputs"].numpy().tobytes() + inputs["state"].numpy().tobytes())
    return steps
  expected = trajectory(jit_separate, False)
  assert expected == trajectory(jit_in_place, True), "tinygrad itself gives one trajectory either way"
  assert expected == trajectory(Replay(*part_separate), False)
  assert expected == trajectory(Replay(*part_separate), True), "a part captured with separate buffers may write next_state into state"
  assert expected == trajectory(Replay(*part_in_place), True)
  assert expected[0] != expected[-1], "the state evolves"

def test_npy_host_input_is_uploaded_inside_the_jit():
  rng = np.random.default_rng(3)
  host = np.zeros(64, np.float32)
  fn = lambda host, x: (host.to(Device.DEFAULT)[:32].reshape(4, 8) * x).sum(axis=0)
  make = lambda: {"host": Tensor(host, device="NPY"), "x": realized(rng.standard_normal((4, 8)).astype(np.float32))}
  jit, part, inputs = capture(fn, make)
  assert any(c["kind"] == "copy" for c in part[0]["calls"])
  plain = Replay(*part)
  inputs = make()
  for _ in range(3):
    host[:] = rng.standard_normal(64)  # the NPY tensor reads this array in place: each call uploads the new contents
    expected = jit(**inputs).numpy().copy()
    assert expected.tobytes() == plain(**inputs).numpy().tobytes()
    assert np.allclose(expected, (host[:32].reshape(4, 8) * inputs["x"].numpy()).sum(axis=0), rtol=1e-6)

def test_programs_are_stored_once_per_binary():
  fn = lambda a, b, c: ((a * 2).contiguous(), (b * 2).contiguous(), (c * 2).contiguous())
  make = lambda: {k: realized(np.ones(8, np.float32)) for k in "abc"}
  _, part, _ = capture(fn, make)
  assert len(part[0]["calls"]) == 3 and len(part[0]["programs"]) == 1
  assert json.loads(json.dumps(part[0])) == part[0], "the header is plain JSON: it survives a round trip unchanged (no tuples, no objects)"

def test_fresh_process_with_compiler_disabled(tmp_bundle):
  fn, make = conv_net()
  jit, part, _ = capture(fn, make)
  write_bundle(tmp_bundle, {"run": part}, {})
  img = np.random.default_rng(9).integers(0, 256, (1, 6, 32, 64), dtype=np.uint8)
  expected = jit(img=realized(img)).numpy()
  np.save(tmp_bundle + ".img.npy", img)
  out = run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
img = Tensor(np.load({tmp_bundle!r} + ".img.npy")).realize()
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
run = Replay(*read_parts({tmp_bundle!r})[0]["run"])
for _ in range(3): out = run(img=img)
print(bytes(out.uop.base.buffer.as_memoryview(force_zero_copy=True)).hex())
""")
  assert bytes.fromhex(out.strip()) == expected.tobytes()

def test_null_device_replays_graph_batches_without_compiling(tmp_path):
  path = str(tmp_path / "null.bin")
  run_python(f"""
import numpy as np
from tinygrad import Tensor, dtypes
from sunnypilot.modeld_v2.format.bundle import write_bundle
from sunnypilot.modeld_v2.compile.capture import capture
w = Tensor(np.ones((8, 6, 3, 3), np.float32)).realize()
fn = lambda img, host: (img.cast(dtypes.float32) * host.to("NULL")[0]).conv2d(w).relu().contiguous().sum(axis=(2, 3)).contiguous()
part = capture(fn, lambda: dict(img=Tensor(np.zeros((1, 6, 16, 16), np.uint8)).realize(), host=Tensor(np.zeros(4, np.float32), device="NPY"))).part
assert part[0]["check"] is None and not any("init" in b for b in part[0]["buffers"])
write_bundle({path!r}, {{"run": part}}, {{}})
""", env={"DEV": "NULL"})
  out = run_python(f"""
import numpy as np
from tinygrad import Tensor, Device
img, host = Tensor(np.zeros((1, 6, 16, 16), np.uint8)).realize(), Tensor(np.zeros(4, np.float32), device="NPY")
Device[Device.DEFAULT]
{NO_COMPILE}
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
run = Replay(*read_parts({path!r})[0]["run"])
for _ in range(3): run(img=img, host=host)
print(run.call_kinds)
""", env={"DEV": "NULL", "JIT_BATCH_SIZE": "0"})
  assert out.strip() == "['COPY', 'graph']", out

def test_memory_planner_holds_buffers_live_tensors_reference():
  """tinygrad #16571 (seed tinygrad_engine_jit.txt): a buffer made during capture that a live Tensor still references is not suballocated."""
  kept = {}
  def fn(x):
    kept["y"] = y = (x * 3).contiguous()
    return (y + 1).sum()
  jit = TinyJit(fn)
  for i in range(4):
    x = np.full(16, i + 1, np.float32)
    total = jit(x=realized(x)).item()
    assert total == float((x * 3 + 1).sum())
    assert np.array_equal(kept["y"].numpy(), x * 3), "a buffer held by a live Tensor reads its real values after replay"

# *** errors, not crashes ***

@pytest.fixture(scope="module")
def small_part():
  rng = np.random.default_rng(5)
  weights = realized(rng.standard_normal((16, 32)).astype(np.float32))
  make = lambda: {"x": realized(rng.standard_normal((1, 16)).astype(np.float32)), "state": realized(np.zeros((1, 32), np.float32)),
                  "output_buffers": {"outputs": realized(np.zeros((1, 1), np.float32)), "next_state": realized(np.zeros((1, 32), np.float32))}}
  captured = capture(stateful(weights), make)
  return captured.part, make, captured.jit

def test_wrong_and_missing_input_names(small_part):
  part, make, _ = small_part
  plain, inputs = Replay(*part), make()
  with pytest.raises(InputError, match="expected inputs"): plain(**{k: v for k, v in inputs.items() if k != "x"})
  with pytest.raises(InputError, match="expected inputs"): plain(**inputs, extra=inputs["x"])
  with pytest.raises(InputError, match=r"output_buffers\[outputs\] is missing"): plain(**inputs | {"output_buffers": {"next_state": inputs["state"]}})

def test_wrong_shape_dtype_device(small_part):
  part, make, _ = small_part
  plain, inputs = Replay(*part), make()
  with pytest.raises(InputError, match=r"input x: expected shape \(1, 16\)"): plain(**inputs | {"x": realized(np.zeros((16,), np.float32))})
  with pytest.raises(InputError, match="input x: expected shape"): plain(**inputs | {"x": realized(np.zeros((1, 16), np.int32))})
  with pytest.raises(InputError, match="input x: expected a CPU tensor"): plain(**inputs | {"x": Tensor(np.zeros((1, 16), np.float32), device="NPY")})

def test_non_realized_and_view_inputs(small_part):
  part, make, _ = small_part
  plain, inputs = Replay(*part), make()
  with pytest.raises(InputError, match="input x is not realized"): plain(**inputs | {"x": inputs["x"] + 1})
  big = realized(np.zeros((2, 16), np.float32))
  with pytest.raises(InputError, match="input x"): plain(**inputs | {"x": big[1:]})

def test_reordered_views_are_rejected():
  """A permute or flip of the right shape, dtype and size would be read in raw memory order: only the buffer itself (or a reshape) binds."""
  rng = np.random.default_rng(12)
  make = lambda: {"m": realized(rng.standard_normal((2, 3, 3)).astype(np.float32))}
  jit, part, _ = capture(lambda m: (m * 2 + 1).contiguous(), make)
  plain, m = Replay(*part), realized(rng.standard_normal((2, 3, 3)).astype(np.float32))
  for view in (m.permute(0, 2, 1), m.flip(0), m.flip(2)):
    with pytest.raises(InputError, match="reordered view"): plain(m=view)
  ordered = m.permute(0, 2, 1).contiguous().realize()
  assert plain(m=ordered).numpy().tobytes() == jit(m=realized(ordered.numpy())).numpy().tobytes()
  assert plain(m=m.reshape(18).reshape(2, 3, 3)).numpy().tobytes() == jit(m=realized(m.numpy())).numpy().tobytes(), "a reshape keeps the order"

def test_misaligned_pointer(small_part):
  part, make, _ = small_part
  plain, inputs = Replay(*part), make()
  raw = np.zeros(64 + 4, np.uint8)
  ptr = raw.ctypes.data + (4 - raw.ctypes.data % 16) % 16 + 4  # 4 bytes past a 16-byte boundary
  x = Tensor.from_blob(ptr, (1, 16), dtype=dtypes.float32, device="CPU")
  with pytest.raises(InputError, match="not 16-byte aligned"): plain(**inputs | {"x": x})

def test_aliasing_that_would_read_after_write_is_rejected(small_part):
  part, make, _ = small_part
  inputs = make()
  Replay(*part)(**inputs | {"output_buffers": {"outputs": inputs["output_buffers"]["outputs"], "next_state": inputs["state"]}})  # next_X into X
  def late_read(x, state, output_buffers):
    output_buffers["y"].assign(x * 2).realize()
    return (x + state).sum()  # reads state after y was written
  rng = np.random.default_rng(6)
  make2 = lambda: {"x": realized(rng.standard_normal(8).astype(np.float32)), "state": realized(np.zeros(8, np.float32)),
                   "output_buffers": {"y": realized(np.zeros(8, np.float32))}}
  plain, inputs = Replay(*capture(late_read, make2)[1]), make2()
  with pytest.raises(InputError, match="state and output_buffers\\[y\\] share a buffer"): plain(**inputs | {"output_buffers": {"y": inputs["state"]}})
  shared = plain(**inputs | {"state": inputs["x"]}).item()  # two read-only slots may share a buffer
  assert shared == plain(**inputs | {"state": realized(inputs["x"].numpy())}).item()

@pytest.mark.parametrize("field,value,message", [("device", "QCOM", "built for device QCOM"),
                                                  ("tinygrad_source", "ab" * 32, r"built with tinygrad \S+ \(source abababababab\)"),
                                                  ("target", "CPU::arm64,native", "kernels built for CPU::arm64"), ("format", 99, "format 99")])
def test_bundle_for_another_device_arch_version_format(small_part, tmp_bundle, monkeypatch, field, value, message):
  real = bundle.provenance
  monkeypatch.setattr(bundle, "provenance", lambda device, flags=None: real(device, flags) | {field: value})
  if field in ("tinygrad_source", "format"):  # a bundle no loader of this version reads is never written (one for another device is: cross-compiles)
    with pytest.raises(ArtifactError, match=message): write_bundle(tmp_bundle, {"run": small_part[0]}, {})
  write_bundle(tmp_bundle, {"run": small_part[0]}, {}, check=False)  # crafted
  monkeypatch.undo()
  with pytest.raises(ArtifactError, match=message): read_parts(tmp_bundle)

def test_format_version_and_magic_in_the_preamble(small_part, tmp_bundle):
  write_bundle(tmp_bundle, {"run": small_part[0]}, {})
  data = bytearray(open(tmp_bundle, "rb").read())
  struct.pack_into("<I", data, 8, 2)
  open(tmp_bundle, "wb").write(data)
  with pytest.raises(ArtifactError, match="format version 2, this loader reads version 1"): read_parts(tmp_bundle)
  open(tmp_bundle, "wb").write(b"PK\x03\x04" + data[4:])
  with pytest.raises(ArtifactError, match="not a modeld_v2 bundle"): read_parts(tmp_bundle)

def test_truncated_and_edited_files(small_part, tmp_bundle):
  write_bundle(tmp_bundle, {"run": small_part[0]}, {})
  data = open(tmp_bundle, "rb").read()
  for cut in (0, 10, bundle.PREAMBLE.size + 5, len(data) - 1):
    open(tmp_bundle, "wb").write(data[:cut])
    with pytest.raises(ArtifactError, match="truncated|too short"): read_parts(tmp_bundle)
  edited = data.replace(b'"nbytes":128', b'"nbytes":256', 1)
  assert edited != data
  open(tmp_bundle, "wb").write(edited)
  with pytest.raises(ArtifactError, match="content hash mismatch"): read_parts(tmp_bundle)

def test_fuzzed_bundles_are_rejected_cleanly(small_part, tmp_bundle):
  write_bundle(tmp_bundle, {"run": small_part[0]}, {})
  data = open(tmp_bundle, "rb").read()
  rng = np.random.default_rng(7)
  positions = list(range(bundle.PREAMBLE.size + 8)) + list(rng.integers(0, len(data), 300))
  for pos in positions:
    mutated = bytearray(data)
    mutated[pos] ^= 1 << int(rng.integers(0, 8))
    open(tmp_bundle, "wb").write(mutated)
    with pytest.raises(ArtifactError): read_parts(tmp_bundle)

def test_rehashed_bundle_with_a_bad_reference_is_rejected(small_part, tmp_bundle):
  header, blob = small_part[0]
  good = {"buffer": 0, "offset": 0, "nbytes": 4, "dtype": "dtypes.float"}
  for arg in (good | {"buffer": 99}, good | {"offset": 1 << 40}, good | {"dtype": "dtypes.__class__"}, {"input": -1}):
    call = header["calls"][-1]
    bad = header | {"calls": header["calls"][:-1] + [call | {"args": [arg] + call["args"][1:]}]}
    write_bundle(tmp_bundle, {"run": (bad, blob)}, {}, check=False)  # a valid hash over a hostile header
    with pytest.raises(ArtifactError, match="malformed"): read_parts(tmp_bundle)

def test_copy_longer_than_its_source_is_rejected(tmp_bundle):
  """A hash-valid crafted bundle whose upload copies more bytes than the host input holds would read past it: rejected at read."""
  host = np.zeros(64, np.float32)
  _, (header, blob), _ = capture(lambda host, x: (host.to(Device.DEFAULT)[:8] * x).contiguous(),
                                 lambda: {"host": Tensor(host, device="NPY"), "x": realized(np.ones(8, np.float32))})
  copy = next(i for i, c in enumerate(header["calls"]) if c["kind"] == "copy")
  dst = next(a for a in header["calls"][copy]["args"] if "buffer" in a)
  header["buffers"][dst["buffer"]]["nbytes"] *= 4
  longer = header["calls"][copy] | {"args": [dst | {"nbytes": dst["nbytes"] * 4}, header["calls"][copy]["args"][1]]}
  write_bundle(tmp_bundle, {"run": (header | {"calls": header["calls"][:copy] + [longer] + header["calls"][copy + 1:]}, blob)}, {}, check=False)
  with pytest.raises(ArtifactError, match="equal lengths"): read_parts(tmp_bundle)

@pytest.mark.parametrize("head", [[], {"parts": {}}, {"provenance": {}, "parts": {"run": []}}, {"provenance": {}, "parts": {"run": {"header": {}}}},
                                  {"provenance": {}, "parts": {"run": {"header": {}, "blob": [0, 0]}}}], ids=str)
def test_header_that_is_not_the_expected_object(tmp_bundle, head):
  import hashlib
  import json
  if isinstance(head, dict) and "provenance" in head: head = head | {"provenance": bundle.provenance("CPU")}  # past the provenance check
  data = json.dumps(head).encode()
  with open(tmp_bundle, "wb") as f: f.write(bundle.PREAMBLE.pack(bundle.MAGIC, bundle.FORMAT_VERSION, len(data), hashlib.sha256(data).digest()) + data)
  with pytest.raises(ArtifactError, match="malformed"): read_parts(tmp_bundle, allow_device=True)
  from sunnypilot.modeld_v2.tools.inspect_bundle import main as inspect_main
  for command in ("inspect", "verify"):
    assert inspect_main([command, tmp_bundle]) == 2, f"{command} reports a malformed bundle as an error, not a traceback"

@pytest.mark.parametrize("linear", [False, True], ids=["direct", "graph back-end"])
def test_each_tensor_is_bound_once_per_slot(small_part, monkeypatch, linear):
  """Fixed slots bind once and camera-like rotating tensors once each; results equal the TinyJit replay whichever tensor is patched in."""
  if linear: monkeypatch.setenv("PLAIN_JIT_LINEAR", "1")
  part, make, jit = small_part
  plain, fixed = Replay(*part), make()
  rng = np.random.default_rng(10)
  xs = [realized(rng.standard_normal((1, 16)).astype(np.float32)) for _ in range(18)]
  jit_inputs = make()
  for step in range(54):
    plain(**fixed | {"x": xs[step % 18]})
    jit(**jit_inputs | {"x": realized(xs[step % 18].numpy()), "state": realized(fixed["state"].numpy())})
    assert fixed["output_buffers"]["outputs"].numpy().tobytes() == jit_inputs["output_buffers"]["outputs"].numpy().tobytes(), step
  assert plain.bindings_made == len(plain.inputs) - 1 + 18, "each fixed slot once, each of the 18 rotating tensors once"
  plain.forget(xs[:3])
  for x in xs[:6]: plain(**fixed | {"x": x})
  assert plain.bindings_made == len(plain.inputs) - 1 + 18 + 3, "forgotten tensors bind again, the others do not"

def test_bindings_stay_bounded(small_part):
  part, make, _ = small_part
  plain, inputs = Replay(*part), make()
  rng = np.random.default_rng(11)
  for _ in range(replay.MAX_BINDINGS_PER_SLOT + 20): plain(**inputs | {"x": realized(rng.standard_normal((1, 16)).astype(np.float32))})
  assert plain.bindings == len(plain.inputs) - 1 + replay.MAX_BINDINGS_PER_SLOT, "a caller allocating per call evicts its oldest tensors"
  plain.reset()
  assert plain.bindings == 0
  plain(**inputs)
  assert plain.bindings == len(plain.inputs), "after a reset every slot binds again"

@pytest.fixture(scope="module")
def two_outputs():
  """a is written first, then z from state: a may not share state's buffer, and no two outputs may share one."""
  def fn(x, state, output_buffers):
    output_buffers["a"].assign(x * 2).realize()
    output_buffers["z"].assign(x + state).realize()
  rng = np.random.default_rng(13)
  vec = lambda: realized(rng.standard_normal(8).astype(np.float32))
  make = lambda: {"x": vec(), "state": vec(), "output_buffers": {"a": vec(), "z": vec()}}
  return capture(fn, make).part, make

def test_a_rejected_call_binds_nothing(two_outputs):
  """A call that fails on one slot leaves no slot bound: the next call checks sharing again instead of taking the fast path."""
  part, make = two_outputs
  plain, inputs = Replay(*part), make()
  shared = inputs | {"output_buffers": {"a": inputs["state"], "z": inputs["output_buffers"]["z"]}}
  with pytest.raises(InputError, match="expected shape"): plain(**shared | {"output_buffers": {"a": inputs["state"], "z": realized(np.zeros(3, np.float32))}})
  with pytest.raises(InputError, match="share a buffer"): plain(**shared)
  plain(**inputs)
  assert inputs["output_buffers"]["a"].numpy().tobytes() == (inputs["x"].numpy() * 2).tobytes()

def test_two_written_inputs_never_share(two_outputs):
  part, make = two_outputs
  plain, inputs = Replay(*part), make()
  with pytest.raises(InputError, match="output_buffers\\[a\\] and output_buffers\\[z\\] share a buffer"):
    plain(**inputs | {"output_buffers": {"a": inputs["output_buffers"]["z"], "z": inputs["output_buffers"]["z"]}})

def test_one_time_weight_preparation_runs_once_at_load():
  """TinyJit(prune=True) splits off calls that do not depend on inputs (weight preparation): the loader runs them once, not per call."""
  rng = np.random.default_rng(8)
  weights = realized(rng.standard_normal((8, 8)).astype(np.float32))
  make = lambda: {"x": realized(rng.standard_normal((4, 8)).astype(np.float32))}
  jit, (header, blob), _ = capture(lambda x: (x @ (weights * 2 + 1).contiguous()).relu(), make)
  assert header["onetime_calls"] and len(header["calls"]) == 1, "the weight preparation was split off"
  prepared = {a["buffer"] for c in header["onetime_calls"] for i, a in enumerate(c["args"]) if i in header["programs"][c["program"]]["outs"]}
  assert not any("init" in header["buffers"][b] for b in prepared), "what the one-time calls write is computed at load, not stored"
  plain = Replay(header, blob)
  for _ in range(3):
    x = realized(rng.standard_normal((4, 8)).astype(np.float32))
    assert jit(x=x).numpy().tobytes() == plain(x=x).numpy().tobytes()

def test_generic_replay_path_on_cpu():
  """The LINEAR replay GPUs use (run_linear over rebuilt PROGRAMs), forced on CPU: bit-identical to the TinyJit replay, with a host upload."""
  out = run_python("""
import numpy as np
from tinygrad import Device, Tensor, dtypes
from sunnypilot.modeld_v2.compile.capture import capture
from sunnypilot.modeld_v2.runtime.kernel_replay import Replay
rng = np.random.default_rng(0)
w = Tensor(rng.standard_normal((8, 6, 3, 3)).astype(np.float32)).realize()
fn = lambda img, host: (img.cast(dtypes.float32) * host.to(Device.DEFAULT)[0]).conv2d(w).relu().sum(axis=(2, 3))
make = lambda: dict(img=Tensor(rng.integers(0, 256, (1, 6, 16, 16), dtype=np.uint8)).realize(),
                    host=Tensor(rng.standard_normal(4).astype(np.float32), device="NPY"))
jit, part, _ = capture(fn, make)  # the self-check already compared the two once
plain = Replay(*part)
assert not plain.outputs_in_place, "PLAIN_JIT_LINEAR=1 selects the linear replay"
for _ in range(3):
  inputs = make()
  assert jit(**inputs).numpy().tobytes() == plain(**inputs).numpy().tobytes()
print("ok")
""", env={"PLAIN_JIT_LINEAR": "1"})
  assert out.strip() == "ok"
