"""Kernel families: one module per kind of kernel (direction, layout), each its axes, restrictions and geometry."""
from __future__ import annotations

from dataclasses import asdict


class AxisConfig:
    """What a family's config dataclass shares: every field is a value of its axis, and it is JSON-ready."""

    AXES: dict[str, tuple] = {}

    def __post_init__(self) -> None:
        for axis, values in self.AXES.items():
            v = getattr(self, axis)
            if type(v) is not type(values[0]) or v not in values:
                raise ValueError(f"config {axis}={v!r} is not one of {values}")

    def to_dict(self) -> dict:
        return asdict(self)
