"""The tunable axes, named restriction predicates, enumeration, and each variant's name and digest."""
from __future__ import annotations

import hashlib
import itertools
import json
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from dwgen.problem import Problem

TEMPLATE_DIR = Path(__file__).resolve().parent.parent / "templates"
KERNEL_TEMPLATE = "dw1d.cu.j2"
ANY_TEMPLATE = "dw1d_any.cu.j2"
COMMON_TEMPLATE = "_common.cu.j2"

# Flags every variant is compiled with, by nvcc for the search and by load_inline for the frozen module.
# They are part of the digest: a change of flags makes every frozen entry stale.
NVCC_FLAGS = ("-O3",)  # the language standard is left to nvcc (C++17) and torch (C++20)

# Axes as data: enumeration is their product, then the restrictions below filter it.
AXES: dict[str, tuple] = {
    "threads": (64, 128, 256, 512, 1024),
    "vec": (1, 2, 4),
    "outs": (1, 2, 4),
    "run": (1, 2),
    "walk": ("tile", "row", "persistent"),
    "halo": ("l1", "smem", "shfl", "async"),
    "stream": (False, True),
    "batches": (1, 2),
}
WALKS = AXES["walk"]
HALOS = AXES["halo"]

SMEM_LIMIT_BYTES = 48 * 1024  # static shared memory without opting in to more
MAX_WINDOW_FLOATS = 64  # beyond this the per-thread register window spills
MAX_THREADS_PER_SM = 2048  # Hopper; the most threads an SM holds, an upper bound on a persistent grid
# Bumped when the way a variant is launched changes (grid sizing): a study's stored timings are only
# reused under the rules they were measured with (it is part of the study name).
LAUNCH_RULES = 2  # 2: persistent grids sized by the driver's occupancy answer, not by the thread limit


@dataclass(frozen=True)
class Config:
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

    def __post_init__(self) -> None:
        for axis, values in AXES.items():
            v = getattr(self, axis)
            if type(v) is not type(values[0]) or v not in values:
                raise ValueError(f"config {axis}={v!r} is not one of {values}")

    def to_dict(self) -> dict:
        return asdict(self)


WALK_TOKENS = {"row": "row", "persistent": "pers"}  # the tile walk is the default and has no token
DTYPE_TOKENS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}


def signature_tokens(p: Problem) -> list[str]:
    """The first tokens of a variant's name: what it is specialised to (dw1d_f32_k7[_s2][_d2])."""
    parts = ["dw1d", DTYPE_TOKENS[p.dtype], f"k{p.kernel_size}"]
    if p.stride != 1:
        parts.append(f"s{p.stride}")
    if p.dilation != 1:
        parts.append(f"d{p.dilation}")
    return parts


@dataclass(frozen=True)
class Variant:
    """A config specialised to a problem's compile-time parameters (K, stride, dilation, dtype).

    Sizes, padding and bias are run-time arguments, so one variant serves every problem of its signature.
    """

    problem: Problem
    config: Config

    # Derived numbers, computed here once; the template derives the same ones from the same constants.
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
        return (offset + (c.run * c.vec - 1) * p.stride + (p.kernel_size - 1) * p.dilation) // c.vec + 1

    @property
    def max_window_vectors(self) -> int:
        return self.window_vectors(self.config.vec - 1)

    @property
    def smem_vectors(self) -> int:
        """Vectors of input one tile step stages in shared memory."""
        if self.config.halo not in ("smem", "async"):
            return 0
        p, v = self.problem, self.config.vec
        return ((self.tile_outputs - 1) * p.stride + (v - 1) + (p.kernel_size - 1) * p.dilation) // v + 1

    @property
    def smem_bytes(self) -> int:
        buffers = 2 if self.config.halo == "async" else 1
        return buffers * self.smem_vectors * self.config.vec * self.problem.elem_bytes

    @property
    def align_bytes(self) -> int:
        """Base-pointer alignment the vector accesses need; the dispatcher checks it at run time."""
        return self.config.vec * self.problem.elem_bytes

    def tiles(self, out_length: int) -> int:
        """Tile steps per row: enough for the row's aligned output vectors, and at least one."""
        return max(1, -(-(out_length // self.config.vec) // self.tile_vectors))

    def grid(self, problem: Problem, sm_count: int, blocks_per_sm: int | None = None) -> int:
        """Blocks to launch for a problem of this variant's signature (possibly another size).

        A persistent grid must be resident all at once, or the blocks of a second wave start only when
        the first have walked all their items; `blocks_per_sm` is what the driver says an SM holds of this
        kernel (registers and shared memory decide). Without it, the thread limit: an upper bound."""
        if self.config.walk == "row":
            return problem.channels * -(-problem.batch // self.config.batches)
        items = problem.rows * self.tiles(problem.out_length)
        if self.config.walk == "persistent":
            per_sm = blocks_per_sm if blocks_per_sm else max(1, MAX_THREADS_PER_SM // self.config.threads)
            return min(items, sm_count * per_sm)
        return items

    @property
    def name(self) -> str:
        """Short tokens in a fixed order; booleans and defaults appear as a token or not at all."""
        c = self.config
        parts = signature_tokens(self.problem) + [f"t{c.threads}", f"v{c.vec}", f"o{c.outs}"]
        if c.run != 1:
            parts.append(f"r{c.run}")
        if c.batches != 1:
            parts.append(f"n{c.batches}")
        if c.walk != "tile":
            parts.append(WALK_TOKENS[c.walk])
        parts.append(c.halo)
        if c.stream:
            parts.append("cs")
        return "_".join(parts)

    @property
    def digest(self) -> str:
        return content_digest(
            {
                "config": self.config.to_dict(),
                "signature": signature(self.problem),
                "flags": list(NVCC_FLAGS),
            },
            (KERNEL_TEMPLATE, COMMON_TEMPLATE),
        )

    def to_dict(self) -> dict:
        return {"problem": self.problem.to_dict(), "config": self.config.to_dict()}


def config_from_name(name: str, problem: Problem) -> Config:
    """The config of a variant name such as dw1d_f32_k7_t128_v4_o2_row_l1, which must fit `problem`."""
    tokens, prefix = name.split("_"), signature_tokens(problem)
    if tokens[:len(prefix)] != prefix:
        raise ValueError(f"{name} is not a variant of {problem.key} (expected it to start with {'_'.join(prefix)}_)")
    fields: dict = {"run": 1, "walk": "tile", "stream": False, "batches": 1}
    walks = {token: walk for walk, token in WALK_TOKENS.items()}
    for tok in tokens[len(prefix):]:
        if tok in walks:
            fields["walk"] = walks[tok]
        elif tok in HALOS:
            fields["halo"] = tok
        elif tok == "cs":
            fields["stream"] = True
        elif tok[:1] in "tvorn" and tok[1:].isdigit():
            fields[{"t": "threads", "v": "vec", "o": "outs", "r": "run", "n": "batches"}[tok[0]]] = int(tok[1:])
        else:
            raise ValueError(f"{name}: unknown token {tok!r}")
    config = Config(**fields)
    if Variant(problem, config).name != name:
        raise ValueError(f"{name} is not a canonical variant name (did you mean {Variant(problem, config).name}?)")
    return config


def signature(p: Problem) -> dict:
    """The compile-time part of a problem: what a kernel is specialised to (sizes, padding, bias stay run-time)."""
    return {"kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation, "dtype": p.dtype}


def template_text(name: str) -> str:
    return (TEMPLATE_DIR / name).read_text()


def content_digest(payload: dict, templates: tuple[str, ...]) -> str:
    """sha256 over a JSON payload and the text of the templates it is rendered from."""
    h = hashlib.sha256(json.dumps(payload, sort_keys=True).encode())
    for t in templates:
        h.update(t.encode())
        h.update(template_text(t).encode())
    return h.hexdigest()


# Restrictions: plain named predicates over (problem, config); True means the combination is allowed.
def shfl_needs_unit_stride(p: Problem, c: Config) -> bool:
    """Neighbouring lanes hold neighbouring inputs only when consecutive outputs read consecutive inputs."""
    return c.halo != "shfl" or p.stride == 1


def shfl_needs_single_runs(p: Problem, c: Config) -> bool:
    """With runs of several vectors, lane+m no longer holds window vector m."""
    return c.halo != "shfl" or c.run == 1


def shfl_window_within_warp(p: Problem, c: Config) -> bool:
    return c.halo != "shfl" or Variant(p, c).max_window_vectors <= 16


def window_fits_registers(p: Problem, c: Config) -> bool:
    return Variant(p, c).max_window_vectors * c.vec <= MAX_WINDOW_FLOATS


def smem_fits(p: Problem, c: Config) -> bool:
    return Variant(p, c).smem_bytes <= SMEM_LIMIT_BYTES


def tile_fits_row(p: Problem, c: Config) -> bool:
    """A tile longer than the row leaves most threads idle; allow one warp's worth of vectors at least."""
    tile = Variant(p, c).tile_outputs
    return tile <= max(p.out_length, 32 * c.vec) or (c.threads == 64 and c.outs == 1 and c.run == 1)


def several_tiles_to_walk(p: Problem, c: Config) -> bool:
    """With one tile per row and one row per block, walking the row is the tile walk under another name."""
    return c.walk != "row" or c.batches > 1 or p.out_length > Variant(p, c).tile_outputs


def batches_need_a_row_walk(p: Problem, c: Config) -> bool:
    """Only a row-walking block covers several rows; the other walks take one tile at a time."""
    return c.batches == 1 or c.walk == "row"


def batches_within_the_batch(p: Problem, c: Config) -> bool:
    """More batch entries per block than the problem has is the same kernel as all of them, with fewer blocks."""
    return c.batches == 1 or c.batches <= p.batch


def async_needs_a_walk(p: Problem, c: Config) -> bool:
    """The asynchronous stage pays only when a block has a next tile to fetch while it computes."""
    return c.halo != "async" or c.walk != "tile"


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    shfl_needs_unit_stride,
    shfl_needs_single_runs,
    shfl_window_within_warp,
    window_fits_registers,
    smem_fits,
    tile_fits_row,
    several_tiles_to_walk,
    batches_need_a_row_walk,
    batches_within_the_batch,
    async_needs_a_walk,
)


def violations(p: Problem, c: Config) -> list[str]:
    """Names of the restrictions (p, c) breaks; empty when the variant is valid."""
    return [r.__name__ for r in RESTRICTIONS if not r(p, c)]


def all_configs() -> Iterator[Config]:
    names = list(AXES)
    for values in itertools.product(*(AXES[n] for n in names)):
        yield Config(**dict(zip(names, values, strict=True)))


def enumerate_space(p: Problem) -> list[Variant]:
    """Every valid variant for a problem, in a fixed order."""
    return [Variant(p, c) for c in all_configs() if not violations(p, c)]


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
)


def known_good(p: Problem) -> list[Config]:
    return [c for c in KNOWN_GOOD if not violations(p, c)]


# The frozen module's fast path for problems nobody tuned: one kernel per K for stride 1 and dilation 1
# (padding, bias and sizes are run-time). Each K's config is chosen by measurement (python -m
# search.generic, which writes GENERIC_FILE); a K it has not measured gets GENERIC_CONFIG.
GENERIC_CONFIG = Config(threads=128, vec=4, outs=2, halo="shfl")
GENERIC_KERNEL_SIZES = tuple(range(1, 10))
GENERIC_FILE = Path(__file__).resolve().parent / "generic.json"


def generic_configs(dtype: str = "fp32", path: Path = GENERIC_FILE) -> dict[int, Config]:
    """The fast generic config of each K: the measured choice where there is one."""
    chosen = json.loads(path.read_text()).get(dtype, {}) if path.exists() else {}
    return {k: Config(**chosen[str(k)]["config"]) if str(k) in chosen else GENERIC_CONFIG for k in GENERIC_KERNEL_SIZES}


def generic_problem(k: int, dtype: str = "fp32") -> Problem:
    """A stand-in carrying only the signature (K, stride 1, dilation 1) of the generic kernel for K."""
    return Problem(1, 1, 4096, k, 1, (k - 1) // 2, 1, dtype)


def generic_variants(dtype: str = "fp32") -> list[Variant]:
    """The fast generic kernels, one per K."""
    out = []
    for k, config in generic_configs(dtype).items():
        v = Variant(generic_problem(k, dtype), config)
        if violations(v.problem, v.config):
            raise ValueError(f"generic kernel {v.name} breaks {violations(v.problem, v.config)}; fix {GENERIC_FILE}")
        out.append(v)
    return out
