"""The (B, L, C) tensor-core forward with channels as the product's columns (dwgen/families/tcdiag.py, not yet
registered): its own source on the CPU emulator, ldmatrix, stmatrix, both mma.sync shapes and the zero-filling
cp.async emulated lane by lane, against float64 on designs that cover its paths and on its family's edge problems.
Says nothing of speed."""
from __future__ import annotations

import shutil

import pytest

from dwgen import render
from dwgen.families import tcdiag
from dwgen.families.tcdiag import Config
from dwgen.problem import Problem
from tests.cuda_on_cpu import PRELUDE, WARP_LDST_ON_CPU, WARP_MMA_ON_CPU, _compile, _emulated
from tests.test_cl_fwd_on_cpu import MAIN, run_on_cpu

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def blc(b, c, n, k, s, pad, d, dtype, **kw) -> Problem:
    return Problem(b, c, n, k, s, pad, d, dtype, layout="blc", **kw)


# Conformer's K15 and Mamba's causal SiLU K4; a tile several groups long with warps splitting it; strides 2 to 4
# (the staged rows by phase) with dilation; odd K (the last tap's m16n8k8 product); K31 (16 tap pairs, the most
# registers); K1; channels past C in a block.
CASES = [
    (blc(2, 64, 300, 15, 1, 7, 1, "fp16", bias=True), Config(chunks=4, wpc=2, tile=128, nt=2, steps=4)),
    (blc(1, 64, 300, 4, 1, 3, 1, "bf16", padding_right=0, activation="silu"),
     Config(chunks=8, wpc=1, tile=128, nt=2, steps=1)),
    (blc(2, 40, 600, 9, 1, 4, 1, "fp16"), Config(chunks=2, wpc=4, tile=256, nt=2, steps=4)),
    (blc(2, 32, 257, 5, 2, 2, 1, "bf16", bias=True), Config(chunks=4, wpc=2, tile=64, nt=1, steps=16)),
    (blc(1, 24, 501, 7, 3, 6, 2, "fp16", activation="silu"), Config(chunks=4, wpc=4, tile=128, nt=1, steps=1)),
    (blc(1, 16, 200, 31, 1, 15, 1, "bf16", bias=True), Config(chunks=2, wpc=2, tile=64, nt=1, steps=4)),
    (blc(2, 16, 333, 1, 4, 0, 8, "fp16"), Config(chunks=2, wpc=1, tile=64, nt=2, steps=4)),
    (blc(1, 8, 190, 6, 1, 9, 3, "bf16", padding_right=2), Config(chunks=8, wpc=2, tile=64, nt=1, steps=16)),
]


def _binary(p: Problem, c: Config, tmp, monkeypatch):
    import jinja2

    loader = jinja2.ChoiceLoader([jinja2.DictLoader({"_warp_mma.cu.j2": WARP_MMA_ON_CPU,
                                                     "_warp_mma_extra.cu.j2": WARP_LDST_ON_CPU}), render._ENV.loader])
    monkeypatch.setattr(render, "_ENV", render._ENV.overlay(loader=loader))
    name, _, src = tcdiag.standalone(p, c)
    storage = "__half" if p.dtype == "fp16" else "__nv_bfloat16"
    return _compile(name, _emulated(src) + PRELUDE + MAIN.replace("{{ storage }}", storage), tmp)


def _checks(p: Problem, c: Config) -> list[Problem]:
    """Its problem, the other bias, and its family's edge problems up to 1000 long (the emulator is slow)."""
    from dataclasses import replace

    return [p, replace(p, bias=not p.bias)] + [q for q in tcdiag.edge_problems(p, c) if q.length <= 1000]


@pytest.mark.parametrize("p,c", CASES, ids=[tcdiag.standalone(p, c)[0] for p, c in CASES])
def test_matches_float64_on_cpu(tmp_path, monkeypatch, p, c):
    exe = _binary(p, c, tmp_path, monkeypatch)
    for q in _checks(p, c):
        _, outcome = run_on_cpu(exe, q, seed=q.length % 7, tmp=tmp_path)
        assert outcome.ok, f"{exe.name} on {q.key}: {outcome.message}"


def test_designs_cover_the_signatures():
    """Every K 1 to 32, stride 1 to 4 and dilation 1 to 8 of 16-bit (B, L, C) has a design (the generic choice
    among them), and the restrictions refuse what the template cannot run."""
    for k in range(1, 33):
        for s in (1, 2, 3, 4):
            for d in (1, 2, 4, 8):
                p = blc(1, 64, 4096, k, s, 0, d, "bf16")
                if not tcdiag.applies(p) or p.out_length < 1:
                    continue
                assert any(all(r(p, c) for r in tcdiag.RESTRICTIONS) for c in tcdiag.KNOWN_GOOD), p.key
    assert not tcdiag.applies(blc(1, 64, 4096, 33, 1, 0, 1, "bf16"))
    assert not tcdiag.applies(blc(1, 60, 4096, 3, 1, 0, 1, "bf16"))
    assert not tcdiag.applies(blc(1, 64, 4096, 3, 1, 0, 1, "fp32"))
    assert not tcdiag.applies(Problem(1, 64, 4096, 3, 1, 0, 1, "bf16"))


def test_name_round_trip():
    for c in tcdiag.KNOWN_GOOD:
        assert tcdiag.config_from_tokens(tcdiag.name_tokens(c), "x") == c
