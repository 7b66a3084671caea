"""The tunable axes, named restriction predicates, enumeration, and each variant's name and digest."""
from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from dwgen.problem import Problem

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
KERNEL_TEMPLATE = "dw1d.cu.j2"
ANY_TEMPLATE = "dw1d_any.cu.j2"
COMMON_TEMPLATE = "_common.cu.j2"

# Flags every variant is compiled with, by nvcc for the search and by load_inline for the frozen module.
# They are part of the digest: a change of flags makes every frozen entry stale.
NVCC_FLAGS = ("-O3",)  # the language standard is left to nvcc (C++17) and torch (C++20)

# Axes as data: enumeration is their product, then the restrictions below filter it.
AXES: dict[str, tuple] = {
    "threads": (64, 128, 256, 512, 1024),
    "vec": (1, 2, 4),
    "outs": (1, 2, 4),
    "walk": ("tile", "row"),
    "halo": ("l1", "smem", "shfl"),
    "stream": (False, True),
}
WALKS = AXES["walk"]
HALOS = AXES["halo"]

SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more
MAX_WINDOW_FLOATS = 64  # beyond this the per-thread register window spills


@dataclass(frozen=True)
class Config:
    """How one variant computes: the tunables, nothing about the problem."""

    threads: int = 256
    vec: int = 4
    outs: int = 1
    walk: str = "tile"  # tile: one block per tile of a row; row: one block walks a whole row
    halo: str = "l1"  # l1: re-read neighbours through L1; smem: tile in shared memory; shfl: warp shuffles
    stream: bool = False  # streaming cache hints (__ldcs / __stcs) instead of __ldg / plain stores

    def __post_init__(self) -> None:
        for axis, values in AXES.items():
            v = getattr(self, axis)
            if type(v) is not type(values[0]) or v not in values:
                raise ValueError(f"config {axis}={v!r} is not one of {values}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Variant:
    """A config specialised to one problem's compile-time parameters (K, stride, padding, dilation, bias)."""

    problem: Problem
    config: Config

    # Derived numbers, computed here once and passed to the template.
    @property
    def tile_outputs(self) -> int:
        c = self.config
        return c.threads * c.vec * c.outs

    @property
    def lead(self) -> int:
        """Window start, in vectors, relative to the vector of input j0*stride (floor(-padding / vec))."""
        return -((self.problem.padding + self.config.vec - 1) // self.config.vec)

    @property
    def window_offset(self) -> int:
        """Offset of the first needed element inside the register window: (-padding) mod vec."""
        return (-self.problem.padding) % self.config.vec

    @property
    def window_vectors(self) -> int:
        p, v = self.problem, self.config.vec
        last = self.window_offset + (v - 1) * p.stride + (p.kernel_size - 1) * p.dilation
        return last // v + 1

    @property
    def smem_vectors(self) -> int:
        """Vectors of input one tile step needs when it is staged in shared memory."""
        if self.config.halo != "smem":
            return 0
        return (self.tile_outputs // self.config.vec - 1) * self.problem.stride + self.window_vectors

    @property
    def smem_bytes(self) -> int:
        return self.smem_vectors * self.config.vec * self.problem.elem_bytes

    @property
    def align_bytes(self) -> int:
        """Pointer alignment the vector accesses need; the dispatcher checks it at run time."""
        return self.config.vec * self.problem.elem_bytes

    def tiles(self, out_length: int) -> int:
        return -(-out_length // self.tile_outputs)

    def grid(self, problem: Problem) -> int:
        """Blocks to launch for a problem of this variant's signature (possibly another size)."""
        per_row = self.tiles(problem.out_length) if self.config.walk == "tile" else 1
        return problem.rows * per_row

    @property
    def name(self) -> str:
        """Short tokens in a fixed order; booleans and defaults appear as a token or not at all."""
        p, c = self.problem, self.config
        parts = ["dw1d", {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}[p.dtype], f"k{p.kernel_size}"]
        if p.stride != 1:
            parts.append(f"s{p.stride}")
        parts.append(f"p{p.padding}")
        if p.dilation != 1:
            parts.append(f"d{p.dilation}")
        if p.bias:
            parts.append("bias")
        parts += [f"t{c.threads}", f"v{c.vec}", f"o{c.outs}"]
        if c.walk != "tile":
            parts.append(c.walk)
        parts.append(c.halo)
        if c.stream:
            parts.append("cs")
        return "_".join(parts)

    @property
    def digest(self) -> str:
        return content_digest(
            {
                "config": self.config.to_dict(),
                "signature": signature(self.problem),
                "flags": list(NVCC_FLAGS),
            },
            (KERNEL_TEMPLATE, COMMON_TEMPLATE),
        )

    def to_dict(self) -> dict:
        return {"problem": self.problem.to_dict(), "config": self.config.to_dict()}


def signature(p: Problem) -> dict:
    """The compile-time part of a problem: what a kernel is specialised to (sizes stay run-time)."""
    return {
        "kernel_size": p.kernel_size,
        "stride": p.stride,
        "padding": p.padding,
        "dilation": p.dilation,
        "dtype": p.dtype,
        "bias": p.bias,
    }


def template_text(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


def content_digest(payload: dict, templates: tuple[str, ...]) -> str:
    """sha256 over a JSON payload and the text of the templates it is rendered from."""
    h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    for t in templates:
        h.update(t.encode())
        h.update(template_text(t).encode())
    return h.hexdigest()


# Restrictions: plain named predicates over (problem, config); True means the combination is allowed.
def vec_divides_lengths(p: Problem, c: Config) -> bool:
    """Vector accesses need every row of x and y to start on a vector boundary."""
    return p.length % c.vec == 0 and p.out_length % c.vec == 0


def shfl_needs_unit_stride(p: Problem, c: Config) -> bool:
    """Neighbouring lanes hold neighbouring inputs only when consecutive outputs read consecutive inputs."""
    return c.halo != "shfl" or p.stride == 1


def shfl_window_within_warp(p: Problem, c: Config) -> bool:
    return c.halo != "shfl" or Variant(p, c).window_vectors <= 16


def window_fits_registers(p: Problem, c: Config) -> bool:
    return Variant(p, c).window_vectors * c.vec <= MAX_WINDOW_FLOATS


def smem_fits(p: Problem, c: Config) -> bool:
    return Variant(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def tile_fits_row(p: Problem, c: Config) -> bool:
    """A tile longer than the row leaves most threads idle; allow one warp's worth of vectors at least."""
    tile = c.threads * c.vec * c.outs
    return tile <= max(p.out_length, 32 * c.vec) or (c.threads == 64 and c.outs == 1)


def row_walk_needs_several_tiles(p: Problem, c: Config) -> bool:
    """With one tile per row, walking the row is the tile walk under another name."""
    return c.walk != "row" or p.out_length > c.threads * c.vec * c.outs


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    vec_divides_lengths,
    shfl_needs_unit_stride,
    shfl_window_within_warp,
    window_fits_registers,
    smem_fits,
    tile_fits_row,
    row_walk_needs_several_tiles,
)

# Restrictions that depend on the tensor sizes, not only on the signature: the frozen dispatcher
# and the edge-shape checks must re-test these for any other size.
SIZE_RESTRICTIONS = (vec_divides_lengths,)


def violations(p: Problem, c: Config) -> list[str]:
    """Names of the restrictions (p, c) breaks; empty when the variant is valid."""
    return [r.__name__ for r in RESTRICTIONS if not r(p, c)]


def all_configs() -> Iterator[Config]:
    names = list(AXES)
    for values in itertools.product(*(AXES[n] for n in names)):
        yield Config(**dict(zip(names, values, strict=True)))


def enumerate_space(p: Problem) -> list[Variant]:
    """Every valid variant for a problem, in a fixed order."""
    return [Variant(p, c) for c in all_configs() if not violations(p, c)]


# Tried first: designs that measured well (see docs/perf-notes.md), then a plain scalar one.
KNOWN_GOOD: tuple[Config, ...] = (
    Config(threads=256, vec=4, outs=1, walk="tile", halo="l1", stream=True),
    Config(threads=256, vec=4, outs=2, walk="tile", halo="shfl", stream=True),
    Config(threads=128, vec=4, outs=2, walk="tile", halo="smem", stream=True),
    Config(threads=512, vec=4, outs=1, walk="tile", halo="l1", stream=False),
    Config(threads=256, vec=1, outs=4, walk="tile", halo="l1", stream=False),
)


def known_good(p: Problem) -> list[Config]:
    return [c for c in KNOWN_GOOD if not violations(p, c)]
