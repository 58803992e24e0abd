"""The seed's import path: `from sunnypilot.modeld_v2.helpers import load_model`. Loading lives in loader.py, replay in replay.py."""
from sunnypilot.modeld_v2.loader import load_model
from sunnypilot.modeld_v2.replay import PlainJit, _Jit

__all__ = ["PlainJit", "_Jit", "load_model"]
