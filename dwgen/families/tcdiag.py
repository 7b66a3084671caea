"""The tensor-core forward over (B, L, C) memory with channels as the product's columns: no transposes.

An m16n8k16 product here is sixteen outputs m (along the length) by the eight channels n of one 16-byte chunk,
over two taps h by the same eight channels:

    y[m][n] = b[n] + sum_h sum_n' A[m][8h + n'] * B[8h + n'][n],
    A[m][8h + n'] = x[(j0 + m) * S - P + (2i + h) * D][n'],   B[8h + n'][n] = w[n][2i + h] if n' == n, else 0,

one m16n8k16 product a tap pair i (an odd K's last tap: one m16n8k8, h = 0 alone). A's rows are staged 16-byte
chunks of x as they lie in memory (8 channels of one position), so ldmatrix reads them straight from the cp.async
copy, and the results go back through stmatrix as chunks of 8 channels of one position: the (B, L, C) order both
ways, where tcl (thirty-second session, removed in the thirty-third) transposed each element twice through shared
memory and lost to the CUDA-core channel family. B is diagonal, so 7/8 of each product is zeros: at K15, 7
products and a short one for 128 outputs, inside the tensor cores' rate at copy speed (docs/perf-notes.md).

Not in the registry yet (dwgen/space.py FAMILIES): unmeasured; docs/proposed/tcdiag-register.diff registers it
for scripts/ab-tcdiag.txt. `standalone` renders its variants as the registry will.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from dwgen import families
from dwgen.families import AxisConfig
from dwgen.families.tc import MMA_TYPES, sixteen_bit_only
from dwgen.problem import Problem

TEMPLATE = "dw1d_tcd.cu.j2"
FAMILY_NAME = "dw1d_tcd"  # first token of its variants' names

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding and bias (Family.sizes_at_run_time)

AXES: dict[str, tuple] = {
    "chunks": (2, 4, 8),  # 16-byte chunks of 8 channels a block: 16, 32 or 64 channels
    "wpc": (1, 2, 4),  # warps a chunk: they split the tile's 16-output groups
    "tile": (64, 128, 256, 512),  # outputs a block along the length
    "nt": (1, 2),  # 16-output groups a warp has in flight at once
    "steps": (1, 4, 16),  # tiles a block walks along the length, the next one's inputs copied meanwhile
}

VEC = 8  # 16-bit channels in a 16-byte chunk: the product's 8 columns
GROUP = 16  # outputs along the length a product computes: its 16 rows
MAX_TAP_PAIRS = 16  # B fragments live in registers, 2 a tap pair: K up to 32
MAX_THREADS = 512
SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more


@dataclass(frozen=True)
class Config(AxisConfig):
    chunks: int = 4
    wpc: int = 2
    tile: int = 128
    nt: int = 2
    steps: int = 4

    AXES = AXES

    @property
    def threads(self) -> int:
        return 32 * self.chunks * self.wpc


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def span(self) -> int:
        """Input positions a tile's outputs read."""
        p = self.problem
        return (self.config.tile - 1) * p.stride + p.halo + 1

    @property
    def phase_rows(self) -> int:
        """Staged positions of one stride phase: a tile's inputs are kept phase by phase (position r at
        (r % S) * phase_rows + r / S), so that the 8 rows of an ldmatrix, S positions apart, are 8 adjacent
        chunks whatever S: 128 contiguous bytes, every bank once."""
        return -(-self.span // self.problem.stride)

    @property
    def x_rows(self) -> int:
        """Chunks a channel chunk's staged inputs take: S * phase_rows, to 8m + 1, so that the chunks of one
        position (a warp's neighbouring copies) fall in different banks."""
        return _round_up(self.problem.stride * self.phase_rows - 1, 8) + 1

    @property
    def y_rows(self) -> int:
        return self.config.tile + 1  # likewise for the outputs' copy to global memory

    @property
    def tap_pairs(self) -> int:
        """B fragments in registers: the pairs' and an odd K's last tap's (2 registers each, counted as a pair)."""
        return -(-self.problem.kernel_size // 2)

    @property
    def x_buffers(self) -> int:
        """Staged input buffers: two when the block walks, the next tile's copy landing in the other."""
        return 2 if self.config.steps > 1 else 1

    @property
    def smem_bytes(self) -> int:
        return self.config.chunks * (self.x_buffers * self.x_rows + self.y_rows) * 16


def blc_only(p: Problem, c: Config) -> bool:
    """Its rows are chunks of channels of one position: (B, L, C) memory; tc.py is the (B, C, L) kernel."""
    return p.layout == "blc"


def channels_whole_vectors(p: Problem, c: Config) -> bool:
    """A position's channels are copied 8 at a time, 16 bytes: C must be whole chunks."""
    return p.channels % VEC == 0


def block_within_limit(p: Problem, c: Config) -> bool:
    return c.threads <= MAX_THREADS


def groups_split_evenly(p: Problem, c: Config) -> bool:
    """Every warp of a chunk takes the same number of nt groups from a tile."""
    return (c.tile // GROUP) % (c.wpc * c.nt) == 0


def weights_fit_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).tap_pairs <= MAX_TAP_PAIRS


def smem_fits(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def tile_fits_length(p: Problem, c: Config) -> bool:
    """A tile longer than the output computes what nobody stores."""
    return c.tile <= max(p.out_length, 64)


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    sixteen_bit_only,
    blc_only,
    channels_whole_vectors,
    block_within_limit,
    groups_split_evenly,
    weights_fit_registers,
    smem_fits,
    tile_fits_length,
)


def name_tokens(c: Config) -> list[str]:
    return [f"q{c.chunks}", f"w{c.wpc}", f"t{c.tile}", f"n{c.nt}", f"s{c.steps}"]


TOKEN_KEYS = {"q": "chunks", "w": "wpc", "t": "tile", "n": "nt", "s": "steps"}


def config_from_tokens(tokens: list[str], name: str) -> Config:
    expected = "q<chunks>, w<warps>, t<tile>, n<groups>, s<steps>"
    return Config(**families.fields_from_tokens(tokens, name, TOKEN_KEYS, expected))


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "chunks": c.chunks, "wpc": c.wpc, "tile": c.tile, "nt": c.nt, "steps": c.steps,
        "vec": VEC,
        "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation,
        "phase_rows": t.phase_rows, "x_rows": t.x_rows, "y_rows": t.y_rows, "mma_type": MMA_TYPES[p.dtype],
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Lengths shorter than K or than a tile, channels that are one chunk or not a whole block, B = 1, paddings
    from none to past the halo."""
    tile, ct, k, d = c.tile, c.chunks * VEC, p.kernel_size, p.dilation
    sizes = [(1, 8, 1), (1, 8, k), (2, 8, 7), (1, 24, 33), (2, ct + 8, tile + 1), (1, 2 * ct - 8, 3 * tile - 1),
             (3, 40, 1000), (p.batch if p.batch <= 4 else 1, p.channels, min(p.length, 2 * tile + 3))]
    others = [(2, 16, tile + 5, 0, not p.bias), (1, 8, 3 * tile + 1, (k - 1) * d, p.bias),
              (1, 24, 999, (k - 1) // 2 * d, not p.bias), (2, 8, 777, 5 * tile // 4 + 3, p.bias)]
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return VEC


# First guesses (unmeasured): 4 to 8 warps, 64-256 outputs a tile, walks of 4 and 16 tiles and none.
KNOWN_GOOD: tuple[Config, ...] = (
    Config(chunks=4, wpc=2, tile=128, nt=2, steps=4),
    Config(chunks=8, wpc=1, tile=128, nt=2, steps=4),
    Config(chunks=4, wpc=2, tile=256, nt=2, steps=4),
    Config(chunks=4, wpc=2, tile=128, nt=2, steps=16),
    Config(chunks=2, wpc=4, tile=256, nt=2, steps=1),
    Config(chunks=8, wpc=2, tile=64, nt=1, steps=1),
    Config(chunks=4, wpc=4, tile=128, nt=1, steps=4),
    Config(chunks=4, wpc=2, tile=64, nt=2, steps=4),  # strides 3 and 4: a 64-output tile reads 190-250 positions
    Config(chunks=2, wpc=2, tile=64, nt=1, steps=4),
)


def generic_config(p: Problem) -> Config:
    return Config(chunks=4, wpc=2, tile=128, nt=2, steps=4)


def applies(p: Problem) -> bool:
    """The problems any config can serve: what RESTRICTIONS ask of the problem alone."""
    return (p.dtype in MMA_TYPES and p.layout == "blc" and p.channels % VEC == 0
            and -(-p.kernel_size // 2) <= MAX_TAP_PAIRS)


def standalone(p: Problem, c: Config) -> tuple[str, str, str]:
    """(name, digest, CUDA source) of a variant, as space.Variant will make them once the registry holds this
    family (families.standalone)."""
    return families.standalone(sys.modules[__name__], p, c)


def edge_problems(p: Problem, c: Config) -> list[Problem]:
    """The problems edge_sizes names, as space.Variant.edge_problems makes them."""
    from dwgen import space

    return space.edge_problems(p, edge_sizes(p, c))
