"""float16 bundles (compile/precision.py): the ONNX converted to half, kernels that load and store half, the interface dtypes kept, float32
bundles as they were, and every generation's stand-in (and the driver-monitoring one) within a derived bound of onnxruntime's float32
outputs: every raw head, and every float the messages publish from the outputs (the in-graph parse's block).

The bound, derived (docs/ARCHITECTURE.md, "Precision"): float16 rounds to within u = 2^-11 of a value, relative. Each layer (Conv, MatMul,
Gemm) meets three roundings: its input activation stored in half, its weights, its output stored in half; tinygrad accumulates its sum in
float32, which adds nothing at this scale. Through L layers of gain about 1 (stand-in weights are scaled by 1/sqrt(fan-in); relu, tanh and
sigmoid are 1-Lipschitz) the roundings add up to at most 3 L u of the output's scale, the head's RMS over the drive. L is the longest chain
of layers from an input to the outputs in the frame's models (vision, then the policy reading its features), plus the chain from an input
the frame feeds back (a state, a 20 Hz features_buffer, prev_desired_curv) once more: that input carries the previous frame's error.
What the parse does to an output error e (openpilot's parse_model_outputs): a mean moves by e; exp (stds, safe_exp clipped at 11) moves
by at most a factor exp(e) - 1 of the value; sigmoid by e / 4; softmax by a factor exp(2 e) - 1 of the probability (each log-probability
moves by at most 2 e); the lane lines' times by e times the plan's time per distance where the search's comparisons are decided by more
than e; the path polynomials by e times the least-squares matrix's row sums. Decisions within e of their boundary (a mixture head's
hypothesis pick, a lane line's search step) may go either way in half: those floats are not compared on that frame, and counted.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sunnypilot.modeld_v2.compile.compile_onnx import compile_onnx
from sunnypilot.modeld_v2.compile.precision import to_float16
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.format.bundle import read_bundle, read_parts
from sunnypilot.modeld_v2.model.parse_dmonitoring_outputs import DMOutputParser
from sunnypilot.modeld_v2.model.parse_model_outputs import OutputParser
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, reference_block, trace
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import realized
from openpilot_reference import GATE, Openpilot, T, X, step_inputs

U = 2.0 ** -11  # float16's unit roundoff
ROUNDINGS_PER_LAYER = 3  # input, weights, output
LAYER_OPS = ("Conv", "MatMul", "Gemm")
EXP_CLIP = 11.0  # openpilot's safe_exp
FRAMES = 16
FED_BACK = ("features_buffer", "prev_desired_curv")

# *** the bound's L, read from the ONNX graphs ***

def chains(path: str) -> dict[str, int]:
  """Per graph input, the longest chain of LAYER_OPS from it to any graph output (-1: it reaches none)."""
  g = onnx.load(path, load_external_data=False).graph
  inits = {i.name for i in g.initializer}
  out = {}
  for name in (v.name for v in g.input if v.name not in inits):
    depth = {name: 0}
    for n in g.node:
      if (reached := [depth[i] for i in n.input if i in depth]):
        for o in n.output: depth[o] = max(reached) + (n.op_type in LAYER_OPS)
    out[name] = max((depth.get(o.name, -1) for o in g.output), default=-1)
  return out

def layers(files: dict[str, str]) -> int:
  """L of the bound for a generation's files (see the module's docstring)."""
  c = {k: chains(p) for k, p in files.items()}
  if "onnx" in c:
    fed = [n for n in c["onnx"] if n.startswith("state_") or n.startswith(FED_BACK)]
    return max(c["onnx"].values()) + max((c["onnx"][n] for n in fed), default=0)
  policies = [k for k in c if k != "vision"]
  chain = max(max(c["vision"].values()) + max(c[k]["features_buffer"] for k in policies), *(max(c[k].values()) for k in policies))
  return chain + max((c[k][n] for k in policies for n in c[k] if n.startswith("prev_desired_curv")), default=0)

# *** driving a float16 bundle beside onnxruntime ***

def drive(path: str, reference: Openpilot, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """FRAMES frames through the bundle (states fed back in place, as modeld runs it) and through onnxruntime: (its outputs, its message
  floats block, onnxruntime's outputs), one row per frame."""
  model, rng = load_bundle(path), np.random.default_rng(seed)
  specs = model.input_specs
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  got, blocks, want = [], [], []
  for step in range(FRAMES):
    new_img = rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8)
    desire, host = step_inputs(rng, step, reference.host, reference)
    want.append(reference.step(new_img, desire, host)[0])
    model.run(**{n: realized(v) for n, v in ({"new_img": new_img, "desire": desire} | GATE | host).items() if n in specs}, **states, output_buffers=outs)
    got.append(outs["outputs"].numpy()[0].copy())
    blocks.append(outs[FLOAT_BLOCK].numpy().copy())
  return np.array(got), np.array(blocks), np.array(want)

def head_bounds(slices: dict, want: np.ndarray, n_layers: int) -> dict[str, float]:
  """Each head's bound: 3 L u times its RMS over the drive."""
  return {h: ROUNDINGS_PER_LAYER * n_layers * U * float(np.sqrt(np.mean(np.square(want[:, a:b], dtype=np.float64)))) for h, (a, b) in slices.items()}

def plan_t_bound(plan_x: np.ndarray, e: float) -> np.ndarray:
  """Per lane-line distance, how far the time the plan reaches it may move when each plan x moves by e (openpilot fill_model_msg.py's
  search, written out: t = p T[i+1] + (1 - p) T[i], p = (X - x[i]) / (x[i+1] - x[i]), so t moves by at most (T[i+1] - T[i]) e (1 + 2|p|) /
  (|x[i+1] - x[i]| - 2 e)); inf from the first comparison of the search within e of its distance on (the search may stop elsewhere)."""
  bound, ti, decided = np.zeros(len(X)), 0, True
  for xi in range(1, len(X)):
    while True:
      if ti < 32: decided &= bool(abs(float(plan_x[ti + 1]) - X[xi]) > e)
      if not (ti < 32 and plan_x[ti + 1] < X[xi]): break
      ti += 1
    if ti == 32:
      bound[xi] = 0.0 if decided else np.inf  # 10 s, then NaN after it
      break
    x0, x1 = float(plan_x[ti]), float(plan_x[ti + 1])
    p = (X[xi] - x0) / (x1 - x0) if abs(x1 - x0) > 1e-9 else 0.0
    bound[xi] = (T[ti + 1] - T[ti]) * e * (1 + 2 * abs(p)) / (abs(x1 - x0) - 2 * e) if decided and abs(x1 - x0) > 2 * e else np.inf
  return bound

def block_bounds(slices: dict, raw: np.ndarray, bounds: dict[str, float]) -> np.ndarray:
  """Per float of the block, how far float16 may move it from the reference's (raw: the reference's outputs; inf: not compared)."""
  parser, layout = OutputParser(slices), trace(slices)
  parsed = parser(raw)
  owner = np.empty(len(parser.buffer), object)
  for name, span in parser.spans.items(): owner[span] = name
  buf = np.zeros(len(parser.buffer))
  for i, name in enumerate(owner):
    if name in ("plan_t", "path", "hidden_state"): continue
    e = bounds[name.removesuffix("_std")] + (bounds["planplus"] if name == "plan" and "planplus" in bounds else 0.0)
    value = abs(float(parser.buffer[i]))
    if parser.stds.start <= i < parser.stds.stop: buf[i] = value * np.expm1(e)
    elif parser.binary.start <= i < parser.binary.stop: buf[i] = e / 4
    elif parser.categorical.start <= i < parser.categorical.stop: buf[i] = value * np.expm1(2 * e)
    else: buf[i] = e
  for h in parser.hypotheses:  # a pick within 2 e of the next hypothesis may go either way
    top2 = np.sort(raw.reshape(-1)[h.logits], axis=0)[-2:]
    if np.any(top2[1] - top2[0] <= 2 * bounds["plan" if h.means == parser.spans.get("plan") else "lead"]): buf[h.means], buf[h.stds] = np.inf, np.inf
  if "plan" in parser.spans:
    e, picked = bounds["plan"] + bounds.get("planplus", 0.0), not np.isinf(buf[parser.spans["plan"]]).any()
    buf[parser.spans["plan_t"]] = plan_t_bound(parsed["plan"][:, 0], e) if picked else np.inf
    fit = np.abs(np.linalg.pinv(np.polynomial.polynomial.polyvander(T, 4))).sum(axis=1)  # least squares: each coefficient a sum of positions
    buf[parser.spans["path"]] = np.repeat(fit * e, 3) if picked else np.inf
  return buf[layout.sources]

@pytest.fixture(scope="module")
def half_bundles(tmp_path_factory):
  """Each generation's tiny stand-in (seed 1) compiled in float16, built the first time a test asks for it: (files, bundle path)."""
  tmp, cache = tmp_path_factory.mktemp("float16"), {}
  def get(generation: str) -> tuple[dict, str]:
    if generation not in cache:
      files = stand_in_models.write(generation, "tiny", str(tmp / f"{generation}.onnx"), seed=1)["files"]
      cache[generation] = files, compile_model(str(tmp / f"{generation}.bin"), **files, log=lambda s: None, precision="float16")["output"]
    return cache[generation]
  return get

@pytest.mark.parametrize("generation", stand_in_models.NAMES)
def test_every_generation_in_float16_stays_within_the_bound_of_onnxruntime_float32(half_bundles, generation):
  files, path = half_bundles(generation)
  reference = Openpilot(files)
  got, blocks, want = drive(path, reference)
  slices = {h: s for h, s in load_bundle(path).metadata["output_slices"].items()}
  n_layers = layers(files)
  bounds = head_bounds(slices, want, n_layers)
  for h, (a, b) in slices.items():
    err = np.abs(got[:, a:b] - want[:, a:b]).max()
    assert err <= bounds[h], f"{generation} head {h}: float16 moves it by {err:.3g}, the bound 3*{n_layers}*u*RMS is {bounds[h]:.3g}"
  layout, parser = trace(slices), OutputParser(slices)
  fields = [f"{service}.{name}" for service, name, n in layout.fields for _ in range(n)]
  skipped = 0
  for frame in range(FRAMES):
    ref = reference_block(parser, layout, want[frame:frame + 1]).astype(np.float64)
    limit = block_bounds(slices, want[frame:frame + 1], bounds)
    err = np.abs(blocks[frame].astype(np.float64) - ref)
    same_nan = np.isnan(blocks[frame]) & np.isnan(ref)
    compared = ~np.isinf(limit) & ~same_nan
    skipped += int(np.sum(np.isinf(limit)))
    bad = np.flatnonzero(compared[:layout.published] & ~(err[:layout.published] <= limit[:layout.published]))
    assert not len(bad), f"{generation} frame {frame}: " + ", ".join(f"{fields[i]} {blocks[frame][i]:.6g} vs {ref[i]:.6g} (bound {limit[i]:.3g})"
                                                                     for i in bad[:5])
  assert skipped <= FRAMES * layout.published // 10, f"{generation}: {skipped} floats within a decision's reach, not compared: too many to say much"

def test_driver_monitoring_in_float16_stays_within_the_bound(tmp_path):
  """The DM stand-in through compile_onnx --precision float16 against onnxruntime: every head, and what dmonitoringmodeld publishes of it
  (openpilot's parse: face orientation and position as they are, their stds through safe_exp, every probability through sigmoid)."""
  import onnxruntime as ort
  path = stand_in_models.write("dmonitoring", "tiny", str(tmp_path / "dm.onnx"), seed=2)["files"]["onnx"]
  bundle = compile_onnx(str(tmp_path / "dm.bin"), path, log=lambda s: None, precision="float16")["output"]
  loaded, session, rng = load_bundle(bundle), ort.InferenceSession(path, providers=["CPUExecutionProvider"]), np.random.default_rng(4)
  slices = read_bundle(bundle)[0]["extras"]["metadata"]["onnx_metadata"]
  feeds = [{"input_img": rng.integers(0, 256, (1, 1440 * 960), dtype=np.uint8), "calib": rng.standard_normal((1, 3)).astype(np.float32)}
           for _ in range(6)]
  got = np.array([loaded.run(**{k: realized(v) for k, v in f.items()})["outputs"].numpy()[0] for f in feeds])
  want = np.array([session.run(["outputs"], f)[0][0] for f in feeds])
  from sunnypilot.modeld_v2.compile.onnx_model import read_output_slices
  heads = read_output_slices(slices["output_slices"])
  bounds = head_bounds(heads, want, max(chains(path).values()))
  for h, (a, b) in heads.items(): assert np.abs(got[:, a:b] - want[:, a:b]).max() <= bounds[h], h
  parser = DMOutputParser(heads)
  for g, w in zip(got, want):
    mine, theirs = {k: v.copy() for k, v in parser(g).items()}, parser(w)
    for name, value in theirs.items():
      head = name.removesuffix("_std") if name.startswith("face_descs") else name
      e = bounds[head]
      limit = np.abs(value) * np.expm1(e) if name.endswith("_std") else e / 4 if name.endswith("prob") or name == "wheel_on_right" else e
      assert np.all(np.abs(mine[name] - value) <= limit), f"{name}: {mine[name]} vs {value} (bound {limit})"

# *** the kernels, the interface and the float32 path ***

def test_the_float16_kernels_load_and_store_half_and_the_interface_keeps_its_dtypes(half_bundles, tmp_path):
  """The bundle's weights are half (half the bytes of the float32 build), its kernels pass half between them, and the inputs and outputs
  the runtime feeds and reads are the float32 build's."""
  files, path = half_bundles("split_current")
  full = compile_model(str(tmp_path / "f32.bin"), **files, log=lambda s: None)["output"]
  half, single = read_parts(path)[0]["run"][0], read_parts(full)[0]["run"][0]
  weights = lambda part: {b.dtype: sum(x.init[1] - x.init[0] for x in part.buffers if x.init is not None and x.dtype == b.dtype) for b in part.buffers}
  # the model's weights: every float32 one of the float32 build is a half one here; the output parse's constants (its float32 and float64
  # tables, int32 indices) are the same in both
  w16, w32 = weights(half), weights(single)
  assert w16["dtypes.half"] * 2 == w32["dtypes.float"] - w16["dtypes.float"] and w16["dtypes.half"] > 100 * w16["dtypes.float"], (w16, w32)
  assert {k: v for k, v in w16.items() if k != "dtypes.half"} == {k: v for k, v in w32.items() if k != "dtypes.float"} | {"dtypes.float": w16["dtypes.float"]}
  inner = [p.dtype for prog in half.programs for p in prog.signature]
  assert inner.count("dtypes.half") > inner.count("dtypes.float"), "activations between kernels are half; float32 only at the interface"
  h, f = read_bundle(path)[0]["extras"], read_bundle(full)[0]["extras"]
  assert h["input_specs"] == f["input_specs"] and h["output_specs"] == f["output_specs"]
  assert h["metadata"]["precision"] == "float16" and "precision" not in f["metadata"]
  assert read_bundle(path)[0]["provenance"]["flags"]["FLOAT16"] == 1 and read_bundle(full)[0]["provenance"]["flags"]["FLOAT16"] == 0

def test_precision_float32_is_the_default_build_byte_for_byte(tmp_path):
  files = stand_in_models.write("native", "tiny", str(tmp_path / "native.onnx"), seed=5)["files"]
  a = compile_model(str(tmp_path / "a.bin"), **files, log=lambda s: None)["output"]
  b = compile_model(str(tmp_path / "b.bin"), **files, log=lambda s: None, precision="float32")["output"]
  assert open(a, "rb").read() == open(b, "rb").read()

def test_tinygrads_float16_flag_makes_float16_the_default(tmp_path):
  """FLOAT16=1, as openpilot's device build sets it: float16 without --precision (test_compile_onnx builds one with the environment's);
  an explicit float32 is built with tinygrad's FLOAT16 off, and says so."""
  from tinygrad.helpers import Context

  from sunnypilot.modeld_v2.compile.precision import default_precision
  with Context(FLOAT16=1):
    assert default_precision() == "float16"
    files = stand_in_models.write("dmonitoring", "tiny", str(tmp_path / "dm.onnx"), seed=5)["files"]
    bundle = compile_onnx(str(tmp_path / "dm.bin"), files["onnx"], log=lambda s: None, precision="float32")["output"]
  head = read_bundle(bundle)[0]
  assert head["provenance"]["flags"]["FLOAT16"] == 0 and "precision" not in head["extras"]["metadata"]
  assert default_precision() == "float32"

# *** the conversion ***

def test_to_float16_converts_what_computes_and_keeps_what_must_stay():
  """Float initializers, Constant values (tensor and value_float), Cast-to-float and the graph's float inputs and outputs become float16;
  uint8 inputs, integer constants, Resize's scales and the metadata stay."""
  x = helper.make_tensor_value_info("x", TensorProto.FLOAT, (1, 2, 4, 4))
  img = helper.make_tensor_value_info("img", TensorProto.UINT8, (1, 2, 4, 4))
  y = helper.make_tensor_value_info("y", TensorProto.FLOAT, (1, 2, 8, 8))
  nodes = [helper.make_node("Cast", ["img"], ["imgf"], to=TensorProto.FLOAT), helper.make_node("Add", ["x", "imgf"], ["s"]),
           helper.make_node("Constant", [], ["k"], value_float=0.5), helper.make_node("Mul", ["s", "k"], ["m"]),
           helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(np.full((1, 2, 1, 1), 2, np.float32))),
           helper.make_node("Mul", ["m", "w"], ["n"]), helper.make_node("Resize", ["n", "", "scales"], ["y"], mode="nearest")]
  inits = [numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"), numpy_helper.from_array(np.array([7], np.int64), "ints")]
  model = helper.make_model(helper.make_graph(nodes, "g", [x, img], [y], inits), opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
  model.metadata_props.add(key="output_slices", value="kept")
  half = to_float16(model)
  onnx.checker.check_model(half, full_check=True)
  types = {v.name: v.type.tensor_type.elem_type for v in (*half.graph.input, *half.graph.output)}
  assert types == {"x": TensorProto.FLOAT16, "img": TensorProto.UINT8, "y": TensorProto.FLOAT16}
  assert {i.name: i.data_type for i in half.graph.initializer} == {"scales": TensorProto.FLOAT, "ints": TensorProto.INT64}
  assert half.graph.node[0].attribute[0].i == TensorProto.FLOAT16
  assert [(a.name, a.t.data_type) for n in half.graph.node if n.op_type == "Constant" for a in n.attribute] == [("value", TensorProto.FLOAT16)] * 2
  assert [(p.key, p.value) for p in half.metadata_props] == [("output_slices", "kept")]
  assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT, "the original is left as it was"
  import onnxruntime as ort
  feed = {"x": np.random.default_rng(0).standard_normal((1, 2, 4, 4)).astype(np.float32), "img": np.arange(32, dtype=np.uint8).reshape(1, 2, 4, 4)}
  want = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
  got = ort.InferenceSession(half.SerializeToString()).run(None, feed | {"x": feed["x"].astype(np.float16)})[0]
  assert got.dtype == np.float16 and np.allclose(got, want, rtol=4 * U, atol=0), "each value is the float32 one within a few roundings"
