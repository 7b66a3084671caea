"""dwgen: an autotuning code generator for depthwise 1D convolution on NVIDIA GPUs."""
from __future__ import annotations

import importlib

from dwgen.recording import record

# The frozen module's public names, imported from generated/ on first use: `import dwgen` stays cheap,
# needs no GPU, and never compiles anything.
_FROM_GENERATED = {"depthwise_conv1d": "generated", "DepthwiseConv1d": "generated.layers",
                   "swap_conv1d": "generated.layers"}

__all__ = ["record", *_FROM_GENERATED]


def __getattr__(name: str):
    if name not in _FROM_GENERATED:
        raise AttributeError(f"module 'dwgen' has no attribute {name!r}")
    value = getattr(importlib.import_module(_FROM_GENERATED[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_FROM_GENERATED])
