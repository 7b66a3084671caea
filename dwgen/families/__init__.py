"""Kernel families: one module per kind of kernel (direction, layout), each its axes, restrictions and geometry."""
from __future__ import annotations

import functools
import itertools
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


@functools.cache
def all_designs(config_type: type) -> tuple:
    """Every config of a family's config dataclass: the product of its axes."""
    return tuple(config_type(*v) for v in itertools.product(*config_type.AXES.values()))


def fields_from_tokens(tokens: list[str], name: str, keys: dict[str, str], expected: str,
                       flags: dict[str, tuple[str, object]] | None = None) -> dict:
    """A config's fields from its name tokens: a letter and digits for each axis of keys (each once), and flag
    words that set an axis (each once); ValueError names the first token it cannot read, or what is missing."""
    flags = flags or {}
    fields: dict = {}
    for tok in tokens:
        if tok in flags and flags[tok][0] not in fields:
            fields[flags[tok][0]] = flags[tok][1]
        elif tok[:1] in keys and tok[1:].isdigit() and keys[tok[0]] not in fields:
            fields[keys[tok[0]]] = int(tok[1:])
        else:
            raise ValueError(f"{name}: unknown token {tok!r}")
    if not set(keys.values()) <= set(fields):
        raise ValueError(f"{name}: expected one each of {expected}")
    return fields

def some_design_fits(p, config_type: type, restrictions) -> bool:
    """Whether any of a family's designs passes all its restrictions on p: a family with none would only cost
    a tune its asks (each refused)."""
    return any(all(r(p, c) for r in restrictions) for c in all_designs(config_type))


def standalone(module, p, c) -> tuple[str, str, str]:
    """(name, digest, CUDA source) of a variant of a family module not (yet) in the registry, as space.Variant
    will make them once it is (name: its tokens under the module's FAMILY_NAME; digest: the same payload over
    its template)."""
    from dwgen import render, space

    bad = [r.__name__ for r in module.RESTRICTIONS if not r(p, c)]
    if bad:
        raise render.RenderError(f"{p.key} {c} breaks {', '.join(bad)}")
    name = "_".join([module.FAMILY_NAME, *space.signature_tokens(p)[1:], *module.name_tokens(c)])
    digest = space.content_digest(
        {"config": c.to_dict(), "signature": space.signature(p), "flags": list(space.NVCC_FLAGS)},
        (module.TEMPLATE, space.COMMON_TEMPLATE))
    return name, digest, render.render_family(module.TEMPLATE, module.render_context(p, c), p.dtype, name, digest)
