"""The causal backward families (dwgen/families/bwdlane.py over (B, C, L), also for centred padding; bwdwalk.py
over (B, L, C)): where they join a tune, what their restrictions keep out, and their names."""
from __future__ import annotations

from dataclasses import replace

import pytest

from dwgen.families import bwdlane, bwdwalk
from dwgen.problem import Problem
from dwgen.space import Variant, config_from_name, enumerate_space, families_of, family_of_config, violations

MAMBA_BCL = Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16", padding_right=0, activation="silu")
MAMBA_BLC = Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0, activation="silu")


def _names(p: Problem) -> list[str]:
    return [f.name for f in families_of(p, "bwd")]


def test_each_causal_layout_gets_its_family_and_symmetric_padding_of_the_halo_only_the_walk():
    assert "dw1d_bwdlane" in _names(MAMBA_BCL)
    assert "dw1d_bwdwalk" in _names(MAMBA_BLC)
    symmetric = Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16")  # P = 3 on both sides: Lout = L + 3
    assert _names(symmetric) == ["dw1d_bwd"]  # the lane family wants Lout = L
    assert _names(replace(symmetric, layout="blc")) == ["dw1d_bwd", "dw1d_bwdwalk"]  # the walk P = H on the left
    assert _names(Problem(8, 4096, 2048, 4, 1, 2, 1, "bf16", layout="blc")) == ["dw1d_bwd"]  # P < H


def test_the_lane_family_takes_centred_padding_without_an_activation():
    # odd K with symmetric padding (H // 2 both sides), even K with PyTorch's "same" split (1 left, 2 right)
    centred = [Problem(16, 1024, 4096, 7, 1, 3, 1, "bf16"), Problem(2, 8, 2048, 4, 1, 1, 1, "fp32", padding_right=2)]
    for p in centred:
        assert "dw1d_bwdlane" in _names(p)
        lane = next(f for f in families_of(p, "bwd") if f.name == "dw1d_bwdlane")
        assert lane.activations(p) == ("none",)  # the checks never ask a centred lane for SiLU
    assert _names(Problem(16, 1024, 4096, 7, 1, 3, 1, "bf16", activation="silu")) == ["dw1d_bwd"]
    # the other split of an even filter's halo (2 left, 1 right) is neither causal nor centred
    assert "dw1d_bwdlane" not in _names(Problem(2, 8, 2048, 4, 1, 2, 1, "fp32", padding_right=1))
    lane = family_of_config(MAMBA_BCL, bwdlane.Config(), "bwd")
    assert lane.activations(MAMBA_BCL) == ("none", "silu")


def test_a_family_with_no_design_for_the_problem_stays_out_of_the_tune():
    # halos past every run (lane) and every register budget (walk): the family would only cost asks
    assert "dw1d_bwdlane" not in _names(Problem(1, 8, 2048, 20, 1, 19, 1, "bf16", padding_right=0))
    assert "dw1d_bwdwalk" not in _names(Problem(1, 8, 2048, 12, 1, 11, 1, "bf16", layout="blc", padding_right=0))
    # rows that are not whole 16-byte vectors: no lane design
    assert "dw1d_bwdlane" not in _names(Problem(2, 8, 2050, 4, 1, 3, 1, "bf16", padding_right=0))


@pytest.mark.parametrize("p,family", [(MAMBA_BCL, "dw1d_bwdlane"), (MAMBA_BLC, "dw1d_bwdwalk")])
def test_every_enumerated_design_renders_a_name_that_reads_back(p, family):
    vs = [v for v in enumerate_space(p, "bwd") if v.family.name == family]
    assert len(vs) > 10
    for v in vs:
        assert config_from_name(v.name, p, "bwd") == v.config


def test_the_grid_limit_is_a_restriction_not_a_launch_error():
    many_rows = Problem(70000, 1, 512, 4, 1, 3, 1, "bf16", padding_right=0)
    assert "grid_fits" in violations(many_rows, bwdlane.Config(threads=64, outs=8), "bwd")
    assert not violations(many_rows, bwdlane.Config(threads=64, outs=8, rows=2), "bwd")
    many_blocks = Problem(32768, 32, 512, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0)
    assert "grid_fits" in violations(many_blocks, bwdwalk.Config(threads=128, ct=16, vec=2, seg=32, unroll=8), "bwd")


def test_register_budgets_count_what_the_design_holds():
    fp32 = Problem(8, 512, 4096, 4, 1, 3, 1, "fp32", padding_right=0)
    # fetching ahead holds the next step's runs too: 32-position fp32 runs no longer fit
    assert not violations(fp32, bwdlane.Config(threads=64, outs=32), "bwd")
    assert "run_fits_registers" in violations(fp32, bwdlane.Config(threads=64, outs=32, rows=2, ahead=True), "bwd")
    # the walk's batch of loads counts against what a 512-thread block leaves a thread (128 registers)
    blc = Problem(8, 4096, 2048, 4, 1, 3, 1, "fp32", layout="blc", padding_right=0)
    assert "loads_fit_block_registers" in violations(blc, bwdwalk.Config(threads=512, ct=64, vec=4, seg=256,
                                                                              unroll=8), "bwd")
    assert not violations(MAMBA_BLC, bwdwalk.Config(threads=512, ct=64, vec=4, seg=256, unroll=8), "bwd")


def test_edge_problems_keep_the_padding_with_rows_the_launch_takes():
    centred = Problem(16, 1024, 4096, 7, 1, 3, 1, "bf16")
    for p, c in ((MAMBA_BCL, bwdlane.Config(threads=128, outs=8, rows=4)),
                 (centred, bwdlane.Config(threads=64, outs=8, rows=2, halves=2)),
                 (MAMBA_BLC, bwdwalk.Config(threads=256, ct=64, vec=4, seg=256, unroll=8))):
        edges = Variant(p, c, "bwd").edge_problems()
        assert edges and all(q.paddings == p.paddings and q.out_length == q.length for q in edges)
        if p.layout == "bcl":
            assert all(q.length % 8 == 0 for q in edges)  # whole 16-byte vectors a row
        else:
            assert all(q.channels % c.vec == 0 for q in edges)
