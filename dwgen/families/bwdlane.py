"""The lane backward over (B, C, L) for problems of output length L at stride 1, causal or centred: grad_x and
the weight partials with no shared-memory windows, each thread's halos taken from the lanes beside it by warp
shuffles.

Why: the fused family stages a tile of x and grad_out in shared memory and a Mamba row (2048 positions) is
one tile, so each thread's 16-position run pays the tile's fetch, commit, realigned run loads and the block's
set-up and reduction; Nsight Compute counted 55 warp instructions an output for the Mamba SiLU backward at
88.6% issue-active (fourteenth session, docs/perf-notes.md). Reading the run straight into registers and
shuffling the halos leaves about 32 (a count of the kernel's own arithmetic). Two paddings, each compiled with
its halo sizes fixed: causal (P = H, Lout = L: what Mamba, Hyena and other short-convolution language models
run), with or without SiLU, and centred (P = H // 2 on the left, the rest on the right: PyTorch's "same",
what odd filters with symmetric padding give), without an activation.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.dtypes import DTYPES
from dwgen.families import AxisConfig, some_design_fits, stride_one
from dwgen.problem import ACTIVATIONS, Problem

TEMPLATE = "dw1d_bwd_lane.cu.j2"

AXES: dict[str, tuple] = {
    "threads": (64, 128, 256),
    # positions a thread owns: a multiple of a 16-byte vector, and at least the halo (which comes whole
    # from the lane beside)
    "outs": (8, 16, 32),
    # batch rows of its channel a block walks, its weight sums carried across them (one partial slot and
    # one reduction a block; a block that walks the whole batch writes the gradients itself, with no
    # second launch to sum slots)
    "rows": (1, 2, 4, 8, 16),
    # the next step's runs fetched into registers before this step's are computed (token ahead), their loads
    # in flight meanwhile, for walks of more than one step
    "ahead": (False, True),
    # runs a thread computes at a step, a block's width of runs apart (token h<n>): each warp's loads stay
    # one contiguous request a vector, while the step's barrier, exchange and addressing serve them all
    "halves": (1, 2),
}

# As a fast generic backward (search.generic): its launch takes any B, C and L of whole vectors (no size is
# compiled in), so beside a fused design it serves causal calls and centred ones without an activation on rows
# of whole 16-byte vectors (space.scope_admits)
GENERIC_SCOPE = "causal_or_centred"

MAX_RUN_FLOATS = 112  # x and its halo, grad_out through the slope and grad_x a thread holds for its run


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 128
    outs: int = 16
    rows: int = 1
    ahead: bool = False
    halves: int = 1

    AXES = AXES


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def vec(self) -> int:
        return DTYPES[self.problem.dtype].max_vec

    @property
    def halo(self) -> int:
        return self.problem.halo

    @property
    def chunk(self) -> int:
        """Positions a block covers at a step."""
        return self.config.halves * self.config.threads * self.config.outs

    @property
    def run_registers(self) -> int:
        """x and its halo, grad_out through the slope and grad_x for the run, and (ahead) the next step's
        runs of x and grad_out as words."""
        c = self.config
        words = 2 * c.outs * self.problem.elem_bytes // 4 if c.ahead else 0
        return c.halves * (3 * c.outs + 2 * self.halo + words)

    @property
    def slots(self) -> int:
        """Blocks along the batch, the grid's second dimension: one partial slot each, or a single block
        writing the gradients itself where it walks the whole batch."""
        return max(1, -(-self.problem.batch // self.config.rows))


def bcl_only(p: Problem, c: Config) -> bool:
    return p.layout == "bcl"


def causal_or_centred(p: Problem, c: Config) -> bool:
    """Output length L with the halo all on the left (causal) or split H // 2 left, the rest right (centred):
    the two paddings the template compiles. SiLU only when causal: a centred run needs the grad_out before it
    through the slope, and the first run of a chunk would need it from the chunk not yet walked."""
    left, right = p.paddings
    return left + right == p.halo and (left == p.halo or (left == p.halo // 2 and p.activation == "none"))


def activations(p: Problem) -> tuple[str, ...]:
    """What the launch takes at run time for p's padding: both when causal, none only when centred."""
    return ACTIVATIONS if p.causal else ("none",)


def rows_whole_vectors(p: Problem, c: Config) -> bool:
    """Every row starts on a 16-byte boundary (x, grad_out and grad_x from 16-byte aligned pointers)."""
    return p.length % Tiling(p, c).vec == 0


def run_whole_vectors(p: Problem, c: Config) -> bool:
    return c.outs % Tiling(p, c).vec == 0


def halo_within_next_lane(p: Problem, c: Config) -> bool:
    return Tiling(p, c).halo <= c.outs


def run_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).run_registers <= MAX_RUN_FLOATS


def chunk_fits_length(p: Problem, c: Config) -> bool:
    """A chunk no longer than twice the row (past that, most of the block would idle: half the threads do
    the same row)."""
    return Tiling(p, c).chunk // 2 < max(p.length, 256)


def ahead_has_a_next_step(p: Problem, c: Config) -> bool:
    """Fetching ahead needs a walk of two steps or more: two rows, or a row longer than a chunk."""
    return not c.ahead or (c.rows > 1 and p.batch > 1) or Tiling(p, c).chunk < p.length


def grid_fits(p: Problem, c: Config) -> bool:
    """The batch's row groups are the grid's y dimension (at most 65535; the launch refuses more)."""
    return Tiling(p, c).slots <= 65535


def rows_fit(p: Problem, c: Config) -> bool:
    """A walk of n rows only where half as many would not cover the batch (else a variant already asked)."""
    return c.rows == 1 or c.rows // 2 < p.batch


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    bcl_only,
    stride_one,
    causal_or_centred,
    rows_whole_vectors,
    run_whole_vectors,
    halo_within_next_lane,
    run_fits_registers,
    chunk_fits_length,
    rows_fit,
    ahead_has_a_next_step,
    grid_fits,
)


def applies(p: Problem) -> bool:
    """Whether any of the family's designs fits p (a family with none would only cost the tune its asks)."""
    return p.layout == "bcl" and some_design_fits(p, Config, RESTRICTIONS)


def name_tokens(c: Config) -> list[str]:
    return [f"t{c.threads}", f"o{c.outs}", *([f"n{c.rows}"] if c.rows != 1 else []), *(["ahead"] if c.ahead else []),
            *([f"h{c.halves}"] if c.halves != 1 else [])]


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields: dict = {}
    for tok in tokens:
        if tok == "ahead" and "ahead" not in fields:
            fields["ahead"] = True
            continue
        key = {"t": "threads", "o": "outs", "n": "rows", "h": "halves"}.get(tok[:1])
        if key is None or not tok[1:].isdigit() or key in fields:
            raise ValueError(f"{name}: unknown token {tok!r}")
        fields[key] = int(tok[1:])
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    return {"threads": c.threads, "outs": c.outs, "rows": c.rows, "vec": Tiling(p, c).vec,
            "kernel_size": p.kernel_size, "dilation": p.dilation, "top_half": DTYPES[p.dtype].top_half,
            "ahead": c.ahead, "halves": c.halves}


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Rows of whole vectors with the problem's padding: one vector, shorter than a chunk, a chunk and a vector
    (a second chunk almost empty), chunks walked right to left, batches that are not whole walks."""
    t = Tiling(p, c)
    v, ch, pad = t.vec, t.chunk, p.padding
    return [(1, 1, v, pad, p.bias), (2, 3, 2 * v, pad, not p.bias), (1, 3, ch + v, pad, p.bias),
            (c.rows + 1, 2, 2 * ch - v, pad, not p.bias), (3, 5, 3 * ch + 5 * v, pad, p.bias),
            (2 * c.rows + 1, 7, 1000, pad, p.bias)]


def align_bytes(p: Problem, c: Config) -> int:
    """x, grad_out and grad_x move in 16-byte vectors from their rows' starts."""
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return 1


KNOWN_GOOD: tuple[Config, ...] = (
    # the Mamba SiLU backward (H200, sixteenth session, 60-trial tune's interleaved re-timing): t64_o8_n2_h2
    # 0.1052 ms (1.60x copy), t128_o8_n4_h2 0.1063, t64_o8_n4_h2 0.1078, t128_o8_n4 0.1080 (the best one-run
    # design); fifteenth session, one run a thread: t128_o8_n2 0.1102, t256_o8_n8 0.1103, t64_o32 0.1134;
    # the fused family's best 0.1378. Fetching ahead lost in every design (0.113-0.136). Centred (sixteenth
    # session, 36-trial tunes): bf16 K7 P3 t128_o8_n2 0.1129 ms (fused 0.1249), bf16 K3 P1 t256_o8_ahead_h2
    # 0.1935 (fused 0.1969), fp32 K7 P3 t128_o8_n2_ahead 0.1959 (fused 0.1964).
    Config(threads=64, outs=8, rows=2, halves=2),
    Config(threads=128, outs=8, rows=4, halves=2),
    Config(threads=128, outs=8, rows=4),
    Config(threads=64, outs=8, rows=4, halves=2),
    Config(threads=128, outs=8, rows=2),
    Config(threads=256, outs=8, rows=8),
    Config(threads=64, outs=8, rows=2),
    Config(threads=64, outs=32, rows=1),
    Config(threads=128, outs=16, rows=2),
    Config(threads=256, outs=8, ahead=True, halves=2),
)


def generic_config(p: Problem) -> Config:
    return KNOWN_GOOD[0]
