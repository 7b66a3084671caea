"""The walking backward over (B, L, C) for problems padded by the halo on the left at stride 1 (causal, or
symmetric padding of H, or any right padding): each thread owns a vector of
neighbouring channels and walks a stretch of the length, its halo held in registers; no shared-memory windows.

Why: the fused family stages a tile of TC channels by TL positions in shared memory, and each thread then
reads its one channel's run from it element by element (a 2-byte shared load an element for 16-bit types);
with SiLU the Mamba `(B, L, C)` backward read 2.10x copy against 1.68x for the `(B, C, L)` lane family
(fifteenth session). Over `(B, L, C)` a thread's own positions follow each other, so walking them keeps the
last H + 1 inputs in registers: x and grad_out are read once each from memory, a warp's vector loads side by
side across the channels (one contiguous request a position), and only the first H positions of a walk are
read twice. The halo as left padding (P = H): causal, or symmetric padding of H, whose longer grad_out rows
only add positions to walk (the suite's Mamba-shaped K4 P3 problem).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.families import AxisConfig, some_design_fits, stride_one
from dwgen.problem import Problem

TEMPLATE = "dw1d_bwd_walk.cu.j2"

AXES: dict[str, tuple] = {
    "threads": (128, 256, 512),
    "ct": (16, 32, 64),  # threads side by side across the channels (the rest of the block along the length)
    "vec": (1, 2, 4, 8),  # channels a thread, one vector access of 4, 8 or 16 bytes
    "seg": (32, 64, 128, 256),  # positions a thread walks
    "unroll": (4, 8),  # positions whose loads are issued together
    # 0: a batch's loads land in registers; 3-6: a ring of that many batches in shared memory filled by
    # cp.async, all but one in flight while one is computed, without registers to hold them (token a<n>)
    "stages": (0, 3, 4, 6),
}

# As a fast generic backward (search.generic): its launch takes any B, C and L (no size is compiled in), so beside a
# fused design it serves calls whose left padding is the halo (causal, or any right padding) with or without
# SiLU, channels in whole vectors (space.scope_admits; the dispatchers' fits() checks the channels); its grid's
# second dimension, B times a row's blocks, holds for every call the scope admits at spans of 1024 positions or
# more (space.LEFT_HALO_SPAN: every design search.generic weighs)
GENERIC_SCOPE = "left_halo"

STATIC_SMEM_BYTES = 48 * 1024
MAX_STATE_FLOATS = 80  # weights, windows and sums a thread holds for its channels


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 256
    ct: int = 32
    vec: int = 2
    seg: int = 64
    unroll: int = 8
    stages: int = 0

    AXES = AXES


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def halo(self) -> int:
        return self.problem.halo

    @property
    def rows(self) -> int:
        """Thread rows along the length in a block."""
        return self.config.threads // self.config.ct

    @property
    def span(self) -> int:
        """Positions a block covers along a row."""
        return self.rows * self.config.seg

    @property
    def smem_bytes(self) -> int:
        """The weight sums' rows, or the ring where larger (the one buffer serves both)."""
        c = self.config
        red = 4 * self.rows * (self.problem.kernel_size + 1) * c.ct * c.vec
        return max(red, c.stages * c.unroll * 2 * c.threads * c.vec * self.problem.elem_bytes)

    @property
    def state_floats(self) -> int:
        """Weights and bias, the two windows and the weight sums for the thread's channels."""
        k, h = self.problem.kernel_size, self.halo
        return self.config.vec * (k + 1 + 2 * (h + 1) + (k + 1))

    @property
    def load_words(self) -> int:
        """The batch's vectors of x and grad_out, in flight together."""
        return 2 * self.config.unroll * self.config.vec * self.problem.elem_bytes // 4 if not self.config.stages else 0

    @property
    def slots(self) -> int:
        """Partial slots, one a block: the grid's second dimension."""
        return self.problem.batch * -(-self.problem.out_length // self.span)


def left_padding_is_halo(p: Problem, c: Config) -> bool:
    """P = H on the left (right padding any): grad_out position o pairs with x from o - H to o, so a thread
    walking grad_out positions holds its own halo; a longer row of grad_out only adds positions to walk."""
    return p.padding == p.halo


def blc_only(p: Problem, c: Config) -> bool:
    return p.layout == "blc"


def vector_of_4_to_16_bytes(p: Problem, c: Config) -> bool:
    return c.vec * p.elem_bytes in (4, 8, 16)


def channels_whole_vectors(p: Problem, c: Config) -> bool:
    return p.channels % c.vec == 0


def state_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).state_floats <= MAX_STATE_FLOATS


def loads_fit_block_registers(p: Problem, c: Config) -> bool:
    """The state and the batch's loads within what a block of this size leaves a thread (65536 registers an
    SM, 255 a thread), with about 20 for addresses and temporaries: past that ptxas spills."""
    t = Tiling(p, c)
    return t.state_floats + t.load_words <= min(255, 65536 // c.threads) - 20


def grid_fits(p: Problem, c: Config) -> bool:
    """Batch rows times a row's blocks are the grid's y dimension (at most 65535; the launch refuses more)."""
    return Tiling(p, c).slots <= 65535


def fits_static_smem(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= STATIC_SMEM_BYTES


def walk_covers_halo(p: Problem, c: Config) -> bool:
    """A walk much longer than the H positions it re-reads (at most an eighth of them)."""
    return 8 * Tiling(p, c).halo <= c.seg


def whole_warps_across(p: Problem, c: Config) -> bool:
    return c.ct <= c.threads and c.threads % c.ct == 0


def channels_fill_block(p: Problem, c: Config) -> bool:
    """No more channel threads than half again the channels need (else the grid is another variant's)."""
    return (c.ct // 2) * c.vec < p.channels


def span_fits_length(p: Problem, c: Config) -> bool:
    """A block's span no longer than twice grad_out's row (past that, most of its rows would idle)."""
    return Tiling(p, c).span // 2 < max(p.out_length, 256)


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    blc_only,
    stride_one,
    left_padding_is_halo,
    vector_of_4_to_16_bytes,
    channels_whole_vectors,
    state_fits_registers,
    loads_fit_block_registers,
    fits_static_smem,
    walk_covers_halo,
    whole_warps_across,
    channels_fill_block,
    span_fits_length,
    grid_fits,
)


def applies(p: Problem) -> bool:
    """Whether any of the family's designs fits p (a family with none would only cost the tune its asks)."""
    return p.layout == "blc" and some_design_fits(p, Config, RESTRICTIONS)


def name_tokens(c: Config) -> list[str]:
    return [f"t{c.threads}", f"c{c.ct}", f"v{c.vec}", f"s{c.seg}", f"u{c.unroll}",
            *([f"a{c.stages}"] if c.stages else [])]


def config_from_tokens(tokens: list[str], name: str) -> Config:
    keys = {"t": "threads", "c": "ct", "v": "vec", "s": "seg", "u": "unroll", "a": "stages"}
    fields: dict = {}
    for tok in tokens:
        key = keys.get(tok[:1])
        if key is None or not tok[1:].isdigit() or key in fields:
            raise ValueError(f"{name}: unknown token {tok!r}")
        fields[key] = int(tok[1:])
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    return {"threads": c.threads, "channel_threads": c.ct, "vec": c.vec, "seg": c.seg, "unroll": c.unroll,
            "stages": c.stages, "kernel_size": p.kernel_size, "dilation": p.dilation}


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Rows with the halo as left padding (the right one as the problem has it): shorter than the halo, than a
    walk, a block's span and a little, several spans; channels past the last block's threads."""
    t = Tiling(p, c)
    v, h, sp = c.vec, t.halo, t.span
    return [(1, v, 1, h, p.bias), (2, 3 * v, h + 2, h, not p.bias), (1, c.ct * v + v, c.seg + 3, h, p.bias),
            (2, 2 * v, sp + 5, h, not p.bias), (3, 5 * v, 2 * sp + c.seg + 1, h, p.bias),
            (2, 7 * v, 999, h, p.bias)]


def align_bytes(p: Problem, c: Config) -> int:
    """x, grad_out and grad_x move in vectors of `vec` channels from each position's first channel."""
    return c.vec * p.elem_bytes


def channel_multiple(p: Problem, c: Config) -> int:
    return c.vec


KNOWN_GOOD: tuple[Config, ...] = (
    # the Mamba SiLU (B, L, C) backward with the cp.async ring (H200, sixteenth session, 60-trial tune's
    # interleaved re-timing): t256_c64_v4_s256_u4_a3 0.1139 ms (1.72x copy), t128_c64_v4_s256_u4_a3 0.1149,
    # t256_c32_v4_s256_u4_a3 0.1151; fifteenth session: t128_c32_v4_s256_u4_a6 0.1200, the register walk
    # t256_c64_v4_s256_u8 0.1245
    Config(threads=256, ct=64, vec=4, seg=256, unroll=4, stages=3),
    Config(threads=256, ct=32, vec=4, seg=256, unroll=4, stages=3),
    Config(threads=128, ct=32, vec=4, seg=256, unroll=4, stages=6),
    Config(threads=128, ct=16, vec=4, seg=256, unroll=4, stages=3),
    Config(threads=256, ct=64, vec=4, seg=256, unroll=8),
    Config(threads=256, ct=32, vec=4, seg=256, unroll=8),
)


def generic_config(p: Problem) -> Config:
    return KNOWN_GOOD[0]
