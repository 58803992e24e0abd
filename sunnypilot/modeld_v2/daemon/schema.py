"""Which cereal this process speaks, found once at import: the device's own first, then the schema openpilot-logging bundles.

  openpilot.cereal     today's openpilot and sunnypilot (openpilot moved cereal into its package, #38220, 2026-06-21): log.capnp with
                       opendbc's car.capnp, cereal.messaging, services.SERVICE_LIST, visionipc.VisionStreamType
  cereal               an older device (a top-level cereal package: openpilot before that move)
  openpilot_logging    a PC: the schema openpilot-logging (PyPI) bundles, with this package's own PubMaster/SubMaster over msgq

On a comma device (daemon/hardware.on_device) only the first two are the device's: when neither imports, `problem` says so in one
line and the daemons refuse to start (a daemon publishing in another schema than its readers' is worse than none). Nothing here raises
at import: a module may import `log` from here before the daemon has checked `problem`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from sunnypilot.modeld_v2.daemon.hardware import on_device

@dataclass(frozen=True)
class Schema:
  """A cereal: its log and car schemas, openpilot's messaging module if it has one (None: this package's), the services it lists (by
  SERVICE_LIST where it has one, else the Event union's fields) and where it came from."""
  log: Any
  car: Any
  messaging: Any | None
  services: tuple[str, ...]
  source: str
  device: bool  # the device's own (openpilot.cereal, cereal), not the bundled one

def union_services(log: Any) -> tuple[str, ...]:
  """The services an Event can carry: the names of its union's fields (read once: pycapnp builds that dict anew on each access)."""
  return tuple(log.Event.schema.union_fields)

def device_schema(package: str) -> Schema:
  """The cereal of `package` (openpilot.cereal or cereal) and what comes with it: ImportError when it is not there, or not whole."""
  cereal = importlib.import_module(package)
  messaging = importlib.import_module(f"{package}.messaging")
  try: services = tuple(importlib.import_module(f"{package}.services").SERVICE_LIST)
  except (ImportError, AttributeError): services = union_services(cereal.log)
  car = getattr(cereal, "car", None)
  if car is None: car = importlib.import_module("opendbc.car.structs").car  # today's CarParams: opendbc's car.capnp (openpilot modeld.py @084747c)
  return Schema(cereal.log, car, messaging, services, package, True)

def bundled_schema() -> Schema:
  from openpilot_logging.cereal import car, log
  return Schema(log, car, None, union_services(log), "openpilot_logging (the schema it bundles: a PC)", False)

def find_schema(device: bool) -> tuple[Schema | None, str]:
  """(the schema this process uses, or None; the reason when None). On a device only its own cereal will do."""
  tried = []
  for package in ("openpilot.cereal", "cereal"):
    try: return device_schema(package), ""
    except Exception as e:  # a cereal that is there but broken (a capnp file it cannot load) is as absent as a missing one
      tried.append(f"{package} ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})")
  if device: return None, f"this is a comma device, and neither of its cereal schemas imports: {'; '.join(tried)}"
  try: return bundled_schema(), ""
  except Exception as e: return None, f"no cereal schema: {'; '.join(tried)}; openpilot_logging ({type(e).__name__}: {e})"

SCHEMA, problem = find_schema(on_device())
# capnp schema modules (open shapes), None without a schema: whoever uses them checks `problem` first
log: Any = SCHEMA.log if SCHEMA is not None else None
car: Any = SCHEMA.car if SCHEMA is not None else None
