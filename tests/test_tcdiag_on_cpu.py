"""The (B, L, C) tensor-core forward with channels as the product's columns (dwgen/families/tcdiag.py, not yet
registered): its own source on the CPU emulator, ldmatrix, both mma.sync shapes and the zero-filling cp.async
(landing only at its wait) emulated lane by lane, against float64 on designs that cover its paths and on its
family's edge problems; its schedule and shared-memory layout by their own rules. Says nothing of speed."""
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
    (blc(2, 64, 300, 15, 1, 7, 1, "fp16", bias=True), Config(chunks=4, wpc=2, tile=128, steps=4)),
    (blc(1, 64, 300, 4, 1, 3, 1, "bf16", padding_right=0, activation="silu"),
     Config(chunks=8, wpc=1, tile=128, steps=1)),
    (blc(2, 40, 600, 9, 1, 4, 1, "fp16"), Config(chunks=2, wpc=4, tile=256, steps=4)),
    (blc(2, 32, 257, 5, 2, 2, 1, "bf16", bias=True), Config(chunks=4, wpc=2, tile=64, steps=16)),
    (blc(1, 24, 501, 7, 3, 6, 2, "fp16", activation="silu"), Config(chunks=4, wpc=4, tile=128, steps=1)),
    (blc(1, 16, 200, 31, 1, 15, 1, "bf16", bias=True), Config(chunks=2, wpc=2, tile=64, steps=4)),
    (blc(2, 16, 333, 1, 4, 0, 8, "fp16"), Config(chunks=2, wpc=1, tile=64, steps=4)),
    (blc(1, 8, 190, 6, 1, 9, 3, "bf16", padding_right=2), Config(chunks=8, wpc=2, tile=64, steps=16)),
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
    """Its problem, the other bias, and its family's edge problems up to 1000 long or of one channel chunk (the
    emulator is slow)."""
    from dataclasses import replace

    return [p, replace(p, bias=not p.bias)] + [q for q in tcdiag.edge_problems(p, c)
                                               if q.length <= 1000 or q.channels == 8 and q.batch == 1]


@pytest.mark.parametrize("p,c", CASES, ids=[tcdiag.standalone(p, c)[0] for p, c in CASES])
def test_matches_float64_on_cpu(tmp_path, monkeypatch, p, c):
    exe = _binary(p, c, tmp_path, monkeypatch)
    for q in _checks(p, c):  # under both warp schedules (run_on_cpu: tests.cuda_on_cpu.run_both_schedules)
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


def test_each_block_is_loaded_once_and_reused():
    """A warp's schedule loads every block it reads once, before its first use; at stride and dilation 1 a group
    past the first loads 16 (the window slides 16 positions), where a product a tap pair alone would load 2K."""
    for k in (1, 4, 9, 15, 31):
        for s, d in ((1, 1), (2, 1), (3, 2), (1, 3), (4, 8)):
            p = blc(2, 64, 4000, k, s, 0, d, "fp16")
            for c in [c for c in tcdiag.KNOWN_GOOD if not [r for r in tcdiag.RESTRICTIONS if not r(p, c)]]:
                loaded: set[str] = set()
                for g in tcdiag.schedule(p, c):
                    new = {f"{ld.name}[{j}]" for ld in g.loads for j in range(ld.n)}
                    assert not new & loaded
                    loaded |= new
                    used = {b for _, q in g.pairs for b in q} | set(g.last or ())
                    assert used <= loaded, (p.key, c, g.u)
                    assert len(g.pairs) == k // 2 and (g.last is not None) == (k % 2 == 1)
                    if s == d == 1 and g.u > 0:
                        assert len(new) == min(16, 2 * k), (p.key, c, g.u)


def test_copies_and_write_back_meet_every_bank_group():
    """A quarter-warp's 16-byte copies into shared memory (at strides 1 to 4: the phases' pitch is chosen for it),
    and its reads of the outputs, fall in 8 different 16-byte bank groups (Tiling.row_skew, phase_pitch)."""
    for s in (1, 2, 3, 4):
        for k, d in ((3, 1), (7, 2), (15, 1)):
            p = blc(2, 64, 4000, k, s, 0, d, "bf16")
            for c in tcdiag.KNOWN_GOOD:
                if [r for r in tcdiag.RESTRICTIONS if not r(p, c)]:
                    continue
                t = tcdiag.Tiling(p, c)
                assert t.copy_conflicts(t.phase_pitch) == 1.0, (p.key, c)
                assert t.x_rows % 8 == t.y_rows % 8 == t.row_skew and t.x_rows >= s * t.phase_pitch
                for quarter in range(4):  # the write-back: chunk l % QG of output l / QG
                    lanes = range(8 * quarter, 8 * quarter + 8)
                    assert len({(lane % c.chunks * t.y_rows + lane // c.chunks) % 8 for lane in lanes}) == 8
