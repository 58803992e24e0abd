"""Every CLI argument is checked when the arguments are parsed: a bad value is one error line and exit 2, before anything is rendered,
compiled or served (fake_camerad and demo accepted `--hz -5` and `nan`, or failed with a traceback or only after compiling)."""
import argparse

import pytest

from sunnypilot.modeld_v2 import compile_modeld, compile_warp
from sunnypilot.modeld_v2.common import cli
from sunnypilot.modeld_v2.model.calibration import parse_camera_size
from sunnypilot.modeld_v2.replay import fake_camerad
from sunnypilot.modeld_v2.tools import demo, stand_in_models

def forbidden(*args, **kwargs): raise AssertionError("work started before the arguments were checked")

def rejected(capsys, main, argv: list[str], message: str) -> None:
  with pytest.raises(SystemExit) as e: main(argv)
  err = capsys.readouterr().err
  assert e.value.code == 2 and message in err.strip().splitlines()[-1] and "Traceback" not in err, f"{argv}: {err}"

@pytest.mark.parametrize("argv,message", [(["--camera", "100x100"], "no known sensor has 100x100 frames"), (["--camera", "big"], "WIDTHxHEIGHT"),
                                          (["--hz", "0"], "above 0 up to 1000, got '0'"), (["--hz", "-5"], "got '-5'"), (["--hz", "nan"], "got 'nan'"),
                                          (["--hz", "inf"], "got 'inf'"), (["--skip", "abc"], "comma-separated frame ids"), (["--skip", "1,-2"], "got '1,-2'"),
                                          (["--frames", "0"], "at least 1, got 0"), (["--start-delay", "nan"], "got 'nan'")])
def test_fake_camerad(capsys, monkeypatch, argv, message):
  monkeypatch.setattr(fake_camerad, "synthetic_frames", forbidden)
  rejected(capsys, fake_camerad.main, argv, message)

def test_argument_types_accept_good_values():
  assert cli.finite_float(0, 1000, low_open=True)("0.5") == 0.5 and cli.finite_float(0, 10)("0") == 0.0
  assert cli.int_list("30, 31,") == {30, 31} and cli.int_list("") == set()
  camera_size = cli.checked(parse_camera_size)
  assert camera_size("1344x760") == (1344, 760) and camera_size("1928x1208") == (1928, 1208)
  with pytest.raises(argparse.ArgumentTypeError, match="no known sensor has 100x100 frames"): camera_size("100x100")
  assert cli.positive_int("3") == 3 and cli.non_negative_int("0") == 0

@pytest.mark.parametrize("argv,message", [(["--frames", "0"], "at least 1, got 0"), (["--frames", "x"], "got 'x'"),
                                          (["--camera", "100x100"], "no known sensor has 100x100 frames"), (["--out", "{file}"], "is not a folder"),
                                          (["--artifacts", "{file}"], "is not a folder"), (["--dm-onnx", "{file}x"], "--dm-onnx "),
                                          (["--dm-onnx", "{file}", "--no-dm"], "--dm-onnx is for the driver-monitoring daemon")])
def test_demo_before_any_compile(tmp_path, capsys, monkeypatch, argv, message):
  monkeypatch.setattr(demo, "build_artifacts", forbidden)
  (tmp_path / "file").write_text("not a folder")
  rejected(capsys, demo.main, [a.format(file=tmp_path / "file") for a in argv], message)

@pytest.mark.parametrize("main", [compile_warp.main, compile_modeld.main])
def test_compilers_beam_is_checked_at_parse_time(tmp_path, capsys, main):
  argv = ["--frame", "1344,760,1408,768,384,2428928", "--warp-to", "512x256"] if main is compile_warp.main else ["--onnx", "m.onnx"]
  rejected(capsys, main, argv + ["--beam", "-1", "--output", str(tmp_path / "x.bin")], "at least 0, got -1")

def test_stand_in_seed(tmp_path, capsys):
  rejected(capsys, stand_in_models.main, ["--generation", "native", "--seed", "-1", "--output", str(tmp_path / "x.onnx")], "at least 0, got -1")

def test_diagnostics_read_prog_colon_message_on_stderr_results_stay_on_stdout(capsys):
  """Any module's log line in a CLI reads `<prog>: message` on stderr (as the CLIs printed them by hand before); a second CLI in the same
  process replaces the first setup rather than doubling every line; results printed by the CLI stay on stdout."""
  import logging
  @cli.interruptible("first")
  def first() -> int:
    logging.getLogger("sunnypilot.modeld_v2.runtime.loader").warning("a cache entry was ignored")
    return 0
  @cli.interruptible("second")
  def second() -> int:
    logging.getLogger("sunnypilot.modeld_v2.daemon.camera_sync").info("waiting for camerad")
    logging.getLogger("__main__").info("running")
    print("a result")
    return 0
  assert first() == 0 and capsys.readouterr().err == "first: a cache entry was ignored\n"
  assert second() == 0
  out, err = capsys.readouterr()
  assert out == "a result\n" and err == "second: waiting for camerad\nsecond: running\n", err

@pytest.mark.parametrize("argv,message", [
  (["--frame", "640,480,640,480,240,460800"], "no known sensor has 640x480 frames"),  # modeld has no intrinsics for it: refused before work
  (["--frame", "1344,760,1408,768,384,2428928", "--warp-to", "100000x100000"], "--warp-to 100000x100000 is more than 16,777,216 pixels")])
def test_compile_warp_refuses_what_modeld_could_never_use_before_any_work(tmp_path, capsys, argv, message):
  """`--frame 640,480,...` exited 0 (modeld then waits forever for a camera it has no intrinsics for); a 100000x100000 model input failed
  only after the capture, out of memory."""
  argv = argv + ["--warp-to", "512x256"] * ("--warp-to" not in argv)
  rejected(capsys, compile_warp.main, argv + ["--output", str(tmp_path / "x.bin")], message)
  assert not list(tmp_path.iterdir())

def test_usage_errors_are_one_line_named_for_the_command(capsys):
  """argparse printed 4-10 usage lines as `compile_modeld.py: error:`; every other error of a CLI is one line `compile_modeld: error:`."""
  with pytest.raises(SystemExit) as e: compile_modeld.main(["--no-such-flag"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.count("\n") == 1 and err.startswith("compile_modeld: error: "), err

def console_scripts() -> dict[str, str]:
  import os
  import tomllib

  from conftest import ROOT
  with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f: return tomllib.load(f)["project"]["scripts"]

@pytest.mark.parametrize("script", sorted(console_scripts()))
def test_usage_and_errors_name_the_console_command(capsys, script):
  """modeld_demo, modeld_watch and warp_preview printed `usage: demo`, `watch`, `preview`: commands nobody can type."""
  import importlib
  main = getattr(importlib.import_module(console_scripts()[script].split(":")[0]), console_scripts()[script].split(":")[1])
  with pytest.raises(SystemExit) as e: main(["--no-such-flag"])
  err = capsys.readouterr().err
  assert e.value.code == 2 and err.startswith(f"{script}: error: ") and len(err.strip().splitlines()) == 1, err
  with pytest.raises(SystemExit) as e: main(["--help"])
  assert e.value.code == 0 and capsys.readouterr().out.startswith(f"usage: {script} ")
