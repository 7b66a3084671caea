"""The split backward for long 16-bit filters over (B, C, L): grad_weight and grad_bias from a weight-gradient
kernel, grad_x from the tensor-core forward run on grad_out with the taps reversed.

At stride 1, grad_x[i] = sum_k w[k] grad_out[i + P - k D] is a forward convolution of grad_out (length Lout,
giving L outputs) with the taps reversed and left padding H - P (H = (K - 1) D). The fused backward does 2K
fp32 FMAs an element; for K31 that bounds it at about 4.5x copy (docs/perf-notes.md), while the tensor-core
forward runs K31 at about 1.15x. Here the weight-gradient kernel does the K FMAs of grad_weight alone, grad_x
moves to tensor cores (its reversed taps from a small kernel of their own), and grad_out is read twice; the
weight gradient runs on a second stream beside grad_x, since neither needs the other's output.
Measured on fp16 K31 (H200): with the weight gradient on CUDA cores a tie with the fused kernel (twelfth
session, about 75 us of 100 in the weight gradient); with it on tensor cores 0.060 ms against the fused
kernel's 0.102, frozen (thirteenth session); side by side, 2.50x -> 2.03x copy (eighteenth session;
docs/perf-notes.md).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from dwgen.families import AxisConfig, tc
from dwgen.problem import Problem

TEMPLATE = "dw1d_bwd_tc.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding up to the halo and bias (Family.sizes_at_run_time)
# As a fast generic backward (search.generic): beside a fused design, for calls without an activation padded
# up to the halo a side (space.scope_admits)
GENERIC_SCOPE = "within_halo"

VEC = 8  # 16-bit elements in 16 bytes

AXES: dict[str, tuple] = {
    # The weight-gradient kernel: threads a block, positions a thread sums its K products over (its tile is
    # threads x run positions), and the tiles a block walks (along its channel's rows, then on to the next
    # row) before its one reduction.
    "threads": (64, 128, 256),
    "run": (8, 16, 32),
    "span": (1, 2, 4, 8, 16),
    # How it multiplies: K fp32 FMAs an element on CUDA cores from float windows (fma), or on tensor cores
    # (mma: grad_out's 16-position blocks against x's, 256 positions an m16n8k16 step, the taps read off the
    # product's diagonals; the next tile fetched by cp.async while one is multiplied). The fma kernel measured
    # about 75 us on fp16 K31 where 20-25 were predicted (docs/perf-notes.md, twelfth session); the mma kernel
    # put the split backward at 0.059 ms against the fused kernel's 0.102 (thirteenth session).
    "wgrad": ("fma", "mma"),
    # grad_x: the tensor-core forward's own axes (dwgen/families/tc.py).
    **tc.AXES,
}

# Below this the fused backward's 2K FMAs an element cost less than reading grad_out twice. It was 16 until the
# generic backward weighed the split one: the fused generic kernels read 2.4-2.5x copy at 16-bit K7 and
# 3.4-3.8x at K15 on their training shapes, the split one 2.0x at K31 (H200); from K10 a measurement chooses.
# K8 and K9 stay the lane backward's as narrow generic kernels (halos of 7 and 8 within its 8-position runs), so
# no key weighs two narrow scopes.
MIN_TAPS = 10
STATIC_SMEM_BYTES = 48 * 1024
MAX_RUN_FLOATS = 104  # K + 1 sums and a run of grad_out a thread holds (K64 with 32-position runs: 97)
# Two 16-bit ones in a 32-bit word (fp16 1.0 is 0x3C00, bf16 1.0 is 0x3F80): an mma operand of all ones.
ONES_PAIR = {"fp16": "0x3c003c00u", "bf16": "0x3f803f80u"}  # C++ literals, plain tokens
MAX_MMA_CHUNKS = 8  # the product a lane holds: 8 floats a chunk (K31: 4 chunks, 32 floats)


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 128
    run: int = 16
    span: int = 4
    wgrad: str = "fma"
    warps: int = 4
    nt: int = 2
    tile: int = 1024
    walk: str = "tile"

    AXES = AXES

    @property
    def gx(self) -> tc.Config:
        return tc.Config(**{n: getattr(self, n) for n in tc.AXES})



def activations(p: Problem) -> tuple[str, ...]:
    """Its launch refuses a SiLU (the fused family recomputes the pre-activation its slope needs): the checks
    run it without one only."""
    return ("none",)

def mirrored(p: Problem) -> Problem:
    """The forward problem grad_x is: grad_out (length Lout) as input, L outputs, the taps reversed (their
    values are run-time), left padding H - P and right padding H - P_right, no bias, no activation."""
    h = p.halo
    return replace(p, length=p.out_length, padding=h - p.padding, padding_right=h - p.padding_right, bias=False,
                   activation="none")


def skew(i: int, run: int) -> int:
    """Where window element i sits in shared memory: a float left empty after every run, so that the threads
    of a warp, reading element j of their runs together, meet at a stride of run + 1 floats (odd: no bank
    conflict). The template's skew()."""
    return i + i // run


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def halo(self) -> int:
        return self.problem.halo

    @property
    def tile_length(self) -> int:
        """Output positions one tile of the weight-gradient kernel covers."""
        return self.config.threads * self.config.run

    @property
    def x_floats(self) -> int:
        return skew(self.tile_length + self.halo - 1, self.config.run) + 1

    @property
    def gy_floats(self) -> int:
        return skew(self.tile_length - 1, self.config.run) + 1

    @property
    def x_vectors(self) -> int:
        """16-byte vectors staged for a tile's x window, from the boundary at or before its first element."""
        return (self.tile_length + self.halo + 2 * VEC - 2) // VEC

    @property
    def gy_vectors(self) -> int:
        return (self.tile_length + 2 * VEC - 2) // VEC

    @property
    def reduce_floats(self) -> int:
        return (self.problem.kernel_size + 1) * self.config.threads

    @property
    def smem_floats(self) -> int:
        """The staged windows, and after the walk the block's sums, in one buffer (fma)."""
        return max(self.x_floats + self.gy_floats, self.reduce_floats)

    @property
    def nch(self) -> int:
        """16-wide chunks of the product's columns t = m + k D + e (mma): 16 + (VEC - 1) + H of them."""
        return -(-(16 + VEC - 1 + self.halo) // 16)

    @property
    def smem_bytes(self) -> int:
        if self.config.wgrad == "fma":
            return 4 * self.smem_floats
        warps, tl, nch = self.config.threads // 32, self.tile_length, self.nch
        x_vectors, gy_vectors = (tl + 16 * (nch - 1)) // VEC, tl // VEC
        # two buffers of each tile, a warp's product (rows padded by a float), the block's sums
        return 2 * 16 * (x_vectors + gy_vectors) + 4 * warps * 16 * (16 * nch + 1) + 4 * warps * (
            self.problem.kernel_size + 1)

    @property
    def run_registers(self) -> int:
        return self.problem.kernel_size + 1 + self.config.run


def sixteen_bit_only(p: Problem, c: Config) -> bool:
    """grad_x runs on tensor cores (mma.sync m16n8k16: fp16 or bf16)."""
    return p.dtype in tc.MMA_TYPES


def bcl_only(p: Problem, c: Config) -> bool:
    return p.layout == "bcl"


def stride_one(p: Problem, c: Config) -> bool:
    """grad_x is a forward convolution only at stride 1."""
    return p.stride == 1


def no_activation(p: Problem, c: Config) -> bool:
    """A SiLU's slope needs the forward's pre-activation, which the fused family recomputes in its tile."""
    return p.activation == "none"


def long_filter(p: Problem, c: Config) -> bool:
    return p.kernel_size >= MIN_TAPS


def padding_within_halo(p: Problem, c: Config) -> bool:
    """grad_x's paddings H - P and H - P_right must not be negative."""
    h = p.halo
    return p.padding <= h and p.padding_right <= h


def gx_design_fits(p: Problem, c: Config) -> bool:
    """The grad_x design is a valid tensor-core forward of the mirrored problem."""
    q = mirrored(p) if padding_within_halo(p, c) else p
    return all(r(q, c.gx) for r in tc.RESTRICTIONS)


def fits_static_smem(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= STATIC_SMEM_BYTES


def run_fits_registers(p: Problem, c: Config) -> bool:
    """fma: K + 1 sums and a run of grad_out a thread; mma: its share of the product, 8 floats a 16-wide chunk."""
    t = Tiling(p, c)
    return t.run_registers <= MAX_RUN_FLOATS if c.wgrad == "fma" else t.nch <= MAX_MMA_CHUNKS


def taps_fit_lanes(p: Problem, c: Config) -> bool:
    """mma: a lane sums taps lane and lane + 32 off the diagonals."""
    return c.wgrad == "fma" or p.kernel_size <= 64


def tile_fits_length(p: Problem, c: Config) -> bool:
    return Tiling(p, c).tile_length <= max(p.out_length, 256)


def span_fits(p: Problem, c: Config) -> bool:
    """A walk of n tiles only where half as many would not cover the channel's tiles (past that, the grid is
    that of the shorter walk: a variant already asked)."""
    tiles = p.batch * -(-p.out_length // Tiling(p, c).tile_length)
    return c.span == 1 or c.span // 2 < tiles


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    sixteen_bit_only,
    bcl_only,
    stride_one,
    no_activation,
    long_filter,
    padding_within_halo,
    gx_design_fits,
    fits_static_smem,
    run_fits_registers,
    taps_fit_lanes,
    tile_fits_length,
    span_fits,
)


def applies(p: Problem) -> bool:
    """What RESTRICTIONS ask of the problem alone."""
    c = Config()
    return all(r(p, c) for r in (sixteen_bit_only, bcl_only, stride_one, no_activation, long_filter,
                                 padding_within_halo))


def name_tokens(c: Config) -> list[str]:
    return [f"t{c.threads}", f"r{c.run}", f"s{c.span}", *(["mma"] if c.wgrad == "mma" else []), *tc.name_tokens(c.gx)]


def config_from_tokens(tokens: list[str], name: str) -> Config:
    if len(tokens) < 3:
        raise ValueError(f"{name}: expected t<threads>_r<run>_s<span> before the grad_x design")
    fields: dict = {}
    for tok, (key, field) in zip(tokens[:3], (("t", "threads"), ("r", "run"), ("s", "span")), strict=True):
        if tok[:1] != key or not tok[1:].isdigit():
            raise ValueError(f"{name}: expected {key}<{field}>, got {tok!r}")
        fields[field] = int(tok[1:])
    rest = tokens[3:]
    if rest[:1] == ["mma"]:
        fields["wgrad"], rest = "mma", rest[1:]
    gx = tc.config_from_tokens(rest, name)
    return Config(**fields, **{n: getattr(gx, n) for n in tc.AXES})


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "run": c.run, "span": c.span, "vec": VEC, "kernel_size": p.kernel_size,
        "dilation": p.dilation, "halo": t.halo, "x_vectors": t.x_vectors, "gy_vectors": t.gy_vectors,
        "x_floats": t.x_floats, "smem_floats": t.smem_floats, "wgrad_mma": c.wgrad == "mma", "nch": t.nch,
        "tile_length": t.tile_length, "mma_type": tc.MMA_TYPES[p.dtype], "ones_pair": ONES_PAIR[p.dtype],
        # the grad_x kernel's own context, rendered under the variant's name + _gx
        "gx": tc.render_context(mirrored(p), c.gx),
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Rows shorter than the filter or a tile, a tile and one, walks that cross rows, paddings from 0 to the
    halo (grad_x's own padding from the halo to 0), rows that start inside a 16-byte vector."""
    t = Tiling(p, c)
    tl, h, k, g = t.tile_length, t.halo, p.kernel_size, c.tile
    return [(1, 1, k, p.padding, p.bias), (2, 3, tl + 1, p.padding, not p.bias), (1, 2, 2 * tl - 3, 0, p.bias),
            (1, 2, 3 * tl + 5, h, p.bias), (3, 5, 999, h // 2, p.bias), (5, 3, 37, p.padding, p.bias),
            (2, 1, tl * c.span + 7, p.padding, not p.bias), (2, 3, g + 9, p.padding, p.bias),
            (1, 1, 2 * g + 1, 1, p.bias), (p.batch if p.batch <= 4 else 2, 3, p.length, p.padding, p.bias)]


def align_bytes(p: Problem, c: Config) -> int:
    """x and grad_out are staged in 16-byte vectors from their base pointers."""
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return 1


KNOWN_GOOD: tuple[Config, ...] = (
    # fp16 K31 (H200, thirteenth session's first tune): weight gradient on tensor cores, t64_r16_s16 0.0592 ms
    # (2.7x copy) against the fused kernel's 0.1016, then s4 (0.0622) and s8 (0.0632), t128_r8_s4 (0.0728); the
    # fma kernel's best of the twelfth session (0.1025 ms). grad_x as the fp16 K31 forward's tuned design
    # (dw1d_tc_f16_k31_w2_n4_t1024, 1.15x copy)
    Config(threads=64, run=16, span=16, wgrad="mma", warps=2, nt=4, tile=1024),
    Config(threads=64, run=16, span=4, wgrad="mma", warps=2, nt=2, tile=1024),
    Config(threads=64, run=16, span=8, wgrad="mma", warps=2, nt=4, tile=1024),
    Config(threads=128, run=8, span=4, wgrad="mma", warps=2, nt=4, tile=1024),
    Config(threads=128, run=8, span=4, warps=2, nt=2, tile=1024),
    Config(threads=64, run=16, span=16, warps=2, nt=4, tile=1024),
)


def generic_config(p: Problem) -> Config:
    return KNOWN_GOOD[0]
