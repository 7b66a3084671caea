"""Every call the search's checks make of a fast generic backward candidate, its own launch function takes.

search.generic builds each candidate once (a narrow one on its scope's stand-in) and measures it on the training
shapes its scope admits; the worker checks it there on the shape and on the family's edge problems, with each
activation it asks for. A launch that refuses one of those calls drops the candidate whole, which only the GPU
showed so far (thirty-ninth session: every lane candidate, checked with SiLU on the centred shapes). Here each
candidate's rendered source runs on the CPU (tests/cuda_on_cpu.h) with EMU_DRY_LAUNCH set: its launch function
validates the call and sizes its grid as on the device, against the device's grid limits, and no block runs, so
the GPU shapes cost nothing. The split backward (streams and events in its launch) is left to its own tests."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from dwgen.problem import ACTIVATIONS
from tests.backward_checks import asked
from tests.cuda_on_cpu import build_all

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# stdin: one call a line (B, C, L, Lout, P, act, bias); stdout: the launch's return code for each. Buffers of a few
# bytes on 64-byte boundaries (no block runs).
DRY_MAIN = r"""
int main() {
    void* buf[7];
    for (auto& p : buf) p = std::aligned_alloc(64, 64);
    long long v[7];
    while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) == 7) {
        if (CAT(dwgen_workspace_, NAME)(v[0], v[1], v[2], v[3], v[4]) < 0) return 3;
        const int rc = CAT(dwgen_launch_, NAME)(buf[0], buf[1], buf[2], v[6] ? buf[3] : nullptr, buf[4], buf[5],
                                                buf[6], buf[0], v[0], v[1], v[2], v[3], v[4], v[5], nullptr);
        std::printf("%d\n", rc);
    }
    return 0;
}
"""


def launch_codes(exe, calls) -> list[int]:
    """Each call's return code from the binary's launch function, no block run (EMU_DRY_LAUNCH)."""
    lines = "".join(f"{q.batch} {q.channels} {q.length} {q.out_length} {q.padding} "
                    f"{ACTIVATIONS.index(q.activation)} {int(q.bias)}\n" for q in calls)
    proc = subprocess.run([str(exe)], input=lines, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "EMU_DRY_LAUNCH": "1"})
    assert proc.returncode == 0, f"{exe.name}: exit {proc.returncode} {proc.stderr[-500:]}"
    codes = [int(c) for c in proc.stdout.split()]
    assert len(codes) == len(calls)
    return codes


KEYS = (("bf16", 4, "bcl"), ("fp32", 7, "bcl"), ("fp16", 9, "bcl"), ("bf16", 4, "blc"), ("fp16", 7, "blc"),
        ("fp32", 3, "blc"))



@pytest.mark.parametrize("dtype,k,layout", KEYS, ids=[f"{d}_{lay}_k{k}" for d, k, lay in KEYS])
def test_each_call_the_checks_make_of_a_generic_backward_candidate_is_taken_by_its_launch(dtype, k, layout, tmp_path):
    from dwgen.space import scope_admits
    from search.generic import candidate_variants, training_problems

    variants = [v for v in candidate_variants(k, dtype, layout, "bwd") if v.family.name != "dw1d_bwdtc"]
    narrow = "causal_or_centred" if layout == "bcl" else "left_halo"
    assert {v.family.generic_scope for v in variants} == {"any", narrow}
    exes = build_all(variants, tmp_path, DRY_MAIN)
    refused = []
    for p in training_problems(k, dtype, layout, "bwd"):
        for v in (v for v in variants if scope_admits(v.family.generic_scope, p)):
            calls = asked(v, p)
            refused += [f"{v.name} on {q.key} ({q.activation}, measured on {p.key}): {rc}"
                        for q, rc in zip(calls, launch_codes(exes[v.name], calls), strict=True) if rc != 0]
    assert not refused, f"{len(refused)} calls refused, e.g. " + "; ".join(refused[:3])


LANE_SIGNATURES = (("bf16", 1), ("bf16", 9), ("fp32", 2), ("fp32", 8))


def test_a_narrow_lane_kernel_takes_every_call_its_scope_admits():
    """The dispatcher runs a frozen lane design (built on its scope's stand-in, at K 1 to 9) for every call that
    space.scope_admits("causal_or_centred", ...) takes; its launch must take each of them (a refusal would reach
    the user as an error from a call the module promised to run), including a batch of 65535 rows and rows of
    2^30 positions."""
    import random

    from dwgen.problem import Problem, ProblemError
    from dwgen.space import Variant, generic_problem, scope_admits, scope_stand_in, violations
    from search.generic import candidate_variants

    designs = [v.config for v in candidate_variants(4, "bf16", "bcl", "bwd") if v.family.name == "dw1d_bwdlane"]
    variants = []
    for dtype, k in LANE_SIGNATURES:
        stand_in = scope_stand_in(generic_problem(k, dtype), "causal_or_centred")
        variants += [Variant(stand_in, c, "bwd") for c in designs if not violations(stand_in, c, "bwd")]
    assert len(variants) >= 3 * len(LANE_SIGNATURES)
    import tempfile
    from pathlib import Path

    rng = random.Random(39)
    with tempfile.TemporaryDirectory() as tmp:
        exes = build_all(variants, Path(tmp), DRY_MAIN)
        for v in variants:
            p, vec = v.problem, 16 // v.problem.elem_bytes
            h = p.halo
            calls = []
            while len(calls) < 200:
                left, right = rng.choice([(h, 0), (h // 2, h - h // 2), (0, h), (h, h)])
                try:  # Problem itself refuses 2^31 elements or more (the op splits no batch either)
                    q = Problem(rng.choice([1, 2, 3, 7, 64, 1000, 65535]), rng.choice([1, 5, 768, 4096, 1 << 20]),
                                vec * rng.choice([1, 2, 37, 1024, 1 << 17, (1 << 30) // vec]), p.kernel_size, 1,
                                left, 1, p.dtype, padding_right=right, bias=rng.random() < 0.5,
                                activation=rng.choice(ACTIVATIONS))
                except ProblemError:
                    continue
                if scope_admits("causal_or_centred", q):
                    calls.append(q)
            codes = launch_codes(exes[v.name], calls)
            refused = [f"{q.key}: {rc}" for q, rc in zip(calls, codes, strict=True) if rc != 0]
            assert not refused, f"{v.name} refused {len(refused)} of the calls its scope admits, e.g. {refused[:3]}"


WALK_SIGNATURES = (("bf16", 1), ("bf16", 4), ("fp16", 9), ("fp32", 4))


def test_a_narrow_walk_kernel_takes_every_call_its_scope_admits(tmp_path):
    """The same for the walk backward over (B, L, C) (scope left_halo): each of search.generic's walk designs that
    fits, on its scope's stand-in, takes every call space.scope_admits("left_halo", ...) lets the dispatcher send
    it: the halo on the left, any right padding, SiLU or not, channels in whole vectors, batches and rows up to
    the grid's bound (B * ceil(Lout / 1024) <= 65535)."""
    import random

    from dwgen.problem import Problem, ProblemError
    from dwgen.space import Variant, generic_problem, scope_admits, scope_stand_in, violations
    from search.generic import bwd_candidates

    designs = [c for c in bwd_candidates("bf16", "blc") if type(c).__module__.endswith("bwdwalk")]
    variants = []
    for dtype, k in WALK_SIGNATURES:
        stand_in = scope_stand_in(generic_problem(k, dtype, "blc"), "left_halo")
        variants += [Variant(stand_in, c, "bwd") for c in designs if not violations(stand_in, c, "bwd")]
    assert len(variants) >= 2 * len(WALK_SIGNATURES)
    exes = build_all(variants, tmp_path, DRY_MAIN)
    rng = random.Random(40)
    for v in variants:
        p, h, calls = v.problem, v.problem.halo, []
        while len(calls) < 200:
            try:  # Problem itself refuses 2^31 elements or more (the dispatchers' fits() too)
                q = Problem(rng.choice([1, 2, 3, 64, 1000, 65535]), v.config.vec * rng.choice([1, 5, 192, 4096]),
                            rng.choice([1, 7, 300, 1024, 1025, 1 << 17, 1 << 20]), p.kernel_size, 1, h, 1, p.dtype,
                            padding_right=rng.choice([0, 1, h, 100]), bias=rng.random() < 0.5, layout="blc",
                            activation=rng.choice(ACTIVATIONS))
            except ProblemError:
                continue
            if scope_admits("left_halo", q):
                calls.append(q)
        refused = [f"{q.key}: {rc}" for q, rc in zip(calls, launch_codes(exes[v.name], calls), strict=True) if rc != 0]
        assert not refused, f"{v.name} refused {len(refused)} of the calls its scope admits, e.g. {refused[:3]}"
