"""Loading a model + warp pair, streamed against today's whole-file read, and checking a signature: time and peak memory, fresh processes.

  python -m benchmarks.bench_load [--sizes full,big] [--loads 3] [--workdir out/bench_load] [--json out/bench_load.json]
  DEV=CUDA python -m benchmarks.bench_load --sizes full,big        # on a GPU machine: host memory beside the device's

Stand-ins of today's openpilot layout (split_current: vision + policy) with a 1928x1208 split warp: `full` (a realistic backbone) and
`big` (805 MB of weights, the size of openpilot's big model). They are built once into --workdir (the big one takes minutes).
Each load runs in a fresh process, the two ways interleaved. Before the timed load the process has imported everything and opened the
device (its first-time costs out of the way), and its peak RSS is reset (/proc/self/clear_refs); the table gives the load's time and
how far its peak RSS rose above where it started, against the bundle's size:
  streamed   runtime/loader.load_fused: the blob read once in chunks of at most 4 MiB, weights written straight into the device's buffers
  whole      what loads did before: read_parts of each file whole into memory (hashed), fused, the replay filling its buffers from that copy
The signature check (signed here with a fresh key): check_signed on the hash the preamble declares (what a daemon does before a byte of
the blob is read; the first in a fresh process imports what it needs), and the full content hash check a load then does while it streams
(check_content alone).
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import check_outputs, logger, markdown_table, write_json
from benchmarks.stand_ins import build_split_current
from sunnypilot.modeld_v2.common.cli import parser as cli_parser

LOAD = """
import json, sys, time
kind, model, warp = sys.argv[1:4]
from tinygrad import Device
from sunnypilot.modeld_v2.format.bundle import read_parts
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
from sunnypilot.modeld_v2.runtime.frame_fusion import frame_part
from sunnypilot.modeld_v2.runtime.loader import load_device, load_fused, loaded
dev = load_device()
Device[dev]
imported_tinygrad()
def status(key): return next(int(l.split()[1]) * 1024 for l in open('/proc/self/status') if l.startswith(key + ':'))
try: open('/proc/self/clear_refs', 'w').write('5')  # the peak from here
except OSError: pass
before = status('VmRSS')
t = time.perf_counter()
if kind == 'streamed': bundle = load_fused(model, warp)
else: bundle = loaded(*frame_part(warp, *read_parts(model, dev), dev), dev)
Device[dev].synchronize()
print(json.dumps({'s': time.perf_counter() - t, 'peak_rise': status('VmHWM') - before, 'after_rise': status('VmRSS') - before}))
"""

VERIFY = """
import json, os, sys, time
path, keys = sys.argv[1:3]
from sunnypilot.modeld_v2.format.bundle import BundleFile, check_content
from sunnypilot.modeld_v2.format.signature import TrustedKeys, check_signed
trusted = TrustedKeys.load(keys)
times = []
for _ in range(2):  # the first in a fresh process, then again
  t = time.perf_counter()
  with BundleFile(path) as f: check_signed(path, 'bundle', f.digest.hex(), f.size, trusted)
  times.append(time.perf_counter() - t)
t = time.perf_counter()
check_content(path)
print(json.dumps({'first_signature_s': times[0], 'signature_s': times[1], 'content_s': time.perf_counter() - t}))
"""

KINDS = {"streamed": "streamed (load_fused)", "whole": "whole-file read (read_parts + fuse + replay)"}

def fresh(code: str, *args: str) -> dict:
  out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
  if out.returncode != 0: raise SystemExit(f"bench_load: a fresh process failed: {out.stderr.strip()[-2000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])

def bench_size(workdir: str, size: str, loads: int, log) -> dict:
  import tempfile

  from sunnypilot.modeld_v2.format.bundle import check_content
  from sunnypilot.modeld_v2.format.signature import Signed, generate_key, load_private_key, sign
  model, warp = build_split_current(workdir, size, log)
  runs: dict[str, list[dict]] = {kind: [] for kind in KINDS}
  for i in range(loads):
    for kind in list(KINDS)[i % 2:] + list(KINDS)[:i % 2]:  # each round starts with the other kind
      log(f"{size}: load {i + 1}/{loads}, {kind} ...")
      runs[kind].append(fresh(LOAD, kind, model, warp))
  with tempfile.TemporaryDirectory() as keys:
    private, public = generate_key(os.path.join(keys, "publisher.pem"))
    digest, nbytes = check_content(model)
    sign(model, Signed("bundle", "model.bin", digest, nbytes), load_private_key(private))
    os.makedirs(trusted := os.path.join(keys, "trusted"))
    os.replace(public, os.path.join(trusted, "publisher.pem"))
    verify = [fresh(VERIFY, model, trusted) for _ in range(loads)]
  med = lambda rows, key: statistics.median(r[key] for r in rows)
  return {"size": size, "bundle_bytes": os.path.getsize(model) + os.path.getsize(warp), "model_bytes": os.path.getsize(model), "loads": loads,
          "load": {kind: {"s": med(rows, "s"), "peak_rise_bytes": med(rows, "peak_rise"), "after_rise_bytes": med(rows, "after_rise")}
                   for kind, rows in runs.items()},
          "verify": {key: med(verify, key) for key in ("first_signature_s", "signature_s", "content_s")}}

def table(results: list[dict], device: str) -> str:
  loads = ((r["size"], f"{r['bundle_bytes'] / 1e6:.0f}", KINDS[kind], f"{v['s']:.2f}", f"{v['peak_rise_bytes'] / 1e6:.0f}",
            f"{v['peak_rise_bytes'] / r['bundle_bytes']:.2f}", f"{v['after_rise_bytes'] / 1e6:.0f}") for r in results for kind, v in r["load"].items())
  checks = ((r["size"], f"{r['model_bytes'] / 1e6:.0f}", f"{r['verify']['first_signature_s'] * 1e3:.2f} / {r['verify']['signature_s'] * 1e3:.2f}",
             f"{r['verify']['content_s']:.2f}", f"{r['model_bytes'] / r['verify']['content_s'] / 1e9:.2f}") for r in results)
  return "\n".join([f"load of model + 1928x1208 split warp on {device}, fresh processes, median of {results[0]['loads']} (interleaved); peak RSS rise "
                    "above the process before the load", "",
                    markdown_table(("stand-in", "bundles MB", "load", "s", "peak RSS rise MB", "rise / bundles", "RSS after MB"), loads), "",
                    markdown_table(("stand-in", "model MB", "signature check (header + Ed25519) ms: first in a process / again", "content hash check s",
                                    "GB/s"), checks)])

def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("benchmarks.bench_load", __doc__)
  parser.add_argument("--sizes", default="full,big", help="stand-in sizes, comma-separated (tiny, full, big)")
  parser.add_argument("--loads", type=int, default=3, help="fresh processes per way of loading")
  parser.add_argument("--workdir", default="out/bench_load", help="where the stand-ins are built (and kept)")
  parser.add_argument("--json", help="also write the results here")
  args = parser.parse_args(argv)
  check_outputs(parser, args.json)
  from tinygrad import Device

  from sunnypilot.modeld_v2.tools.stand_in_models import BACKBONES
  sizes = [s for s in args.sizes.split(",") if s]
  if bad := [s for s in sizes if s not in BACKBONES]: parser.error(f"--sizes: {bad} are not among {list(BACKBONES)}")
  log = logger()
  results = [bench_size(args.workdir, size, args.loads, log) for size in sizes]
  print(table(results, Device.DEFAULT))
  write_json(args.json, {"device": Device.DEFAULT, "results": results})
  return 0

if __name__ == "__main__":
  sys.exit(main())
