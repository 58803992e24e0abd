"""Seeded random vision + policy pairs of varied shapes: each must compile, verify in a fresh process with the compiler disabled, and match
onnxruntime driven by openpilot's input handling (openpilot_reference). The vision bodies read the stacked frames apart (Slice, strided
and reversed Slice, Gather of planes, a 3x3 Conv on one frame, pools, Transpose/Reshape), the heads come in any order with hidden_state
first, in the middle or last and gaps between them: the shapes that once made compile_modeld write bundles its loader refused. The
sliced-vision repro of that defect must compile once its desire_pred has openpilot's 32 values, and be refused in one line as shipped."""
import base64
import json
import pickle
from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from sunnypilot.modeld_v2.compile_modeld import compile_model, main
from sunnypilot.modeld_v2.model.constants import CURRENT_POLICY_SLICES, CURRENT_VISION_SLICES, FEATURE_LEN, POLICY_SLICES, VISION_SLICES
from sunnypilot.modeld_v2.runtime.loader import load_bundle
from sunnypilot.modeld_v2.tools import stand_in_models

from conftest import NO_COMPILE, run_python
from openpilot_reference import Openpilot, drive_bundle

STEPS = 6  # frame_skip 4: steps 4 and 5 read an older frame and a fed-back feature
SMALL = 32  # the width the bodies project to before the heads: small weights, fast compiles
IMG = (1, 12, 128, 256)
GENERATIONS = ("split_010", "split_action", "split_current")
HEADS = {"split_010": (VISION_SLICES, {k: n for k, n in POLICY_SLICES.items() if k != "action"}), "split_action": (VISION_SLICES, POLICY_SLICES),
         "split_current": (CURRENT_VISION_SLICES, CURRENT_POLICY_SLICES)}
POLICY_INPUTS = {"split_010": {"desire_pulse": (1, 25, 8), "traffic_convention": (1, 2), "features_buffer": (1, 24, FEATURE_LEN)},
                 "split_action": {"desire_pulse": (1, 25, 8), "traffic_convention": (1, 2), "action_t": (1, 2), "features_buffer": (1, 25, FEATURE_LEN)},
                 "split_current": {"desire_pulse": (1, 25, 8), "traffic_convention": (1, 2), "features_buffer": (1, 25, FEATURE_LEN)}}
# no Gather of rows: tinygrad makes a constant Gather a cat of shrinks, and one of rows fused with a pool or the projection after it
# unrolls to ~200 kB of C that clang compiles for minutes
BRANCHES = ("frames", "hw_stride", "plane_stride", "gather_planes", "conv")
FEATURES = ("mean", "last", "gather", "stride", "flat")

class Graph:
  """A small ONNX graph: one-output nodes, seeded weights scaled by fan-in."""
  def __init__(self, rng): self.rng, self.nodes, self.inits, self.n = rng, [], [], 0

  def op(self, kind: str, *inputs: str, **attrs) -> str:
    self.n += 1
    self.nodes.append(helper.make_node(kind, list(inputs), [out := f"{kind.lower()}{self.n}"], **attrs))
    return out

  def const(self, a) -> str:
    self.n += 1
    self.inits.append(numpy_helper.from_array(np.asarray(a), name := f"c{self.n}"))
    return name

  def ints(self, *v: int) -> str: return self.const(np.array(v, np.int64))
  def weight(self, *shape: int) -> str:
    """Standard normal / sqrt(fan-in): a MatMul's (in, out) or a Conv's (out, in, kh, kw)."""
    return self.const((self.rng.standard_normal(shape) / np.sqrt(shape[0] if len(shape) == 2 else np.prod(shape[1:]))).astype(np.float32))

  def model(self, inputs: dict[str, tuple], dtype: dict[str, int], out: str, n: int, order: list[tuple[str, int]]) -> onnx.ModelProto:
    """The graph with `out` renamed `outputs` (1, n) and openpilot's output_slices of the named entries of `order` (gaps are unnamed)."""
    self.nodes.append(helper.make_node("Identity", [out], ["outputs"]))
    vi = helper.make_tensor_value_info
    g = helper.make_graph(self.nodes, "generated", [vi(k, dtype.get(k, TensorProto.FLOAT), s) for k, s in inputs.items()],
                          [vi("outputs", TensorProto.FLOAT, [1, n])], self.inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    helper.set_model_props(m, {"output_slices": output_slices(order)})
    onnx.checker.check_model(m, full_check=True)
    return m

def output_slices(order: list[tuple[str, int]]) -> str:
  """comma's format, base64 of a pickled {name: slice}; names starting with '.' are gaps."""
  slices, start = {}, 0
  for name, size in order:
    if not name.startswith("."): slices[name] = slice(start, start + size)
    start += size
  return base64.b64encode(pickle.dumps(slices)).decode()

@dataclass(frozen=True)
class Case:
  """What one seed drew: the generation, each camera's branches, where the vision's hidden_state sits, both head orders (gaps '.n'),
  how the heads are made ('one': one MatMul; 'concat': Slices of a MatMul joined with hidden_state and zero gaps), the policy's body."""
  seed: int
  generation: str
  cameras: tuple[tuple[str, ...], tuple[str, ...]]
  post: str  # what follows each branch's pool: flatten, transpose (+Reshape) or a mean over W
  gemm: bool
  vision_order: tuple[tuple[str, int], ...]
  vision_join: str
  features: tuple[str, ...]
  desire: str
  acts: tuple[str, ...]
  policy_order: tuple[tuple[str, int], ...]
  policy_join: str

  @property
  def id(self) -> str:
    heads = lambda order: ",".join(f"gap{s}" if n == "." else "HIDDEN" if n == "hidden_state" else "".join(w[0] for w in n.split("_")) if "_" in n else n
                                   for n, s in order)
    return (f"s{self.seed:02d}-{self.generation}-v[{'+'.join(self.cameras[0])}|{'+'.join(self.cameras[1])}/{self.post}{'/gemm' * self.gemm}"
            f"/{self.vision_join}:{heads(self.vision_order)}]-p[{'+'.join(self.features)}/{self.desire}/{'+'.join(self.acts)}/{self.policy_join}:"
            f"{heads(self.policy_order)}]")

def shuffled(rng, sizes: dict[str, int], hidden_at: str | None = None) -> tuple[tuple[str, int], ...]:
  """The heads in a random order (hidden_state first, in the middle or last) with up to two gaps of 1-7 floats between them."""
  names = [n for n in sizes if n != "hidden_state"]
  rng.shuffle(names)
  if hidden_at: names.insert({"first": 0, "middle": len(names) // 2, "last": len(names)}[hidden_at], "hidden_state")
  order = [(n, sizes[n]) for n in names]
  for _ in range(rng.integers(0, 3)): order.insert(int(rng.integers(0, len(order) + 1)), (".", int(rng.integers(1, 8))))
  return tuple(order)

def draw(seed: int) -> Case:
  """A seed's case: the generation and hidden_state's place cycle with the seed (every pairing in 9 seeds), the rest is drawn."""
  rng = np.random.default_rng(seed)
  generation, hidden_at = GENERATIONS[seed % 3], ("first", "middle", "last")[seed // 3 % 3]
  vision, policy = HEADS[generation]
  cameras = tuple(tuple(rng.choice(BRANCHES, int(rng.integers(1, 3)), replace=False)) for _ in range(2))
  return Case(seed, generation, cameras, str(rng.choice(["flat", "transpose", "mean"])), bool(rng.integers(0, 2)), shuffled(rng, vision, hidden_at),
              str(rng.choice(["one", "concat"])), tuple(rng.choice(FEATURES, int(rng.integers(1, 3)), replace=False)), str(rng.choice(["flat", "max"])),
              tuple(rng.choice(["Sigmoid", "Tanh", "Relu"], int(rng.integers(1, 3)))), shuffled(rng, policy), str(rng.choice(["one", "concat"])))

CASES = [draw(seed) for seed in range(30)]

# *** the vision model ***

def pool(g: Graph, rng, x: str, kernel: list[int]) -> str:
  return g.op(str(rng.choice(["AveragePool", "MaxPool"])), x, kernel_shape=kernel, strides=kernel)

def as_float(g: Graph, x: str) -> str: return g.op("Mul", g.op("Cast", x, to=TensorProto.FLOAT), g.const(np.float32(1 / 255)))

def branch(g: Graph, rng, kind: str, cam: str) -> list[tuple[str, tuple[int, int, int]]]:
  """One reading of a camera's (1, 12, 128, 256) uint8 planes: pooled float maps and their (C, h, w)."""
  if kind == "frames":  # each stacked frame apart, newest first or last (the defect's shape)
    halves = [(6, 12), (0, 6)] if rng.integers(0, 2) else [(0, 6), (6, 12)]
    return [(pool(g, rng, as_float(g, g.op("Slice", cam, g.ints(lo), g.ints(hi), g.ints(1))), [16, 16]), (6, 8, 16)) for lo, hi in halves]
  if kind == "hw_stride":  # every 8th or 16th row and column from an offset
    sh, sw = int(rng.choice([8, 16])), int(rng.choice([8, 16]))
    x = g.op("Slice", cam, g.ints(int(rng.integers(0, sh)), int(rng.integers(0, sw))), g.ints(128, 256), g.ints(2, 3), g.ints(sh, sw))
    return [(pool(g, rng, as_float(g, x), [128 // sh // 4, 256 // sw // 4]), (12, 4, 4))]
  if kind == "plane_stride":  # every 2nd or 3rd plane, or every 2nd backwards
    start, step, c = [(0, 2, 6), (1, 3, 4), (11, -2, 6), (1, 2, 6)][rng.integers(0, 4)]
    x = g.op("Slice", cam, g.ints(start), g.ints(12 if step > 0 else -100), g.ints(1), g.ints(step))
    return [(pool(g, rng, as_float(g, x), [16, 16]), (c, 8, 16))]
  if kind == "gather_planes":  # a few planes by index, negative ones and repeats allowed
    idx = rng.integers(-12, 12, int(rng.integers(2, 6)))
    return [(pool(g, rng, as_float(g, g.op("Gather", cam, g.ints(*idx), axis=1)), [16, 16]), (len(idx), 8, 16))]
  # conv: a 3x3 convolution of one frame, strided or after a pool; (4, 4, 8) either way
  lo, stride = int(rng.choice([0, 6])), int(rng.choice([1, 2, 4]))
  x = as_float(g, g.op("Slice", cam, g.ints(lo), g.ints(lo + 6), g.ints(1)))
  if stride == 1: x = pool(g, rng, x, [4, 4])
  y = g.op("Relu", g.op("Conv", x, g.weight(4, 6, 3, 3), g.const(np.zeros(4, np.float32)), kernel_shape=[3, 3], strides=[stride, stride], pads=[1] * 4))
  return [(pool(g, rng, y, [8, 8] if stride != 2 else [16, 16]), (4, 4, 8))]

def flat(g: Graph, x: str, shape: tuple[int, int, int], post: str) -> tuple[str, int]:
  """(1, n) of a (1, C, h, w) map: flattened, transposed to channels last and reshaped, or averaged over w."""
  if post == "transpose": return g.op("Reshape", g.op("Transpose", x, perm=[0, 2, 3, 1]), g.ints(1, -1)), int(np.prod(shape))
  if post == "mean": return g.op("Flatten", g.op("ReduceMean", x, axes=[3], keepdims=0), axis=1), shape[0] * shape[1]
  return g.op("Flatten", x, axis=1), int(np.prod(shape))

def heads(g: Graph, x: str, order: tuple, join: str, hidden: str | None = None) -> tuple[str, int]:
  """outputs (1, n) from the (1, SMALL) `x` in `order`: one MatMul of x (hidden_state a linear head), or a MatMul's Slices, the Tanh'd
  `hidden` and zero gaps joined by Concat."""
  n = sum(s for _, s in order)
  if join == "one": return g.op("MatMul", x, g.weight(SMALL, n)), n
  named = [(k, s) for k, s in order if k != "hidden_state" and not k.startswith(".")]
  y, start, pieces = g.op("MatMul", x, g.weight(SMALL, sum(s for _, s in named))), 0, []
  for k, s in order:
    if k == "hidden_state": pieces.append(hidden)
    elif k.startswith("."): pieces.append(g.const(np.zeros((1, s), np.float32)))
    else: pieces, start = pieces + [g.op("Slice", y, g.ints(start), g.ints(start + s), g.ints(1))], start + s
  return g.op("Concat", *pieces, axis=1), n

IMAGES = dict.fromkeys(("img", "big_img"), IMG)
UINT8 = dict.fromkeys(("img", "big_img"), TensorProto.UINT8)

def vision_model(case: Case) -> onnx.ModelProto:
  """Each camera's branches concatenated and projected to SMALL on their own (four branches fused into one product took a minute to
  compile), the two projections added."""
  g, rng = Graph(np.random.default_rng([case.seed, 1])), np.random.default_rng([case.seed, 2])
  proj = []
  for cam, kinds in zip(IMAGES, case.cameras):
    vecs = [flat(g, m, shape, case.post) for kind in kinds for m, shape in branch(g, rng, kind, cam)]
    z, f = g.op("Concat", *(v for v, _ in vecs), axis=1) if len(vecs) > 1 else vecs[0][0], sum(n for _, n in vecs)
    if case.gemm:  # weights (out, in)
      proj.append(g.op("Gemm", z, g.const((rng.standard_normal((SMALL, f)) / np.sqrt(f)).astype(np.float32)), g.const(np.zeros(SMALL, np.float32)), transB=1))
    else: proj.append(g.op("MatMul", z, g.weight(f, SMALL)))
  x = g.op("Relu", g.op("Add", *proj))
  hidden = g.op("Tanh", g.op("MatMul", x, g.weight(SMALL, FEATURE_LEN))) if case.vision_join == "concat" else None
  out, n = heads(g, x, case.vision_order, case.vision_join, hidden)
  return g.model(IMAGES, UINT8, out, n, list(case.vision_order))

# *** the policy model ***

def features(g: Graph, fb: str, n: int, kind: str) -> tuple[str, int]:
  """(1, k) of features_buffer (1, n, 512): its mean, newest entry, a Gather of three entries, every 4th entry ending at the newest, or all."""
  if kind == "mean": return g.op("ReduceMean", fb, axes=[1], keepdims=0), FEATURE_LEN
  if kind == "last": return g.op("Flatten", g.op("Slice", fb, g.ints(n - 1), g.ints(n), g.ints(1)), axis=1), FEATURE_LEN
  if kind == "gather": return g.op("Flatten", g.op("Gather", fb, g.ints(-1, n - 5, 0), axis=1), axis=1), 3 * FEATURE_LEN
  if kind == "stride": return g.op("Flatten", g.op("Slice", fb, g.ints((n - 1) % 4), g.ints(n), g.ints(1), g.ints(4)), axis=1), (n + 3) // 4 * FEATURE_LEN
  return g.op("Flatten", fb, axis=1), n * FEATURE_LEN

def policy_model(case: Case) -> onnx.ModelProto:
  g, inputs = Graph(np.random.default_rng([case.seed, 3])), POLICY_INPUTS[case.generation]
  vecs = [features(g, "features_buffer", inputs["features_buffer"][1], kind) for kind in case.features]
  vecs.append((g.op("Flatten", "desire_pulse", axis=1), 25 * 8) if case.desire == "flat" else (g.op("ReduceMax", "desire_pulse", axes=[1], keepdims=0), 8))
  vecs += [(name, 2) for name in ("traffic_convention", "action_t") if name in inputs]
  f = sum(n for _, n in vecs)
  x = g.op(case.acts[0], g.op("Add", g.op("MatMul", g.op("Concat", *(v for v, _ in vecs), axis=1), g.weight(f, SMALL)), g.const(np.zeros(SMALL, np.float32))))
  for act in case.acts[1:]: x = g.op(act, g.op("MatMul", x, g.weight(SMALL, SMALL)))
  out, n = heads(g, x, case.policy_order, case.policy_join)
  return g.model(inputs, {}, out, n, list(case.policy_order))

# *** the defect's repro: each camera's two frames apart, 16x16 average pools, one MatMul ***

def sliced_vision(desire_pred: int) -> onnx.ModelProto:
  """The repro's graph, its desire_pred `desire_pred` values wide (it shipped with 6; openpilot's parser reads 32), its weights / 255: on
  raw pixels hidden_state nears 5, where float32 sum order alone moves the policy's outputs by more than the 1e-5 compared to."""
  g = Graph(np.random.default_rng(7))
  frame = lambda cam, lo, hi: g.op("Cast", g.op("Slice", cam, g.ints(lo), g.ints(hi), g.ints(1)), to=TensorProto.FLOAT)
  feats = [g.op("Flatten", g.op("AveragePool", frame(cam, lo, hi), kernel_shape=[16, 16], strides=[16, 16]), axis=1) for cam in IMAGES
           for lo, hi in ((6, 12), (0, 6))]
  order = [("hidden_state", 512), ("pose", 12), ("road_transform", 12), ("desire_pred", desire_pred)]
  n = sum(s for _, s in order)
  w = g.const((g.rng.standard_normal((4 * 6 * 8 * 16, n)) * 1e-3 / 255).astype(np.float32))
  return g.model(IMAGES, UINT8, g.op("MatMul", g.op("Concat", *feats, axis=1), w), n, order)

def write_pair(folder, name: str, vision: onnx.ModelProto, policy: onnx.ModelProto) -> dict[str, str]:
  files = {"vision": str(folder / f"{name}_vision.onnx"), "policy": str(folder / f"{name}_policy.onnx")}
  onnx.save(vision, files["vision"]), onnx.save(policy, files["policy"])
  return files

def repro_policy() -> onnx.ModelProto:
  """The repro's policy: the tiny split_010 stand-in."""
  return stand_in_models.build("split_010", "tiny", 0)["policy"][0]

@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """{name: (ONNX files, bundle path)} compiled the first time a test asks for a case (or for "repro": the sliced vision with 32 desire_pred values)."""
  tmp, cache = tmp_path_factory.mktemp("generated"), {}
  def get(case: Case | str) -> tuple[dict[str, str], str]:
    name = case if isinstance(case, str) else f"s{case.seed:02d}"
    if name not in cache:
      files = write_pair(tmp, name, sliced_vision(32), repro_policy()) if name == "repro" else write_pair(tmp, name, vision_model(case), policy_model(case))
      cache[name] = files, compile_model(str(tmp / f"{name}.bin"), **files, log=lambda s: None)["output"]
    return cache[name]
  return get

def own_slices(path: str) -> dict[str, slice]:
  meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
  return pickle.loads(base64.b64decode(meta["output_slices"]))

def check_bundle(files: dict[str, str], path: str, generation: str, seed: int) -> None:
  """Its generation derived from the ONNX, every model's heads where that model put them (the policy's after the vision's outputs), and
  STEPS frames of state feedback equal to onnxruntime's."""
  meta = load_bundle(path).metadata
  assert meta["generation"] == generation and meta["generation_source"] == "onnx", meta["generation"]
  offset = onnx.load(files["vision"], load_external_data=False).graph.output[0].type.tensor_type.shape.dim[1].dim_value
  for model, start in (("vision", 0), ("policy", offset)):
    expected = {f"{model}/{k}": [s.start + start, s.stop + start] for k, s in own_slices(files[model]).items()}
    assert {k: v for k, v in meta["output_slices"].items() if k.startswith(f"{model}/")} == expected, f"{model} heads"
  drive_bundle(path, Openpilot(files), np.random.default_rng(seed), STEPS)

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_generated_pair_compiles_and_matches_onnxruntime(built, case):
  check_bundle(*built(case), case.generation, case.seed)

def test_sliced_vision_repro_with_openpilot_desire_pred_compiles_and_matches(built):
  check_bundle(*built("repro"), "split_010", 7)

def test_sliced_vision_repro_as_shipped_is_refused_in_one_line(tmp_path, capsys):
  """6 desire_pred values: refused before any compile, naming the head and both sizes, and nothing written."""
  files = write_pair(tmp_path, "shipped", sliced_vision(6), repro_policy())
  with pytest.raises(SystemExit) as e: main(["--vision", files["vision"], "--policy", files["policy"], "--output", str(tmp_path / "model.bin")])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and all(w in err for w in ("desire_pred", " 6 ", "32")), err
  assert sorted(p.name for p in tmp_path.iterdir()) == ["shipped_policy.onnx", "shipped_vision.onnx"], "no bundle, no temporary file"

def test_every_bundle_verifies_in_a_fresh_process(built):
  """What `inspect_bundle verify` does, for every bundle in one interpreter that cannot compile: each recorded digest must match."""
  paths = {built(c)[1]: c.id for c in CASES} | {built("repro")[1]: "repro"}
  out = run_python(f"""
import json
import tinygrad.engine.realize as realize
from tinygrad import Device
from tinygrad.uop.ops import Ops
Device[Device.DEFAULT]
compile_linear, to_compile = realize.compile_linear, realize._get_call_to_compile
{NO_COMPILE}
def copies_only(linear):  # verify_part realizes its seeded inputs through the schedule: copies pass, a kernel to compile does not
  if any(c.op is Ops.CALL and to_compile(c) is not None for c in linear.toposort()): raise AssertionError("a kernel to compile in verify")
  return linear
realize.compile_linear, realize.lower_and_compile = compile_linear, copies_only
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.compile.capture import verify_part
print(json.dumps({{p: {{f"{{n}}: {{k}}": ok for n, (h, b) in read_parts(p)[0].items() for k, ok in verify_part(h, b).items()}} for p in {list(paths)!r}}}))
""")
  results = json.loads(out.strip().splitlines()[-1])
  assert set(results) == set(paths) and all(results.values()), "no digests"
  failed = {paths[p]: [k for k, ok in r.items() if not ok] for p, r in results.items() if not all(r.values())}
  assert not failed, f"digests differ in a fresh process: {failed}"
