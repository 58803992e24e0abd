"""A model daemon's command line, written once for both: the arguments every daemon takes, then start-up in the order that fails fast (the
output paths, the model sets folder, the trusted keys, one daemon per bus, the default set checked) before the frame loop runs, and the
exit codes (2 for what cannot run, 130 after Ctrl-C)."""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from sunnypilot.modeld_v2.common.cli import finite_float, positive_int
from sunnypilot.modeld_v2.common.cli import parser as cli_parser
from sunnypilot.modeld_v2.common.files import ArtifactError, check_output_path
from sunnypilot.modeld_v2.common.logs import Episodes
from sunnypilot.modeld_v2.daemon import schema, topics
from sunnypilot.modeld_v2.daemon.artifacts import check_artifacts
from sunnypilot.modeld_v2.daemon.big_model import BIG_MODEL_TIMEOUT_S
from sunnypilot.modeld_v2.daemon.daemon_spec import DaemonSpec
from sunnypilot.modeld_v2.daemon.device_params import device_params
from sunnypilot.modeld_v2.daemon.device_paths import DEVICE_ARTIFACTS, DEVICE_MODEL_SETS, DEVICE_TRUSTED_KEYS, first_folder
from sunnypilot.modeld_v2.daemon.frame_daemon import RECONNECT_AFTER_S, FrameDaemon
from sunnypilot.modeld_v2.daemon.hardware import on_device
from sunnypilot.modeld_v2.daemon.messaging import claim_bus
from sunnypilot.modeld_v2.daemon.model_sets import Trust, sets_root
from sunnypilot.modeld_v2.daemon.process import core_arg, exit_code, stop_on_signals
from sunnypilot.modeld_v2.daemon.shadow import WARM_UP_MARGIN_S, WHILE_ENGAGED
from sunnypilot.modeld_v2.daemon.status import STATUS_EVERY_S, write_timings

def daemon_parser(name: str, doc: str | None, bundles: str, send_raw_help: str, device_core: int, priority: int) -> argparse.ArgumentParser:
  """`name`'s parser with the arguments every model daemon takes; the daemon adds its own."""
  parser = cli_parser(name, doc)
  parser.add_argument("--artifacts", help=f"the default model set: a folder with {bundles}. On a comma device the first of "
                      f"{', '.join(DEVICE_ARTIFACTS)} that exists (a device starts the daemons with no arguments); required elsewhere")
  parser.add_argument("--max-frames", type=positive_int, help="exit after publishing this many frames")
  parser.add_argument("--send-raw", action="store_true", default=bool(os.environ.get("SEND_RAW_PRED")), help=send_raw_help)
  parser.add_argument("--core", type=core_arg, help=f"pin {name} to this CPU core; on a device it runs on core {device_core} at SCHED_FIFO priority "
                      f"{priority} (where permitted), as openpilot's {name} does (a realtime process can starve others on a PC)")
  parser.add_argument("--reconnect-after", type=finite_float(0.1, 3600), default=RECONNECT_AFTER_S, help="seconds without frames before "
                      f"{name} re-attaches to camerad, which may have restarted (default {RECONNECT_AFTER_S:g}); route_replay's lockstep sets it "
                      "high: its frames pause while its reference check catches up, and a frame sent while the daemon re-attaches would be lost")
  parser.add_argument("--status-every", type=finite_float(0, 3600), default=STATUS_EVERY_S, help="seconds between status lines (frames "
                      f"published and dropped, modelExecutionTime p50 and max) while frames run; 0: none (default {STATUS_EVERY_S:g})")
  parser.add_argument("--timings", help="on exit, write per published frame [frame_id, monotonic ns at each of STAGE_STAMPS] as JSON here "
                      "(benchmarks.bench_daemon reads it)")
  parser.add_argument("--trusted-keys", help="a folder of publishers' Ed25519 public keys (*.pem, sign_bundle --generate-key writes them): every "
                      "bundle must then be signed by one of them (its own .sig, or a signed manifest naming it), else it is refused with one line "
                      f"before any of its kernels is read. On a comma device the first of {', '.join(DEVICE_TRUSTED_KEYS)} that exists. Without: bundles "
                      "load unsigned")
  parser.add_argument("--model-sets", help="the folder of installed model sets (install_models writes ROOT/<name>/): the set asked for (ROOT/active "
                      "on a PC, sunnypilot's ModelManager_ActiveBundle parameter on a device) is loaded while frames run and switched to between "
                      f"two frames; a set that fails falls back to the last that ran, then to --artifacts. On a comma device {DEVICE_MODEL_SETS}")
  parser.add_argument("--switch-while-engaged", choices=list(WHILE_ENGAGED), default="defer", help="a model set asked for while openpilot "
                      "is engaged (selfdriveState.enabled): " + "; ".join(f"{k}: {v}" for k, v in WHILE_ENGAGED.items()) + " (default defer). "
                      "Either way a model with temporal state warms up in the shadow of the running one until its context is its own")
  parser.add_argument("--warm-up-timeout", type=finite_float(0.1, 3600), help="seconds a set's warm-up in the shadow may take before it is "
                      f"dropped with one line (default: its context's frames at a third of 20 Hz plus {WARM_UP_MARGIN_S:g} s)")
  parser.add_argument("--big-model-timeout", type=finite_float(0.1, 3600), default=BIG_MODEL_TIMEOUT_S, help="seconds a set's big model may "
                      f"take to load before the small one drives for the rest of the drive (default {BIG_MODEL_TIMEOUT_S:g}, openpilot's)")
  return parser

def daemon_main(parser: argparse.ArgumentParser, argv: list[str] | None, make_spec: Callable[[argparse.Namespace, Episodes], DaemonSpec[Any]],
                episodes: Episodes) -> int:
  """Parse `argv`, start the daemon `make_spec` gives, run its frames until SIGTERM, Ctrl-C or --max-frames; the exit code."""
  import msgq
  args = parser.parse_args(argv)
  name = parser.prog
  fail = lambda message: parser.exit(2, f"{name}: error: {message}\n")
  device = on_device()
  if schema.problem or topics.problem: fail(schema.problem or topics.problem)  # publishing in another schema than the readers' is worse than none
  if args.artifacts is None and not device: fail("--artifacts is required (a folder with the default model set) off a comma device")
  artifacts = args.artifacts or first_folder(DEVICE_ARTIFACTS)
  if artifacts is None: fail(f"no default model set on this device: none of {', '.join(DEVICE_ARTIFACTS)} exists (install the bundles there)")
  if args.timings:
    try: check_output_path(args.timings)
    except ArtifactError as e: fail(f"--timings: {e}")
  try: root = sets_root(args.model_sets, device)
  except ArtifactError as e: fail(str(e))
  try: trust = Trust.for_daemon(args.trusted_keys, device)
  except ArtifactError as e: fail(f"--trusted-keys: {e}")
  prefix = os.environ.get("OPENPILOT_PREFIX")
  bus = f"the bus{f' OPENPILOT_PREFIX={prefix}' if prefix else ''}"
  if (claim := claim_bus(name)) is None: fail(f"another {name} is already running on {bus}")
  spec = make_spec(args, episodes)
  try: planes = check_artifacts(artifacts, report=episodes.once, trust=trust, kind=spec.bundles)
  except ArtifactError as e: fail(str(e))
  daemon = FrameDaemon(spec, episodes, artifacts, root, trust, planes, [] if args.timings else None, args.reconnect_after, args.status_every,
                       device_params(episodes.once), args.switch_while_engaged, args.warm_up_timeout, args.big_model_timeout)
  stopped_by = stop_on_signals(daemon.exit)
  try: code = daemon.run(args.max_frames, args.core, device)
  except msgq.MultiplePublishersError: fail(f"another process took over publishing {', '.join(spec.services)} on {bus}: exiting")
  finally: claim.close()
  if args.timings: write_timings(args.timings, daemon.timings or [])
  return exit_code(stopped_by, code)  # Ctrl-C: the shell's convention, 130
