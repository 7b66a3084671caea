from __future__ import annotations

import itertools

import pytest

from dwgen.problem import Problem
from dwgen.space import (
    AXES,
    KNOWN_GOOD,
    RESTRICTIONS,
    Config,
    Variant,
    enumerate_space,
    known_good,
    violations,
)

PROBLEMS = [
    Problem(32, 512, 8192, 3, 1, 1),
    Problem(4, 2048, 8192, 3, 2, 1),
    Problem(32, 512, 1024, 31, 1, 15),
    Problem(1, 768, 510, 3, 1, 1, bias=True),
    Problem(2, 8, 1001, 5, 1, 4, 2),
]


def brute_force_ok(p: Problem, threads, vec, outs, walk, halo, stream) -> bool:
    """The restrictions restated from first principles, independent of dwgen.space."""
    tile = threads * vec * outs
    r = (-p.padding) % vec
    nv = (r + (vec - 1) * p.stride + (p.kernel_size - 1) * p.dilation) // vec + 1
    smem = ((tile // vec - 1) * p.stride + nv) * vec * 4 if halo == "smem" else 0
    return (
        p.length % vec == 0 and p.out_length % vec == 0
        and (halo != "shfl" or (p.stride == 1 and nv <= 16))
        and nv * vec <= 64
        and smem <= 48 * 1024
        and (tile <= max(p.out_length, 32 * vec) or (threads == 64 and outs == 1))
        and (walk != "row" or p.out_length > tile)
    )


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_enumeration_matches_brute_force(p):
    expect = {
        combo for combo in itertools.product(*AXES.values()) if brute_force_ok(p, *combo)
    }
    got = {tuple(getattr(v.config, a) for a in AXES) for v in enumerate_space(p)}
    assert got == expect
    assert got, "every problem needs at least one variant"


def test_golden_name():
    v = Variant(Problem.from_shape("32x512x8192"),
                Config(threads=256, vec=4, outs=2, walk="tile", halo="shfl", stream=True))
    assert v.name == "dw1d_f32_k3_p1_t256_v4_o2_shfl_cs"
    v2 = Variant(Problem(4, 2048, 8192, 3, 2, 1, 2, bias=True),
                 Config(threads=128, vec=2, outs=1, walk="row", halo="smem", stream=False))
    assert v2.name == "dw1d_f32_k3_s2_p1_d2_bias_t128_v2_o1_row_smem"


def test_names_and_digests_unique_and_stable():
    p = PROBLEMS[0]
    vs = enumerate_space(p)
    assert len({v.name for v in vs}) == len(vs)
    assert len({v.digest for v in vs}) == len(vs)
    again = [Variant(p, Config(**v.config.to_dict())) for v in vs[:20]]
    assert [v.digest for v in again] == [v.digest for v in vs[:20]]


def test_digest_ignores_sizes_but_not_signature():
    c = Config()
    a = Variant(Problem(32, 512, 8192), c)
    assert a.digest == Variant(Problem(1, 7, 64), c).digest  # sizes are run-time arguments
    assert a.digest != Variant(Problem(32, 512, 8192, padding=2), c).digest
    assert a.digest != Variant(Problem(32, 512, 8192, bias=True), c).digest


def test_digest_follows_template_text(monkeypatch):
    from dwgen import space

    v = Variant(PROBLEMS[0], Config())
    before = v.digest
    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + "// changed\n")
    assert v.digest != before


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_window_indexing_reads_the_right_inputs(p):
    """Replay the kernel's index arithmetic: window element R + v*S + k*D is input (j0+v)*S - P + k*D."""
    for v in enumerate_space(p)[::7]:
        V, S, D = v.config.vec, p.stride, p.dilation
        assert v.window_offset + (V - 1) * S + (p.kernel_size - 1) * D < v.window_vectors * V
        for j0 in range(0, 4 * V, V):
            start = (j0 // V * S + v.lead) * V
            for lane in range(V):
                for k in range(p.kernel_size):
                    assert start + v.window_offset + lane * S + k * D == (j0 + lane) * S - p.padding + k * D


def test_violations_name_the_failed_restrictions():
    p = Problem(1, 4, 1001, 3, 2, 1)
    bad = violations(p, Config(vec=4, halo="shfl"))
    assert "vec_divides_lengths" in bad and "shfl_needs_unit_stride" in bad
    assert set(bad) <= {r.__name__ for r in RESTRICTIONS}
    assert violations(p, Config(vec=1, outs=1, threads=64)) == []


def test_config_refuses_values_off_the_axes():
    with pytest.raises(ValueError):
        Config(threads=100)
    with pytest.raises(ValueError):
        Config(halo="texture")
    with pytest.raises(ValueError):
        Config(stream=1)


def test_known_good_are_valid_where_kept():
    p = PROBLEMS[0]
    assert known_good(p) == [c for c in KNOWN_GOOD if not violations(p, c)]
    assert known_good(p)
