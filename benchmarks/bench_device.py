"""modeld as a comma device runs it, on today's schema and on the 2025 one: what resolving the topics by role costs per frame (nothing,
if the role lookup happens once at start as it should).

  python tests/device_tree.py today out/device/today MODELS      # a device tree per schema, its default set from MODELS (model.bin, a
  python tests/device_tree.py 2025 out/device/2025 MODELS        # 1344x760 warp; dmonitoring bundles too, if wanted), from an openpilot
  python -m benchmarks.bench_device --tree today=out/device/today --tree 2025=out/device/2025 [--frames 1000] [--json out/bench_device.json]

Per tree, tests/device_driver.py serves 1344x760 frames at 20 Hz and the car's messages under that schema's topic names; modeld is the
tree's entry script with no arguments but --timings, in the tree's environment. modeld's added latency per frame is its own stamps'
(receive -> modelV2 sent, minus the model run: copy + run + readback, as bench_daemon's "added in modeld"); its CPU per frame is /proc's
over the published frames. The trees alternate, --rounds times, so the machine's drift falls on both.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

from benchmarks.common import markdown_table, percentiles, write_json
from benchmarks.daemon_run import INPUTS, READBACK, SENT, cpu_seconds

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = {"today": os.path.join("openpilot", "sunnypilot", "modeld_v2"), "2025": os.path.join("sunnypilot", "modeld_v2")}

def run_tree(layout: str, root: str, frames: int) -> dict:
  """One modeld on the tree at `root` for `frames` frames at 20 Hz: its added latency (ms) and CPU per frame."""
  work, prefix = tempfile.mkdtemp(prefix="bench_device_"), f"bench_device_{uuid.uuid4().hex[:10]}"
  os.makedirs(f"/dev/shm/msgq_{prefix}")
  params, timings, out = os.path.join(work, "params"), os.path.join(work, "timings.json"), os.path.join(work, "driver.json")
  os.makedirs(params)
  env = os.environ | {"PYTHONPATH": root, "OPENPILOT_PREFIX": prefix, "FAKE_PARAMS_DIR": params, "FAKE_REALTIME_LOG": os.path.join(work, "rt")}
  running = os.path.join(work, "running")
  driver = subprocess.Popen([sys.executable, os.path.join(ROOT, "tests", "device_driver.py"), layout, out, "--frames", str(frames), "--want", "0",
                             "--car-params", params, "--wait", running, "--timeout", str(frames / 10 + 300)], env=env)
  modeld = None
  try:
    while not os.path.exists(out + ".ready"): time.sleep(0.05)
    modeld = subprocess.Popen([sys.executable, os.path.join(root, PACKAGES[layout], "modeld"), "--timings", timings, "--status-every", "0"],
                              env=env, stderr=subprocess.PIPE, text=True)
    for line in modeld.stderr:
      if "running:" in line: break
    open(running, "w").close()
    cpu0 = cpu_seconds(modeld.pid)
    driver.wait()
    cpu = cpu_seconds(modeld.pid) - cpu0
  finally:
    if modeld is not None:
      modeld.terminate()
      modeld.wait(timeout=60)
    if driver.poll() is None: driver.kill()
    shutil.rmtree(f"/dev/shm/msgq_{prefix}", ignore_errors=True)
  with open(timings) as f: stamps = [row[1:] for row in json.load(f)["frames"]][20:]  # the first frames warm the bindings up
  shutil.rmtree(work, ignore_errors=True)
  ms = lambda ns: ns / 1e6
  return {"frames": len(stamps), "added_in_modeld_ms": percentiles([ms(r[SENT] - r[0] - (r[READBACK] - r[INPUTS])) for r in stamps]),
          "cpu_ms_per_frame": 1e3 * cpu / max(len(stamps), 1)}

def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="benchmarks.bench_device", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tree", action="append", required=True, metavar="LAYOUT=ROOT", help="a device tree (tests/device_tree.py): today=DIR or 2025=DIR")
  p.add_argument("--frames", type=int, default=1000)
  p.add_argument("--rounds", type=int, default=2)
  p.add_argument("--json")
  args = p.parse_args(argv)
  trees = dict(t.split("=", 1) for t in args.tree)
  if bad := [k for k in trees if k not in PACKAGES]: p.error(f"--tree: layout {bad[0]} is none of {', '.join(PACKAGES)}")
  runs: dict[str, list[dict]] = {k: [] for k in trees}
  for r in range(args.rounds):
    for layout, root in trees.items():
      print(f"round {r + 1}/{args.rounds}: {layout} ...", file=sys.stderr, flush=True)
      runs[layout].append(run_tree(layout, os.path.abspath(root), args.frames))
  print(f"modeld on each schema, {args.frames} frames at 20 Hz per round, {args.rounds} rounds, the first 20 frames of each left out\n")
  print(markdown_table(("schema", "round", "frames", "added p50 ms", "added p99 ms", "CPU ms/frame"),
                       ((layout, i + 1, row["frames"], f"{row['added_in_modeld_ms']['p50']:.3f}", f"{row['added_in_modeld_ms']['p99']:.3f}",
                         f"{row['cpu_ms_per_frame']:.2f}") for layout, rows in runs.items() for i, row in enumerate(rows))))
  write_json(args.json, {"frames": args.frames, "runs": runs})
  return 0

if __name__ == "__main__":
  sys.exit(main())
