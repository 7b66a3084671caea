"""The fused backward's tiling, from the host function its launch uses (compiled by nvcc, called without a
GPU): every grad_x position and every grad_out position is covered once, and a tail of grad_out at most a
halo long is summed by the last tile rather than costing a tile of its own."""
from __future__ import annotations

import ctypes

import pytest

from dwgen import build
from dwgen.families.bwd import Config
from dwgen.problem import Problem
from dwgen.render import render_variant
from dwgen.space import Variant

pytestmark = pytest.mark.nvcc


def tiling_of(tmp_path, p: Problem, c: Config):
    import torch  # noqa: F401  (its CUDA runtime is what the library links against)

    v = Variant(p, c, "bwd")
    b = build.compile_library(v.name, render_variant(v), v.digest[:16], tmp_path)
    assert b.ok, b.log[-2000:]
    fn = getattr(ctypes.CDLL(str(b.library)), f"dwgen_tiles_{v.name}")
    fn.argtypes = [ctypes.c_longlong] * 3 + [ctypes.POINTER(ctypes.c_longlong)]

    def tiles(L: int, Lout: int, P: int) -> tuple[int, int, int]:
        out = (ctypes.c_longlong * 3)()
        fn(L, Lout, P, out)
        return out[0], out[1], out[2]
    return v.tiling.tile_length, tiles


@pytest.mark.parametrize("k,d", [(3, 1), (4, 1), (3, 2)])
def test_every_position_is_covered_once(tmp_path, k, d):
    h = (k - 1) * d
    tl, tiles = tiling_of(tmp_path, Problem(2, 8, 1000, k, 1, h // 2, d), Config(threads=128, outs=2))
    for L in (1, 2, 7, 255, 256, 257, 511, 512, 513, 1000):
        for pl in range(0, h + 4):
            for pr in range(0, h + 4):
                Lout = L + pl + pr - h
                if Lout < 1:
                    continue
                base, nt, extra = tiles(L, Lout, pl)
                sigma = pl - h
                xs = [i for j in range(nt) for i in range(base + j * tl, base + (j + 1) * tl) if 0 <= i < L]
                os_ = [o for j in range(nt) for o in range(base + sigma + j * tl, base + sigma + (j + 1) * tl)]
                os_ += list(range(base + sigma + nt * tl, base + sigma + nt * tl + extra))
                os_ = [o for o in os_ if 0 <= o < Lout]
                case = (L, pl, pr, base, nt, extra)
                assert xs == list(range(L)), case
                assert os_ == list(range(Lout)), case
                assert 0 <= extra <= h and base <= 0 and base % 4 == 0, case
                # no tile is spent on a tail the last tile can sum
                nt_x = -(-(L - base) // tl)
                assert nt == nt_x or Lout - base - sigma - nt_x * tl > h, case


def test_the_targets_tail_costs_no_tile(tmp_path):
    """32x512x8192 K3 P1: grad_out reaches one position past the tiles of x (P - H = -1)."""
    tl, tiles = tiling_of(tmp_path, Problem(32, 512, 8192), Config(threads=256, outs=8))
    assert tl == 2048 and tiles(8192, 8192, 1) == (0, 4, 1)
