"""Stand-in for cuda-bindings (see bindings/nvrtc.py)."""
