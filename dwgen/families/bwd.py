"""The fused backward family at stride 1, both layouts: grad_x and per-tile grad_weight/grad_bias partials
from one shared-memory tile of x and grad_out, then a fixed-order sum of the partials (deterministic)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.dtypes import DTYPES
from dwgen.families import AxisConfig
from dwgen.problem import Problem

TEMPLATE = "dw1d_bwd.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding up to the halo and bias (Family.sizes_at_run_time)
GENERIC_SCOPE = "any"  # and padding past the halo too, every activation: it may be a fast generic kernel alone

AXES: dict[str, tuple] = {
    "threads": (128, 256, 512),
    "outs": (2, 4, 8, 16, 32),  # positions per thread along the length
    "tc": (1, 16, 32, 64),  # channels per block: 1 over (B, C, L) memory, a channel tile over (B, L, C)
    # How the windows sit in shared memory: f32, converted at commit and staged as floats (skewed one in 33);
    # raw, staged as stored, realigned at commit so that each thread reads its run in 16-byte loads and
    # widens it in registers (fewer instructions an output; more bank conflicts for fp32's long runs);
    # rawp, raw with a 16-bit run's odd parity undone by a byte permute a word rather than by a branch
    # between two widenings (one more instruction a word of an odd window, fewer registers); async, (B, L, C)
    # only: staged as stored by cp.async into two buffers, the next tile's in flight, converted as each
    # element is read (no window in registers: the register walk held 40 of the SiLU design's 96 registers).
    "stage": ("f32", "raw", "rawp", "async"),
    # Tiles a block walks, the next tile's loads in flight while one is computed; the weights, set-up and
    # weight-sum reduction paid once a block, one partial slot a block (token b<n>, 1 unnamed).
    "tiles": (1, 2, 4, 8),
    # Where the walk goes: along one row, or on across the batch's rows of its channel tile (token across),
    # for walks longer than a row. Each walk's own: the one across rows costs instructions where a walk
    # would stay in a row (the bf16 target's backward, docs/perf-notes.md).
    "walk": ("row", "across"),
    # A register ceiling for ptxas, asked through __launch_bounds__'s minimum blocks an SM (65536 registers
    # over threads x regs), so that one more block fits beside the others at the price of a few spilled
    # words (token r<n>; 0, unnamed, leaves ptxas free). Only where the ceiling is exactly reachable and
    # below what the block size enforces anyway; 56 on the raw stages, whose 56-64 registers cost the
    # 128-thread designs their ninth block; 128 for long filters, whose 16-bit walks take 168-254 (fp16 K31's
    # `t128_o8_b4_across` fits 128 with no spill: 4 blocks an SM instead of 3; docs/perf-notes.md); 80 over
    # (B, L, C), whose SiLU designs hold 96 registers for 29% occupancy (Nsight Compute, eleventh session; 64
    # spilled there and lost to its twins in every measurement).
    "regs": (0, 56, 80, 128),
}

REGISTERS_PER_SM = 65536

STATIC_SMEM_BYTES = 48 * 1024  # the kernel's windows are static shared arrays


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 256
    outs: int = 8
    tc: int = 1
    stage: str = "f32"
    tiles: int = 1
    walk: str = "row"
    regs: int = 0

    AXES = AXES

    @property
    def min_blocks(self) -> int:
        """__launch_bounds__'s minimum blocks an SM that caps ptxas at `regs` (0: none asked)."""
        return REGISTERS_PER_SM // (self.threads * self.regs) if self.regs else 0

    @property
    def raw(self) -> bool:
        """Windows staged as stored and widened in registers (the raw and rawp stages)."""
        return self.stage in ("raw", "rawp")


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def vec(self) -> int:
        """Elements per global vector access (16 bytes); over (B, L, C) at most the channel tile."""
        d = DTYPES[self.problem.dtype]
        return d.max_vec if self.problem.layout == "bcl" else min(d.max_vec, self.config.tc)

    @property
    def halo(self) -> int:
        return self.problem.halo

    @property
    def tile_length(self) -> int:
        return self.config.threads // self.config.tc * self.config.outs

    @property
    def slack(self) -> int:
        return 2 * self.vec if self.problem.layout == "bcl" else 0

    @property
    def elems_per_word(self) -> int:
        return 4 // self.problem.elem_bytes

    def run_words(self, n: int) -> int:
        """Words a thread loads for a raw run of n elements after a parity (as the template's run_words())."""
        e, w = self.elems_per_word, self.config.outs // self.elems_per_word
        lw = 4 if w % 4 == 0 else 2 if w % 2 == 0 else 1
        return -(-((e - 1 + n + e - 1) // e) // lw) * lw

    def raw_words(self, count: int, run: int) -> int:
        """A raw window's words: its vectors after one vector's room, or the last run (as raw_words())."""
        v, e, tl = self.vec, self.elems_per_word, self.tile_length
        return max(v // e * ((count + 2 * v - 2) // v + 1), (tl - self.config.outs) // e + v // e + run)

    @property
    def swizzled(self) -> bool:
        """Raw windows whose 16-byte chunks are XORed in groups of 8 so that runs 8 words or more apart miss
        each other's banks (the template's SWZ): each window holds one group (32 words) more."""
        chunks = self.config.outs // self.elems_per_word // 4
        return self.config.outs // self.elems_per_word % 4 == 0 and chunks >= 2 and chunks & (chunks - 1) == 0

    @property
    def smem_bytes(self) -> int:
        c, h, tl = self.config, self.halo, self.tile_length
        xw, gw = tl + 2 * h + self.slack, tl + h + self.slack
        if c.stage == "async":  # two buffers of each window, as stored
            windows = 2 * (xw + gw) * c.tc * self.problem.elem_bytes // 4
        elif c.raw:  # 4-byte words, each 16-byte aligned
            rw = c.outs + h
            xwords = self.raw_words(tl + 2 * h, self.run_words(rw + h))
            gwords = self.raw_words(tl + h, self.run_words(rw))
            if self.swizzled:
                xwords, gwords = xwords + 32, gwords + 32
            windows = -(-xwords // 4) * 4 + gwords
        elif self.problem.layout == "bcl":  # skewed: a float left empty after every 32 (as the template's skew())
            windows = (xw + xw // 32 + 1) + (gw + gw // 32 + 1)
        else:
            windows = (xw + gw) * c.tc
        return 4 * (windows + c.threads // 32 * (self.problem.kernel_size + 1) * 32)

    @property
    def run_registers(self) -> int:
        """Floats a thread holds for its run: x and grad_out windows of outs + halo, and outs results."""
        return 2 * (self.config.outs + self.halo) + self.config.outs


def stride_one(p: Problem, c: Config) -> bool:
    """grad_x as a correlation with the taps reversed holds at stride 1; other strides run the generic backward."""
    return p.stride == 1


def tile_matches_layout(p: Problem, c: Config) -> bool:
    return (c.tc == 1) if p.layout == "bcl" else (c.tc >= 16)


def raw_stage_over_rows(p: Problem, c: Config) -> bool:
    """The raw stage realigns a row's vectors; over (B, L, C) a thread's channel is one element of a vector."""
    return c.stage in ("f32", "async") or p.layout == "bcl"


def async_stage_over_channels(p: Problem, c: Config) -> bool:
    """The async stage copies vectors along the channels: (B, L, C) only."""
    return c.stage != "async" or p.layout == "blc"


def permute_needs_halves(p: Problem, c: Config) -> bool:
    """A word of fp32 is one element: no parity to permute away (rawp would be raw under another name)."""
    return c.stage != "rawp" or p.elem_bytes == 2


def whole_warps_per_channel_tile(p: Problem, c: Config) -> bool:
    return c.threads % c.tc == 0 and c.threads // c.tc >= 1


def channels_whole_vectors(p: Problem, c: Config) -> bool:
    return p.layout == "bcl" or p.channels % Tiling(p, c).vec == 0


def fits_static_smem(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= STATIC_SMEM_BYTES


def run_fits_registers(p: Problem, c: Config) -> bool:
    """Past about 96 floats of run state a thread spills (or holds so many registers that few warps fit)."""
    return Tiling(p, c).run_registers <= 96


def tile_fits_length(p: Problem, c: Config) -> bool:
    return Tiling(p, c).tile_length <= max(p.length, 256)


def walk_fits(p: Problem, c: Config) -> bool:
    """Walking n tiles only where half as many would not cover what the walk goes through (past that, the
    grid is the same as with fewer tiles a block: a variant already asked): in one row where half the walk
    falls short of the row, across rows where it does not but falls short of a channel's rows (the batch)."""
    if c.tiles == 1:
        return c.walk == "row"
    half = Tiling(p, c).tile_length * (c.tiles // 2)
    return half < p.length if c.walk == "row" else p.length <= half < p.length * p.batch


# The designs each register ceiling is for: elsewhere the ceiling is above what ptxas takes (the variant would
# repeat its uncapped twin) or not worth its compile.
CEILING_FOR: dict[int, Callable[[Problem, Config], bool]] = {
    56: lambda p, c: c.raw,
    80: lambda p, c: p.layout == "blc",
    128: lambda p, c: p.kernel_size >= 16,
}


def register_ceiling_reachable(p: Problem, c: Config) -> bool:
    """A ceiling of regs is what ptxas gets from min_blocks blocks an SM (registers go in 8s a thread), lies
    below the block size's own limit, and is one for this design."""
    if not c.regs:
        return True
    blocks = c.min_blocks
    return (blocks * c.threads <= 2048 and c.threads * c.regs < REGISTERS_PER_SM
            and REGISTERS_PER_SM // (c.threads * blocks) // 8 * 8 == c.regs and CEILING_FOR[c.regs](p, c))


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    stride_one,
    tile_matches_layout,
    raw_stage_over_rows,
    async_stage_over_channels,
    permute_needs_halves,
    whole_warps_per_channel_tile,
    channels_whole_vectors,
    fits_static_smem,
    run_fits_registers,
    tile_fits_length,
    walk_fits,
    register_ceiling_reachable,
)


def name_tokens(c: Config) -> list[str]:
    parts = [f"t{c.threads}", f"o{c.outs}"]
    if c.tc != 1:
        parts.append(f"c{c.tc}")
    if c.stage != "f32":
        parts.append(c.stage)
    if c.tiles != 1:
        parts.append(f"b{c.tiles}")
    if c.walk != "row":
        parts.append(c.walk)
    if c.regs:
        parts.append(f"r{c.regs}")
    return parts


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields: dict = {}
    for tok in tokens:
        if tok[:1] in "tocbr" and tok[1:].isdigit():
            fields[{"t": "threads", "o": "outs", "c": "tc", "b": "tiles", "r": "regs"}[tok[0]]] = int(tok[1:])
        elif tok in AXES["stage"] and tok != "f32":
            fields["stage"] = tok
        elif tok in AXES["walk"] and tok != "row":
            fields["walk"] = tok
        else:
            raise ValueError(f"{name}: unknown token {tok!r}")
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "outs": c.outs, "tile_channels": c.tc, "vec": t.vec, "slack": t.slack,
        "kernel_size": p.kernel_size, "dilation": p.dilation, "bcl": p.layout == "bcl",
        "raw": c.raw, "async_stage": c.stage == "async",
        "top_half": DTYPES[p.dtype].top_half, "permute": c.stage == "rawp",
        "tiles": c.tiles, "across": c.walk == "across", "min_blocks": c.min_blocks,
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Lengths shorter than the halo or a tile, a tile and one, paddings past the halo, odd channel counts."""
    t = Tiling(p, c)
    v = t.vec if p.layout == "blc" else 1
    tl, h = t.tile_length, t.halo
    return [(1, v, 1, p.padding, p.bias), (2, 3 * v, p.kernel_size, p.padding, not p.bias),
            (1, c.tc + v if c.tc > 1 else 3, tl + 1, p.padding, p.bias), (2, 5 * v, 2 * tl - 3, 0, p.bias),
            (1, 2 * v, tl + 7, h, not p.bias), (1, 2 * v, 3 * tl + 5, h + 3, p.bias),
            (3, 7 * v, 999, h // 2, p.bias)]


def align_bytes(p: Problem, c: Config) -> int:
    return Tiling(p, c).vec * p.elem_bytes


def channel_multiple(p: Problem, c: Config) -> int:
    return Tiling(p, c).vec if p.layout == "blc" else 1


KNOWN_GOOD: tuple[Config, ...] = (
    # blocks walking 4 tiles with the next tile's loads in flight: the first won the bf16 target (1.58x copy
    # against 1.84x for the o8 raw design before it, H200; docs/perf-notes.md)
    Config(threads=128, outs=16, tc=1, stage="rawp", tiles=4),
    Config(threads=128, outs=8, tc=1, stage="raw", tiles=4),
    # the same walks across batch rows, where a row holds fewer tiles than the walk: fp32 K31's backward
    # 2.74x copy against 3.25x without a walk, bf16 K7's 1.93x against 2.06x (H200, docs/perf-notes.md)
    Config(threads=128, outs=8, tc=1, stage="raw", tiles=4, walk="across"),
    Config(threads=128, outs=16, tc=1, stage="rawp", tiles=4, walk="across"),
    # the raw stage: about half the instructions an output of the f32 stage's tuned designs (SASS,
    # docs/perf-notes.md); the 16-bit suite's winners since
    Config(threads=128, outs=16, tc=1, stage="raw"),
    Config(threads=128, outs=16, tc=1, stage="rawp"),
    Config(threads=256, outs=8, tc=1, stage="raw"),
    Config(threads=128, outs=16, tc=1),
    Config(threads=256, outs=8, tc=1),
    Config(threads=256, outs=16, tc=1),
    Config(threads=256, outs=16, tc=64),
    Config(threads=256, outs=16, tc=32),
    # (B, L, C) staged by cp.async: the Mamba P3 winner (3% ahead of t128_o16_c64_b4, H200); with SiLU 6% behind
    # the register walk (each element converted at every read: 21% more instructions, ncu)
    Config(threads=128, outs=16, tc=64, stage="async", tiles=8),
    Config(threads=128, outs=16, tc=64, stage="async", tiles=4),
)


def generic_config(p: Problem) -> Config:
    """A first design per layout, before any measurement: long tiles for (B, C, L), 64-channel tiles for (B, L, C)."""
    for c in ((Config(256, 8, 1), Config(256, 4, 1), Config(128, 2, 1)) if p.layout == "bcl"
              else (Config(256, 16, 64), Config(256, 8, 64), Config(256, 8, 32), Config(256, 8, 16))):
        if all(r(p, c) for r in RESTRICTIONS):
            return c
    raise ValueError(f"no backward design fits {p.key}")
