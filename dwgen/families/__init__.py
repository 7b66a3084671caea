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


# Restrictions the causal backward families share (each family names the ones it applies in RESTRICTIONS).
def stride_one(p, c) -> bool:
    """A backward written as a correlation over each thread's own positions holds at stride 1 only."""
    return p.stride == 1


def causal(p, c) -> bool:
    """P = H on the left and none on the right (Lout = L): grad_out position o pairs with x from o - H to o,
    so a thread's grad_out positions lie over its own x positions, and its halo is H on one side."""
    return p.causal
