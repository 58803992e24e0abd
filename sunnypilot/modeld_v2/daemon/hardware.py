"""Whether this process runs on a comma device, decided as openpilot decides it. Imports nothing of the package: the schema and the
daemons' defaults depend on it before anything else is read."""
from __future__ import annotations

import importlib
import os

HARDWARE_MODULES = ("openpilot.common.hardware", "openpilot.system.hardware")  # today's (openpilot #38202, #38581), then the older one
AGNOS_FILE = "/AGNOS"  # on every comma device: what openpilot's hardware module itself looks at (common/hardware/__init__.py @084747c)

def on_device() -> bool:
  """A comma device: the hardware module of its openpilot says so (today's `openpilot.common.hardware`, then the older
  `openpilot.system.hardware`: PC is false on a device), else, with no openpilot to ask, /AGNOS exists."""
  for module in HARDWARE_MODULES:
    try: return not importlib.import_module(module).PC
    except (ImportError, AttributeError): continue
  return os.path.isfile(AGNOS_FILE)
