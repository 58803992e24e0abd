"""sunnypilot modeld_v2: plain tinygrad artifacts for openpilot driving models and camera warps."""
