"""The live camera geometry as modeld reads it from a connected VisionIPC client: camerad's layout, the one NV12Frame type."""
from types import SimpleNamespace

import pytest

from sunnypilot.modeld_v2.daemon.camera_sync import Geometry, live_frame
from sunnypilot.modeld_v2.model.camera_frame import camerad_frame

def client(width: int, height: int, stride: int, uv_offset: int, buffer_len: int) -> SimpleNamespace:
  return SimpleNamespace(width=width, height=height, stride=stride, uv_offset=uv_offset, buffer_len=buffer_len)

@pytest.mark.parametrize("size", [(1928, 1208), (1344, 760)])
def test_live_frame_of_camerads_buffers(size):
  """camerad's buffers (1344x760: stride 1408, uv_offset 1081344, 2428928 bytes) give the layout a warp for that camera was built for."""
  built = camerad_frame(*size)
  live = live_frame(client(built.width, built.height, built.stride, built.uv_offset, built.size))
  assert (live.width, live.height, live.stride, live.uv_offset, live.size) == (built.width, built.height, built.stride, built.uv_offset, built.size)
  expected = f"{size[0]}x{size[1]} frames (stride {built.stride}, uv_offset {built.uv_offset}, {built.size} bytes, streams [0, 2])"
  assert str(Geometry((0, 2), live, live)) == expected

def test_live_frame_refuses_buffers_no_warp_reads():
  with pytest.raises(ValueError, match="not a whole number of 1408 byte rows"): live_frame(client(1344, 760, 1408, 1081345, 2428928))
  with pytest.raises(ValueError, match="stride 1000 is smaller than the width"): live_frame(client(1344, 760, 1000, 768000, 2428928))
