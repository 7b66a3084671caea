"""The lane forward over (B, C, L) for problems of output length L at stride 1, causal or centred: each thread's
run of x straight into registers, its halo from the lanes beside it by warp shuffles.

Why: the window family (bcl.py) loads each group's window of whole vectors, tests every one against the row's
edges where a tile touches them and dispatches on the row's offset inside a vector; on the Mamba SiLU shape
ncu counted 24.7 thread instructions an output (197 a 16-byte vector), of which 4 are the taps' multiply-adds
and 6 SiLU, at 1.08-1.10x copy (nineteenth and twentieth sessions, docs/perf-notes.md). Here an output costs
the taps, the activation, its share of unpacking (V + H values a vector) and about one of loads, shuffles,
packing and stores. Two paddings are compiled, each with its halo sizes fixed: causal (P = H, Lout = L: Mamba,
Hyena) and centred (P = H // 2, the rest on the right: PyTorch's "same"); rows must be whole 16-byte vectors.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.dtypes import DTYPES
from dwgen.families import AxisConfig, some_design_fits, stride_one
from dwgen.problem import Problem

TEMPLATE = "dw1d_lane.cu.j2"

AXES: dict[str, tuple] = {
    "threads": (64, 128, 256),
    # positions a thread owns at a step, in whole 16-byte vectors (token o<n>): 1, 2 or 4 of them
    "vecs": (1, 2, 4),
    # a run's vectors side by side (False) or a warp's width apart (True, token sp): then each store of a warp
    # writes 512 contiguous bytes, and each vector's halo comes from the lane beside's vector of the same index
    "spread": (False, True),
    # tile: a block per chunk of a row; row: a block walks `rows` batch rows of one channel chunk by chunk
    # (its taps read once for all)
    "walk": ("tile", "row"),
    "rows": (1, 2, 4, 8),
    # a row walk's next run fetched into registers before this one is computed (token ahead): twice the
    # bytes in flight a thread
    "ahead": (False, True),
}

# As a fast generic forward (search.generic), beside a design that takes every call: its launch takes any B, C and
# L of whole vectors (no size is compiled in) for causal and centred calls (space.scope_admits); row walks only
# there (space.scope_violations), since a tile walk's grid counts a row's chunks, at most 65535 of them
GENERIC_SCOPE = "causal_or_centred"

MAX_WINDOW_FLOATS = 96  # x and its halo a thread holds as floats for one run (more spills)


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 128
    vecs: int = 2
    spread: bool = False
    walk: str = "tile"
    rows: int = 1
    ahead: bool = False

    AXES = AXES


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def vec(self) -> int:
        return DTYPES[self.problem.dtype].max_vec

    @property
    def outs(self) -> int:
        """Positions a thread owns at a step."""
        return self.config.vecs * self.vec

    @property
    def span(self) -> int:
        """Contiguous positions a thread holds: its run, or one vector where the run is spread."""
        return self.vec if self.config.spread else self.outs

    @property
    def chunk(self) -> int:
        return self.config.threads * self.outs

    @property
    def window_floats(self) -> int:
        """The run and its halos, in floats (the halos rounded to whole 32-bit words)."""
        return self.outs + self.problem.halo + 2

    @property
    def groups(self) -> int:
        """Blocks along the grid's second dimension (at most 65535): chunks of a row, or groups of rows."""
        p, c = self.problem, self.config
        return -(-p.batch // c.rows) if c.walk == "row" else -(-p.length // self.chunk)


def bcl_only(p: Problem, c: Config) -> bool:
    return p.layout == "bcl"


def causal_or_centred(p: Problem, c: Config) -> bool:
    """Output length L with the halo all on the left (causal) or H // 2 on the left (centred): the two paddings
    the template compiles."""
    left, right = p.paddings
    return left + right == p.halo and left in (p.halo, p.halo // 2)


def rows_whole_vectors(p: Problem, c: Config) -> bool:
    """Every row starts on a 16-byte boundary (x and y from 16-byte aligned pointers)."""
    return p.length % Tiling(p, c).vec == 0


def halo_within_next_lane(p: Problem, c: Config) -> bool:
    """Each side's halo (whole words) comes from the one lane beside: the problem's padding must fit the
    positions a thread holds side by side (its run, or one vector where the run is spread)."""
    left, right = p.paddings
    e, span = 4 // p.elem_bytes, Tiling(p, c).span
    return -(-left // e) * e <= span and -(-right // e) * e <= span


def spread_needs_vectors(p: Problem, c: Config) -> bool:
    """One vector a thread is the same run spread or not."""
    return not c.spread or c.vecs > 1


def window_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).window_floats <= MAX_WINDOW_FLOATS


def chunk_fits_length(p: Problem, c: Config) -> bool:
    """A chunk no longer than twice the row (past that, most of the block idles), or one warp's."""
    t = Tiling(p, c)
    return t.chunk // 2 < max(p.length, 32 * t.outs)


def rows_need_a_row_walk(p: Problem, c: Config) -> bool:
    """Only a row-walking block covers several rows or fetches ahead."""
    return c.walk == "row" or (c.rows == 1 and not c.ahead)


def rows_fit(p: Problem, c: Config) -> bool:
    """A walk of n rows only where half as many would not cover the batch (else a variant already asked)."""
    return c.rows == 1 or c.rows // 2 < p.batch


def ahead_has_a_next_step(p: Problem, c: Config) -> bool:
    return not c.ahead or (c.rows > 1 and p.batch > 1) or Tiling(p, c).chunk < p.length


def grid_fits(p: Problem, c: Config) -> bool:
    return Tiling(p, c).groups <= 65535


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    bcl_only,
    stride_one,
    causal_or_centred,
    rows_whole_vectors,
    spread_needs_vectors,
    halo_within_next_lane,
    window_fits_registers,
    chunk_fits_length,
    rows_need_a_row_walk,
    rows_fit,
    ahead_has_a_next_step,
    grid_fits,
)


def applies(p: Problem) -> bool:
    """Whether any of the family's designs fits p (a family with none would only cost the tune its asks)."""
    return p.layout == "bcl" and p.stride == 1 and some_design_fits(p, Config, RESTRICTIONS)


def name_tokens(c: Config) -> list[str]:
    return [f"t{c.threads}", f"o{c.vecs}", *(["sp"] if c.spread else []), *(["row"] if c.walk == "row" else []),
            *([f"n{c.rows}"] if c.rows != 1 else []), *(["ahead"] if c.ahead else [])]


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields: dict = {}
    for tok in tokens:
        flag = {"row": ("walk", "row"), "ahead": ("ahead", True), "sp": ("spread", True)}.get(tok)
        if flag is not None and flag[0] not in fields:
            fields[flag[0]] = flag[1]
            continue
        key = {"t": "threads", "o": "vecs", "n": "rows"}.get(tok[:1])
        if key is None or not tok[1:].isdigit() or key in fields:
            raise ValueError(f"{name}: unknown token {tok!r}")
        fields[key] = int(tok[1:])
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {"threads": c.threads, "outs": t.outs, "spread": c.spread, "rows": c.rows, "walk_row": c.walk == "row",
            "ahead": c.ahead, "vec": t.vec, "kernel_size": p.kernel_size, "dilation": p.dilation,
            "top_half": DTYPES[p.dtype].top_half}


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Rows of whole vectors with the problem's padding: one vector, shorter than a warp's runs, a chunk and a
    vector (a second chunk almost empty, most of its warps idle), several chunks, batches that are not whole
    row groups; bias on and off."""
    t = Tiling(p, c)
    v, ch, pad = t.vec, t.chunk, p.padding
    return [(1, 1, v, pad, p.bias), (2, 3, 2 * v, pad, not p.bias), (1, 3, ch + v, pad, p.bias),
            (c.rows + 1, 2, 2 * ch - v, pad, not p.bias), (3, 5, 3 * ch + 5 * v, pad, p.bias),
            (2 * c.rows + 1, 7, 1000 // v * v, pad, p.bias)]


def align_bytes(p: Problem, c: Config) -> int:
    """x and y move in 16-byte vectors from their rows' starts."""
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return 1


# The twentieth session's winners first (H200): spread runs for the Mamba SiLU and bf16 K7 forwards, one vector a
# thread for 1x768x512; runs side by side lost by 20-50% where a spread run fits (docs/perf-notes.md).
KNOWN_GOOD: tuple[Config, ...] = (
    Config(threads=128, vecs=2, spread=True),
    Config(threads=64, vecs=4, spread=True, walk="row"),
    Config(threads=128, vecs=1, walk="row"),
    Config(threads=64, vecs=2, spread=True, walk="row", ahead=True),
    Config(threads=128, vecs=1, walk="row", ahead=True),
    Config(threads=128, vecs=1),
    Config(threads=128, vecs=2),
    Config(threads=64, vecs=2),  # long filters: a halo of up to 16 values needs runs side by side
    Config(threads=64, vecs=4),
)


def generic_config(p: Problem) -> Config:
    return KNOWN_GOOD[0]
