"""The tensor-core forward family over (B, L, C) memory: each channel's inputs staged as a row, then tc's product.

Not in the registry yet (dwgen/space.py FAMILIES): on the H200 its first designs ran 1.7-2.9x copy where the
channel family runs 1.08-1.72x (docs/perf-notes.md, thirty-second session), and a registered family takes a share
of every (B, L, C) tune's trials. `standalone` renders its variants as the registry will once it earns its place.

A block takes CT channels and TILE outputs along the length. It stages each channel's inputs as a row of shared
memory (a transpose: 16-byte loads across 8 channels, 16-bit stores along the length), computes sixteen
consecutive outputs j = j_b + m of a row as y[j_b + m] = b + sum_t A[m][t] * x[j_b - P + t] with the channel's
weights on A's diagonals (tc.py's Toeplitz product, one m16n8k16 mma per 16-wide chunk of t for 128 outputs), and
writes the rows back across the channels. The CUDA-core channel family (blc.py) spends about 9 FMAs and 7 other
instructions an output at K9 in 16 bits; here the FMAs move to the tensor cores and each element costs its two
transposes.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from dwgen import families
from dwgen.families import AxisConfig
from dwgen.families.tc import MMA_TYPES, sixteen_bit_only, unit_stride  # the same mma, the same Toeplitz form
from dwgen.problem import Problem

TEMPLATE = "dw1d_tcl.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding and bias (Family.sizes_at_run_time)

AXES: dict[str, tuple] = {
    "warps": (2, 4, 8),
    "cthreads": (16, 32),  # channels a block: two or four 16-byte vectors a position
    "tile": (256, 512),  # outputs a block along the length
    "nt": (1, 2),  # n8 tiles (128 outputs each) a warp computes at once, their products interleaved
    # tile: a block an item; pers: a GPU-sized grid strides over the items, the next one's loads in registers
    "walk": ("tile", "pers"),
}

OUTS_PER_N8 = 128
VEC = 8  # 16-bit elements in a 16-byte vector: the channels one load reads
W_OFF = 15  # pair index of tap position 0: a fragment looks up taps from t - m = 0 - 15 on
MAX_CHUNKS = 12  # A fragments live in registers, 4 a chunk
MAX_BATCH = 8  # staging loads a thread has in flight at once (16-byte vectors: 4 registers each)
SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more
FAMILY_NAME = "dw1d_tcl"  # first token of its variants' names; distinct from tc's, as both build into one module


@dataclass(frozen=True)
class Config(AxisConfig):
    warps: int = 4
    cthreads: int = 32
    tile: int = 256
    nt: int = 2
    walk: str = "tile"

    AXES = AXES

    @property
    def threads(self) -> int:
        return 32 * self.warps


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def groups(self) -> int:
        """16-byte vectors of channels a position: the lanes side by side on one position."""
        return self.config.cthreads // VEC

    @property
    def chunks(self) -> int:
        """16-wide chunks of t that 16 outputs need: 16 + the halo (the staged rows start at j0 - P exactly)."""
        return -(-(16 + self.problem.halo) // 16)

    @property
    def x_row(self) -> int:
        """Inputs a channel's row stages: its outputs' blocks and the last block's further chunks."""
        return self.config.tile + 16 * (self.chunks - 1)

    @property
    def x_stride(self) -> int:
        """A row's stride in elements: x_row to a multiple of 64, plus 32 / groups, so that the groups' rows one
        warp's stores reach (64 / groups bytes each) lie side by side in the banks."""
        return _round_up(self.x_row, 64) + 32 // self.groups

    @property
    def y_stride(self) -> int:
        return self.config.tile + 32 // self.groups

    @property
    def w_pairs(self) -> int:
        """Adjacent-tap pairs (32 bits) of a channel's zero-padded, dilated weights that fragments are built from."""
        return 16 * self.chunks + W_OFF

    @property
    def x_iters(self) -> int:
        """Staging loads a thread makes for an item."""
        return -(-self.groups * self.x_row // self.config.threads)

    @property
    def smem_bytes(self) -> int:
        ct = self.config.cthreads
        return ct * (self.x_stride + self.y_stride) * self.problem.elem_bytes + ct * self.w_pairs * 4


def blc_only(p: Problem, c: Config) -> bool:
    """The staging reads positions of (B, L, C) memory; tc.py is the (B, C, L) kernel."""
    return p.layout == "blc"


def channels_whole_vectors(p: Problem, c: Config) -> bool:
    """A position's channels are read 8 at a time, 16 bytes: C must be whole vectors."""
    return p.channels % VEC == 0


def warps_share_channels(p: Problem, c: Config) -> bool:
    return c.cthreads % c.warps == 0


def tile_holds_whole_steps(p: Problem, c: Config) -> bool:
    return (c.tile // OUTS_PER_N8) % c.nt == 0


def a_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).chunks <= MAX_CHUNKS


def smem_fits(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def persistent_holds_an_item(p: Problem, c: Config) -> bool:
    """The persistent walk keeps the next item's staging loads in registers: at most one batch of them."""
    return c.walk != "pers" or Tiling(p, c).x_iters <= MAX_BATCH


def tile_fits_length(p: Problem, c: Config) -> bool:
    """A tile longer than the output computes what nobody stores."""
    return c.tile <= max(p.out_length, 256)


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    sixteen_bit_only,
    blc_only,
    unit_stride,
    channels_whole_vectors,
    warps_share_channels,
    tile_holds_whole_steps,
    a_fits_registers,
    smem_fits,
    persistent_holds_an_item,
    tile_fits_length,
)


def name_tokens(c: Config) -> list[str]:
    return [f"w{c.warps}", f"c{c.cthreads}", f"t{c.tile}", f"n{c.nt}"] + (["pers"] if c.walk == "pers" else [])


TOKEN_KEYS = {"w": "warps", "c": "cthreads", "t": "tile", "n": "nt"}


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields = families.fields_from_tokens(tokens, name, TOKEN_KEYS, "w<warps>, c<channels>, t<tile>, n<tiles>",
                                         {"pers": ("walk", "pers")})
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "warps": c.warps, "cthreads": c.cthreads, "tile": c.tile, "nt": c.nt, "vec": VEC,
        "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation, "nch": t.chunks,
        "x_row": t.x_row, "x_stride": t.x_stride, "y_stride": t.y_stride, "w_pairs": t.w_pairs, "w_off": W_OFF,
        "mma_type": MMA_TYPES[p.dtype], "persistent": c.walk == "pers", "max_batch": MAX_BATCH,
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Lengths shorter than K or than a tile, channels that are one vector or not a whole block, B = 1, paddings
    from none to past the halo."""
    tile, ct, k, d = c.tile, c.cthreads, p.kernel_size, p.dilation
    sizes = [(1, 8, 1), (1, 8, k), (2, 8, 7), (1, 24, 33), (2, ct + 8, tile + 1), (1, 2 * ct - 8, 3 * tile - 1),
             (3, 40, 1000), (p.batch if p.batch <= 4 else 1, p.channels, min(p.length, 2 * tile + 3))]
    others = [(2, 16, tile + 5, 0, not p.bias), (1, 8, 3 * tile + 1, (k - 1) * d, p.bias),
              (1, 24, 999, (k - 1) // 2 * d, not p.bias), (2, 8, 777, 5 * tile // 4 + 3, p.bias)]
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return VEC


KNOWN_GOOD: tuple[Config, ...] = (
    Config(warps=4, cthreads=32, tile=256, nt=2),
    Config(warps=4, cthreads=16, tile=512, nt=2),
    Config(warps=8, cthreads=32, tile=256, nt=1),
    Config(warps=2, cthreads=16, tile=256, nt=2),
    Config(warps=8, cthreads=32, tile=256, nt=1, walk="pers"),
    Config(warps=4, cthreads=16, tile=256, nt=2, walk="pers"),
)


def generic_config(p: Problem) -> Config:
    return Config(warps=4, cthreads=32, tile=256, nt=2)


def applies(p: Problem) -> bool:
    """The problems any config can serve: what RESTRICTIONS ask of the problem alone."""
    return p.dtype in MMA_TYPES and p.layout == "blc" and p.stride == 1 and p.channels % VEC == 0


def standalone(p: Problem, c: Config) -> tuple[str, str, str]:
    """(name, digest, CUDA source) of a variant, as space.Variant will make them once the registry holds this
    family (families.standalone)."""
    return families.standalone(sys.modules[__name__], p, c)


def edge_problems(p: Problem, c: Config) -> list[Problem]:
    """The problems edge_sizes names, as space.Variant.edge_problems makes them."""
    from dwgen import space

    return space.edge_problems(p, edge_sizes(p, c))
