"""Look inside a bundle or a model set's manifest, or check it still computes what it computed when it was built and who signed it.

  python -m sunnypilot.modeld_v2.tools.inspect_bundle inspect model.bin   # provenance, precision, inputs (with their roles)/outputs, buffers,
                                                                           # kernels, programs; who signed it, which manifest names it
  python -m sunnypilot.modeld_v2.tools.inspect_bundle inspect manifest.json   # a set's bundles by role and hash, who signed it
  python -m sunnypilot.modeld_v2.tools.inspect_bundle inspect out/first       # a folder's bundles: kind, device, size, hash, signed or not
  python -m sunnypilot.modeld_v2.tools.inspect_bundle verify model.bin    # replay the recorded check here; exit 1 on any mismatch
  python -m sunnypilot.modeld_v2.tools.inspect_bundle verify model.bin --trusted-keys keys/   # its signature first, as modeld checks it
  python -m sunnypilot.modeld_v2.tools.inspect_bundle verify manifest.json --trusted-keys keys/   # a set: signature, folder, every hash
  python -m sunnypilot.modeld_v2.tools.inspect_bundle profile model.bin [--warp warp.bin] [--peak-tflops 67 --peak-tbs 4.8 | --peaks h200] [--json out.json]
      # time each kernel alone here: FLOPs and bytes (tinygrad's estimates), GFLOP/s, GB/s, share, and the roofline lower bound;
      # --peaks h200: the H200 datasheet's peaks, each kernel's FLOP rate by its arithmetic (fp32, fp16, tensor cores in its binary)
"""
from __future__ import annotations

import argparse
import collections
import logging
import os
import sys
from typing import TYPE_CHECKING

from sunnypilot.modeld_v2.common.cli import finite_float, interruptible, non_negative_int, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError
from sunnypilot.modeld_v2.compile.onnx_model import ModelError, read_output_slices
from sunnypilot.modeld_v2.format.bundle import BundleFile, Metadata
from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, Manifest, read_manifest
from sunnypilot.modeld_v2.format.part import Part
from sunnypilot.modeld_v2.format.signature import read_signatures, sig_path

if TYPE_CHECKING:
  from sunnypilot.modeld_v2.daemon.model_sets import Trust

# line by line, or too long for the metadata line
LONG_METADATA = ("output_slices", "input_shapes", "output_shapes", "input_roles", "onnx_roles", "message_floats", "onnx_metadata")
LONG_VALUE = 80  # an ONNX metadata value longer than this is summarized, never printed whole

def onnx_metadata_lines(props: dict) -> list[str]:
  """A compile_onnx bundle's ONNX metadata as a person reads it: comma's output_slices (a base64 pickle) decoded as data by the compiler's
  restricted unpickler (dicts and slices only), one head a line; any other long value summarized."""
  lines = []
  for key, value in props.items():
    if key == "output_slices":
      try: slices = read_output_slices(value)
      except ModelError as e:
        lines.append(f"  onnx metadata output_slices: {len(value):,} characters that are not comma's pickled slices ({e})")
        continue
      lines.append(f"  onnx metadata output_slices (comma's pickled slices, read as data): {len(slices)} heads, "
                   f"{max((stop for _, stop in slices.values()), default=0)} floats")
      lines += [f"    {name:32s} [{start}:{stop}]" for name, (start, stop) in slices.items()]
    else: lines.append(f"  onnx metadata {key}: " + (repr(value) if len(str(value)) <= LONG_VALUE else f"{len(str(value)):,} characters, not shown"))
  return lines

def parse_line(floats: dict | None) -> str:
  """Where a model bundle's output parse runs: in its graph (the float block's size per service), or on the host."""
  if not floats: return "on the host (built before the parse was in the graph, or with --host-parse)"
  per: collections.Counter[str] = collections.Counter()
  for service, _, n in floats["fields"]: per[service] += n
  tail = len(floats["sources"]) - floats["published"]
  return (f"in the graph: message_floats holds {', '.join(f'{s} {n}' for s, n in per.items())} floats"
          + (f", and {tail} the host reads alone" if tail else "") + f" (layout version {floats['version']})")

def precision_line(meta: Metadata, parts: dict[str, Part]) -> str:
  """What a bundle computes in, and the bytes its initial buffers hold per dtype (a float16 model's weights are half)."""
  from sunnypilot.modeld_v2.format.bundle import precision_of
  held: collections.Counter[str] = collections.Counter()
  for h in parts.values():
    for b in h.buffers:
      if b.init is not None: held[b.dtype.removeprefix("dtypes.")] += b.init[1] - b.init[0]
  kind = ("a warp: uint8 in and out, its coordinates in float32" if meta.get("kind") in ("warp", "dm_warp") else
          "weights and activations in half, sums accumulated in float32; inputs and outputs keep their dtypes" if precision_of(meta) == "float16"
          else "the ONNX's own dtypes")
  return f"precision: {precision_of(meta)} ({kind}); initial buffers: {', '.join(f'{d} {n:,} bytes' for d, n in held.most_common()) or 'none'}"

def describe(path: str) -> str:
  from sunnypilot.modeld_v2.format.bundle import check_parts, read_bundle
  from sunnypilot.modeld_v2.format.tinygrad_identity import describe as describe_tinygrad
  head, blob = read_bundle(path)
  prov, extras = head["provenance"], head.get("extras", {})
  parts = check_parts(head, blob, path)  # any tinygrad's bundle may be inspected, but only a well-formed one
  built = describe_tinygrad(prov.get("tinygrad"), prov.get("tinygrad_source"))
  lines = [f"{path}: {len(blob):,} blob bytes", f"  built with {built} for {prov.get('device')} ({prov.get('target')}), "
           f"format {prov.get('format')}", f"  flags: {', '.join(f'{k}={v}' for k, v in prov.get('flags', {}).items())}"]
  meta = extras.get("metadata", {})
  if meta: lines.append(f"  metadata: {', '.join(f'{k}={v}' for k, v in meta.items() if k not in LONG_METADATA)}")
  lines += onnx_metadata_lines(meta.get("onnx_metadata", {}))
  lines.append(f"  {precision_line(meta, parts)}")
  if meta.get("kind") == "model":
    from sunnypilot.modeld_v2.model.generations import GENERATIONS, of_bundle
    generation, source = of_bundle(meta)
    lines.append(f"  generation: {generation} ({source}): {GENERATIONS[generation].about}")
    lines.append(f"  output parse: {parse_line(meta.get('message_floats'))}")
  for model, roles in meta.get("onnx_roles", {}).items(): lines.append(f"  onnx {model}: {', '.join(f'{n} ({r})' for n, r in roles.items())}")
  roles = meta.get("input_roles", {})
  for kind, specs in (("input_specs", extras.get("input_specs", {})), ("output_specs", extras.get("output_specs", {}))):
    for name, (shape, dtype, device) in specs.items():
      role = roles.get(name, "") if kind == "input_specs" else ""
      lines.append(f"  {kind[:-6]:6s} {name:24s} {str(tuple(shape)):20s} {dtype} {device:6s} {role}".rstrip())
  lines += [f"  {line}" for line in signature_lines(path)]
  for name, h in parts.items():
    calls = collections.Counter(c.kind for c in h.calls)
    weights = sum(b.init[1] - b.init[0] for b in h.buffers if b.init is not None)
    inputs = ", ".join(s.label for s in h.inputs)
    check = "none" if h.check is None else f"seed {h.check.seed}, {len(h.check.outputs)} output digests"
    lines += [f"  part {name!r}: {sum(calls.values())} calls ({', '.join(f'{n} {k}' for k, n in calls.items())}), "
              f"{len(h.onetime_calls)} one-time calls, {len(h.programs)} programs ({len({p.lib for p in h.programs})} binaries), "
              f"{len(h.buffers)} buffers ({sum(b.nbytes for b in h.buffers):,} bytes, {weights:,} of them weights)",
              f"    inputs: {inputs}", f"    check: {check}",
              f"    {'program':40s} {'global':>14s} {'local':>12s} {'binary':>9s} {'calls':>6s}"]
    uses = collections.Counter(c.program for c in h.calls if c.kind == "program")
    for i, p in enumerate(h.programs):
      size = p.lib[1] - p.lib[0]
      lines.append(f"    {p.name[:40]:40s} {str(p.global_size):>14s} {str(p.local_size or ()):>12s} {size:>9,d} {uses[i]:>6d}")
  return "\n".join(lines)

def signature_lines(path: str) -> list[str]:
  """Who signed a bundle (its .sig) and which manifest of its folder names it, as a person reads them."""
  from sunnypilot.modeld_v2.format.bundle import content_digest
  from sunnypilot.modeld_v2.format.manifest import MANIFEST_NAME, read_manifest
  from sunnypilot.modeld_v2.format.signature import describe_signatures
  digest, size = content_digest(path), os.path.getsize(path)
  lines = [f"signature: {line}" for line in describe_signatures(path, digest, size)]
  if os.path.isfile(manifest_path := os.path.join(os.path.dirname(os.path.abspath(path)), MANIFEST_NAME)):
    try:
      manifest = read_manifest(manifest_path)[0]
      entry = manifest.entry(os.path.basename(path))
      same = entry is not None and (entry.sha256, entry.size) == (digest, size)
      named = "does not name it" if entry is None else f"names it as its {entry.role}, {'with this' if same else 'with ANOTHER'} content hash"
      lines.append(f"manifest: {MANIFEST_NAME} of set {manifest.name} {named}")
    except ArtifactError as e: lines.append(f"manifest: {e}")
  return lines

def describe_manifest(path: str) -> str:
  """A set's manifest: its bundles by role and content hash (here or not, matching or not, from their preambles), and who signed it."""
  from sunnypilot.modeld_v2.format.bundle import content_digest
  from sunnypilot.modeld_v2.format.manifest import read_manifest
  from sunnypilot.modeld_v2.format.signature import describe_signatures
  manifest, digest, size = read_manifest(path)
  folder = os.path.dirname(os.path.abspath(path))
  lines = [f"{path}: the manifest of set {manifest.name}, {len(manifest.bundles)} bundles", f"  {'file':32s} {'role':14s} {'sha256':16s} {'bytes':>14s}  here"]
  for e in manifest.bundles:
    bundle = os.path.join(folder, e.file)
    try: here = "matches" if (content_digest(bundle), os.path.getsize(bundle)) == (e.sha256, e.size) else "ANOTHER content hash or size"
    except ArtifactError as err: here = "missing" if not os.path.lexists(bundle) else f"unreadable: {err}"
    lines.append(f"  {e.file:32s} {e.role:14s} {e.sha256[:16]} {e.size:>14,d}  {here}")
  lines += [f"  signature: {line}" for line in describe_signatures(path, digest, size)]
  return "\n".join(lines)

def signed_or_not(path: str, digest: str, size: int, manifest: Manifest | None) -> str:
  """Whether a bundle is signed, in a few words: its own .sig stating this content (and by which keys), or its folder's manifest naming it
  with this hash (signed or not). Whether a key is trusted is verify --trusted-keys's question."""
  if os.path.lexists(sig_path(path)):
    try: sigs = read_signatures(sig_path(path))
    except ArtifactError as e: return f"a bad .sig: {e}"
    if (sigs.signed.sha256, sigs.signed.size) != (digest, size): return "its .sig states another content"
    return f"signed by key {', '.join(s.key_id for s in sigs.signatures)}"
  if manifest is not None and (entry := manifest.entry(os.path.basename(path))) is not None:
    same = (entry.sha256, entry.size) == (digest, size)
    signed = "signed" if os.path.lexists(sig_path(os.path.join(os.path.dirname(path), MANIFEST_NAME))) else "unsigned"
    return f"named by the {signed} {MANIFEST_NAME}" + ("" if same else " with ANOTHER hash")
  return "unsigned"

def describe_folder(folder: str) -> str:
  """A folder's bundles (every *.bin), one a line: kind, device, size, the content hash its preamble declares, signed or not. Headers are
  read, not blobs: a whole read is verify's."""
  manifest, note = None, ""
  if os.path.isfile(path := os.path.join(folder, MANIFEST_NAME)):
    try:
      manifest = read_manifest(path)[0]
      note = f", the manifest of set {manifest.name}"
    except ArtifactError as e: note = f", {e}"
  names = sorted(n for n in os.listdir(folder) if n.endswith(".bin"))
  lines = [f"{folder}: {len(names)} bundles{note}", f"  {'file':32s} {'kind':18s} {'device':8s} {'bytes':>13s}  {'sha256':16s}  signed"]
  for name in names:
    try:
      with BundleFile(path := os.path.join(folder, name)) as f: head, digest, size = f.head, f.digest.hex(), f.size
    except ArtifactError as e:
      lines.append(f"  {name:32s} not a bundle: {e}")
      continue
    kind = head.get("extras", {}).get("metadata", {}).get("kind", "?")
    lines.append(f"  {name:32s} {kind:18s} {head['provenance'].get('device', '?'):8s} {size:>13,d}  {digest[:16]}  "
                 f"{signed_or_not(path, digest, size, manifest)}")
  return "\n".join(lines)

def is_manifest(path: str) -> bool:
  """Whether `path` is a file that is not a bundle (read as a manifest); a file that cannot be read is left to the bundle reader's error."""
  from sunnypilot.modeld_v2.common.files import open_regular
  from sunnypilot.modeld_v2.format.bundle import MAGIC
  try:
    with open_regular(path) as f: return f.read(len(MAGIC)) != MAGIC
  except ArtifactError: return False

def verify_signature(path: str, trust: Trust) -> bool:
  """A PASS or FAIL line: whether a bundle is vouched for as modeld decides it with these keys (model_sets.Trust; its own signature, or
  its folder's signed manifest naming it)."""
  from sunnypilot.modeld_v2.daemon.model_sets import vouch_for
  try: print(f"PASS signature: {vouch_for(path, trust)}")
  except ArtifactError as e:
    print(f"FAIL signature: {e}")
    return False
  return True

def verify_manifest(path: str, trust: Trust | None) -> bool:
  """PASS or FAIL lines for a set's manifest: its signature with these keys (model_sets.Trust, when given), then its folder holding
  exactly its bundles, each read whole against the content hash it names."""
  from sunnypilot.modeld_v2.tools.sign_bundle import statement
  step = "signature"
  try:
    if trust is not None: print(f"PASS signature: {trust.manifest(path)[1]}")
    step = "bundles"
    statement(path)
    print("PASS bundles: the folder holds exactly the manifest's bundles, each with the content hash it names")
  except ArtifactError as e:
    print(f"FAIL {step}: {e}")
    return False
  return True

def run_profile(args: argparse.Namespace) -> int:
  """The profile command: each call of the bundle (the warp fused in front with --warp) timed alone against the roofline of the peaks given."""
  import json

  from sunnypilot.modeld_v2.common.files import replaced_atomically
  from sunnypilot.modeld_v2.tools.kernel_profile import PEAKS, bound_calls, profile, table
  replay, what = bound_calls(args.bundle, args.warp)
  logging.getLogger(__name__).info(f"profiling {args.bundle}: {what}, {args.rounds} runs per call ...")
  result = profile(replay, args.rounds, args.peak_tflops and args.peak_tflops * 1e12, args.peak_tbs and args.peak_tbs * 1e12,
                   PEAKS[args.peaks] if args.peaks else None)
  print(table(result, args.top))
  if args.json:
    with replaced_atomically(args.json) as (tmp,), open(tmp, "w") as f:
      json.dump(result | {"bundle": args.bundle, "warp": args.warp, "what": what}, f, indent=2)
  return 0

@interruptible("inspect_bundle")
def main(argv: list[str] | None = None) -> int:
  parser = cli_parser("inspect_bundle", __doc__)
  parser.add_argument("command", choices=("inspect", "verify", "profile"))
  parser.add_argument("bundle", help="a bundle, a set's manifest.json, or (inspect) a folder of bundles")
  parser.add_argument("--warp", help="profile: a warp bundle to fuse in front of the model (the frame modeld runs)")
  parser.add_argument("--rounds", type=positive_int, default=20, help="profile: timed runs per call (median)")
  peak = finite_float(0, 1e6, low_open=True)
  parser.add_argument("--peak-tflops", type=peak, help="profile: the device's peak FLOP rate for the roofline, in TFLOP/s (say where it comes from)")
  parser.add_argument("--peak-tbs", type=peak, help="profile: the device's peak memory bandwidth for the roofline, in TB/s")
  from sunnypilot.modeld_v2.tools.kernel_profile import PEAKS
  parser.add_argument("--peaks", choices=tuple(PEAKS), help="profile: a device's datasheet peaks instead of --peak-tflops/--peak-tbs, each kernel's "
                      "FLOP rate picked by its arithmetic: " + "; ".join(f"{n}: {p.source}" for n, p in PEAKS.items()))
  parser.add_argument("--top", type=non_negative_int, default=0, help="profile: print only the N slowest calls (0: all)")
  parser.add_argument("--json", help="profile: also write the results as JSON here")
  parser.add_argument("--trusted-keys", help="verify: a folder of trusted public keys (*.pem): the bundle or manifest must be signed as modeld "
                      "requires with these keys")
  args = parser.parse_args(argv)
  if args.trusted_keys and args.command != "verify": parser.error("--trusted-keys goes with verify")
  if args.peaks and (args.peak_tflops or args.peak_tbs): parser.error("--peaks sets the peaks: give it or --peak-tflops/--peak-tbs, not both")
  from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
  from sunnypilot.modeld_v2.format.bundle import read_parts
  if args.json:
    try: check_output_path(args.json, inputs=(args.bundle, args.warp))
    except ArtifactError as e: parser.exit(2, f"inspect_bundle: error: --json: {e}\n")
  from sunnypilot.modeld_v2.compile.capture import verify_part
  try:
    from sunnypilot.modeld_v2.daemon.model_sets import Trust
    trust = Trust.from_folder(args.trusted_keys) if args.trusted_keys else None
    if os.path.isdir(args.bundle):
      if args.command != "inspect": raise ArtifactError(f"{args.bundle} is a folder: inspect lists its bundles, {args.command} takes one")
      print(describe_folder(args.bundle))
      return 0
    if args.command != "profile" and is_manifest(args.bundle):
      if args.command == "inspect":
        print(describe_manifest(args.bundle))
        return 0
      return 0 if verify_manifest(args.bundle, trust) else 1
    if args.command == "inspect":
      print(describe(args.bundle))
      return 0
    if args.command == "profile": return run_profile(args)
    if trust is not None and not verify_signature(args.bundle, trust):  # kernels nobody trusted vouched for are never run, not even to check them
      print(f"{args.bundle}: NOT SIGNED as the trusted keys require: its kernels were not run")
      return 1
    ok = True
    for name, (header, blob) in read_parts(args.bundle)[0].items():
      for label, match in verify_part(header, blob).items():
        print(f"{'PASS' if match else 'FAIL'} {name}: {label}")
        ok &= match
    print(f"{args.bundle}: {'verified' if ok else 'MISMATCH: this device computes something else than the build recorded'}")
    return 0 if ok else 1
  except (ArtifactError, OSError) as e:
    named = any(p and str(e).startswith(p) for p in (args.bundle, args.warp))  # errors of a file's read name that file already
    print(f"inspect_bundle: error: {e if named else f'{args.bundle}: {e}'}", file=sys.stderr)
    return 2

if __name__ == "__main__":
  sys.exit(main())
