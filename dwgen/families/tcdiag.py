"""The tensor-core forward over (B, L, C) memory with channels as the product's columns: no transposes.

An m16n8k16 product here is sixteen outputs m (along the length) by the eight channels n of one 16-byte chunk,
over two taps h by the same eight channels:

    y[m][n] = b[n] + sum_h sum_n' A[m][8h + n'] * B[8h + n'][n],
    A[m][8h + n'] = x[(j0 + m) * S - P + (2i + h) * D][n'],   B[8h + n'][n] = w[n][2i + h] if n' == n, else 0,

one m16n8k16 product a tap pair i (an odd K's last tap: one m16n8k8, h = 0 alone). A's 8x8 quarters are blocks of
8 staged 16-byte chunks (8 channels of one position each) exactly as they lie in memory, so ldmatrix reads them
straight from the cp.async copy, and C's rows are chunks of outputs: the (B, L, C) order both ways, where tcl
(thirty-second session, removed in the thirty-third) transposed each element twice through shared memory and lost
to the CUDA-core channel family. B is diagonal, so 7/8 of each product is zeros: at K15, 7 products and a short
one for 128 outputs, inside the tensor cores' rate at copy speed. What bounds it is shared memory (a review's
count, docs/perf-notes.md): an ldmatrix moves 128 bytes a block, and 2K blocks a group of 16 outputs would take
1.2-1.4x a copy's time at K15. So a warp's code is unrolled over its run of groups (`schedule`): a block serves
several taps and groups and is loaded once, 16 a group at stride and dilation 1 whatever K.

Not in the registry (dwgen/space.py FAMILIES): measured in the thirty-sixth session and not landed
(docs/perf-notes.md); docs/proposed/tcdiag-tune.diff registers it for tunes and scripts/ab-tcdiag.txt.
`standalone` renders its variants as the registry will.
"""
from __future__ import annotations

import functools
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
    "wpc": (1, 2, 4),  # warps a chunk: each takes a run of the tile's 16-output groups, unrolled
    "tile": (64, 128, 256, 512),  # outputs a block along the length
    "steps": (1, 4, 16),  # tiles a block walks along the length, the next one's inputs copied meanwhile
}

VEC = 8  # 16-bit channels in a 16-byte chunk: the product's 8 columns
GROUP = 16  # outputs along the length a product computes: its 16 rows
MAX_TAP_PAIRS = 16  # B fragments live in registers, 2 a tap pair: K up to 32
MAX_THREADS = 512
MAX_WARP_GROUPS = 8  # 16-output groups a warp's straight-line code computes a tile
SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more


@dataclass(frozen=True)
class Config(AxisConfig):
    chunks: int = 4
    wpc: int = 2
    tile: int = 128
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
        (r % S) * phase_pitch + r / S), so that the 8 rows of an ldmatrix, S positions apart, are 8 adjacent
        chunks whatever S: 128 contiguous bytes, every bank once."""
        return -(-self.span // self.problem.stride)

    @functools.cached_property
    def phase_pitch(self) -> int:
        """Chunks from one stride phase's staged rows to the next's: phase_rows, or up to 7 more where that spreads
        a quarter-warp's copies (8 / QG consecutive positions, so S > 1 phases) over more bank groups."""
        if self.problem.stride == 1:
            return self.phase_rows
        return min(range(self.phase_rows, self.phase_rows + 8), key=lambda pitch: (self.copy_conflicts(pitch), pitch))

    def copy_conflicts(self, pitch: int) -> float:
        """The mean over a quarter-warp's copies (8 lanes: chunk l % QG of position l / QG from a multiple of
        8 / QG) of the most that meet one 16-byte bank group, with phases `pitch` chunks apart (1: none)."""
        s, qg, skew = self.problem.stride, self.config.chunks, self.row_skew
        worst = []
        for r0 in range(0, 8 * s, 8 // qg):  # the pattern repeats every 8 S positions
            groups = [(q * skew + (r % s) * pitch + r // s) % 8 for r in range(r0, r0 + 8 // qg) for q in range(qg)]
            worst.append(max(groups.count(b) for b in set(groups)))
        return sum(worst) / len(worst)

    @property
    def row_skew(self) -> int:
        """Chunks past a multiple of 8 between channel chunks' rows, so that a quarter-warp's 16-byte accesses (8
        chunks: 8 / QG positions by QG channel chunks, in the copies at stride 1 and in the write-back's reads)
        meet 8 different bank groups."""
        return 8 // self.config.chunks % 8

    @property
    def x_rows(self) -> int:
        """Chunks a channel chunk's staged inputs take: S * phase_pitch, to 8m + row_skew."""
        return _round_up(self.problem.stride * self.phase_pitch - self.row_skew, 8) + self.row_skew

    @property
    def y_rows(self) -> int:
        return self.config.tile + self.row_skew  # likewise for the outputs' copy to global memory

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
    """Every warp of a chunk takes a run of the same number of groups from a tile, at most MAX_WARP_GROUPS (its
    code is unrolled over them, so that their shared blocks stay in registers)."""
    return (c.tile // GROUP) % c.wpc == 0 and c.tile // GROUP // c.wpc <= MAX_WARP_GROUPS


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
    return [f"q{c.chunks}", f"w{c.wpc}", f"t{c.tile}", f"s{c.steps}"]


TOKEN_KEYS = {"q": "chunks", "w": "wpc", "t": "tile", "s": "steps"}


def config_from_tokens(tokens: list[str], name: str) -> Config:
    expected = "q<chunks>, w<warps>, t<tile>, s<steps>"
    return Config(**families.fields_from_tokens(tokens, name, TOKEN_KEYS, expected))


@dataclass(frozen=True)
class Load:
    """One ldmatrix of a warp's schedule: n (1, 2 or 4) blocks, matrix j's rows from staged row row0 + shape[j] on
    (rows past the warp's first output, stride phases folded in: phase * phase_pitch + index); `name` is its
    registers' array in the kernel."""

    name: str
    n: int
    row0: int
    shape: tuple[int, int, int, int]


@dataclass(frozen=True)
class GroupCode:
    """What a warp's code does for its u-th group of 16 outputs: the blocks it loads first, then one m16n8k16
    product a tap pair (A's four quarters: C expressions of loaded blocks) and, for an odd K, an m16n8k8 of the
    last tap's two."""

    u: int
    loads: tuple[Load, ...]
    pairs: tuple[tuple[int, tuple[str, str, str, str]], ...]
    last: tuple[str, str] | None


def _block(p: Problem, pitch: int, u: int, m0: int, tap: int) -> int:
    """The staged row (past the warp's first output) of the first of the 8 chunks that hold A's rows m0 .. m0 + 7
    of group u at a tap: outputs 16u + m0 + r read position (16u + m0 + r) S + tap D, staged at its phase's row
    (phases `pitch` rows apart)."""
    q = tap * p.dilation
    return q % p.stride * pitch + GROUP * u + m0 + q // p.stride


def _pack(rows: list[int], quads: list[tuple[int, ...]], first: int) -> list[Load]:
    """ldmatrix loads for blocks (their first rows): first whole A quads of this group and later ones whose four
    blocks are all among them (loaded in the quad's order, so that the product takes the registers as they are:
    an mma's A operand is 4 consecutive registers), then the rest 4 (else 2, else 1) an equal step apart, the
    smallest step that fits; names ld<first>, ld<first + 1>, ..."""
    loads: list[Load] = []
    left = list(dict.fromkeys(rows))
    for q in quads:
        if len(set(q)) == 4 and set(q) <= set(left):
            loads.append(Load(f"ld{first + len(loads)}", 4, q[0], tuple(b - q[0] for b in q)))
            left = [b for b in left if b not in q]
    left.sort()
    while left:
        r0 = left[0]
        for n in (4, 2, 1):
            d = next((d for d in range(1, 17) if all(r0 + k * d in left for k in range(n))), None)
            if d is not None or n == 1:
                d = d or 1
                loads.append(Load(f"ld{first + len(loads)}", n, r0, (0, d, 2 * d, 3 * d)))
                left = [b for b in left if b not in {r0 + k * d for k in range(n)}]
                break
    return loads


@functools.cache
def schedule(p: Problem, c: Config) -> tuple[GroupCode, ...]:
    """A warp's straight-line code for its run of groups: each block of 8 chunks is loaded once, by the first group
    that reads it, and kept in registers for the later ones (at stride and dilation 1 a group's bottom quarters at
    tap T are its top ones at T + 8, and group u + 1's top ones at T are group u's bottom ones at T + 8: 16 blocks
    a group instead of 2K). Loads are shaped as A quads where they can be, so that fewer registers are moved into
    the products' operands."""
    k, pitch = p.kernel_size, Tiling(p, c).phase_pitch
    gw = c.tile // GROUP // c.wpc
    quads = [[tuple(_block(p, pitch, u, m0, 2 * i + h) for h in (0, 1) for m0 in (0, 8)) for i in range(k // 2)]
             for u in range(gw)]
    lasts = [(_block(p, pitch, u, 0, k - 1), _block(p, pitch, u, 8, k - 1)) if k % 2 else None for u in range(gw)]
    where: dict[int, str] = {}
    groups: list[GroupCode] = []
    count = 0
    for u in range(gw):
        needed = [b for q in quads[u] for b in q] + list(lasts[u] or ())
        loads = _pack([b for b in needed if b not in where], [q for v in range(u, gw) for q in quads[v]], count)
        count += len(loads)
        for ld in loads:
            for j in range(ld.n):
                where[ld.row0 + ld.shape[j]] = f"{ld.name}[{j}]"
        groups.append(GroupCode(u, tuple(loads), tuple((i, tuple(where[b] for b in q)) for i, q in enumerate(quads[u])),
                                tuple(where[b] for b in lasts[u]) if lasts[u] else None))
    return tuple(groups)


def blocks_loaded(p: Problem, c: Config) -> int:
    """Blocks (8 chunks, 128 bytes of shared memory) a warp's schedule reads a tile."""
    return sum(ld.n for g in schedule(p, c) for ld in g.loads)


def _ref(name: str) -> int:
    """A block's C expression ld<id>[<slot>] as the int id * 4 + slot (render contexts hold ints, not text)."""
    load, slot = name[2:-1].split("[")
    return int(load) * 4 + int(slot)


def schedule_context(p: Problem, c: Config) -> dict:
    """The schedule as the template reads it, flat int records: load shapes (4 row offsets each), loads (group, id,
    n, first row, shape), pairs (group, tap pair, A's four blocks as id * 4 + slot), last taps (group, two
    blocks)."""
    groups = schedule(p, c)
    shapes = list(dict.fromkeys(ld.shape for g in groups for ld in g.loads))
    return {
        "warp_groups": len(groups),
        "load_shapes": [v for sh in shapes for v in sh],
        "sched_loads": [v for g in groups for ld in g.loads
                        for v in (g.u, int(ld.name[2:]), ld.n, ld.row0, shapes.index(ld.shape))],
        "sched_pairs": [v for g in groups for i, q in g.pairs for v in (g.u, i, *map(_ref, q))],
        "sched_last": [v for g in groups if g.last for v in (g.u, *map(_ref, g.last))],
    }


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "chunks": c.chunks, "wpc": c.wpc, "tile": c.tile, "steps": c.steps, "vec": VEC,
        **schedule_context(p, c),
        "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation,
        "phase_rows": t.phase_rows, "phase_pitch": t.phase_pitch, "x_rows": t.x_rows, "y_rows": t.y_rows,
        "mma_type": MMA_TYPES[p.dtype],
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Lengths shorter than K or than a tile, channels that are one chunk or not a whole block, B = 1, paddings
    from none to past the halo, and a row of two walks."""
    tile, ct, k, d = c.tile, c.chunks * VEC, p.kernel_size, p.dilation
    sizes = [(1, 8, 1), (1, 8, k), (2, 8, 7), (1, 24, 33), (2, ct + 8, tile + 1), (1, 2 * ct - 8, 3 * tile - 1),
             (3, 40, 1000), (p.batch if p.batch <= 4 else 1, p.channels, min(p.length, 2 * tile + 3))]
    others = [(2, 16, tile + 5, 0, not p.bias), (1, 8, 3 * tile + 1, (k - 1) * d, p.bias),
              (1, 24, 999, (k - 1) // 2 * d, not p.bias), (2, 8, 777, 5 * tile // 4 + 3, p.bias)]
    if c.steps > 1:  # a second item along the row: its walk starts past position 0
        sizes.append((1, 8, c.steps * tile * p.stride + tile // 2 + 3))
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    return 16


def channel_multiple(p: Problem, c: Config) -> int:
    return VEC


# First guesses (unmeasured): 4 to 8 warps, 2 to 8 groups a warp, 64-256 outputs a tile, walks of 4 and 16 tiles
# and none.
KNOWN_GOOD: tuple[Config, ...] = (
    Config(chunks=4, wpc=2, tile=128, steps=4),
    Config(chunks=8, wpc=1, tile=128, steps=1),
    Config(chunks=4, wpc=2, tile=256, steps=1),
    Config(chunks=4, wpc=2, tile=128, steps=16),
    Config(chunks=2, wpc=4, tile=256, steps=1),
    Config(chunks=8, wpc=2, tile=64, steps=1),
    Config(chunks=4, wpc=4, tile=128, steps=4),
    Config(chunks=4, wpc=2, tile=64, steps=4),  # strides 3 and 4: a 64-output tile reads 190-250 positions
    Config(chunks=2, wpc=2, tile=64, steps=4),
)


def generic_config(p: Problem) -> Config:
    """The first of KNOWN_GOOD that fits p (the last, the smallest, where none does)."""
    return next((c for c in KNOWN_GOOD if all(r(p, c) for r in RESTRICTIONS)), KNOWN_GOOD[-1])


def applies(p: Problem) -> bool:
    """The problems some config can serve."""
    return (p.dtype in MMA_TYPES and p.layout == "blc" and p.channels % VEC == 0
            and families.some_design_fits(p, Config, RESTRICTIONS))


def standalone(p: Problem, c: Config) -> tuple[str, str, str]:
    """(name, digest, CUDA source) of a variant, as space.Variant will make them once the registry holds this
    family (families.standalone)."""
    return families.standalone(sys.modules[__name__], p, c)


def edge_problems(p: Problem, c: Config) -> list[Problem]:
    """The problems edge_sizes names, as space.Variant.edge_problems makes them."""
    from dwgen import space

    return space.edge_problems(p, edge_sizes(p, c))
