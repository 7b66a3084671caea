"""The tensor-core forward over (B, L, C) memory (dwgen/families/tcl.py, not yet in the registry): naming,
restrictions, its nvcc build, and its own source run on the CPU (tests/cuda_on_cpu.h, the mma primitives emulated
lane by lane as the PTX fragment layouts say) against float64, edge problems included. Says nothing of speed."""
from __future__ import annotations

import itertools
import shutil
import subprocess

import pytest

from dwgen import render
from dwgen.build import nvcc_path
from dwgen.families import tcl
from dwgen.problem import Problem
from dwgen.space import FAMILIES, NVCC_FLAGS
from tests.conftest import has_nvcc
from tests.cuda_on_cpu import WARP_MMA_ON_CPU, build_source
from tests.test_cl_fwd_on_cpu import MAIN, run_on_cpu


def blc(b, c, n, k, pad, d, dtype, **kw) -> Problem:
    return Problem(b, c, n, k, 1, pad, d, dtype, layout="blc", **kw)


K9 = blc(8, 1024, 4000, 9, 4, 1, "fp16")


def broken(p: Problem, c: tcl.Config) -> list[str]:
    return [r.__name__ for r in tcl.RESTRICTIONS if not r(p, c)]


def test_names_round_trip():
    for vals in itertools.product(*tcl.AXES.values()):
        c = tcl.Config(*vals)
        assert tcl.config_from_tokens(tcl.name_tokens(c), "x") == c
    assert tcl.standalone(K9, tcl.Config(4, 32, 256, 2))[0] == "dw1d_tcl_f16_k9_w4_c32_t256_n2"
    assert tcl.standalone(blc(2, 64, 900, 5, 4, 2, "bf16"), tcl.Config(8, 16, 512, 1, "pers"))[0] == \
        "dw1d_tcl_bf16_k5_d2_w8_c16_t512_n1_pers"


@pytest.mark.parametrize("tokens", [["w4", "c32", "t256"], ["w4", "c32", "t256", "n2", "n1"],
                                    ["w4", "c32", "t256", "x2"], ["w4", "c32", "t256", "n2", "pers", "pers"]])
def test_bad_tokens_are_refused(tokens):
    with pytest.raises(ValueError):
        tcl.config_from_tokens(tokens, "_".join(tokens))


@pytest.mark.parametrize("p, why", [
    (blc(2, 64, 500, 9, 4, 1, "fp32"), "sixteen_bit_only"),
    (Problem(2, 64, 500, 9, 1, 4, 1, "fp16"), "blc_only"),
    (Problem(2, 64, 500, 3, 2, 1, 1, "bf16", layout="blc"), "unit_stride"),
    (blc(2, 60, 500, 9, 4, 1, "fp16"), "channels_whole_vectors"),
    (blc(2, 64, 800, 64, 0, 8, "bf16"), "a_fits_registers"),
])
def test_restrictions_name_what_the_kernel_cannot_do(p, why):
    assert why in broken(p, tcl.Config())
    with pytest.raises(render.RenderError, match=why):
        tcl.standalone(p, tcl.Config())


def test_the_persistent_walk_holds_one_batch_of_loads():
    p = blc(2, 64, 2000, 9, 4, 1, "fp16")
    assert tcl.Tiling(p, tcl.Config(2, 16, 512, 2, "pers")).x_iters > tcl.MAX_BATCH
    assert "persistent_holds_an_item" in broken(p, tcl.Config(2, 16, 512, 2, "pers"))
    assert not broken(p, tcl.Config(2, 16, 512, 2)) and not broken(p, tcl.Config(8, 32, 256, 1, "pers"))


def test_not_in_the_registry_until_it_measures_faster():
    assert all(f.module is not tcl for fams in FAMILIES.values() for f in fams)


def test_every_known_good_design_fits_the_shared_memory_at_k31():
    p = blc(4, 256, 2000, 31, 15, 1, "bf16")
    for c in tcl.KNOWN_GOOD:
        assert not broken(p, c), c
        assert tcl.Tiling(p, c).smem_bytes <= tcl.SMEM_LIMIT_BYTES


def test_digest_follows_the_config_and_the_edge_problems_keep_their_padding_rules():
    a = tcl.standalone(K9, tcl.Config(4, 32, 256, 2))[1]
    assert a == tcl.standalone(K9, tcl.Config(4, 32, 256, 2))[1] != tcl.standalone(K9, tcl.Config(4, 32, 256, 1))[1]
    causal = blc(1, 24, 530, 4, 3, 1, "bf16", padding_right=0)
    qs = tcl.edge_problems(causal, tcl.Config())
    assert qs and all(q.padding_right == 0 and q.channels % 8 == 0 for q in qs)


@pytest.mark.skipif(not has_nvcc(), reason="needs nvcc")
def test_builds_with_nvcc_without_spills(tmp_path):
    p = blc(2, 64, 600, 15, 7, 1, "bf16", activation="silu")
    for c in (tcl.Config(2, 16, 512, 2), tcl.Config(8, 32, 256, 1, "pers")):
        _, _, source = tcl.standalone(p, c)
        src = tmp_path / "k.cu"
        src.write_text(source)
        proc = subprocess.run([nvcc_path(), "-cubin", "-arch=sm_90", *NVCC_FLAGS, "-Xptxas", "-v", "-o",
                               str(tmp_path / "k.cubin"), str(src)], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stderr.count(" 0 bytes spill stores") == 2, c  # both activations


# Designs on problems that reach every path: K9 (two chunks) with bias, causal K4 with SiLU, K15 past a tile,
# K31 (three chunks), dilation 2, channels that are not a whole block, staging batches that end short, bf16, fp16;
# and the persistent walk, which the emulator runs on a grid of 2 blocks (tests/cuda_on_cpu.h): each block walks
# items across channel tiles, tiles and batch rows, its next item's loads in registers.
CASES = [
    (blc(2, 40, 300, 9, 4, 1, "fp16", bias=True), tcl.Config(4, 32, 256, 2)),
    (blc(1, 24, 530, 4, 3, 1, "bf16", padding_right=0, activation="silu"), tcl.Config(2, 16, 256, 2)),
    (blc(2, 16, 600, 15, 7, 1, "fp16"), tcl.Config(8, 16, 512, 1)),
    (blc(1, 32, 400, 31, 15, 1, "bf16", bias=True), tcl.Config(4, 32, 256, 1)),
    (blc(2, 8, 600, 5, 4, 2, "bf16"), tcl.Config(2, 16, 512, 2)),
    (blc(2, 40, 700, 9, 4, 1, "fp16", bias=True), tcl.Config(8, 32, 256, 1, "pers")),
    (blc(3, 24, 300, 4, 3, 1, "bf16", padding_right=0, activation="silu"), tcl.Config(4, 16, 256, 2, "pers")),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    import jinja2

    tmp = tmp_path_factory.mktemp("tcl_cpu")
    loader = jinja2.ChoiceLoader([jinja2.DictLoader({"_warp_mma.cu.j2": WARP_MMA_ON_CPU}), render._ENV.loader])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "_ENV", render._ENV.overlay(loader=loader))
        built = {}
        for p, c in CASES:
            name, _, source = tcl.standalone(p, c)
            built[name] = build_source(name, source, p.dtype, MAIN, tmp)
        return built, tmp


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("p,c", CASES, ids=["_".join(tcl.name_tokens(c)) + "_" + p.key for p, c in CASES])
def test_matches_float64_on_cpu(binaries, p, c):
    exes, tmp = binaries
    name = tcl.standalone(p, c)[0]
    for q in [p] + [q for q in tcl.edge_problems(p, c) if q.length <= 2000]:
        _, outcome = run_on_cpu(exes[name], q, seed=q.length % 7, tmp=tmp)
        assert outcome.ok, f"{name} on {q.key}: {outcome.message}"
