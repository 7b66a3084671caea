from __future__ import annotations

import itertools
import json
import math
import os
import subprocess
import sys
from dataclasses import replace

import pytest

from dwgen.families import blc
from dwgen.families.bcl import AXES, KNOWN_GOOD, RESTRICTIONS, Config
from dwgen.problem import Problem
from dwgen.render import render_variant
from dwgen.space import (
    FAMILIES,
    GENERIC_KERNEL_SIZES,
    Variant,
    config_from_name,
    enumerate_space,
    generic_key,
    generic_problem,
    generic_variants,
    known_good,
    violations,
)
from tests.conftest import ROOT

PROBLEMS = [
    Problem(32, 512, 8192, 3, 1, 1),
    Problem(8, 4096, 2048, 4, 1, 3),
    Problem(4, 2048, 8192, 3, 2, 1),
    Problem(32, 512, 1024, 31, 1, 15),
    Problem(1, 768, 510, 3, 1, 1, bias=True),
    Problem(2, 8, 1001, 5, 1, 4, 2),
    Problem(32, 512, 8192, 3, 1, 1, dtype="bf16"),
    Problem(32, 512, 1024, 31, 1, 15, dtype="fp16"),
]


def brute_force_ok(p: Problem, threads, vec, outs, run, walk, halo, stream, batches, cap) -> bool:
    """The restrictions restated from first principles, independent of dwgen.space."""
    tile = threads * vec * outs * run
    # the widest window: first input 3 elements into a float4, RUN*V outputs, K taps
    span = (vec - 1) + (run * vec - 1) * p.stride + (p.kernel_size - 1) * p.dilation + 1
    nv = -(-span // vec)
    stage = -(-((tile - 1) * p.stride + (vec - 1) + (p.kernel_size - 1) * p.dilation + 1) // vec)
    smem = stage * vec * p.elem_bytes * {"smem": 1, "async": 2}.get(halo, 0)
    return (
        vec * p.elem_bytes <= 16
        and (halo != "async" or vec * p.elem_bytes >= 4)
        and (halo != "shfl" or (p.stride == 1 and run == 1 and nv <= 16))
        and nv * vec <= 64
        and smem <= 48 * 1024
        and (tile <= max(p.out_length, 32 * vec) or (threads == 64 and outs == 1 and run == 1))
        and (walk != "row" or batches > 1 or p.out_length > tile)
        and (batches == 1 or (walk == "row" and batches <= p.batch))
        and (halo != "async" or walk != "tile")
        and (not cap or batches == 1)
    )


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_enumeration_matches_brute_force(p):
    expect = {
        combo for combo in itertools.product(*AXES.values()) if brute_force_ok(p, *combo)
    }
    got = {tuple(getattr(v.config, a) for a in AXES) for v in enumerate_space(p) if v.family.name == "dw1d"}
    assert got == expect
    assert got, "every problem needs at least one variant"


def test_golden_name():
    v = Variant(Problem.from_shape("32x512x8192"),
                Config(threads=256, vec=4, outs=2, walk="tile", halo="shfl", stream=True))
    assert v.name == "dw1d_f32_k3_t256_v4_o2_shfl_cs"
    v2 = Variant(Problem(4, 2048, 8192, 3, 2, 1, 2, bias=True),
                 Config(threads=128, vec=2, outs=1, run=2, walk="persistent", halo="smem", stream=False))
    assert v2.name == "dw1d_f32_k3_s2_d2_t128_v2_o1_r2_pers_smem"


def test_names_and_digests_unique_and_stable():
    p = PROBLEMS[0]
    vs = enumerate_space(p)
    assert len({v.name for v in vs}) == len(vs)
    assert len({v.digest for v in vs}) == len(vs)
    # Stable means the same in another process with another string-hash seed (a digest built on hash() or
    # on a set's order would differ there), not only the same twice in this one.
    script = ("import json; from dwgen.problem import Problem; from dwgen.space import enumerate_space; "
              f"print(json.dumps([[v.name, v.digest] for v in enumerate_space(Problem(**{p.to_dict()!r}))[:20]]))")
    there = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": "7"}).stdout
    assert json.loads(there) == [[v.name, v.digest] for v in vs[:20]]


def test_digest_ignores_runtime_arguments_but_not_signature():
    c = Config()
    a = Variant(Problem(32, 512, 8192), c)
    # sizes, padding and bias are run-time arguments of the kernel
    assert a.digest == Variant(Problem(1, 7, 64, padding=2, bias=True), c).digest
    assert a.digest != Variant(Problem(32, 512, 8192, kernel_size=5), c).digest
    assert a.digest != Variant(Problem(32, 512, 8192, stride=2), c).digest
    assert a.digest != Variant(Problem(32, 512, 8192, dilation=2), c).digest


def test_digest_follows_template_text(monkeypatch):
    from dwgen import space

    v = Variant(PROBLEMS[0], Config())
    before = v.digest
    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + "// changed\n")
    assert v.digest != before


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_window_covers_every_tap(p):
    """Replay the kernel's index arithmetic for each offset R of a group's first input in its vector:
    window element R + (s*V + v)*S + k*D must lie inside the window and be input (j0 + s*V + v)*S - P + k*D."""
    for var in [v for v in enumerate_space(p) if v.family.name == "dw1d"][::11]:
        V, S, D, run = var.config.vec, p.stride, p.dilation, var.config.run
        for r in range(V):
            nv = var.tiling.window_vectors(r)
            for j0 in (0, 5, 17):
                a0 = j0 * S - p.padding - r  # aligned start of the window when the first input sits r in
                for s in range(run):
                    for v in range(V):
                        for k in range(p.kernel_size):
                            idx = r + (s * V + v) * S + k * D
                            assert idx < nv * V
                            assert a0 + idx == (j0 + s * V + v) * S - p.padding + k * D
        assert var.tiling.max_window_vectors == max(var.tiling.window_vectors(r) for r in range(V))


def test_smem_stage_covers_every_group():
    for p in PROBLEMS:
        for var in [v for v in enumerate_space(p) if getattr(v.config, "halo", None) == "smem"][::9]:
            groups = var.config.threads * var.config.outs
            last = (groups - 1) * var.config.run * p.stride + var.tiling.max_window_vectors
            assert last <= var.tiling.smem_vectors


def test_tiles():
    p = Problem(4, 8, 1000)
    v = Variant(p, Config(threads=64, vec=4, outs=1))  # 256 outputs a tile, 250 aligned vectors a row
    assert v.tiling.tiles(1000) == 4 and v.tiling.tiles(3) == 1


def test_violations_name_the_failed_restrictions():
    p = Problem(1, 4, 1001, 3, 2, 1)
    bad = violations(p, Config(vec=4, run=2, halo="shfl"))
    assert "shfl_needs_unit_stride" in bad and "shfl_needs_single_runs" in bad
    assert set(bad) <= {r.__name__ for r in RESTRICTIONS}
    assert violations(p, Config(vec=4, outs=1, threads=64)) == []  # odd lengths take vectors too


def test_generic_variants_cover_every_dtype_layout_and_small_k():
    vs = generic_variants()
    keys = [generic_key(v.problem) for v in vs]
    forward = [d for d, _ in FAMILIES if d == "fwd"]
    assert len(keys) == len(set(keys)) == len(forward) * 3 * len(GENERIC_KERNEL_SIZES)
    assert all(v.problem.stride == 1 and v.problem.dilation == 1 and not violations(v.problem, v.config) for v in vs)
    # 16-byte accesses in every (B, C, L) kernel; (B, L, C) ones as wide as their registers allow
    assert all(v.config.vec * v.problem.elem_bytes == 16 for v in vs if v.problem.layout == "bcl")
    # (16-bit K15 and K16 take 4-byte vectors: an 8-byte one's window passes the register room)
    assert all(v.config.vec * v.problem.elem_bytes == 8 for v in vs if v.problem.layout == "blc" and
               v.problem.kernel_size <= 9)
    assert all(v.config.vec * v.problem.elem_bytes <= 8 for v in vs if v.problem.layout == "blc")


def test_generic_variants_take_the_measured_choice():
    chosen = Config(threads=256, vec=4, outs=1, walk="row", halo="async")
    key = generic_key(generic_problem(7))
    vs = {generic_key(v.problem): v for v in generic_variants({key: chosen.to_dict()})}
    assert vs[key].config == chosen
    # a K nobody measured takes the nearest measured K's design of its dtype and layout, where it fits
    assert vs[generic_key(generic_problem(3))].config == chosen
    assert vs[generic_key(generic_problem(3, "fp16"))].config != chosen


def test_an_unmeasured_k_takes_the_nearest_measured_design_the_smaller_on_a_tie():
    a = Config(threads=256, vec=4, outs=1, walk="row", halo="async")
    b = Config(threads=64, vec=4, outs=2, halo="l1")
    chosen = {generic_key(generic_problem(3)): a.to_dict(), generic_key(generic_problem(5)): b.to_dict()}
    vs = {v.problem.kernel_size: v.config for v in generic_variants(chosen) if v.problem.dtype == "fp32"
          and v.problem.layout == "bcl"}
    assert (vs[1], vs[3], vs[4], vs[5], vs[6], vs[9]) == (a, a, a, b, b, b)


def test_a_measured_generic_design_may_be_of_another_family_of_its_layout():
    from dwgen.families import tc

    design = Variant(generic_problem(15, "fp16"), tc.Config(warps=2, nt=2, tile=1024))
    assert design.config_dict["family"] == "dw1d_tc"
    vs = {generic_key(v.problem): v for v in generic_variants({generic_key(design.problem): design.config_dict})}
    assert vs["fp16_bcl_k15"].name == design.name
    assert vs["fp16_bcl_k16"].family.name == "dw1d_tc"  # borrowed by the nearest K, where it fits
    assert vs["bf16_bcl_k15"].family.name == "dw1d"  # another dtype keeps its own


def window_slots(window: int, advance: int, steps: int, vec: int, rename: bool) -> int:
    """Registers a renamed window takes: WIN, or the fewest more (16 registers at most, a whole number of steps
    at most) whose names come round within 8 steps, where WIN's would take longer and the walk is longer. This
    restates blc.Tiling.slots's policy (only the period is worked out another way); what checks the policy itself
    is test_blc_window_slots_repeat_within_the_unrolled_steps's invariant and the template's static_assert."""
    def repeats(slots):  # steps until input m + steps * advance lands in input m's slot again
        return next(n for n in range(1, slots + 1) if n * advance % slots == 0)

    if not rename or min(repeats(window), steps) <= 8:
        return window
    whole = -(-window // advance) * advance
    return next((s for s in range(window + 1, whole + 1) if repeats(s) <= 8 and (s - window) * vec <= 16), window)


def brute_force_blc_ok(p: Problem, threads, vec, outs, steps, cthreads, stream, ring, rename) -> bool:
    """The (B, L, C) family's restrictions restated from first principles."""
    window = (outs - 1) * p.stride + (p.kernel_size - 1) * p.dilation + 1
    fresh = min(window, outs * p.stride)  # inputs a step fetches for the next one: raw in registers, or a ring
    slots = window_slots(window, outs * p.stride, steps, vec, rename)
    registers = (slots + p.kernel_size + 2) * vec + fresh * vec * p.elem_bytes // 4  # a ring frees none (ptxas)
    ring_ok = ring == 1 or (vec * p.elem_bytes >= 4 and ring <= steps and not stream
                            and ring * fresh * threads * vec * p.elem_bytes <= 48 * 1024)
    return (vec * p.elem_bytes <= 16 and cthreads <= threads and registers <= 128
            and p.channels % vec == 0
            and (cthreads * vec <= max(p.channels, 32 * vec) or cthreads == 8)
            and threads // cthreads * outs * steps <= max(p.out_length, 64) and ring_ok)


@pytest.mark.parametrize("p", [Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc"),
                               Problem(2, 24, 100, 9, 2, 4, 2, layout="blc"),
                               Problem(1, 768, 30, 3, 1, 1, dtype="fp16", layout="blc"),
                               # renamed designs that the extra slots alone push past the register filter
                               Problem(2, 512, 2000, 14, padding=7, dtype="fp16", layout="blc")],
                         ids=lambda p: p.key)
def test_blc_enumeration_matches_brute_force(p):
    expect = {combo for combo in itertools.product(*blc.AXES.values()) if brute_force_blc_ok(p, *combo)}
    channel = [v for v in enumerate_space(p) if isinstance(v.config, blc.Config)]  # other families' apart
    got = {tuple(getattr(v.config, a) for a in blc.AXES) for v in channel}
    assert got == expect and got
    for v in channel[::17]:
        assert config_from_name(v.name, p) == v.config and "_cl_" in v.name


def test_blc_window_covers_every_tap():
    """Input i of a thread's window feeds output o through tap k exactly when o*S + k*D == i (as the kernel)."""
    p = Problem(2, 64, 500, 5, 2, 4, 3, layout="blc")
    for v in enumerate_space(p)[::7]:
        uses = sorted((o, k) for i in range(v.tiling.window) for o in range(v.config.outs)
                      for k in range(p.kernel_size) if o * p.stride + k * p.dilation == i)
        assert uses == [(o, k) for o in range(v.config.outs) for k in range(p.kernel_size)]


def test_variant_names_parse_back():
    p = Problem(2, 8, 999, 5, 1, 4, 2)
    for v in enumerate_space(p)[::37]:
        assert config_from_name(v.name, p) == v.config
    with pytest.raises(ValueError, match="not a variant of"):
        config_from_name("dw1d_f32_k3_t128_v4_o2_l1", p)
    with pytest.raises(ValueError, match="unknown token"):
        config_from_name("dw1d_f32_k5_d2_t128_v4_o2_texture", p)


def test_backward_variant_names_parse_back():
    for p in (Problem(32, 512, 8192, 3, 1, 1, 1, "bf16"), Problem(8, 256, 2048, 4, 1, 3, 1, "bf16", layout="blc")):
        for v in enumerate_space(p, "bwd"):
            assert config_from_name(v.name, p, "bwd") == v.config
    p = Problem(32, 512, 8192, 3, 1, 1, 1, "bf16")
    with pytest.raises(ValueError, match="not a variant of"):  # a forward name is no backward variant
        config_from_name("dw1d_bf16_k3_t128_v8_o2_l1_oc", p, "bwd")
    with pytest.raises(ValueError, match="not a variant of"):
        config_from_name("dw1d_bwd_bf16_k3_t128_o16_rawp_b4", p)


def test_config_refuses_values_off_the_axes():
    with pytest.raises(ValueError):
        Config(threads=100)
    with pytest.raises(ValueError):
        Config(halo="texture")
    with pytest.raises(ValueError):
        Config(stream=1)


def test_known_good_are_valid_where_kept():
    p = PROBLEMS[0]
    primary = [c for c in known_good(p) if isinstance(c, Config)]  # the lane family's join them (stride 1)
    assert sorted(primary, key=repr) == sorted([c for c in KNOWN_GOOD if not violations(p, c)], key=repr)
    assert primary and not any(violations(p, c) for c in known_good(p))


def raw_window_words(p: Problem, threads, outs, count, run_elems) -> int:
    """Words of a raw window: one vector of room, then every vector the window can touch (a vector boundary
    before it and its last vector), or up to the end of the last thread's run, read in whole 16-, 8- or
    4-byte loads after one element of parity, whichever reaches further; and a group of 32 more where
    the runs' chunks are XOR-placed."""
    per_word = 4 // p.elem_bytes
    vec_words = 4
    vec = 16 // p.elem_bytes
    vectors = (count + 2 * vec - 2) // vec
    run_word_count = -(-(run_elems + per_word - 1) // per_word)
    load = next(w for w in (4, 2, 1) if (outs // per_word) % w == 0)
    run_word_count = -(-run_word_count // load) * load
    words = max(vec_words * (vectors + 1), (threads * outs - outs) // per_word + vec_words + run_word_count)
    # runs 8 words apart or more (16-byte loads, 2, 4 or 8 chunks apart) get their chunks XOR-placed in
    # groups of 8: one group more
    apart = outs // per_word // 4
    return words + 32 if outs // per_word % 4 == 0 and apart in (2, 4, 8, 16, 32) else words


def brute_force_bwd_ok(p: Problem, threads, outs, tc, stage, tiles, walk, regs) -> bool:
    """The fused backward family's restrictions restated from first principles."""
    vec = 16 // p.elem_bytes if p.layout == "bcl" else min(16 // p.elem_bytes, tc)
    tile = threads // tc * outs
    halo = (p.kernel_size - 1) * p.dilation
    slack = 2 * vec if p.layout == "bcl" else 0
    # x window (tile and both halos) and grad_out window (tile and one halo), each with its slack, per channel
    # of the tile (over (B, C, L) with one float in 33 left empty, and one more), and a warp's K + 1 sums
    # (weights and bias) per warp, all as floats; the raw stage holds both windows as stored, in words; the
    # async stage (over (B, L, C)) two copies of both windows as stored
    xw, gw = tile + 2 * halo + slack, tile + halo + slack
    windows = (math.ceil(xw * 33 / 32) + math.ceil(gw * 33 / 32) + 2) if p.layout == "bcl" else (xw + gw) * tc
    if stage == "async":
        windows = 2 * (xw + gw) * tc * p.elem_bytes // 4
    elif stage != "f32":
        xwords = raw_window_words(p, threads, outs, tile + 2 * halo, outs + 2 * halo)
        windows = -(-xwords // 4) * 4 + raw_window_words(p, threads, outs, tile + halo, outs + halo)
    smem = 4 * (windows + threads // 32 * (p.kernel_size + 1) * 32)
    # a thread's run: x and grad_out windows of outs + halo, and outs results, within 96 floats
    run = 2 * (outs + halo) + outs
    return (p.stride == 1 and (tc == 1 if p.layout == "bcl" else tc >= 16) and threads % tc == 0
            and (stage in ("f32", "async") or p.layout == "bcl") and (stage != "async" or p.layout == "blc")
            and (stage != "rawp" or p.elem_bytes == 2)
            and (p.layout == "bcl" or p.channels % vec == 0) and smem <= 48 * 1024 and run <= 96
            and tile <= max(p.length, 256) and walk_ok(p, tile, tiles, walk)
            # 56 registers a thread: 9 blocks of 128 threads (65536 / 1152 = 56.9); 256 threads get 4 blocks
            # (64 registers) and 512 get 2, so only 128 threads reach it; and only on the raw stages.
            # 128: 4 blocks of 128 threads or 2 of 256 (512 threads cannot take more anyway); long filters only
            # 80: 6 blocks of 128 threads or 3 of 256 (1 of 512 would allow 128); (B, L, C) only
            and (regs == 0 or (regs == 56 and threads == 128 and stage in ("raw", "rawp"))
                 or (regs == 128 and threads in (128, 256) and p.kernel_size >= 16)
                 or (regs == 80 and threads in (128, 256) and p.layout == "blc")))


def walk_ok(p: Problem, tile, tiles, walk) -> bool:
    # no walk; a walk in a row where half of it falls short of the row; across the batch's rows where half of
    # it reaches past the row but not past all of them
    half = tile * (tiles // 2)
    return (walk == "row" and (tiles == 1 or half < p.length)) or (
        walk == "across" and tiles > 1 and p.length <= half < p.length * p.batch)


BWD_PROBLEMS = [Problem(4, 64, 1000), Problem(32, 512, 8192, dtype="bf16"), Problem(2, 8, 999, 5, 1, 4, 2),
                Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc"), Problem(2, 24, 100, 9, 1, 4, layout="blc"),
                Problem(3, 16, 5000, 17, 1, 32, 2, dtype="fp16"), Problem(1, 1, 1)]


@pytest.mark.parametrize("p", BWD_PROBLEMS, ids=lambda p: p.key)
def test_bwd_enumeration_matches_brute_force(p):
    from dwgen.families import bwd

    expect = {combo for combo in itertools.product(*bwd.AXES.values()) if brute_force_bwd_ok(p, *combo)}
    every = enumerate_space(p, "bwd")
    # the other families' own tests: tests/test_bwdtc.py, tests/test_causal_families.py
    vs = [v for v in every if v.family.name == "dw1d_bwd"]
    assert {v.family.name for v in every} <= {"dw1d_bwd", "dw1d_bwdtc", "dw1d_bwdlane", "dw1d_bwdwalk"}
    assert {tuple(getattr(v.config, a) for a in bwd.AXES) for v in vs} == expect and expect
    assert all(v.direction == "bwd" and v.family.name == "dw1d_bwd" and v.name.startswith("dw1d_bwd_") for v in vs)
    assert len({v.digest for v in vs}) == len(vs)
    # the forward's space of the same problem is another one, and still the default
    assert enumerate_space(p) == enumerate_space(p, "fwd") and not {v.digest for v in vs} & {
        v.digest for v in enumerate_space(p)}


def test_bwd_space_of_a_small_problem_by_name():
    # (B, C, L) tiles: one channel a block, threads x outs positions no longer than the row (or 256), each
    # staged as floats or as stored; a block walks n tiles only where n / 2 of them would not cover the
    # channel's rows (4 rows of 1000 here: every walk up to 8 tiles), in one row where n / 2 tiles fall short
    # of it, on across rows past that (8 tiles of 256); the raw stage's 128-thread designs again with a
    # ceiling of 56 registers (r56); the lane family's designs follow (tests/test_causal_families.py)
    assert [v.name for v in enumerate_space(Problem(4, 64, 1000), "bwd") if v.family.name == "dw1d_bwd"] == [
        "dw1d_bwd_f32_k3_t128_o2", "dw1d_bwd_f32_k3_t128_o2_b2", "dw1d_bwd_f32_k3_t128_o2_b4",
        "dw1d_bwd_f32_k3_t128_o2_b8_across", "dw1d_bwd_f32_k3_t128_o2_raw", "dw1d_bwd_f32_k3_t128_o2_raw_r56",
        "dw1d_bwd_f32_k3_t128_o2_raw_b2", "dw1d_bwd_f32_k3_t128_o2_raw_b2_r56", "dw1d_bwd_f32_k3_t128_o2_raw_b4",
        "dw1d_bwd_f32_k3_t128_o2_raw_b4_r56", "dw1d_bwd_f32_k3_t128_o2_raw_b8_across",
        "dw1d_bwd_f32_k3_t128_o2_raw_b8_across_r56", "dw1d_bwd_f32_k3_t128_o4", "dw1d_bwd_f32_k3_t128_o4_b2",
        "dw1d_bwd_f32_k3_t128_o4_b4_across", "dw1d_bwd_f32_k3_t128_o4_b8_across", "dw1d_bwd_f32_k3_t128_o4_raw",
        "dw1d_bwd_f32_k3_t128_o4_raw_r56", "dw1d_bwd_f32_k3_t128_o4_raw_b2", "dw1d_bwd_f32_k3_t128_o4_raw_b2_r56",
        "dw1d_bwd_f32_k3_t128_o4_raw_b4_across", "dw1d_bwd_f32_k3_t128_o4_raw_b4_across_r56",
        "dw1d_bwd_f32_k3_t128_o4_raw_b8_across", "dw1d_bwd_f32_k3_t128_o4_raw_b8_across_r56",
        "dw1d_bwd_f32_k3_t256_o2", "dw1d_bwd_f32_k3_t256_o2_b2", "dw1d_bwd_f32_k3_t256_o2_b4_across",
        "dw1d_bwd_f32_k3_t256_o2_b8_across", "dw1d_bwd_f32_k3_t256_o2_raw", "dw1d_bwd_f32_k3_t256_o2_raw_b2",
        "dw1d_bwd_f32_k3_t256_o2_raw_b4_across", "dw1d_bwd_f32_k3_t256_o2_raw_b8_across"]


def test_bwd_golden_names_and_tokens():
    from dwgen.families import bwd

    for p, c, name in ((Problem(32, 512, 8192, dtype="bf16"), bwd.Config(threads=128, outs=16, stage="raw"),
                        "dw1d_bwd_bf16_k3_t128_o16_raw"),
                       (Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc"),
                        bwd.Config(threads=256, outs=16, tc=64), "dw1d_bwd_bf16_k4_t256_o16_c64")):
        v = Variant(p, c, "bwd")
        assert v.name == name
        assert bwd.config_from_tokens(bwd.name_tokens(c), name) == c
    with pytest.raises(ValueError, match="unknown token 'f32'"):
        bwd.config_from_tokens(["t128", "o16", "f32"], "x")  # the default stage has no token
    # the raw stage realigns rows of (B, C, L); over (B, L, C) it is not a variant; fp32 has no parity to permute
    assert violations(Problem(8, 4096, 2048, 4, 1, 3, layout="blc"), bwd.Config(tc=64, stage="raw"), "bwd") == [
        "raw_stage_over_rows"]
    assert violations(Problem(32, 512, 8192), bwd.Config(stage="rawp"), "bwd") == ["permute_needs_halves"]
    assert Variant(Problem(32, 512, 8192, dtype="fp16"), bwd.Config(threads=128, outs=16, stage="rawp"),
                   "bwd").name == "dw1d_bwd_f16_k3_t128_o16_rawp"
    # a register ceiling: 9 blocks of 128 threads asked of ptxas, named r56; out of reach of 256 threads
    # (4 blocks: 64 registers) and of the f32 stage
    target = Problem(32, 512, 8192, dtype="bf16")
    c = bwd.Config(threads=128, outs=16, stage="rawp", tiles=4, regs=56)
    v = Variant(target, c, "bwd")
    assert v.name == "dw1d_bwd_bf16_k3_t128_o16_rawp_b4_r56" and c.min_blocks == 9
    assert bwd.config_from_tokens(bwd.name_tokens(c), v.name) == c
    assert "__launch_bounds__(128, 9)" in render_variant(v)
    assert "__launch_bounds__(128)\n" in render_variant(Variant(target, replace(c, regs=0), "bwd"))
    assert violations(target, replace(c, threads=256, outs=8), "bwd") == ["register_ceiling_reachable"]
    assert violations(target, replace(c, stage="f32"), "bwd") == ["register_ceiling_reachable"]
    # 128 registers (4 blocks of 128 threads, any stage) only for long filters: short ones take fewer anyway
    k31 = Problem(32, 512, 1024, 31, 1, 15, dtype="fp16")
    capped = Variant(k31, bwd.Config(threads=128, outs=8, tiles=4, walk="across", regs=128), "bwd")
    assert capped.name == "dw1d_bwd_f16_k31_t128_o8_b4_across_r128" and capped.config.min_blocks == 4
    assert "__launch_bounds__(128, 4)" in render_variant(capped)
    assert violations(target, replace(c, regs=128), "bwd") == ["register_ceiling_reachable"]
    k17 = Problem(4, 64, 4096, 17, 1, 8)  # 512 threads hold at most 128 registers a thread already
    assert violations(k17, bwd.Config(threads=512, outs=2, regs=128), "bwd") == ["register_ceiling_reachable"]
    assert violations(k17, bwd.Config(threads=256, outs=2, regs=128), "bwd") == []
    # 80 over (B, L, C) only (6 blocks of 128 threads): its SiLU designs hold 96 registers
    mamba = Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc", activation="silu")
    c64 = bwd.Config(threads=128, outs=16, tc=64, tiles=8, regs=80)
    assert Variant(mamba, c64, "bwd").name == "dw1d_bwd_bf16_k4_t128_o16_c64_b8_r80" and c64.min_blocks == 6
    assert "__launch_bounds__(128, 6)" in render_variant(Variant(mamba, c64, "bwd"))
    assert violations(mamba, replace(c64, threads=512, outs=4, regs=80), "bwd") == ["register_ceiling_reachable"]
    assert violations(target, replace(c, regs=80), "bwd") == ["register_ceiling_reachable"]
    # a walk across rows is named, and only where the row is too short for the walk (8192 holds 4 tiles of 2048)
    across = Variant(Problem(8, 64, 2048, 4, 1, 3, dtype="bf16"), replace(c, walk="across", regs=0), "bwd")
    assert across.name == "dw1d_bwd_bf16_k4_t128_o16_rawp_b4_across"
    assert bwd.config_from_tokens(bwd.name_tokens(across.config), across.name) == across.config
    assert "constexpr bool ACROSS = true;" in render_variant(across)
    assert violations(target, replace(c, walk="across"), "bwd") == ["walk_fits"]


def test_bwd_violations_name_the_failed_restrictions():
    from dwgen.families.bwd import RESTRICTIONS as BWD_RESTRICTIONS
    from dwgen.families.bwd import Config as BwdConfig

    names = {r.__name__ for r in BWD_RESTRICTIONS}
    strided = Problem(4, 2048, 8192, 3, 2, 1)
    assert enumerate_space(strided, "bwd") == []
    assert violations(strided, BwdConfig(), "bwd") == ["stride_one"]
    assert violations(Problem(4, 64, 1000), BwdConfig(tc=16), "bwd") == ["tile_matches_layout"]
    # 10 fp32 channels are not whole 16-byte vectors (4 channels) of a channel tile over (B, L, C) memory
    assert violations(Problem(2, 10, 4096, layout="blc"), BwdConfig(tc=16), "bwd") == ["channels_whole_vectors"]
    assert violations(Problem(4, 64, 100), BwdConfig(threads=128, outs=4), "bwd") == ["tile_fits_length"]
    for p in BWD_PROBLEMS:
        for c in all_bwd_configs():
            bad = violations(p, c, "bwd")
            ok = brute_force_bwd_ok(p, c.threads, c.outs, c.tc, c.stage, c.tiles, c.walk, c.regs)
            assert set(bad) <= names and (not bad) == ok


def all_bwd_configs():
    from dwgen.families import bwd

    return [bwd.Config(*combo) for combo in itertools.product(*bwd.AXES.values())]


def test_bwd_known_good_are_valid_where_kept():
    from dwgen.families.bwd import KNOWN_GOOD as BWD_KNOWN_GOOD
    from dwgen.families.bwd import Config as FusedConfig

    for p in BWD_PROBLEMS:
        kept = [c for c in known_good(p, "bwd") if isinstance(c, FusedConfig)]  # the families take turns
        assert kept == [c for c in BWD_KNOWN_GOOD if not violations(p, c, "bwd")]
    assert known_good(Problem(32, 512, 8192), "bwd")
    assert known_good(Problem(8, 4096, 2048, 4, 1, 3, layout="blc"), "bwd")
    assert known_good(Problem(4, 2048, 8192, 3, 2, 1), "bwd") == []


def test_direction_key():
    from dwgen.space import direction_key

    p = Problem(4, 64, 1000)
    assert direction_key(p) == direction_key(p, "fwd") == p.key == "4x64x1000_k3_s1_p1_d1_fp32_bcl_nobias"
    assert direction_key(p, "bwd") == "4x64x1000_k3_s1_p1_d1_fp32_bcl_nobias_bwd"
    with pytest.raises(ValueError, match="unknown direction"):
        direction_key(p, "both")


def test_known_good_asks_the_widest_accesses_first():
    """A 6-trial tune asked only the fp32-shaped designs of a bf16 problem; 16-byte designs go first."""
    for dtype in ("bf16", "fp16"):
        for layout in ("bcl", "blc"):
            p = Problem(8, 512, 4096, 3, 1, 1, 1, dtype, layout=layout)
            widths = [c.vec * p.elem_bytes for c in known_good(p) if hasattr(c, "vec")]  # the CUDA-core designs
            assert widths and widths == sorted(widths, reverse=True) and widths[0] == 16, (dtype, layout, widths)


def test_the_tensor_core_family_joins_16_bit_tunes_only():
    """A (B, C, L) 16-bit problem at stride 1 is tuned over the tensor-core family too, and over the lane family
    where its rows are whole vectors and its padding causal or centred; fp32 ones over the lane family at
    most; strided, odd-length and (B, L, C) ones over their primary family alone. Names, configs and a tune's
    parameters round-trip."""
    from dwgen.space import families_of, make_config, trial_params, tune_axes

    p = Problem(32, 512, 1024, 31, 1, 15, dtype="fp16")
    assert [f.name for f in families_of(p)] == ["dw1d", "dw1d_tc", "dw1d_lane"]
    assert [f.name for f in families_of(Problem(32, 512, 1024, 31, 1, 15))] == ["dw1d", "dw1d_lane"]
    assert [f.name for f in families_of(Problem(32, 512, 1023, 31, 1, 15, dtype="fp16"))] == ["dw1d", "dw1d_tc"]
    for q in (Problem(32, 512, 1023, 31, 1, 15), Problem(4, 64, 4096, 3, 2, 1, dtype="bf16"),
              Problem(8, 512, 2048, 4, 1, 3, dtype="bf16", layout="blc")):
        assert [f.name for f in families_of(q)] == ["dw1d"] and "family" not in tune_axes(q)
    vs = enumerate_space(p)
    tcs = [v for v in vs if v.family.name == "dw1d_tc"]
    lanes = [v for v in vs if v.family.name == "dw1d_lane"]
    assert tcs and lanes and len({v.digest for v in vs}) == len(vs)
    axes = tune_axes(p)
    assert axes["family"] == ("dw1d", "dw1d_tc", "dw1d_lane") and "dw1d_tc.warps" in axes and "threads" in axes
    assert "dw1d_lane.vecs" in axes
    for v in (vs[0], tcs[0], tcs[-1], lanes[0], lanes[-1]):
        params = trial_params(p, v.config)
        assert set(params) <= set(axes) and make_config(p, params) == v.config
        assert make_config(p, v.config_dict) == v.config and config_from_name(v.name, p) == v.config
    assert tcs[0].name.startswith("dw1d_tc_f16_k31_") and "family" in tcs[0].config_dict
    assert lanes[0].name.startswith("dw1d_lane_f16_k31_") and "family" in lanes[0].config_dict
    assert "family" not in vs[0].config_dict  # the primary family's entries stay as they were
    # families take turns in the designs a short tune asks first
    assert [type(c).__module__.rsplit(".", 1)[1] for c in known_good(p)[:5]] == ["bcl", "tc", "lane", "bcl", "tc"]


def test_the_register_cap_is_a_token_and_round_trips():
    p = Problem(16, 1024, 4096, 7, 1, 3, dtype="bf16")
    c = Config(threads=64, vec=8, outs=2, halo="l1", cap=True)
    v = Variant(p, c)
    assert v.name == "dw1d_bf16_k7_t64_v8_o2_l1_oc" and config_from_name(v.name, p) == c
    assert render_variant(v).count("__launch_bounds__(64, 32)") == 1
    assert "__launch_bounds__(64)\n" in render_variant(Variant(p, Config(threads=64, vec=8, outs=2, halo="l1")))
    assert violations(p, Config(threads=64, vec=8, outs=2, walk="row", halo="async", batches=2, cap=True)) == [
        "cap_not_implied"]


def test_digest_covers_the_partials_a_template_includes(monkeypatch):
    from dwgen import space

    assert [name for name, _ in space.with_includes(("dw1d_cl.cu.j2", space.COMMON_TEMPLATE))] == [
        "dw1d_cl.cu.j2", "_common.cu.j2", "_silu_ftz.cu.j2", "_cl_outputs.cu.j2"]
    v = enumerate_space(Problem(2, 16, 300, 4, padding=3, padding_right=0, activation="silu"))[0]
    before = v.digest
    text = space.template_text
    monkeypatch.setattr(space, "template_text",
                        lambda t: text(t) + ("// edited\n" if t == "_silu_ftz.cu.j2" else ""))
    assert v.digest != before  # an edit of the partial stales what is rendered through it


def test_the_gpu_variant_sample_reaches_every_family():
    """tests/gpu/test_variants_gpu.py builds a sample of each problem's space: a (B, C, L) 16-bit problem of
    whole-vector rows at stride 1 must bring window, tensor-core and lane variants (its sampler once stopped at
    the first family without a `vec` axis)."""
    from dwgen.space import families_of
    from tests.gpu.test_variants_gpu import PROBLEMS, sample

    assert {v.family.name for v in sample(Problem(4, 64, 1000, dtype="bf16"))} == {"dw1d", "dw1d_tc", "dw1d_lane"}
    for p in PROBLEMS:
        vs = sample(p)
        assert {v.family.name for v in vs} == {f.name for f in families_of(p)}, p.key


@pytest.mark.parametrize("k, outs, steps, vec, slots, unroll", [
    (15, 4, 16, 2, 20, 5),  # 18 slots would repeat after 9 steps: two more repeat after 5
    (13, 4, 16, 2, 16, 4),
    (8, 4, 16, 4, 12, 3),
    (7, 8, 4, 4, 14, 4),  # a 4-step walk is unrolled whole: no slot beyond the window
    (31, 1, 16, 8, 31, 16),  # 31 steps to repeat, 16 more slots too many: the whole walk unrolled
])
def test_blc_window_slots_repeat_within_the_unrolled_steps(k, outs, steps, vec, slots, unroll):
    from dwgen.families.blc import Config, Tiling

    t = Tiling(Problem(2, 64, 500, k, padding=k // 2, dtype="fp16", layout="blc"),
               Config(threads=128, vec=vec, outs=outs, steps=steps, cthreads=32, rename=True))
    assert (t.slots, t.unroll) == (slots, unroll)
    assert t.slots >= t.window and (t.unroll == steps or t.unroll * t.advance % t.slots == 0)
    moved = Tiling(t.problem, replace(t.config, rename=False))  # the window slid by moves: no extra slots
    assert (moved.slots, moved.unroll) == (moved.window, 1)
