"""The forward family over (B, C, L) memory: each block walks output vectors along a row's length."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.dtypes import DTYPES
from dwgen.families import AxisConfig
from dwgen.problem import Problem

TEMPLATE = "dw1d.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding up to the halo and bias (Family.sizes_at_run_time)
GENERIC_SCOPE = "any"  # and padding past the halo too, every activation: it may be a fast generic kernel alone

# a misaligned x is read from the 16-byte boundary before it: the launch peels the head
PEELS_MISALIGNMENT = True

# Axes as data: enumeration is their product, then the restrictions below filter it.
AXES: dict[str, tuple] = {
    "threads": (64, 128, 256, 512, 1024),
    "vec": (1, 2, 4, 8),  # elements per access; 16 bytes at most (4 floats, 8 halves)
    "outs": (1, 2, 4),
    "run": (1, 2),
    "walk": ("tile", "row", "persistent"),
    "halo": ("l1", "smem", "shfl", "async"),
    "stream": (False, True),
    "batches": (1, 2),
    "cap": (False, True),
}
WALKS = AXES["walk"]
HALOS = AXES["halo"]

SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more
MAX_WINDOW_FLOATS = 64  # beyond this the per-thread register window spills


@dataclass(frozen=True)
class Config(AxisConfig):
    """How one variant computes: the tunables, nothing about the problem."""

    threads: int = 256
    vec: int = 4
    outs: int = 1  # independent vector groups per thread per tile step (loads in flight)
    run: int = 1  # consecutive output vectors per group, sharing one register window (large K)
    walk: str = "tile"  # tile: a block per tile; row: a block walks a row; persistent: a GPU-sized grid
    # l1: re-read neighbours through L1; smem: tile in shared memory; shfl: warp shuffles;
    # async: a walking block's double-buffered shared tile, filled by cp.async while the previous is computed
    halo: str = "l1"
    stream: bool = False  # streaming cache hints (__ldcs / __stcs) instead of __ldg / plain stores
    # Rows of one channel (consecutive batch entries) a row-walking block covers: its K weights and set-up
    # are paid once for all of them, and an async stage prefetches across their boundaries.
    batches: int = 1
    # Registers capped so that 2048 threads fit an SM (__launch_bounds__ with its minimum blocks): ptxas gave
    # the 16-bit K7-K9 designs 38-40 registers when free, and one fewer block per SM; capped they fit 32,
    # where a wider window may spill instead. Implied by batches > 1.
    cap: bool = False

    AXES = AXES


@dataclass(frozen=True)
class Tiling:
    """The derived numbers of a config on a problem; the template derives the same from the same constants."""

    problem: Problem
    config: Config

    @property
    def tile_vectors(self) -> int:
        c = self.config
        return c.threads * c.outs * c.run

    @property
    def tile_outputs(self) -> int:
        return self.tile_vectors * self.config.vec

    def window_vectors(self, offset: int) -> int:
        """Vectors in one group's input window when its first input sits `offset` elements into a vector."""
        p, c = self.problem, self.config
        return (offset + (c.run * c.vec - 1) * p.stride + p.halo) // c.vec + 1

    @property
    def max_window_vectors(self) -> int:
        return self.window_vectors(self.config.vec - 1)

    @property
    def smem_vectors(self) -> int:
        """Vectors of input one tile step stages in shared memory."""
        if self.config.halo not in ("smem", "async"):
            return 0
        p, v = self.problem, self.config.vec
        return ((self.tile_outputs - 1) * p.stride + (v - 1) + p.halo) // v + 1

    @property
    def smem_bytes(self) -> int:
        buffers = 2 if self.config.halo == "async" else 1
        return buffers * self.smem_vectors * self.config.vec * self.problem.elem_bytes

    @property
    def vec_bytes(self) -> int:
        return self.config.vec * self.problem.elem_bytes

    def tiles(self, out_length: int) -> int:
        """Tile steps per row: enough for the row's aligned output vectors, and at least one (as the launcher)."""
        return max(1, -(-(out_length // self.config.vec) // self.tile_vectors))


# Restrictions: plain named predicates over (problem, config); True means the combination is allowed.
def vector_within_16_bytes(p: Problem, c: Config) -> bool:
    """The widest access a thread makes is 16 bytes: 4 floats or 8 halves."""
    return c.vec * p.elem_bytes <= 16


def shfl_needs_unit_stride(p: Problem, c: Config) -> bool:
    """Neighbouring lanes hold neighbouring inputs only when consecutive outputs read consecutive inputs."""
    return c.halo != "shfl" or p.stride == 1


def shfl_needs_single_runs(p: Problem, c: Config) -> bool:
    """With runs of several vectors, lane+m no longer holds window vector m."""
    return c.halo != "shfl" or c.run == 1


def shfl_window_within_warp(p: Problem, c: Config) -> bool:
    return c.halo != "shfl" or Tiling(p, c).max_window_vectors <= 16


def window_fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).max_window_vectors * c.vec <= MAX_WINDOW_FLOATS


def smem_fits(p: Problem, c: Config) -> bool:
    return Tiling(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def tile_fits_row(p: Problem, c: Config) -> bool:
    """A tile longer than the row leaves most threads idle; allow one warp's worth of vectors at least."""
    tile = Tiling(p, c).tile_outputs
    return tile <= max(p.out_length, 32 * c.vec) or (c.threads == 64 and c.outs == 1 and c.run == 1)


def several_tiles_to_walk(p: Problem, c: Config) -> bool:
    """With one tile per row and one row per block, walking the row is the tile walk under another name."""
    return c.walk != "row" or c.batches > 1 or p.out_length > Tiling(p, c).tile_outputs


def batches_need_a_row_walk(p: Problem, c: Config) -> bool:
    """Only a row-walking block covers several rows; the other walks take one tile at a time."""
    return c.batches == 1 or c.walk == "row"


def batches_within_the_batch(p: Problem, c: Config) -> bool:
    """More batch entries per block than the problem has is the same kernel as all of them, with fewer blocks."""
    return c.batches == 1 or c.batches <= p.batch


def cap_not_implied(p: Problem, c: Config) -> bool:
    """A block over several batch entries is capped already: the cap would name the same kernel twice."""
    return not c.cap or c.batches == 1


def async_needs_a_walk(p: Problem, c: Config) -> bool:
    """The asynchronous stage pays only when a block has a next tile to fetch while it computes."""
    return c.halo != "async" or c.walk != "tile"


def async_needs_4_byte_copies(p: Problem, c: Config) -> bool:
    """cp.async moves 4, 8 or 16 bytes; a single half is 2."""
    return c.halo != "async" or c.vec * p.elem_bytes >= 4


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    vector_within_16_bytes,
    shfl_needs_unit_stride,
    shfl_needs_single_runs,
    shfl_window_within_warp,
    window_fits_registers,
    smem_fits,
    tile_fits_row,
    several_tiles_to_walk,
    batches_need_a_row_walk,
    batches_within_the_batch,
    cap_not_implied,
    async_needs_a_walk,
    async_needs_4_byte_copies,
)

WALK_TOKENS = {"row": "row", "persistent": "pers"}  # the tile walk is the default and has no token


def name_tokens(c: Config) -> list[str]:
    """Tokens after the signature, in a fixed order; booleans and defaults appear as a token or not at all."""
    parts = [f"t{c.threads}", f"v{c.vec}", f"o{c.outs}"]
    if c.run != 1:
        parts.append(f"r{c.run}")
    if c.batches != 1:
        parts.append(f"n{c.batches}")
    if c.walk != "tile":
        parts.append(WALK_TOKENS[c.walk])
    parts.append(c.halo)
    if c.stream:
        parts.append("cs")
    if c.cap:
        parts.append("oc")
    return parts


def config_from_tokens(tokens: list[str], name: str) -> Config:
    fields: dict = {"run": 1, "walk": "tile", "stream": False, "batches": 1}
    walks = {token: walk for walk, token in WALK_TOKENS.items()}
    for tok in tokens:
        if tok in walks:
            fields["walk"] = walks[tok]
        elif tok in HALOS:
            fields["halo"] = tok
        elif tok == "cs":
            fields["stream"] = True
        elif tok == "oc":
            fields["cap"] = True
        elif tok[:1] in "tvorn" and tok[1:].isdigit():
            fields[{"t": "threads", "v": "vec", "o": "outs", "r": "run", "n": "batches"}[tok[0]]] = int(tok[1:])
        else:
            raise ValueError(f"{name}: unknown token {tok!r}")
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    """Every number the template needs, computed here (the template does no arithmetic of its own)."""
    t = Tiling(p, c)
    return {
        "threads": c.threads, "vec": c.vec, "outs": c.outs, "batches": c.batches, "run": c.run,
        "tile_vectors": t.tile_vectors, "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation,
        "stream": c.stream, "window_vectors": [t.window_vectors(r) for r in range(c.vec)],
        "max_window_vectors": t.max_window_vectors, "smem_vectors": t.smem_vectors, "halo": c.halo, "walk": c.walk,
        "vec_bytes": t.vec_bytes, "min_blocks": 2048 // c.threads if c.cap or c.batches > 1 else 0,
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """(B, C, L, padding, bias) that break the family's assumptions: rows not whole vectors or tiles, L < K, C = 1."""
    tile, vec = Tiling(p, c).tile_outputs, c.vec
    sizes = [
        (1, 1, 1), (1, 1, p.kernel_size - 1), (1, 3, p.kernel_size), (2, 3, 7), (1, 2, 33),
        (2, 3, tile + vec), (3, 5, 3 * tile - vec), (1, 1, 2 * tile + 1), (2, 1, 4096 + 3), (1, 4, 1000),
        (p.batch if p.batch <= 4 else 1, 1, p.length), (1, p.channels, min(p.length, 4 * tile)),
    ]
    # Padding and bias are run-time arguments of a kernel: check other values than the tuned ones too.
    others = [(2, 3, tile + 5, 0, not p.bias), (1, 2, 3 * tile + 1, p.kernel_size - 1, p.bias),
              (1, 3, 999, (p.kernel_size - 1) // 2 * p.dilation, not p.bias)]
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    """Base-pointer alignment the vector accesses need; the dispatcher checks it at run time."""
    return c.vec * p.elem_bytes


def channel_multiple(p: Problem, c: Config) -> int:
    return 1  # rows of any length, any number of channels


# Tried first: designs that measured well on the H200 (docs/perf-notes.md), then a plain scalar one.
KNOWN_GOOD: tuple[Config, ...] = (
    Config(threads=128, vec=4, outs=2, halo="shfl"),
    Config(threads=128, vec=4, outs=2, halo="l1"),
    Config(threads=256, vec=4, outs=1, halo="l1", stream=True),
    Config(threads=128, vec=4, outs=1, run=2, halo="smem"),
    Config(threads=64, vec=4, outs=1, run=2, halo="l1"),  # K4 (rows of 2051) at 1.04x; 80 trials can miss it
    Config(threads=256, vec=4, outs=2, walk="persistent", halo="l1"),
    Config(threads=256, vec=1, outs=4, halo="l1"),
    Config(threads=256, vec=4, outs=1, walk="row", halo="async"),
    Config(threads=64, vec=4, outs=2, walk="row", halo="async"),
    Config(threads=64, vec=4, outs=4, walk="row", halo="async", batches=2),  # K31's fastest in the row-walk trial
    # 16-bit: the same designs with 16-byte accesses of 8 halves, capped first (38-40 registers uncapped at K7-K9)
    Config(threads=64, vec=8, outs=2, halo="l1", cap=True),
    Config(threads=128, vec=8, outs=2, halo="l1", cap=True),
    Config(threads=128, vec=8, outs=2, halo="l1"),
    Config(threads=128, vec=8, outs=1, halo="shfl"),
    Config(threads=64, vec=8, outs=2, halo="l1"),
    Config(threads=128, vec=8, outs=1, walk="row", halo="async"),
    Config(threads=64, vec=8, outs=2, walk="row", halo="async", batches=2),
)


def generic_config(p: Problem) -> Config:
    """The fast generic kernel of a K that search.generic has not measured: the target's winning design."""
    return Config(threads=128, vec=DTYPES[p.dtype].max_vec, outs=2, halo="l1")
