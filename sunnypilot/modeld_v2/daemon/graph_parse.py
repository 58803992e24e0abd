"""The output parse in the model's graph, on modeld's side: whether a bundle has one this build can publish, and its float block turned into
the three messages' bytes. The graph writes every float the messages publish from the model (model/published_floats.py); per frame the
host computes what is host state (DrivingState: the action, FCW, confidence, the lane change) from the block's views, writes its own
fields (host_fields: frame ids and times, drops, execution time, the action, the driving state) and copies each service's floats into its
byte template in one scatter (message_bytes.BlockWriter). The first frame of a model is parsed and filled on the host as a bundle without
the parse in its graph is: that builds the templates, so both ways publish the same fields in the same bytes."""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sunnypilot.modeld_v2.daemon.message_bytes import BlockWriter, MessageBytes
from sunnypilot.modeld_v2.model.fill_model_msg import SERVICES
from sunnypilot.modeld_v2.model.published_floats import FLOAT_BLOCK, FloatLayout, trace

if TYPE_CHECKING:
  from sunnypilot.modeld_v2.runtime.model_adapter import ModelAdapter

def bundle_layout(metadata: dict, slices: dict[str, list[int]], report: Callable[[str], None]) -> FloatLayout | None:
  """The float block a model bundle's graph writes, when this build publishes it the same way: its recorded layout is the one this build
  traces from its output_slices (the same fields, order and sources); else None, said once, and the bundle is parsed on the host."""
  recorded = metadata.get(FLOAT_BLOCK)
  if recorded is None:
    report("this bundle has no output parse in its graph (built before it, or with --host-parse): its outputs are parsed on the host each frame")
    return None
  try: layout = trace(slices)
  except ValueError as e:
    report(f"this build cannot publish this bundle's in-graph parse ({e}): its outputs are parsed on the host each frame")
    return None
  if recorded != layout.to_json():
    report("this bundle's in-graph parse was built for another layout of the messages (another version of compile_modeld): its outputs are "
           "parsed on the host each frame")
    return None
  report(f"the output parse runs in the model's graph: each frame's {len(layout.sources)} floats are copied into the messages")
  return layout

def graph_parse_of(adapter: ModelAdapter, report: Callable[[str], None]) -> GraphParse | None:
  """The in-graph parse modeld publishes for a loaded model (a ModelRunner: its metadata, output_slices and output_array), or None when
  its outputs are parsed on the host (bundle_layout says why)."""
  layout = bundle_layout(adapter.metadata, adapter.output_slices, report)
  return None if layout is None else GraphParse(layout, adapter.output_array(FLOAT_BLOCK))

class GraphParse:
  """A model's in-graph parse, published: `block` is the array its readback refills every run (the same one each frame); `reads`, the
  driving state's views of it; `writers`, one per service once the host-parsed first frame has built the byte templates."""
  def __init__(self, layout: FloatLayout, block: np.ndarray):
    self.layout, self.block = layout, block
    self.reads = layout.reads_of(block)
    self.checked = layout.checked()
    self.views = {service: block[start:stop] for service, (start, stop) in layout.services.items()}
    self.floats = {service: [(path, n) for s, path, n in layout.fields if s == service] for service in SERVICES}
    self.writers: dict[str, BlockWriter] | None = None

  def checked_values(self) -> np.ndarray:
    """This frame's block floats that must be finite (all but the lane lines' times, NaN past the plan by openpilot's rule)."""
    return self.block[self.checked]

  def unbind(self) -> None:
    """Publish through the host parse until the next bind: a model that frames run on again (a switch, or back from one) builds its
    templates anew on its first frame."""
    self.writers = None

  def bind(self, message_bytes: MessageBytes, host: dict[str, dict[str, Any]]) -> bool:
    """After a frame published through the fill functions: block writers on the templates it built, for these host fields (a frame's
    host_fields); False (said by message_bytes) when a template cannot take the block: then the host parse goes on."""
    writers = {service: message_bytes.block_writer(service, self.floats[service], host[service]) for service in SERVICES}
    self.writers = {s: w for s, w in writers.items() if w is not None} if all(w is not None for w in writers.values()) else None
    return self.writers is not None

  def bytes_of(self, service: str, host: dict[str, Any], valid: bool, log_mono_time: int) -> bytes:
    """`service`'s Event bytes: this frame's block floats and host fields (its host_fields, the keys the writer was bound with)."""
    assert self.writers is not None, "bound"
    writer = self.writers[service]
    if tuple(host) != writer.keys: raise ValueError(f"{service}: host fields {tuple(host)} for a writer of {writer.keys}")
    return writer.bytes_of(list(host.values()), self.views[service], valid, log_mono_time)
