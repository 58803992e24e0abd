"""openpilot's modeld input handling in numpy, driving onnxruntime: the independent reference the bundles are checked against. It shares no
code with the package's queues: it keeps openpilot's full-length buffers and every warped frame, and samples them the way openpilot's
modeld.py does (commaai/openpilot selfdrive/modeld/modeld.py @6c6be47b: full_desire max-pooled per TEMPORAL_SKIP window, temporal_idxs,
features pushed after the vision model and prev_desired_curv after the policy; @00731a68: the 20 Hz supercombo, features and
prev_desired_curv pushed after the run)."""
import base64
import pickle
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime as ort

from sunnypilot.modeld_v2.runtime.loader import load_bundle

from conftest import realized

GATE = {"prepare_only": np.zeros((1, 1), np.float32)}  # a queued bundle's gate, off: every queue pushes
ORT_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(uint8)": np.uint8}

def slices_of(path: str) -> dict[str, slice]:
  meta = {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}
  return pickle.loads(base64.b64decode(meta["output_slices"]))

class Openpilot:
  """openpilot's modeld input handling in numpy, driving onnxruntime sessions of one model, a vision + policy pair or a vision + policies
  triple; `step` returns the outputs concatenated vision first. Native models feed their next_X outputs back as X."""
  def __init__(self, files: dict[str, str], frame_skip: int | None = None):
    self.sessions = {k: ort.InferenceSession(p, providers=["CPUExecutionProvider"]) for k, p in files.items()}
    self.slices = {k: slices_of(p) for k, p in files.items()}
    self.inputs = {i.name: (tuple(i.shape), ORT_DTYPES[i.type]) for s in self.sessions.values() for i in s.get_inputs()}
    shape = lambda name: self.inputs[name][0]
    self.native = "new_img" in self.inputs
    self.states = {n: np.zeros(s, d) for n, (s, d) in self.inputs.items() if n.startswith("state_")}
    # openpilot 0.9.x: a 20 Hz features history (HISTORY_BUFFER_LEN 99); since 0.9.7 the model samples every TEMPORAL_SKIP = 4th frame
    self.fs = frame_skip or (1 if "features_buffer" in self.inputs and shape("features_buffer")[1] >= 99 else 4)
    if not self.native: self.road, self.wide = (next(n for n in self.inputs if "img" in n and ("big" in n) == wide) for wide in (False, True))
    self.desire_key = next((n for n in self.inputs if n.startswith("desire") and len(shape(n)) == 3), None)
    self.curv_key = next((n for n in self.inputs if n.startswith("prev_desired_curv")), None)
    full = lambda name: np.zeros((self.fs * shape(name)[1], shape(name)[2]), np.float32)
    self.full = {name: full(name) for name in (self.desire_key, "features_buffer", self.curv_key) if name in self.inputs}
    self.frames: list[np.ndarray] = []  # every warped (road, wide) pair so far
    self.host = [n for n in self.inputs if n not in self.full and n not in self.states and "img" not in n]

  def temporal(self, name: str) -> np.ndarray:
    """openpilot's temporal_idxs: every fs-th entry ending at the newest."""
    n = self.inputs[name][0][1]
    return self.full[name][-1 - self.fs * (n - 1)::self.fs][None]

  def images(self, cam: int) -> np.ndarray:
    n = self.inputs[self.road][0][1] // 6
    picks = [len(self.frames) - 1 - self.fs * k for k in reversed(range(n))]
    return np.concatenate([self.frames[i][cam] if i >= 0 else np.zeros_like(self.frames[-1][cam]) for i in picks]).reshape(self.inputs[self.road][0])

  def push(self, name: str, value: np.ndarray) -> None:
    self.full[name][:-1] = self.full[name][1:]
    self.full[name][-1] = value

  def run(self, model: str, feeds: dict) -> np.ndarray:
    session = self.sessions[model]
    return session.run(["outputs"], {i.name: feeds[i.name].astype(ORT_DTYPES[i.type]) for i in session.get_inputs()})[0].astype(np.float32)

  def step(self, new_img: np.ndarray, desire: np.ndarray, host: dict[str, np.ndarray]) -> np.ndarray:
    if self.native:
      session = self.sessions["onnx"]
      names = ["outputs"] + [f"next_{k}" for k in self.states]
      out = dict(zip(names, session.run(names, {"new_img": new_img} | host | self.states)))
      self.states = {k: out[f"next_{k}"] for k in self.states}
      return out["outputs"]
    self.frames.append(new_img)
    feeds = dict(host) | {self.road: self.images(0), self.wide: self.images(1)}
    if self.desire_key:
      self.push(self.desire_key, desire.reshape(-1))
      n = self.inputs[self.desire_key][0][1]
      feeds[self.desire_key] = self.full[self.desire_key].reshape(n, self.fs, -1).max(axis=1)[None]
    if self.curv_key: feeds[self.curv_key] = self.temporal(self.curv_key)
    models = list(self.sessions)
    if models == ["onnx"]:
      if "features_buffer" in self.full: feeds["features_buffer"] = self.temporal("features_buffer")
      out = self.run("onnx", feeds)
      hidden, curv_from = out[0, self.slices["onnx"]["hidden_state"]], out[0, self.slices["onnx"].get("desired_curvature", slice(0, 0))]
    else:
      vision = self.run("vision", feeds)
      if "features_buffer" in self.full:
        self.push("features_buffer", vision[0, self.slices["vision"]["hidden_state"]])
        feeds["features_buffer"] = self.temporal("features_buffer")
      policies = {k: self.run(k, feeds) for k in models[1:]}
      out = np.concatenate([vision, *policies.values()], axis=1)
      curv_from = next((o[0, self.slices[k]["desired_curvature"]] for k, o in policies.items() if "desired_curvature" in self.slices[k]), None)
    if models == ["onnx"] and "features_buffer" in self.full: self.push("features_buffer", hidden)
    if self.curv_key: self.push(self.curv_key, curv_from[:self.inputs[self.curv_key][0][2]])  # the head's mean, as OutputParser gives it
    return out

def step_inputs(rng, step: int, host_names: list[str], reference: Openpilot) -> tuple[np.ndarray, dict[str, np.ndarray]]:
  """This step's one-hot desire pulse (a one-frame pulse now and then, which max-pooling must keep) and random host inputs."""
  desire = np.zeros((1, 8), np.float32)
  if step % 6 == 2: desire[0, 1 + step % 7] = 1
  host = {n: rng.standard_normal(reference.inputs[n][0]).astype(np.float32) for n in host_names if n != "desire"}
  return desire, host | ({"desire": desire} if "desire" in host_names else {})

def drive_bundle(path: str, reference: Openpilot, rng, steps: int = 20) -> None:
  """`steps` random frames through the bundle (states written in place, as modeld runs it) and through the reference."""
  model = load_bundle(path)
  specs = model.input_specs
  states = {n: realized(np.zeros(s.shape, s.dtype)) for n, s in specs.items() if f"next_{n}" in model.output_specs}
  outs = {n: states[n[5:]] if n[5:] in states else realized(np.zeros(s.shape, s.dtype)) for n, s in model.output_specs.items()}
  for step in range(steps):
    new_img = rng.integers(0, 256, (2, 6, 128, 256), dtype=np.uint8)
    desire, host = step_inputs(rng, step, reference.host, reference)
    expected = reference.step(new_img, desire, host)
    model.run(**{n: realized(v) for n, v in ({"new_img": new_img, "desire": desire} | GATE | host).items() if n in specs}, **states,
                 output_buffers=outs)
    np.testing.assert_allclose(outs["outputs"].numpy(), expected, rtol=1e-4, atol=1e-5, err_msg=f"{path} step {step} vs onnxruntime")

# openpilot's time and distance axes (selfdrive/modeld/constants.py: T_IDXS, X_IDXS), written out
T = np.array([10.0 * (i / 32) ** 2 for i in range(33)])
X = np.array([192.0 * (i / 32) ** 2 for i in range(33)])

def sig(x): return 1 / (1 + np.exp(-np.asarray(x, np.float64)))

def openpilot_plan_t_idxs(plan_x: np.ndarray) -> list[float]:
  """openpilot fill_model_msg.py's loop, written out: numpy float32 plan points against Python-float X_IDXS, the search restarted at the
  first plan point for every distance."""
  t = [float("nan")] * 33
  t[0] = 0.0
  for xi in range(1, 33):
    ti = 0
    while ti < 32 and plan_x[ti + 1] < X[xi].item(): ti += 1
    if ti == 32:
      t[xi] = 10.0
      break
    x0, x1 = float(plan_x[ti]), float(plan_x[ti + 1])
    p = (X[xi].item() - x0) / (x1 - x0) if abs(x1 - x0) > 1e-9 else float("nan")
    t[xi] = p * T[ti + 1].item() + (1 - p) * T[ti].item()
  return t

def varied_plan_x(rng, i: int) -> np.ndarray:
  """A float32 plan x of kind i % 4: going back and forth, forward, standing still now and then (coincident points: NaN where the search
  stops there), or on a lane-line distance or one float32 step beside it."""
  kind, x32 = i % 4, X.astype(np.float32)
  if kind == 0: return (rng.standard_normal(33) * 60).astype(np.float32)
  if kind == 1: return np.cumsum(rng.uniform(0, 10, 33)).astype(np.float32)
  if kind == 2: return np.round(np.cumsum(rng.uniform(-2, 9, 33))).astype(np.float32)
  plan_x = x32 * np.float32(rng.uniform(0.6, 1.4))
  k = rng.integers(1, 32, 6)
  plan_x[k] = np.nextafter(x32[k], x32[k] + np.float32(rng.choice([-1, 0, 1])), dtype=np.float32)
  plan_x[k + 1] = np.where(rng.random(6) < 0.5, plan_x[k], plan_x[k + 1])
  return plan_x

def car(v_ego=25.0, left=False, right=False, pressed=False, torque=0.0, left_bsm=False, right_bsm=False) -> SimpleNamespace:
  """The carState fields modeld reads, as a stand-in object."""
  return SimpleNamespace(vEgo=v_ego, leftBlinker=left, rightBlinker=right, steeringPressed=pressed, steeringTorque=torque,
                         leftBlindspot=left_bsm, rightBlindspot=right_bsm)
