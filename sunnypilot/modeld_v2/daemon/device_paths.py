"""Where a daemon started with no arguments on a comma device finds its default model set, its trusted keys and the installed model sets.

The package sits in sunnypilot's tree as `sunnypilot/modeld_v2` (sunnypilot's slot for it: process_config.py's
NativeProcess("modeld_tinygrad", "openpilot/sunnypilot/modeld_v2", ["./modeld"])): under the repository's nested `openpilot/` package
today (/data/openpilot/openpilot/sunnypilot/modeld_v2, since openpilot moved its code into openpilot/, 2026), at the repository root
before (/data/openpilot/sunnypilot/modeld_v2). Bundles and keys ship beside the code, so the package's own folder is looked at first,
then both layouts' absolute paths; installed sets live on the data partition beside sunnypilot's model manager's /data/models.
"""
from __future__ import annotations

import os

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # sunnypilot/modeld_v2, wherever it is checked out
CHECKOUTS = (PACKAGE, "/data/openpilot/openpilot/sunnypilot/modeld_v2", "/data/openpilot/sunnypilot/modeld_v2")
DEVICE_ARTIFACTS = tuple(os.path.join(c, "models") for c in CHECKOUTS)  # the default set: model.bin, warps, the DM model and its warps
DEVICE_TRUSTED_KEYS = tuple(os.path.join(c, "trusted_keys") for c in CHECKOUTS)  # updated with the software, never by a download
DEVICE_MODEL_SETS = "/data/models/modeld_v2"

def first_folder(candidates: tuple[str, ...]) -> str | None:
  """The first of `candidates` that is a folder, or None."""
  return next((c for c in candidates if os.path.isdir(c)), None)
