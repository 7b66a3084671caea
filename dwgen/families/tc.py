"""The tensor-core forward family over (B, C, L) memory: 16-bit x and w, taps as a Toeplitz matrix, mma.sync.

Sixteen consecutive outputs j = 16i + m of a row are y[16i + m] = b + sum_t A[m][t] * x[16i - P - e + t]:
A (16 x 16*NCH) holds the row's weights on its diagonals, shifted by e so that every input block starts on
a 16-byte boundary, and the blocks are the columns of B. One m16n8k16 product per 16-wide chunk of t gives
128 outputs; products of 16-bit values are exact in fp32, so the sums match the CUDA-core kernels'.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from dwgen import families
from dwgen.families import AxisConfig
from dwgen.problem import Problem

TEMPLATE = "dw1d_tc.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding up to the halo and bias (Family.sizes_at_run_time)
GENERIC_SCOPE = "any"  # and padding past the halo too, every activation: it may be a fast generic kernel alone

# the launch finds x's 16-byte boundaries itself, so a misaligned x takes this kernel too
PEELS_MISALIGNMENT = True

AXES: dict[str, tuple] = {
    "warps": (2, 4, 8),
    "nt": (1, 2, 4),  # n8 tiles (128 outputs each) a warp computes per step, their products interleaved
    "tile": (512, 1024, 2048, 4096),  # outputs of one work item (from one staged input tile)
    # tile: a block per item; pers: a GPU-sized grid strides over the items, fetching the next while computing
    "walk": ("tile", "pers"),
}

OUTS_PER_N8 = 128  # an m16n8 product: 8 columns of 16 consecutive outputs
ALIGN = 8  # elements in 16 bytes: the staged input starts this aligned, e in [0, ALIGN) shifts the taps
W_OFF = (ALIGN - 1) + 15  # a fragment looks up taps from t - e - m = 0 - 7 - 15 on
MAX_CHUNKS = 12  # A fragments live in registers, 4 a chunk (K64 d2 takes 10: 76-80 registers)
SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more
MMA_TYPES = {"fp16": "f16", "bf16": "bf16"}


@dataclass(frozen=True)
class Config(AxisConfig):
    """How one variant computes: the tunables, nothing about the problem."""

    warps: int = 4
    nt: int = 2
    tile: int = 1024
    walk: str = "tile"

    AXES = AXES

    @property
    def threads(self) -> int:
        return 32 * self.warps


def chunks(p: Problem, shift: int) -> int:
    """16-wide chunks of t that 16 outputs need when their inputs start `shift` elements past the origin."""
    return -(-(16 + shift + p.halo) // 16)


@dataclass(frozen=True)
class Tiling:
    """The derived numbers of a config on a problem; the template uses them as they are."""

    problem: Problem
    config: Config

    @property
    def step_outputs(self) -> int:
        c = self.config
        return c.warps * c.nt * OUTS_PER_N8

    @property
    def steps(self) -> int:
        return self.config.tile // self.step_outputs

    @property
    def nch_min(self) -> int:
        """Chunks when the row's inputs happen to start on a 16-byte boundary (e = 0)."""
        return chunks(self.problem, 0)

    @property
    def nch_max(self) -> int:
        """Chunks in the worst shift (e = 7); a row takes the fewer when its e allows."""
        return chunks(self.problem, ALIGN - 1)

    @property
    def x_vectors(self) -> int:
        """16-byte vectors of input a block stages: its outputs' blocks and the last block's further chunks."""
        return (self.config.tile + 16 * (self.nch_max - 1)) // ALIGN

    @property
    def w_pairs(self) -> int:
        """Adjacent-tap pairs (32 bits) of the zero-padded, dilated weights that fragments are built from."""
        return 16 * self.nch_max + W_OFF

    @property
    def buffers(self) -> int:
        return 2 if self.config.walk == "pers" else 1

    @property
    def smem_bytes(self) -> int:
        return (self.buffers * self.x_vectors * 16 + self.config.tile * self.problem.elem_bytes
                + self.w_pairs * 4)


# Restrictions: plain named predicates over (problem, config); True means the combination is allowed.
def sixteen_bit_only(p: Problem, c: Config) -> bool:
    """mma.sync m16n8k16 multiplies fp16 or bf16; fp32 would need a 3xTF32 split."""
    return p.dtype in MMA_TYPES


def bcl_only(p: Problem, c: Config) -> bool:
    """The staged input tile is a run of one row: (B, C, L) memory."""
    return p.layout == "bcl"


def unit_stride(p: Problem, c: Config) -> bool:
    """Column block i + 1 is column block i shifted by 16 inputs only at stride 1."""
    return p.stride == 1


def tile_holds_whole_steps(p: Problem, c: Config) -> bool:
    return c.tile % Tiling(p, c).step_outputs == 0


def a_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).nch_max <= MAX_CHUNKS


def smem_fits(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def tile_fits_row(p: Problem, c: Config) -> bool:
    """A tile longer than the row (and its alignment head) computes outputs nobody stores; one step may."""
    return c.tile <= max(p.out_length + ALIGN - 1, Tiling(p, c).step_outputs)


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    sixteen_bit_only,
    bcl_only,
    unit_stride,
    tile_holds_whole_steps,
    a_fits_registers,
    smem_fits,
    tile_fits_row,
)


def name_tokens(c: Config) -> list[str]:
    """Tokens after the signature, in a fixed order."""
    return [f"w{c.warps}", f"n{c.nt}", f"t{c.tile}"] + (["pers"] if c.walk == "pers" else [])


TOKEN_KEYS = {"w": "warps", "n": "nt", "t": "tile"}


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields = families.fields_from_tokens(tokens, name, TOKEN_KEYS, "w<warps>, n<tiles>, t<tile>",
                                         {"pers": ("walk", "pers")})
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    """Every number the template needs, computed here (the template does no arithmetic of its own)."""
    t = Tiling(p, c)
    return {
        "threads": c.threads, "warps": c.warps, "nt": c.nt, "tile": c.tile, "steps": t.steps, "vec": ALIGN,
        "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation, "nch_min": t.nch_min,
        "nch_max": t.nch_max, "x_vectors": t.x_vectors, "w_pairs": t.w_pairs, "w_off": W_OFF,
        "mma_type": MMA_TYPES[p.dtype], "persistent": c.walk == "pers",
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """(B, C, L, padding, bias) that break the family's assumptions: rows that start inside a 16-byte vector
    (odd L), rows shorter than one 16-output block or than K, partial tiles, every shift e of the inputs."""
    tile, k, d = c.tile, p.kernel_size, p.dilation
    sizes = [
        (1, 1, 1), (1, 1, k - 1), (1, 3, k), (2, 3, 7), (1, 2, 17), (3, 5, 33), (2, 3, tile + 9),
        (3, 5, 3 * tile - 7), (1, 1, 2 * tile + 1), (2, 1, 4096 + 3), (1, 4, 1000), (2, 3, 1023),
        (p.batch if p.batch <= 4 else 1, 1, p.length), (1, p.channels, min(p.length, 4 * tile)),
    ]
    # Padding and bias are run-time arguments: other values than the tuned ones, each shift e among them.
    others = [(2, 3, tile + 5, 0, not p.bias), (1, 2, 3 * tile + 1, (k - 1) * d, p.bias),
              (1, 3, 999, (k - 1) // 2 * d, not p.bias), (2, 3, 777, 5 * tile // 4 + 3, p.bias)]
    others += [(1, 2, 301, pad, p.bias) for pad in range(1, ALIGN)]
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    """The launch finds the 16-byte boundaries itself: x and y need only hold whole elements."""
    return p.elem_bytes


def channel_multiple(p: Problem, c: Config) -> int:
    return 1


# Tried first; none measured yet (the H200 self-test, scripts/tc_selftest.py, is what will order them).
KNOWN_GOOD: tuple[Config, ...] = (
    Config(warps=4, nt=2, tile=1024),
    Config(warps=4, nt=1, tile=1024),
    Config(warps=2, nt=2, tile=1024),
    Config(warps=4, nt=2, tile=2048),
    Config(warps=8, nt=1, tile=2048),
    Config(warps=4, nt=4, tile=4096),
    Config(warps=2, nt=2, tile=512),
    Config(warps=4, nt=2, tile=1024, walk="pers"),
    Config(warps=2, nt=4, tile=1024, walk="pers"),
    Config(warps=4, nt=1, tile=512, walk="pers"),
)


def generic_config(p: Problem) -> Config:
    """The one design for a K nobody tuned: a 1024-output tile of 4 warps fits rows of 1024 and longer."""
    return Config(warps=4, nt=2, tile=1024)


FAMILY_NAME = "dw1d_tc"  # first token of its variants' names


def standalone(p: Problem, c: Config) -> tuple[str, str, str]:
    """(name, digest, CUDA source) of a variant, as space.Variant will make them once the registry holds this
    family (families.standalone)."""
    return families.standalone(sys.modules[__name__], p, c)


def applies(p: Problem) -> bool:
    """The problems any config can serve: what RESTRICTIONS ask of the problem alone."""
    return p.dtype in MMA_TYPES and p.layout == "bcl" and p.stride == 1
