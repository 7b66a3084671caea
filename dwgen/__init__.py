"""dwgen: an autotuning code generator for depthwise 1D convolution on NVIDIA GPUs."""
from __future__ import annotations

from dwgen.recording import record

__all__ = ["record"]
