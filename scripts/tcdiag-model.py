"""Two lower bounds on the (B, L, C) tensor-core forward's time (dwgen/families/tcdiag.py), shared memory and the
tensor cores, as multiples of a copy of the same bytes, without a GPU: a prediction to hold its measurement
against.

    python scripts/tcdiag-model.py

Per block and tile: every block a warp's schedule loads (an ldmatrix moves 128 bytes a block: one wavefront), the
outputs' 32-bit stores (128 bytes a row of 8 chunks: two wavefronts a group), the copies in (16 bytes a chunk,
wavefronts of 128 bytes) and the write-back's reads; shared memory serves one wavefront a cycle an SM. A copy of
x and y moves their bytes at COPY_BYTES_PER_S over the SMs. Bank conflicts at strides above 1 and the time the
copies wait on memory are left out. The tensor cores: MMA_CYCLES an m16n8k16 product an SM (mma.sync at about
half the H200's dense rate, an assumption), half that an m16n8k8. Lower bounds on the time, not a forecast of it.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dwgen.families import tcdiag  # noqa: E402
from dwgen.problem import Problem  # noqa: E402

SMS = 132
CLOCKS_HZ = (1.755e9, 1.98e9)  # H200 SM clock under load and at boost
COPY_BYTES_PER_S = 4.1e12  # copy_ of a large tensor on the H200 (bytes read plus written a second)
MMA_CYCLES = 2.0  # an m16n8k16 product's cycles an SM through mma.sync (dense peak: about 1)

# The rows of scripts/ab-tcdiag.txt: (B, C, L, K, stride, padding, dtype)
PROBLEMS = [(8, 1024, 4000, 9, 1, 4, "fp16"), (8, 1536, 3001, 5, 1, 2, "fp16"), (16, 512, 2000, 15, 1, 7, "fp16"),
            (8, 1024, 4000, 8, 1, 3, "bf16"), (8, 4096, 2048, 4, 1, 3, "bf16"), (8, 1024, 6000, 3, 3, 1, "bf16"),
            (32, 512, 1024, 31, 1, 15, "fp16")]


def wavefronts_per_tile(p: Problem, c: tcdiag.Config) -> float:
    t = tcdiag.Tiling(p, c)
    warps = c.chunks * c.wpc
    loads = warps * tcdiag.blocks_loaded(p, c)
    stores = warps * 2 * (c.tile // 16 // c.wpc)
    copies_in = c.chunks * t.span * 16 / 128
    write_back = c.chunks * c.tile * 16 / 128
    return loads + stores + copies_in + write_back


def mma_cycles_per_tile(p: Problem, c: tcdiag.Config) -> float:
    groups = c.chunks * c.tile // 16
    return groups * MMA_CYCLES * (p.kernel_size // 2 + 0.5 * (p.kernel_size % 2))


def bound(p: Problem, c: tcdiag.Config, cycles) -> tuple[float, float]:
    """A tile's cycles (cycles(p, c)) as time over the copy's, at the two clocks."""
    tile_bytes = c.chunks * 8 * p.elem_bytes * (c.tile + c.tile * p.stride)  # a tile's y and (about) its x
    copy_s = tile_bytes / (COPY_BYTES_PER_S / SMS)
    return tuple(sorted(cycles(p, c) / f / copy_s for f in CLOCKS_HZ))


def main() -> int:
    for b, ch, n, k, s, pad, dtype in PROBLEMS:
        p = Problem(b, ch, n, k, s, pad, 1, dtype, layout="blc")
        print(p.key)
        for c in tcdiag.KNOWN_GOOD:
            if any(not r(p, c) for r in tcdiag.RESTRICTIONS):
                continue
            name = "_".join(tcdiag.name_tokens(c))
            groups = c.tile // 16 // c.wpc
            (lo, hi), (tlo, thi) = bound(p, c, wavefronts_per_tile), bound(p, c, mma_cycles_per_tile)
            print(f"  {name:18s} blocks a group {tcdiag.blocks_loaded(p, c) / groups:5.1f}  "
                  f"shared memory {lo:.2f}-{hi:.2f}x copy, tensor cores {tlo:.2f}-{thi:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
