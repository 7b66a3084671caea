"""The lane forward's own source (templates/dw1d_lane.cu.j2), run on the CPU through its launch function
(tests/cuda_on_cpu.h: a block's threads as fibers, a warp's shuffles as barriers) and checked against float64:
causal and centred paddings, every element type, SiLU, odd filters and dilation, the tile and row walks with
and without the fetch ahead, runs side by side and spread, rows shorter than a warp's runs, chunks mostly past a
row's end, and what the launch refuses. It says nothing of speed, and the CPU build takes the portable SiLU spelling."""
from __future__ import annotations

import shutil

import pytest

from dwgen.families.lane import Config
from dwgen.families.lane import name_tokens as lane_tokens
from dwgen.problem import Problem
from dwgen.space import Variant, violations
from tests.cuda_on_cpu import build_all, forward_checks
from tests.test_bcl_fwd_on_cpu import MAIN, run_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def causal(b, c, n, k, dtype, d=1, **kw) -> Problem:
    return Problem(b, c, n, k, 1, (k - 1) * d, d, dtype, padding_right=0, **kw)


def centred(b, c, n, k, dtype, d=1, **kw) -> Problem:
    h = (k - 1) * d
    return Problem(b, c, n, k, 1, h // 2, d, dtype, padding_right=h - h // 2, **kw)


CASES = [
    (causal(2, 4, 2048, 4, "bf16", activation="silu"), Config(threads=64, vecs=1)),
    (causal(3, 3, 1040, 4, "bf16", activation="silu"), Config(threads=64, vecs=2, walk="row", rows=2, ahead=True)),
    (centred(2, 3, 1024, 3, "fp32"), Config(threads=64, vecs=2, walk="row")),
    (centred(2, 3, 1000, 7, "bf16"), Config(threads=128, vecs=1)),
    (centred(3, 2, 1056, 31, "fp16"), Config(threads=64, vecs=2, walk="row", rows=2)),
    (causal(3, 2, 1040, 5, "fp16", d=2), Config(threads=64, vecs=2, walk="row", rows=2, ahead=True)),
    (centred(2, 2, 1000, 4, "fp32"), Config(threads=64, vecs=4)),
    (causal(2, 2, 512, 1, "fp32"), Config(threads=64, vecs=1)),
    # runs spread a warp's width apart: each vector's halo from the lane beside's vector of the same index
    (causal(2, 3, 2048, 4, "bf16", activation="silu"), Config(threads=64, vecs=2, spread=True, walk="row", ahead=True)),
    (centred(2, 3, 2000, 7, "bf16"), Config(threads=64, vecs=4, spread=True)),
    (centred(3, 2, 1056, 3, "fp32"), Config(threads=64, vecs=2, spread=True, walk="row", rows=2)),
    (causal(2, 2, 1040, 5, "fp16", d=2), Config(threads=64, vecs=2, spread=True)),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("lane_fwd_cpu")
    return build_all([Variant(p, c) for p, c in CASES], tmp, MAIN), tmp


@pytest.mark.parametrize("p,c", CASES, ids=[Variant(p, c).name for p, c in CASES])
def test_matches_float64_on_cpu(binaries, p, c):
    exes, tmp = binaries
    v = Variant(p, c)
    assert not violations(p, c, "fwd")
    for q in forward_checks(v):
        outcome = run_on_cpu(exes[v.name], q, seed=q.length % 7, tmp=tmp)
        assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"


def test_the_launch_refuses_what_it_cannot_compute(binaries, tmp_path):
    """Rows that are not whole vectors, an x not on a 16-byte boundary, a padding neither causal nor centred:
    the launch returns an error (the program exits 10 + it), never a wrong output."""
    exes, tmp = binaries
    p, c = CASES[0]
    exe = exes[Variant(p, c).name]
    invalid, misaligned = 10 + 1, (10 + 716) % 256  # cudaErrorInvalidValue, cudaErrorMisalignedAddress
    for q, xoff, rc in ((causal(1, 2, 2044, 4, "bf16"), 0, invalid), (p, 1, misaligned),
                        (Problem(1, 2, 2048, 4, 1, 2, 1, "bf16", padding_right=1), 0, invalid)):
        with pytest.raises(AssertionError, match=f"exit {rc} "):
            run_on_cpu(exe, q, seed=0, tmp=tmp, xoff=xoff)


def _generic_lane_candidates() -> list[tuple[int, str, Config]]:
    """The lane designs search.generic weighs as fast generic forwards (bf16 K4, fp16 K9, fp32 K5: the 16-bit
    halos a lane's vector holds at their widest, and fp32's)."""
    from search.generic import candidate_variants

    return [(k, dtype, v.config) for k, dtype in ((4, "bf16"), (9, "fp16"), (5, "fp32"))
            for v in candidate_variants(k, dtype, "bcl") if v.family.name == "dw1d_lane"]


GENERIC_LANE = _generic_lane_candidates()


@pytest.fixture(scope="module")
def generic_binaries(tmp_path_factory):
    from dwgen.space import generic_problem, scope_stand_in

    tmp = tmp_path_factory.mktemp("lane_fwd_generic_cpu")
    variants = [Variant(scope_stand_in(generic_problem(k, dtype), "causal_or_centred"), c)
                for k, dtype, c in GENERIC_LANE]
    return build_all(variants, tmp, MAIN), variants, tmp


@pytest.mark.parametrize("i", range(len(GENERIC_LANE)), ids=[f"{d}_k{k}_{'_'.join(lane_tokens(c))}"
                                                             for k, d, c in GENERIC_LANE])
def test_generic_lane_candidates_take_any_causal_or_centred_call_on_cpu(generic_binaries, i):
    """Built once on the scope's stand-in (as the search and the freeze build them), each lane candidate computes
    every call its scope admits: other batches, channels and row lengths of whole vectors (one vector, a warp's
    runs and a bit, several chunks), causal with and without SiLU, centred plain, bias on and off."""
    from dwgen.space import scope_admits

    exes, variants, tmp = generic_binaries
    v = variants[i]
    vec, h, k, dtype = 16 // v.problem.elem_bytes, v.problem.halo, v.problem.kernel_size, v.problem.dtype
    for b, ch, length in ((1, 3, vec), (3, 2, 37 * vec), (5, 2, 300 * vec)):
        for left, right, act in ((h, 0, "none"), (h, 0, "silu"), (h // 2, h - h // 2, "none")):
            q = Problem(b, ch, length, k, 1, left, 1, dtype, padding_right=right, bias=b % 2 == 1, activation=act)
            assert scope_admits("causal_or_centred", q)
            outcome = run_on_cpu(exes[v.name], q, seed=length % 7, tmp=tmp)
            assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"
