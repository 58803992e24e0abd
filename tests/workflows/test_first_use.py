"""What a new user meets: the README's commands write only under out/ and name flags their CLIs have; synthetic_route makes its missing
parent folders (and removes them again when it fails); stand_in_models' next command never overwrites a fixed model.bin; the pictures
carry their labels (preview panels, the overlay's legend, frame number and 'random weights' banner); profile says when CPU peaks look
like a GPU's."""
import contextlib
import importlib
import io
import os
import re
import shlex

import numpy as np
import pytest

from conftest import ROOT

# the documented commands: the README's and the guide's it points to
README = "\n".join(open(os.path.join(ROOT, f)).read() for f in ("README.md", os.path.join("docs", "GUIDE.md")))
OUTPUT_FLAGS = ("--output", "--out", "--json")

def readme_commands() -> list[list[str]]:
  """Every `.venv/bin/python -m sunnypilot.modeld_v2.X ...` line of the README's bash blocks, split as the shell splits it (comments off)."""
  commands = []
  for block in re.findall(r"```bash\n(.*?)```", README, re.S):
    for line in block.splitlines():
      words = shlex.split(line, comments=True)
      if words[:2] == [".venv/bin/python", "-m"] and words[2].startswith("sunnypilot."): commands.append(words[2:])
  return commands

def test_readme_commands_write_only_under_out_and_use_the_venv():
  commands = readme_commands()
  assert len(commands) > 20
  for words in commands:
    module, args = words[0], [w for w in words[1:] if w != "&"]
    outputs = [args[i + 1] for i, w in enumerate(args[:-1]) if w in OUTPUT_FLAGS]
    outputs += [w.split("=", 1)[1] for w in args if "=" in w and w.split("=")[0] in OUTPUT_FLAGS]
    if module.endswith("synthetic_route"): outputs.append(args[0])
    assert all(p.startswith("out/") for p in outputs), f"{' '.join(words)}: writes outside out/"
  inline = re.findall(r"`([^`]*python -m [^`]*)`", README)
  assert inline and all(re.search(r"(^|\s)\.venv/bin/python -m", cmd) for cmd in inline), [c for c in inline if ".venv/bin/python" not in c]
  for snippet in re.findall(r"```python\n(.*?)```", README, re.S):
    for path in re.findall(r"\"([^\"]+\.(?:bin|onnx|zst))\"", snippet): assert path.startswith("out/"), f"{path}: a python snippet reads outside out/"

def test_readme_commands_use_flags_their_cli_has():
  helps = {}
  for words in readme_commands():
    module = words[0]
    if module not in helps:
      out = io.StringIO()
      with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as e: importlib.import_module(module).main(["--help"])
      assert e.value.code == 0, module
      helps[module] = out.getvalue()
    for flag in (w.split("=")[0] for w in words[1:] if w.startswith("--")): assert flag in helps[module], f"{module} has no {flag}"

def test_synthetic_route_makes_missing_parents_and_removes_them_when_it_fails(tmp_path, monkeypatch):
  from sunnypilot.modeld_v2.replay import synthetic_route
  def fake_segment(folder, *args, **kwargs):
    os.makedirs(folder)
    open(os.path.join(folder, "rlog.zst"), "wb").close()
  monkeypatch.setattr(synthetic_route, "write_segment", fake_segment)
  assert synthetic_route.main([str(tmp_path / "out" / "route" / "seg--0"), "--frames", "2"]) == 0
  assert os.listdir(tmp_path / "out" / "route" / "seg--0") == ["rlog.zst"]
  def interrupted(folder, *args, **kwargs):
    fake_segment(folder)
    raise KeyboardInterrupt
  monkeypatch.setattr(synthetic_route, "write_segment", interrupted)
  assert synthetic_route.main([str(tmp_path / "new" / "deeper" / "seg--0"), "--frames", "2"]) == 130
  assert sorted(os.listdir(tmp_path)) == ["out"], "the parents it made are gone again"

def test_stand_in_next_command_names_a_bundle_beside_the_onnx(tmp_path, capsys):
  from sunnypilot.modeld_v2.tools import stand_in_models
  assert stand_in_models.main(["--generation", "dmonitoring", "--output", str(tmp_path / "dm.onnx")]) == 0
  command = capsys.readouterr().out.strip().splitlines()[-1]
  assert command.startswith("compile with: ") and "model.bin" not in command, command
  words = shlex.split(command.removeprefix("compile with: "))
  # the DM bundle dmonitoringmodeld runs: compile_modeld (its output_slices recorded)
  assert words[1:3] == ["-m", "sunnypilot.modeld_v2.compile_modeld"] and words[words.index("--onnx") + 1] == str(tmp_path / "dm.onnx")
  assert words[words.index("--output") + 1] == str(tmp_path / "dm.bin")
  files = {"vision": str(tmp_path / "s_vision.onnx"), "policy": str(tmp_path / "s_policy.onnx")}
  words = shlex.split(stand_in_models.next_command("split_09", str(tmp_path / "s.onnx"), files))
  assert words[words.index("--output") + 1] == str(tmp_path / "s.bin") and words[words.index("--policy") + 1] == files["policy"]
  assert shlex.split(stand_in_models.next_command("native", "x.bin", {"onnx": "x.bin"}))[-1] == "x_compiled.bin", "never the ONNX itself"

def test_preview_panels_are_labeled_and_the_planes_kept_where_layout_says():
  """The labeled picture holds each warped plane's pixels unchanged at its layout box (Y reassembled: its sub-grid (0, 0) is plane 0), and
  the title and caption strips carry text (bright pixels on the dark strip)."""
  from sunnypilot.modeld_v2.tools import preview
  rng = np.random.default_rng(0)
  planes = rng.integers(0, 200, (2, 6, 32, 64), dtype=np.uint8)
  image = preview.labeled_image(planes, {"road": "road camera", "wide": "wide camera"})
  boxes = preview.layout(32, 64)
  assert image.shape == boxes["size"][2:]
  box = lambda name: image[boxes[name][0]:boxes[name][0] + boxes[name][2], boxes[name][1]:boxes[name][1] + boxes[name][3]]
  for k, cam in enumerate(preview.CAMERAS):
    y = box(f"{cam} Y")
    assert (y[0::2, 0::2] == planes[k, 0]).all() and (y[1::2, 0::2] == planes[k, 1]).all() and (y[1::2, 1::2] == planes[k, 3]).all()
    assert (box(f"{cam} U") == planes[k, 4]).all() and (box(f"{cam} V") == planes[k, 5]).all()
    r, c, _, w = boxes[f"{cam} Y"]
    title, caption = image[:r, c:c + w], image[r + 64:r + 64 + preview.CAPTION, c:c + w]
    assert (title > 200).sum() > 50 and (caption > 200).sum() > 50, f"{cam}: no label text"
  unlabeled = preview.labeled_image(planes, {"road": "", "wide": ""})
  assert (unlabeled[:boxes["road Y"][0], :128] > 200).sum() == 0, "the text is what makes the title strip bright"

def test_overlay_caption_legend_frame_number_and_stand_in_banner():
  from PIL import Image

  from sunnypilot.modeld_v2.replay.route_overlay import draw_caption
  size = (964, 604)
  plain, stand_in = Image.new("RGB", size), Image.new("RGB", size)
  draw_caption(plain, 7, 107)
  draw_caption(stand_in, 7, 107, "random weights: outputs mean nothing")
  a, b = np.asarray(plain).astype(int), np.asarray(stand_in).astype(int)
  assert (a[:100, :200] > 200).any(), "a legend top left"
  assert (a[:30, -200:] > 200).any(), "the frame number top right"
  assert not a[-30:].any() and (b[-30:, :, 0] > b[-30:, :, 1] + 50).mean() > 0.5, "a red banner along the bottom only for a stand-in"
  assert (a[:-40] == b[:-40]).all()
  other = Image.new("RGB", size)
  draw_caption(other, 8, 108)
  assert (np.asarray(other)[:30, -200:] != a[:30, -200:]).any(), "the frame number is drawn, not a fixed label"

def test_profile_says_when_cpu_peaks_are_a_gpus():
  from sunnypilot.modeld_v2.tools import kernel_profile
  ceiling, how = kernel_profile.cpu_flops_ceiling()
  assert ceiling > 0 and "threads" in how
  warning = kernel_profile.peaks_warning("CPU", 67e12, 4.8e12)
  assert warning and "look like a GPU's" in warning and "For this CPU: --peak-tflops" in warning
  assert kernel_profile.peaks_warning("CPU", ceiling / 2, 0.05e12) is None
  assert kernel_profile.peaks_warning("CUDA", 67e12, 4.8e12) is None
  row = {"call": 0, "name": "E_1", "global_size": [1], "local_size": None, "ops": 1e9, "bytes": 1e9, "s": 1e-3, "flops_per_s": 1e12,
         "bytes_per_s": 1e12, "share": 1.0, "bound_s": 1e9 / 4.8e12}
  result = {"device": "CPU", "calls": [row], "sum_s": 1e-3, "floor_s": 1e-3, "bound_s": row["bound_s"], "ops": 1e9, "bytes": 1e9,
            "peak_flops": 67e12, "peak_bytes": 4.8e12}
  text = kernel_profile.table(result)
  assert "x the bound (against another machine's peaks: see the NOTE)" in text and "NOTE:" in text
  assert "For this CPU" in kernel_profile.table(result | {"bound_s": None, "peak_flops": None, "peak_bytes": None})

def test_synthetic_route_says_each_stage_as_it_goes(tmp_path):
  """It ran 68 s behind one line. Now each stage (each video rendered and encoded, the log) has its line, and within one a line comes every
  few seconds (Progress, below)."""
  import subprocess
  import sys
  command = [sys.executable, "-m", "sunnypilot.modeld_v2.replay.synthetic_route", str(tmp_path / "seg--0"), "--camera", "1344x760", "--frames", "12",
             "--distinct", "4"]
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr
  stages = [line for line in proc.stderr.splitlines() if line.endswith("...")]
  assert stages == ["synthetic_route: rendering and encoding 12 frames of 1344x760, a line every few seconds ...",
                    "synthetic_route: fcamera.hevc: rendering 4 road scenes ...", "synthetic_route: fcamera.hevc: encoding 12 frames ...",
                    "synthetic_route: ecamera.hevc: rendering 4 road scenes ...", "synthetic_route: ecamera.hevc: encoding 12 frames ...",
                    "synthetic_route: dcamera.hevc: encoding 12 frames ...", "synthetic_route: rlog.zst: 12 frames of events ..."], proc.stderr
  assert sorted(os.listdir(tmp_path / "seg--0")) == ["dcamera.hevc", "ecamera.hevc", "fcamera.hevc", "rlog.zst"]

def test_progress_lines_come_every_few_seconds_of_a_loop():
  """Progress.step logs where a loop is when 2 s passed since the last line (a stage's start counts), on the clock it is given."""
  from sunnypilot.modeld_v2.common.logs import Progress
  now, lines = [0.0], []
  progress = Progress(lines.append, 2.0, clock=lambda: now[0])
  progress.start("stage")
  for k in range(1, 51):
    now[0] = k * 0.25  # a step every 0.25 s: a line every 8th
    progress.step(f"step {k}")
  assert lines == ["stage", "step 8", "step 16", "step 24", "step 32", "step 40", "step 48"]
  progress.start("next stage")
  progress.step("at once after it: not logged")
  assert lines[-1] == "next stage"

FAKE_PIP = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/pip.calls"
case "$*" in *-e*) echo "Requirement already satisfied: numpy"; echo "Collecting tinygrad==0.14.0"; echo "Successfully installed tinygrad-0.14.0";; esac
"""

def test_setup_says_each_step(tmp_path):
  """setup.sh was silent for 36 s (pip -q) after no line at all. Run here on a copy, with clang and python3 standing in on PATH (python3
  makes a .venv whose pip records its calls and prints what pip prints), so that nothing is installed."""
  import shutil
  import stat
  import subprocess
  shutil.copy(os.path.join(ROOT, "setup.sh"), tmp_path / "setup.sh")
  (bin_ := tmp_path / "bin").mkdir()
  (bin_ / "clang").write_text("#!/bin/sh\n")
  (bin_ / "pip").write_text(FAKE_PIP)
  (bin_ / "python3").write_text(f"#!/bin/sh\nmkdir -p .venv/bin && cp {bin_ / 'pip'} .venv/bin/pip && cp {bin_ / 'pip'} .venv/bin/python\n")
  for f in bin_.iterdir(): f.chmod(f.stat().st_mode | stat.S_IXUSR)
  proc = subprocess.run(["bash", str(tmp_path / "setup.sh")], capture_output=True, text=True, timeout=60,
                        env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
  assert proc.returncode == 0, proc.stderr
  assert proc.stdout.splitlines() == [
    f"setup: clang: {bin_ / 'clang'} (tinygrad's CPU backend compiles with it)", "setup: making the virtual environment .venv ...",
    "setup: upgrading pip in .venv ...",
    "setup: installing this package and its test extras into .venv from PyPI (tinygrad, onnx, onnxruntime, msgq, ray, ...) ...",
    "setup:   pip: Collecting tinygrad==0.14.0", "setup:   pip: Successfully installed tinygrad-0.14.0",
    "setup: done: .venv ready (.venv/bin/python -m sunnypilot.modeld_v2.tools.demo runs the demo)"], proc.stdout
  assert (tmp_path / ".venv" / "bin" / "pip.calls").read_text().splitlines() == ["install -q --upgrade pip", "install -e .[test]"]

def test_each_daemon_in_the_readme_runs_on_a_folder_an_earlier_command_filled():
  """The model-sets walkthrough ran dmonitoringmodeld on out/first, which holds no DM model: exit 2. Each daemon's --artifacts must have
  got its model from an earlier command (compile_modeld --output, or the demo's --artifacts, which builds both), and with --trusted-keys
  been signed (sign_bundle --manifest) before."""
  made, signed = set(), set()
  for words in readme_commands():
    module = words[0].rsplit(".", 1)[-1]
    output, artifacts, manifest = (words[words.index(f) + 1] if f in words else None for f in ("--output", "--artifacts", "--manifest"))
    if module == "compile_modeld": made.add(output)
    if module == "demo" and artifacts: made |= {f"{artifacts}/model.bin", f"{artifacts}/dmonitoring_model.bin"}
    if module == "sign_bundle" and manifest: signed.add(manifest)
    if model := {"modeld": "model.bin", "dmonitoringmodeld": "dmonitoring_model.bin"}.get(module):
      assert f"{artifacts}/{model}" in made, f"{' '.join(words)}: no earlier command writes {artifacts}/{model}"
      assert "--trusted-keys" not in words or artifacts in signed, f"{' '.join(words)}: {artifacts} is not signed before"
