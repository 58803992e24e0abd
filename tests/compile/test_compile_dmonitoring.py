"""compile_modeld on openpilot's driver-monitoring model: told by its input_img, its bundle a `dmonitoring_model`, and a model whose heads
dmonitoringmodeld could not parse refused before any work, as a driving model's are."""
import os
import subprocess
import sys

import onnx
import pytest

from sunnypilot.modeld_v2.compile.onnx_model import ModelError
from sunnypilot.modeld_v2.compile_modeld import compile_model
from sunnypilot.modeld_v2.format.bundle import read_bundle
from sunnypilot.modeld_v2.tools.stand_in_models import dm_output_sizes, output_slices_prop

from conftest import ROOT

def test_the_bundle_is_a_dmonitoring_model(dm_artifacts):
  meta = read_bundle(os.path.join(dm_artifacts, "dmonitoring_model.bin"))[0]["extras"]["metadata"]
  assert (meta["kind"], meta["layout"]) == ("dmonitoring_model", "dmonitoring")
  assert meta["input_roles"] == {"input_img": "frames", "calib": "host"}
  sizes, at = dm_output_sizes(), 0
  for name, size in sizes.items():
    assert meta["output_slices"][name] == [at, at + size], name
    at += size

def with_slices(src: str, dst: str, sizes: dict | None) -> str:
  """The stand-in ONNX at `src` with other output_slices (None: none at all), at `dst`."""
  model = onnx.load(src)
  props = [p for p in model.metadata_props if p.key != "output_slices"]
  del model.metadata_props[:]
  model.metadata_props.extend(props)
  if sizes is not None: model.metadata_props.add(key="output_slices", value=output_slices_prop(sizes))
  onnx.save(model, dst)
  return dst

@pytest.mark.parametrize("sizes,message", [(None, "no output_slices in the ONNX metadata_props"),
                                           (dm_output_sizes() | {"face_descs_lhd": 11},
                                            "face_descs_lhd has 11 values, openpilot's driver-monitoring parse reads 12"),
                                           ({k: n for k, n in dm_output_sizes().items() if k != "wheel_on_right"}, "wheel_on_right missing")])
def test_heads_dmonitoringmodeld_cannot_parse_are_refused_before_any_work(dm_artifacts, tmp_path, sizes, message):
  onnx_path = with_slices(os.path.join(dm_artifacts, "dmonitoring_model.onnx"), str(tmp_path / "dm.onnx"), sizes)
  with pytest.raises(ModelError, match=message): compile_model(str(tmp_path / "dm.bin"), onnx=onnx_path, log=lambda s: None)
  assert not (tmp_path / "dm.bin").exists()
  out = subprocess.run([sys.executable, "-m", "sunnypilot.modeld_v2.compile_modeld", "--onnx", onnx_path, "--output", str(tmp_path / "dm.bin")],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and out.stderr.count("\n") == 1 and message in out.stderr and "Traceback" not in out.stderr, out.stderr

def test_a_generation_is_refused(dm_artifacts, tmp_path):
  with pytest.raises(ModelError, match="a driver-monitoring model has no --generation"):
    compile_model(str(tmp_path / "dm.bin"), onnx=os.path.join(dm_artifacts, "dmonitoring_model.onnx"), generation="native", log=lambda s: None)
