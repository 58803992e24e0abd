"""The CI workflows parse, and every command they run exists with the flags they pass."""
import glob
import importlib
import os
import re
import subprocess
import sys

import pytest
import yaml

from conftest import ROOT

WORKFLOWS = sorted(glob.glob(os.path.join(ROOT, ".github", "workflows", "*.yml")))

def scripts(workflow: dict) -> list[str]:
  return [step["run"].replace("\\\n", " ") for job in workflow["jobs"].values() for step in job["steps"] if "run" in step]

@pytest.fixture(scope="module")
def helps() -> dict:
  cache = {}
  def get(module: str) -> str:
    if module not in cache:
      out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=ROOT, timeout=120)
      assert out.returncode == 0, f"{module} --help failed: {out.stderr}"
      cache[module] = out.stdout
    return cache[module]
  return get

def test_workflows_exist():
  assert {os.path.basename(p) for p in WORKFLOWS} >= {"tests.yml", "compile-warp-kernels.yml", "build-models.yml"}

@pytest.mark.parametrize("path", WORKFLOWS, ids=os.path.basename)
def test_workflow_structure_and_commands(path, helps):
  with open(path) as f: workflow = yaml.safe_load(f)
  assert workflow["name"] and workflow[True if True in workflow else "on"], "a name and triggers"  # YAML reads a bare `on:` as True
  for name, job in workflow["jobs"].items():
    assert job["runs-on"] and job["steps"], name
    assert all("uses" in step or "run" in step for step in job["steps"]), name
  for script in scripts(workflow):
    for cmd in re.findall(r"(\./setup\.sh|bash \.ci/run)", script): assert os.path.exists(os.path.join(ROOT, cmd.split()[-1]))
    for module, rest in re.findall(r"python -m (sunnypilot\.modeld_v2\.[\w.]+)([^\n;|&]*)", script):
      assert hasattr(importlib.import_module(module), "main"), module
      text = helps(module)
      for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", rest): assert flag in text, f"{os.path.basename(path)}: {module} has no {flag}"
      for word in rest.split()[:1]:
        if not word.startswith("-") and not word.startswith('"'): assert word in text, f"{module} has no subcommand {word}"

def test_qcom_warps_use_the_seeds_flags():
  with open(os.path.join(ROOT, ".github", "workflows", "compile-warp-kernels.yml")) as f: workflow = yaml.safe_load(f)
  qcom = " ".join(scripts({"jobs": {"qcom": workflow["jobs"]["qcom"]}}))
  for flag in ("DEV=QCOM", "IMAGE=1", "FLOAT16=1", "NOLOCALS=1", "JIT_BATCH_SIZE=0", "--split-frames"): assert flag in qcom
  assert workflow["jobs"]["qcom"]["strategy"]["matrix"]["camera"] == ["1928x1208", "1344x760"]
  assert "--beam" in qcom and "NULL" not in qcom, "kernels are searched on the comma device itself, never on a NULL cross-compile"
  assert "--split-frames" not in " ".join(scripts({"jobs": {"amd": workflow["jobs"]["amd"]}})), "chestnut warps keep the packed layout"
