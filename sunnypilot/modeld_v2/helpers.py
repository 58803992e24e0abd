"""The seed's import path: `from sunnypilot.modeld_v2.helpers import load_model`. The seed's names live in compat.py."""
from sunnypilot.modeld_v2.compat import PlainJit, _Jit, load_model

__all__ = ["PlainJit", "_Jit", "load_model"]
