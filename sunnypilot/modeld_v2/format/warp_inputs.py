"""A warp bundle's inputs by name: the camera frames it reads (one input per camera, or both packed) and the transforms that map model
pixels to camera pixels. The frames' layout is model/camera_frame's."""
from __future__ import annotations

# road camera first, wide second (openpilot's order)
WARP_FRAMES = ("frame", "big_frame")  # a --split-frames warp's input per camera, bound to that buffer in place
DRIVER_FRAMES = WARP_FRAMES[:1]  # a driver-monitoring warp's one input: the driver camera's buffer, bound in place
PACKED_FRAMES = "input_frame"  # a packed warp's one frame input: both buffers copied, (2, size)
WARP_TRANSFORM = "M_inv"  # the warp's (2, 3, 3) transforms, model pixel -> camera pixel, one per camera ((3, 3): the driver camera's)
HOST_TRANSFORM = "tfm"  # the same transforms as the fused part's host input (the seed's name: modeld fills numpy_inputs["tfm"])
