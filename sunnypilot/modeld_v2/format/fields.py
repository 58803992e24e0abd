"""A stored header's fields read and checked, and the names a bundle gives dtypes and devices: what the part records (`part`), the bundle
header (`bundle`) and openpilot's metadata checks (`bundle_rules`) read JSON with. Each check raises an ArtifactError naming the field;
sizes are Python ints (exact, never overflowing)."""
from __future__ import annotations

import re
from typing import Any, TypeVar, overload

import numpy as np
from tinygrad import dtypes
from tinygrad.dtype import DType

from sunnypilot.modeld_v2.common.files import ArtifactError

T = TypeVar("T")

# *** field checks ***

@overload
def expect(value: object, kind: type[T], what: str) -> T: ...
@overload
def expect(value: object, kind: tuple[type, ...], what: str) -> Any: ...
def expect(value: object, kind: type | tuple[type, ...], what: str) -> Any:
  """`value` if it is a `kind` (never a bool for an int); else an ArtifactError naming `what`."""
  if not isinstance(value, kind) or isinstance(value, bool) and kind is int: raise ArtifactError(f"{what} is {type(value).__name__} {value!r:.60}")
  return value

def ints(value: object, what: str) -> tuple[int, ...]:
  return tuple(expect(x, int, what) for x in expect(value, list, what))

def within(r: object, end: int, what: str) -> tuple[int, int]:
  if len(span := ints(r, what)) != 2 or not 0 <= span[0] <= span[1] <= end: raise ArtifactError(f"{what} range {r!r} is outside 0..{end}")
  return span[0], span[1]

# *** dtypes and devices ***

def dtype_name(dt: DType) -> str:
  """How a part names a dtype: tinygrad's repr ("dtypes.float"), for dtypes that round-trip through it."""
  if getattr(dtypes, repr(dt).removeprefix("dtypes."), None) != dt: raise ArtifactError(f"dtype {dt!r} cannot be stored in a plain artifact")
  return repr(dt)

def parse_dtype(name: object) -> DType:
  if not isinstance(name, str) or not (m := re.fullmatch(r"dtypes\.([a-z0-9_]+)", name)) or not isinstance(dt := getattr(dtypes, m[1], None), DType):
    raise ArtifactError(f"unknown dtype {name!r} in bundle")
  return dt

def np_dtype(name: str) -> np.dtype:
  """The numpy dtype of a part's dtype name ("dtypes.uchar" -> uint8)."""
  if (dt := parse_dtype(name)).fmt is None: raise ArtifactError(f"dtype {dt!r} has no numpy equivalent")
  return np.dtype(dt.fmt)

def device_kind(device: str) -> str: return device.split(":")[0].upper()
