"""Running bundles. The seam to tinygrad's internals (tinygrad_internals) imports nothing of the project: it learns here which tinygrad
was imported (format/tinygrad_identity), before any module of this layer or above can call it."""
from sunnypilot.modeld_v2.format.tinygrad_identity import imported_tinygrad
from sunnypilot.modeld_v2.runtime import tinygrad_internals

tinygrad_internals.identify(lambda: imported_tinygrad().version)
