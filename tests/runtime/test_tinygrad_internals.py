"""The guard for the supported tinygrads: each function of tinygrad_internals called on a tiny tensor or buffer, its effect checked. A tinygrad
bump that moves one of the internals they rely on fails here, by name, before anything else does. `.ci/run` runs this file against PyPI's
0.14.0 and again against openpilot's 138fb4a."""
import ctypes

import numpy as np
import pytest
from onnx import TensorProto, helper
from tinygrad import Device, Tensor, TinyJit, dtypes
from tinygrad.device import Buffer
from tinygrad.helpers import Context
from tinygrad.uop.ops import Ops, UOp

from sunnypilot.modeld_v2.format.kernel_binary import check_kernel_binary
from sunnypilot.modeld_v2.format.tinygrad_identity import SUPPORTED, imported_tinygrad
from sunnypilot.modeld_v2.runtime import tinygrad_internals as ti

def cpu_buffer(data: bytes) -> Buffer:
  buf = Buffer("CPU", len(data), dtypes.uint8).allocate()
  ti.copy_in(buf, memoryview(bytearray(data)))
  return buf

def test_the_imported_tinygrad_is_a_supported_one():
  here = imported_tinygrad()
  assert here.release is not None, f"{here}: this module's contracts are those of {sorted(SUPPORTED.values())}: check each before moving the pin"
  assert ti.on_138fb4a() == (here.release == "openpilot's 138fb4a"), "the seam was told another version than the imported one's"

def test_record_kernel_linear_records_the_capture_and_the_one_time_calls():
  weight = Tensor(np.arange(8, dtype=np.float32)).realize()
  jit = TinyJit(lambda x: (x * 2 + (weight + 1).contiguous()).realize(), prune=True)  # weight + 1 reads no input: a one-time call
  with ti.record_kernel_linear() as recorded:
    for _ in range(2): out = jit(Tensor(np.ones(8, np.float32)).realize())
  assert len(recorded) == 1 and recorded[0].op is Ops.LINEAR and len(recorded.onetime) == 1
  assert all(c.op is Ops.CALL for c in recorded[0].src) and any(c.src[0].op is Ops.PROGRAM for c in recorded[0].src)
  assert all(c.src[0].op is Ops.PROGRAM for c in recorded.onetime[0].src)
  np.testing.assert_equal(out.numpy(), 3 + np.arange(8))
  again = TinyJit(lambda x: (x + 1).realize())
  for _ in range(2): again(Tensor(np.ones(4, np.float32)).realize())
  assert len(recorded) == 1, "jit_lower was not restored when the block ended"

@pytest.mark.parametrize("prune, k", [(True, 2), (False, 3)])  # other kernels per case: searched ones stay compiled for the process
def test_record_kernel_linear_counts_the_kernels_before_they_compile(prune, k):
  weight = Tensor(np.arange(8, dtype=np.float32), device="CPU").realize()
  jit, events = TinyJit(lambda x: (x * k + (weight + k).contiguous()).realize(), prune=prune), []
  with Context(BEAM=0): jit(Tensor(np.ones(8, np.float32), device="CPU").realize())  # call 0 compiles unsearched: call 1's kernels are new
  with ti.watched_beam_search(lambda tms: None, lambda: events.append("searched")), Context(BEAM=1, CACHELEVEL=0):
    with ti.record_kernel_linear(events.append):
      out = jit(Tensor(np.ones(8, np.float32), device="CPU").realize())
  assert events == [2, "searched", "searched"], events  # the one-time kernel (weight + k) and the kept one, counted before either compiles
  np.testing.assert_equal(out.numpy(), 2 * k + np.arange(8))

def test_host_backed_null_keeps_copied_bytes():
  with ti.host_backed_null():
    t = Tensor(np.arange(16, dtype=np.uint8), device="NULL").realize()
    np.testing.assert_equal(t.numpy(), np.arange(16))
    np.testing.assert_equal(t[8:12].contiguous().numpy(), np.arange(8, 12))  # a view at an offset of the same memory
  with pytest.raises(RuntimeError, match="no copyout on NULL"):  # NullAllocator restored: NULL holds no data again
    Tensor(np.arange(16, dtype=np.uint8), device="NULL").realize().numpy()

def test_watched_beam_search_reports_times_and_kernels():
  times, kernels = [], []
  with ti.watched_beam_search(times.extend, lambda: kernels.append(1)), Context(BEAM=1, CACHELEVEL=0):  # no disk cache: every candidate is timed
    (Tensor(np.arange(64, dtype=np.float32), device="CPU") * 3).realize()
  assert kernels == [1] and times and all(isinstance(t, float) and t >= 0 for t in times)

def test_patched_onnx_ops_replace_what_the_runner_runs(tmp_path):
  from tinygrad.nn.onnx import OnnxRunner
  graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4,))],
                            [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4,))])
  path = tmp_path / "relu.onnx"
  path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8).SerializeToString())
  x, called = np.array([-2, -1, 1, 2], np.float32), []
  relu = ti.onnx_ops()["Relu"]
  def negated(t): called.append(1); return -relu(t)
  with ti.patched_onnx_ops({"Relu": negated}):
    np.testing.assert_equal(OnnxRunner(str(path))({"x": Tensor(x, device="CPU")})["y"].numpy(), -np.maximum(x, 0))
  assert called and "MatMul" in ti.onnx_ops() and ti.onnx_ops()["Relu"] is relu
  np.testing.assert_equal(OnnxRunner(str(path))({"x": Tensor(x, device="CPU")})["y"].numpy(), np.maximum(x, 0))

def test_buffer_address_copy_in_and_copy_out():
  data = bytes(range(1, 33))
  buf = cpu_buffer(data)
  assert ti.host_visible(buf) and not ti.host_visible(Buffer("NULL", 4, dtypes.uint8).allocate())
  assert ctypes.string_at(ti.buffer_address(buf), len(data)) == data, "the address is not where copy_in put the bytes"
  out = memoryview(bytearray(len(data)))
  ti.copy_out(buf, out)
  assert bytes(out) == data
  t = (Tensor(np.arange(6, dtype=np.float32), device=Device.DEFAULT) + 1).realize()
  got = np.empty(6, np.float32)
  ti.copy_out(t.uop.base.buffer, memoryview(got).cast("B"))
  np.testing.assert_equal(got, np.arange(6) + 1)

def test_host_array_is_an_npy_buffers_memory():
  t = Tensor(np.arange(5, dtype=np.int32), device="NPY").realize()
  array = ti.host_array(buf := t.uop.base.buffer)
  assert isinstance(array, np.ndarray) and ti.buffer_address(buf) == array.ctypes.data
  array.reshape(-1)[:] = 7
  assert ctypes.string_at(ti.buffer_address(buf), 20) == np.full(5, 7, np.int32).tobytes() and (t.numpy() == 7).all()

def captured_linear(device: str, fn) -> tuple:
  """A TinyJit capture of `fn` on `device`: (its kernel LINEAR with graph batches flattened, the input tensor, the returned tensor)."""
  jit, x = TinyJit(fn), Tensor(np.arange(8, dtype=np.float32), device=device).realize()
  with ti.record_kernel_linear() as recorded:
    for _ in range(2): out = jit(x)
  return UOp(Ops.LINEAR, src=tuple(ti.unbatched_calls(recorded[0]))), x, out

def test_run_calls_time_call_and_cpu_entry_run_the_captured_kernels():
  linear, x, out = captured_linear("CPU", lambda x: (x * 2 + 1).realize())
  assert ti.graph_batches(linear, "CPU") is linear, "CPU has no graph runner: calls stay as they are"
  x2 = Tensor(np.full(8, 5, np.float32)).realize()
  ti.run_calls(linear, (x2.uop.base,))
  np.testing.assert_equal(out.numpy(), np.full(8, 11))
  call = linear.src[0]
  assert ti.time_call(call, (x.uop.base,), "CPU") > 0
  np.testing.assert_equal(out.numpy(), np.arange(8) * 2 + 1)
  entry = ti.cpu_entry(call.src[0], "CPU")
  buffers = [x2.uop.base.buffer if u.op is Ops.PARAM else u.buffer for u in call.src[1:]]
  entry.fxn(*(ctypes.c_uint64(ti.buffer_address(buffers[i])) for i in call.src[0].arg.globals), *([ctypes.c_uint64(0)] if entry.core_id is not None else []))
  np.testing.assert_equal(out.numpy(), np.full(8, 11))

def run_captured_calls(calls: list, inputs: list[Buffer]) -> None:
  """Run captured_calls' decoded calls on CPU by hand, each input slot bound to `inputs`: the decoding alone must say what to run on what."""
  for call in calls:
    bufs = [inputs[a] if isinstance(a, int) else a for a in call.args]
    if call.program is None:
      data = memoryview(bytearray(bufs[1].nbytes))
      ti.copy_out(bufs[1], data)
      ti.copy_in(bufs[0], data)
      continue
    entry = ti.cpu_entry(call.program, "CPU")
    core_id = [ctypes.c_uint64(0)] if entry.core_id is not None else []
    entry.fxn(*(ctypes.c_uint64(ti.buffer_address(bufs[i])) for i in ti.kernel_fields(call.program).globals), *core_id)

def test_captured_calls_bind_inputs_and_buffers_and_say_what_each_call_reads_and_writes():
  jit = TinyJit(lambda x, host: (x[2:10] * 2 + host.to("CPU")).realize())
  x, host = Tensor(np.arange(16, dtype=np.float32), device="CPU").realize(), Tensor(np.ones(8, np.float32), device="NPY").realize()
  with ti.record_kernel_linear() as recorded:
    for _ in range(2): out = jit(x, host)
  calls = ti.captured_calls(recorded[0])
  copy, kernel = calls
  assert copy.program is None and copy.args[1] == 1 and isinstance(copy.args[0], Buffer) and (copy.reads, copy.writes) == ((1,), (0,))
  assert kernel.program is not None and ti.kernel_fields(kernel.program).ins == kernel.reads and ti.kernel_fields(kernel.program).outs == kernel.writes
  assert [kernel.args[i].base for i in kernel.writes] == [out.uop.base.buffer], "the kernel writes the returned tensor"
  assert 0 in [kernel.args[i] for i in kernel.reads] and copy.args[0].base in [kernel.args[i].base for i in kernel.reads if isinstance(kernel.args[i], Buffer)]
  new_x, new_host = Tensor(np.arange(16, dtype=np.float32) * 3, device="CPU").realize(), Tensor(np.full(8, 5, np.float32), device="NPY").realize()
  run_captured_calls(calls, [new_x.uop.base.buffer, new_host.uop.base.buffer])
  np.testing.assert_equal(out.numpy(), np.arange(2, 10) * 3 * 2 + 5)
  with pytest.raises(ti.Unsupported, match="cannot serialize a Ops.SINK call"):
    ti.captured_calls(UOp(Ops.LINEAR, src=(UOp(Ops.CALL, src=(UOp(Ops.SINK),)),)))

def test_graph_batches_and_the_runner_they_build():
  linear, x, _ = captured_linear("NULL", lambda x: ((x * 2).contiguous() + x).realize())
  batched = ti.graph_batches(linear, "NULL")
  graphs = [c.src[0] for c in batched.src if ti.is_graph_batch(c.src[0])]
  assert len(graphs) == 1 and len(batched.src) < len(linear.src) and not any(ti.is_graph_batch(c.src[0]) for c in linear.src)
  assert ti.unbatched_calls(batched) == list(linear.src), "the batch holds the calls it batched, in order"
  runner = ti.graph_runner(graphs[0], (x.uop.base,))
  slots = ti.runner_slots(runner)
  assert list(slots) == [0] and slots[0] and max(slots[0]) < len(linear.src), slots  # the input feeds some of the batch's nodes
  assert ti.always_repointed(runner) == set() and not ti.repointable(runner)  # fixed shapes; NULL's runner re-points every launch
  runner((x.uop.base,), {})
  ti.repoint_only(runner, slots[0])  # NULL's runner has no selective re-pointing (only CUDA's does: see the CUDA test below); it still runs
  runner((x.uop.base,), {})

def test_kernel_fields_and_program_uop_round_trip_a_kernel():
  linear, x, out = captured_linear("CPU", lambda x: (x * 2 + 1).realize())
  ast = linear.src[0].src[0]
  program = ti.kernel_fields(ast)
  assert program.estimates == {"ops": 8 * 2, "lds": 8 * 4 * 2, "mem": 8 * 4 * 2}, program.estimates  # a mul and an add per float; 8 loaded, 8 stored
  assert program.global_size == tuple(ast.arg.global_size) and len(program.params) == len(program.globals) == 2
  assert {program.params[i][1] for i in program.outs} == {0} and program.params[program.ins[0]][2] == dtypes.float
  check_kernel_binary(lib := ti.program_binary(ast), program.name, "CPU")  # stored as an ELF object defining the kernel at its entry
  rebuilt = ti.program_uop(program, lib, "CPU")
  assert rebuilt.src[-1].arg == ast.src[-1].arg, "the rebuilt kernel's code is not the code tinygrad compiled"
  assert ti.kernel_fields(rebuilt) == program._replace(estimates=None)
  entry, y = ti.cpu_entry(rebuilt, "CPU"), Tensor(np.arange(8, dtype=np.float32) - 3).realize()  # the rebuilt kernel runs, on other buffers
  result = Buffer("CPU", 8, dtypes.float32).allocate()
  buffers = {program.outs[0]: result, program.ins[0]: y.uop.base.buffer}
  entry.fxn(*(ctypes.c_uint64(ti.buffer_address(buffers[i])) for i in program.globals), *([ctypes.c_uint64(0)] if entry.core_id is not None else []))
  got = np.empty(8, np.float32)
  ti.copy_out(result, memoryview(got).cast("B"))
  np.testing.assert_equal(got, (np.arange(8) - 3) * 2 + 1)

def test_kernel_fields_refuse_symbolic_shapes():
  from tinygrad import Variable
  n = Variable("n", 1, 8)
  jit = TinyJit(lambda x: (x * 2).realize())
  with ti.record_kernel_linear() as recorded:
    for i in (3, 4): jit(Tensor(np.ones(8, np.float32)).realize()[:n.bind(i)])
  with pytest.raises(ti.Unsupported, match="symbolic variables"): ti.kernel_fields(ti.unbatched_calls(recorded[0])[-1].src[0])

def _cuda_present() -> bool:
  try: return Device.DEFAULT.startswith("CUDA") or bool(Device["CUDA"])
  except Exception: return False

@pytest.mark.skipif(not _cuda_present(), reason="only CUDA's graph runner re-points selectively (run on a GPU machine)")
def test_repoint_only_repoints_exactly_the_nodes_it_is_told():
  linear, x, out = captured_linear("CUDA", lambda x: ((x * 2).contiguous() + x).realize())
  batch = next(c.src[0] for c in ti.graph_batches(linear, "CUDA").src if ti.is_graph_batch(c.src[0]))
  runner, y = ti.graph_runner(batch, (x.uop.base,)), Tensor(np.full(8, 10, np.float32), device="CUDA").realize()
  assert ti.repointable(runner)
  ti.repoint_only(runner, set())
  runner((y.uop.base,), {}, wait=True)
  np.testing.assert_equal(out.numpy(), np.arange(8) * 3, "a node was re-pointed at y that it was not told to")
  ti.repoint_only(runner, ti.runner_slots(runner)[0])
  runner((y.uop.base,), {}, wait=True)
  np.testing.assert_equal(out.numpy(), np.full(8, 30))
