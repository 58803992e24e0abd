"""A comma device's Python environment in a folder, for the tests that run the daemons as a device does: PYTHONPATH is the tree's root
(openpilot's launch_chffrplus.sh sets PYTHONPATH to the checkout), openpilot-logging is not importable there, and the package sits in
sunnypilot's slot for it.

  today  openpilot master 084747c (sunnypilot master merged it): openpilot/cereal (log.capnp, services.py, visionipc.py, messaging),
         opendbc/car (car.capnp), openpilot/common/hardware (AGNOS), the package at openpilot/sunnypilot/modeld_v2 (the nested layout)
  2025   the layout of openpilot-logging 0.1.5's era: a top-level cereal with that schema, openpilot/system/hardware, the package at
         sunnypilot/modeld_v2

Built from today's openpilot files (the workplace keeps them beside the checkout: UPSTREAM) and openpilot-logging's bundled schema;
what a PC has no stand-in for is written here: hardware that says it is a device, a Params that stores values in a folder and raises
UnknownKeyName for keys params_keys.h does not list (openpilot common/params @084747c), config_realtime_process that records its call.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from conftest import ROOT

UPSTREAM = os.path.join(os.path.dirname(ROOT), "shared", "upstream", "openpilot-084747c")  # today's openpilot files, where the workplace has them
PACKAGE = os.path.join(ROOT, "sunnypilot", "modeld_v2")

FAKE_PARAMS = '''"""openpilot's Params as a device behaves (common/params @084747c): a key params_keys.h does not list raises UnknownKeyName. Values
live in files in $FAKE_PARAMS_DIR; with $FAKE_PARAMS_RAISE set, every key raises (a broken Params)."""
import os, re, time

class UnknownKeyName(Exception): pass

KEYS = set(re.findall(r'\\{"(\\w+)", \\{', open(os.path.join(os.path.dirname(__file__), "params_keys.h")).read()))

class Params:
  def __init__(self):
    self.folder = os.environ["FAKE_PARAMS_DIR"]

  def check(self, key):
    if os.environ.get("FAKE_PARAMS_RAISE") or key not in KEYS: raise UnknownKeyName(key)

  def get(self, key, block=False, return_default=False):
    self.check(key)
    path = os.path.join(self.folder, key)
    while block and not os.path.exists(path): time.sleep(0.05)
    return open(path, "rb").read() if os.path.exists(path) else None

  def put(self, key, value):
    self.check(key)
    with open(os.path.join(self.folder, key), "wb") as f: f.write(value if isinstance(value, bytes) else str(value).encode())

  def put_bool(self, key, value): self.put(key, b"1" if value else b"0")

  def get_bool(self, key): return self.get(key) == b"1"

  def remove(self, key):
    self.check(key)
    if os.path.exists(os.path.join(self.folder, key)): os.remove(os.path.join(self.folder, key))
'''

FAKE_REALTIME = '''import gc, os

def config_realtime_process(cores, priority):
  """Records the call (a test machine must not run a daemon at SCHED_FIFO on a core it lacks)."""
  gc.disable()
  with open(os.environ["FAKE_REALTIME_LOG"], "a") as f: f.write(f"{os.getpid()} {cores} {priority}\\n")
'''

MOVING_AVERAGE = '''class MovingAverage:
  def __init__(self, n):
    self.n, self.values = n, []

  def add_value(self, x):
    self.values = (self.values + [x])[-self.n:]

  def get_average(self):
    return sum(self.values) / len(self.values) if self.values else 0.0

  @property
  def count(self):
    return len(self.values)
'''

NO_LOGGING = 'raise ImportError("openpilot-logging is not installed on a comma device")\n'

def write(path: Path, text: str) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(text)

def common(root: Path) -> None:
  """openpilot/common as the daemons meet it on a device: its Params, realtime setup and the MovingAverage cereal.messaging imports."""
  write(root / "openpilot" / "__init__.py", "")
  write(root / "openpilot" / "common" / "__init__.py", "")
  write(root / "openpilot" / "common" / "params.py", FAKE_PARAMS)
  shutil.copy(os.path.join(UPSTREAM, "openpilot", "common", "params_keys.h"), root / "openpilot" / "common" / "params_keys.h")
  write(root / "openpilot" / "common" / "realtime.py", FAKE_REALTIME)
  write(root / "openpilot" / "common" / "utils.py", MOVING_AVERAGE)
  write(root / "openpilot_logging" / "__init__.py", NO_LOGGING)

def package(at: Path, models: Path | None) -> Path:
  """This package copied into sunnypilot's slot at `at` (sunnypilot/modeld_v2), with `models` as its default set; its folder."""
  write(at.parent / "__init__.py", "")
  shutil.copytree(PACKAGE, at, ignore=shutil.ignore_patterns("__pycache__"))
  if models is not None: shutil.copytree(models, at / "models")
  return at

def today(root: Path, models: Path | None, services_edit=None) -> Path:
  """Today's tree at `root`; the package's folder. `services_edit`: a function of services.py's text (a test's broken schema)."""
  common(root)
  cereal = root / "openpilot" / "cereal"
  shutil.copytree(os.path.join(UPSTREAM, "openpilot", "cereal"), cereal)
  if services_edit is not None: (cereal / "services.py").write_text(services_edit((cereal / "services.py").read_text()))
  car = root / "opendbc" / "car"
  car.mkdir(parents=True)
  shutil.copy(os.path.join(UPSTREAM, "opendbc", "car", "car.capnp"), car / "car.capnp")
  shutil.copytree(cereal / "include", car / "include")  # log.capnp and car.capnp import /include/c++.capnp through opendbc's folder
  write(root / "opendbc" / "__init__.py", "")
  write(car / "__init__.py", "")
  write(car / "structs.py", "import os, capnp\ncapnp.remove_import_hook()\nBASEDIR = os.path.dirname(os.path.abspath(__file__))\n"
                            "car = capnp.load(os.path.join(BASEDIR, 'car.capnp'), imports=[BASEDIR])\n")
  write(root / "openpilot" / "common" / "hardware" / "__init__.py", "AGNOS = COMMA_HARDWARE = True  # /AGNOS exists on a device\nPC = False\n")
  return package(root / "openpilot" / "sunnypilot" / "modeld_v2", models)

def older(root: Path, models: Path | None) -> Path:
  """The 2025 tree at `root` (a top-level cereal of openpilot-logging 0.1.5's schema); the package's folder."""
  import openpilot_logging.cereal as bundled
  common(root)
  cereal = root / "cereal"
  shutil.copytree(os.path.dirname(bundled.__file__), cereal, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
  write(cereal / "__init__.py", "import os, capnp\ncapnp.remove_import_hook()\nCEREAL_PATH = os.path.dirname(os.path.abspath(__file__))\n"
                                "log = capnp.load(os.path.join(CEREAL_PATH, 'log.capnp'))\ncar = capnp.load(os.path.join(CEREAL_PATH, 'car.capnp'))\n")
  names = list(bundled.log.Event.schema.union_fields)
  write(cereal / "services.py", "class Service:\n  def __init__(self, should_log, frequency, decimation=None, queue_size=250 * 1024):\n"
        "    self.should_log, self.frequency, self.decimation, self.queue_size = should_log, frequency, decimation, queue_size\n\n"
        f"SERVICE_LIST = {{name: Service(True, 20.) for name in {sorted(set(names))!r}}}\n")
  messaging = open(os.path.join(UPSTREAM, "openpilot", "cereal", "messaging", "__init__.py")).read()
  write(cereal / "messaging" / "__init__.py", messaging.replace("openpilot.cereal", "cereal"))
  write(root / "openpilot" / "system" / "__init__.py", "")
  write(root / "openpilot" / "system" / "hardware" / "__init__.py", "TICI = True\nPC = False  # openpilot.system.hardware of that era\n")
  return package(root / "sunnypilot" / "modeld_v2", models)

if __name__ == "__main__":  # a tree for benchmarks/bench_device.py: python tests/device_tree.py {today,2025} ROOT MODELS
  import sys
  layout, root, models = sys.argv[1:4]
  print((today if layout == "today" else older)(Path(root), Path(models)))
