"""The forward family over (B, L, C) memory: threads take channel vectors, each sliding along the length."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from math import gcd

from dwgen.dtypes import DTYPES
from dwgen.families import AxisConfig
from dwgen.problem import Problem

TEMPLATE = "dw1d_cl.cu.j2"

SIZES_AT_RUN_TIME = True  # its launch takes any sizes, padding up to the halo and bias (Family.sizes_at_run_time)
GENERIC_SCOPE = "any"  # and padding past the halo too, every activation: it may be a fast generic kernel alone

AXES: dict[str, tuple] = {
    "threads": (64, 128, 256, 512),
    "vec": (1, 2, 4, 8),  # consecutive channels per access; 16 bytes at most
    "outs": (1, 2, 4, 8),  # consecutive outputs along the length per step, from one window of inputs
    "steps": (1, 4, 16),  # steps along the length per thread; the window's overlap stays in registers
    "cthreads": (8, 16, 32, 64, 128),  # threads of a block side by side along the channels
    "stream": (False, True),
    # steps a thread fetches ahead: 1, the next step's inputs in registers; 2 or 4, a ring in shared memory filled
    # by cp.async (a 16-step 16-bit design 3-14% faster with 4, thirty-fourth and forty-seventh sessions; against
    # the best design without one: 2-13% ahead at 16-bit K10, K12-16, within 3% at K8-9 and K11, behind at K <= 7)
    "ring": (1, 2, 4),
    # how the window slides a step: False, its overlap moved down the registers; True, the registers renamed (the
    # step loop unrolled over the slots' period) and a walk without tests for threads inside their row: 4-7% off
    # 16-bit K9-15 designs, 4% slower on fp32 K9 `o8_w4` (H100, forty-eighth session), so the search decides
    "rename": (False, True),
}

RING_SHARED_BYTES = 48 * 1024  # a block's static shared memory

MAX_REGISTER_FLOATS = 128  # window, weights, bias and accumulators per thread; more spills


@dataclass(frozen=True)
class Config(AxisConfig):
    threads: int = 128
    vec: int = 4
    outs: int = 4
    steps: int = 4
    cthreads: int = 32
    stream: bool = False
    ring: int = 1
    rename: bool = False

    AXES = AXES


@dataclass(frozen=True)
class Tiling:
    problem: Problem
    config: Config

    @property
    def lthreads(self) -> int:
        return self.config.threads // self.config.cthreads

    @property
    def tile_channels(self) -> int:
        return self.config.cthreads * self.config.vec

    @property
    def tile_length(self) -> int:
        return self.lthreads * self.config.outs * self.config.steps

    @property
    def window(self) -> int:
        """Inputs along the length that one thread's outputs read."""
        p, c = self.problem, self.config
        return (c.outs - 1) * p.stride + p.halo + 1

    @property
    def keep(self) -> int:
        """Inputs of one step's window that the next step reads too."""
        return max(0, self.window - self.config.outs * self.problem.stride)

    @property
    def new_inputs(self) -> int:
        """Inputs each step adds to the window: the next step's loads, raw in registers or in a ring's slots."""
        return self.window - self.keep

    @property
    def advance(self) -> int:
        """Inputs along the length the window moves on a step."""
        return self.config.outs * self.problem.stride

    def _period(self, slots: int) -> int:
        """Steps after which input m's slot, m % slots, comes round to the same name."""
        return slots // gcd(slots, self.advance)

    @property
    def slots(self) -> int:
        """Register slots of the window: WIN where it slides by moves. Renamed, the step loop is unrolled until
        the slots' names repeat, so the window slides without moves; where WIN slots would take more than 8 steps
        to repeat, a few more slots (at most 16 registers) that repeat within 8 are taken instead (fp16 K15, 4
        outputs a step: 20 slots, 5 steps)."""
        win, steps = self.window, self.config.steps
        if not self.config.rename or min(self._period(win), steps) <= 8:
            return win
        whole = -(-win // self.advance) * self.advance  # a whole number of steps: repeats every whole/advance
        for slots in range(win + 1, whole + 1):
            if self._period(slots) <= 8 and (slots - win) * self.config.vec <= 16:
                return slots
        return win

    @property
    def unroll(self) -> int:
        """Steps the step loop is unrolled over: the slots' period, or the whole walk where that is shorter (1
        where the window slides by moves)."""
        if not self.config.rename:
            return 1
        return min(self._period(self.slots), self.config.steps)

    @property
    def register_floats(self) -> int:
        """Window slots, weights, bias, one accumulator vector and the next step's raw inputs, in 4-byte
        registers: a filter against designs that cannot fit, not ptxas's count. The renamed walk's second inlined
        copy (the tested one, for threads at a row's ends) is not in it: ptxas gives renamed designs 16-35 registers
        more than their moved twins (fp16 K15 `o4_w16_r4` 96 -> 122, bf16 K10 132 -> 154), and a few spill (bf16 K6
        `t128_v4_o2_w4_c32_rn` 16 bytes without SiLU, chosen by measurement all the same). A ring holds the raw
        inputs in shared memory, but ptxas (sm_90) gave ring variants no fewer registers (bf16 K9
        `t128_v4_o4_w16_c32`: 122 with and without), so they are counted with or without one."""
        c, p = self.config, self.problem
        return (self.slots + p.kernel_size + 2) * c.vec + self.new_inputs * c.vec * p.elem_bytes // 4

    @property
    def ring_bytes(self) -> int:
        """The ring's shared memory: RING slots of each thread's new inputs a step."""
        c = self.config
        return c.ring * self.new_inputs * c.threads * c.vec * self.problem.elem_bytes if c.ring > 1 else 0


def vector_within_16_bytes(p: Problem, c: Config) -> bool:
    return c.vec * p.elem_bytes <= 16


def cthreads_within_block(p: Problem, c: Config) -> bool:
    return c.cthreads <= c.threads


def fits_registers(p: Problem, c: Config) -> bool:
    return Tiling(p, c).register_floats <= MAX_REGISTER_FLOATS


def channels_whole_vectors(p: Problem, c: Config) -> bool:
    """A (B, L, C) position is vector-aligned only when C is a multiple of the vector."""
    return p.channels % c.vec == 0


def tile_fits_channels(p: Problem, c: Config) -> bool:
    """Threads past the last channel idle: a block's channel tile may pass C by less than one warp's worth."""
    return Tiling(p, c).tile_channels <= max(p.channels, 32 * c.vec) or c.cthreads == 8


def tile_fits_length(p: Problem, c: Config) -> bool:
    return Tiling(p, c).tile_length <= max(p.out_length, 64)


def ring_copies_whole_words(p: Problem, c: Config) -> bool:
    """cp.async copies 4, 8 or 16 bytes."""
    return c.ring == 1 or c.vec * p.elem_bytes >= 4


def ring_fits_shared(p: Problem, c: Config) -> bool:
    return Tiling(p, c).ring_bytes <= RING_SHARED_BYTES


def ring_within_steps(p: Problem, c: Config) -> bool:
    """A thread's walk is STEPS steps: a ring fetches at most that far ahead."""
    return c.ring <= max(c.steps, 1)


def ring_without_stream(p: Problem, c: Config) -> bool:
    """The ring's cp.async copies take no cache hint: a streaming ring would be a streaming design in name only."""
    return c.ring == 1 or not c.stream


RESTRICTIONS: tuple[Callable[[Problem, Config], bool], ...] = (
    vector_within_16_bytes,
    cthreads_within_block,
    fits_registers,
    channels_whole_vectors,
    tile_fits_channels,
    tile_fits_length,
    ring_copies_whole_words,
    ring_fits_shared,
    ring_within_steps,
    ring_without_stream,
)


def twins(c: Config) -> list[Config]:
    """The design with its window slid the other way (Family.twins): renaming wins on long windows and loses
    a little on one-step walks, so a re-tune seeded with either asks the other too."""
    return [replace(c, rename=not c.rename)]


def name_tokens(c: Config) -> list[str]:
    parts = ["cl", f"t{c.threads}", f"v{c.vec}", f"o{c.outs}", f"w{c.steps}", f"c{c.cthreads}"]
    if c.stream:
        parts.append("cs")
    if c.ring > 1:
        parts.append(f"r{c.ring}")
    if c.rename:
        parts.append("rn")
    return parts


def config_from_tokens(tokens: list[str], name: str) -> Config:
    if tokens[:1] != ["cl"]:
        raise ValueError(f"{name}: a (B, L, C) variant's tokens start with cl")
    fields: dict = {"stream": False, "rename": False}
    for tok in tokens[1:]:
        if tok == "cs":
            fields["stream"] = True
        elif tok == "rn":
            fields["rename"] = True
        elif tok[:1] in "tvowcr" and tok[1:].isdigit():
            fields[{"t": "threads", "v": "vec", "o": "outs", "w": "steps", "c": "cthreads",
                    "r": "ring"}[tok[0]]] = int(tok[1:])
        else:
            raise ValueError(f"{name}: unknown token {tok!r}")
    return Config(**fields)


def render_context(p: Problem, c: Config) -> dict:
    t = Tiling(p, c)
    return {
        "threads": c.threads, "vec": c.vec, "outs": c.outs, "cthreads": c.cthreads, "lthreads": t.lthreads,
        "steps": c.steps, "tile_channels": t.tile_channels, "tile_length": t.tile_length, "window": t.window,
        "keep": t.keep, "slots": t.slots, "unroll": t.unroll,
        "kernel_size": p.kernel_size, "stride": p.stride, "dilation": p.dilation, "stream": c.stream,
        "ring": c.ring, "rename": c.rename, "top_half": DTYPES[p.dtype].top_half,
    }


def edge_sizes(p: Problem, c: Config) -> list[tuple[int, int, int, int, bool]]:
    """Lengths shorter than K or than a tile, channels that are one vector or not a whole tile, B = 1."""
    t, v = Tiling(p, c), c.vec
    sizes = [(1, v, 1), (1, v, p.kernel_size), (2, v, 7), (1, 3 * v, 33), (2, t.tile_channels + v, t.tile_length + 1),
             (1, 2 * t.tile_channels - v, 3 * t.tile_length - 1), (3, 5 * v, 1000),
             (p.batch if p.batch <= 4 else 1, p.channels, min(p.length, 2 * t.tile_length + 3))]
    others = [(2, 2 * v, t.tile_length + 5, 0, not p.bias), (1, v, 3 * t.tile_length + 1, p.kernel_size - 1, p.bias),
              (1, 3 * v, 999, (p.kernel_size - 1) // 2 * p.dilation, not p.bias)]
    return [(b, ch, n, p.padding, p.bias) for b, ch, n in sizes] + others


def align_bytes(p: Problem, c: Config) -> int:
    return c.vec * p.elem_bytes


def channel_multiple(p: Problem, c: Config) -> int:
    return c.vec


# The first three measured best on the Mamba shape before the window prefetch (1.64x copy, 2026-11-30).
KNOWN_GOOD: tuple[Config, ...] = (
    # for the 32-bit-offset body: 4 blocks an SM and 2 waves on the Mamba shape; the first won Mamba's
    # causal SiLU (1.03x copy, H200; docs/perf-notes.md)
    Config(threads=128, vec=4, outs=8, steps=16, cthreads=64),
    Config(threads=128, vec=4, outs=4, steps=16, cthreads=64),
    Config(threads=128, vec=8, outs=2, steps=16, cthreads=64),
    Config(threads=128, vec=8, outs=4, steps=16, cthreads=64),
    Config(threads=64, vec=8, outs=1, steps=16, cthreads=32),
    Config(threads=128, vec=8, outs=2, steps=16, cthreads=8),
    Config(threads=128, vec=8, outs=2, steps=4, cthreads=8),
    Config(threads=128, vec=8, outs=4, steps=4, cthreads=8),
    Config(threads=128, vec=8, outs=2, steps=16, cthreads=16),
    Config(threads=256, vec=8, outs=2, steps=4, cthreads=32),
    Config(threads=128, vec=4, outs=4, steps=4, cthreads=32),
    Config(threads=64, vec=4, outs=4, steps=16, cthreads=8),
)


def generic_config(p: Problem) -> Config:
    """The Mamba shape's winner (8-byte accesses, 8 outputs a step, 4 steps, 32 threads across the channels),
    with fewer outputs a step where a larger K's window does not fit the registers, then narrower vectors (16-bit
    K15 and K16: the 16-trial tune of fp16 K15 chose one channel a thread, 8 outputs)."""
    widest = max(1, DTYPES[p.dtype].max_vec // 2)
    for vec in sorted({widest, widest // 2 or 1, 1}, reverse=True):
        for outs in (8, 4, 2, 1):
            c = Config(threads=128, vec=vec, outs=outs, steps=4, cthreads=32)
            if all(r(p, c) for r in RESTRICTIONS):
                return c
    raise ValueError(f"no (B, L, C) generic design fits {p.key}")
