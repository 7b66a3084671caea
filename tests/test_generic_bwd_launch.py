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
import types

import pytest

from dwgen.problem import ACTIVATIONS
from tests.cuda_on_cpu import build_all

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# argv: B, C, L, Lout, P, act, bias; buffers of a few bytes on 64-byte boundaries (no block runs)
DRY_MAIN = r"""
int main(int argc, char** argv) {
    if (argc != 8) return 2;
    long long v[7];
    for (int i = 0; i < 7; ++i) v[i] = std::atoll(argv[1 + i]);
    void* buf[7];
    for (auto& p : buf) p = std::aligned_alloc(64, 64);
    const long long ws = CAT(dwgen_workspace_, NAME)(v[0], v[1], v[2], v[3], v[4]);
    if (ws < 0) return 3;
    const int rc = CAT(dwgen_launch_, NAME)(buf[0], buf[1], buf[2], v[6] ? buf[3] : nullptr, buf[4], buf[5], buf[6],
                                            buf[0], v[0], v[1], v[2], v[3], v[4], v[5], nullptr);
    std::printf("%d\n", rc);
    return 0;
}
"""

KEYS = (("bf16", 4), ("fp32", 7), ("fp16", 9))


def asked(candidate, problem) -> list:
    """The (call, activation) pairs the worker's checks make of a candidate measured on problem."""
    from dwgen import check, worker

    seen = []
    mp = pytest.MonkeyPatch()
    mp.setattr(check, "check_backward", lambda q, run, seeds: seen.append(q))
    try:
        bench = object.__new__(worker._BwdBench)  # its __init__ needs a GPU; checks() reads the problem alone
        bench.problem = problem
        list(bench.checks(types.SimpleNamespace(variant=candidate)))
    finally:
        mp.undo()
    return seen


@pytest.mark.parametrize("dtype,k", KEYS, ids=[f"{d}_k{k}" for d, k in KEYS])
def test_each_call_the_checks_make_of_a_generic_backward_candidate_is_taken_by_its_launch(dtype, k, tmp_path):
    from dwgen.space import scope_admits
    from search.generic import candidate_variants, training_problems

    variants = [v for v in candidate_variants(k, dtype, "bcl", "bwd") if v.family.name != "dw1d_bwdtc"]
    assert {v.family.generic_scope for v in variants} == {"any", "causal_or_centred"}
    exes = build_all(variants, tmp_path, DRY_MAIN)
    env = {**os.environ, "EMU_DRY_LAUNCH": "1"}
    refused = []
    for p in training_problems(k, dtype, "bcl", "bwd"):
        for v in (v for v in variants if scope_admits(v.family.generic_scope, p)):
            for q in asked(v, p):
                args = [q.batch, q.channels, q.length, q.out_length, q.padding, ACTIVATIONS.index(q.activation),
                        int(q.bias)]
                proc = subprocess.run([str(exes[v.name]), *map(str, args)], capture_output=True, text=True,
                                      env=env, timeout=60)
                assert proc.returncode == 0, f"{v.name} on {q.key}: exit {proc.returncode} {proc.stderr[-500:]}"
                if proc.stdout.strip() != "0":
                    refused.append(f"{v.name} on {q.key} ({q.activation}, measured on {p.key}): {proc.stdout.strip()}")
    assert not refused, f"{len(refused)} calls refused, e.g. " + "; ".join(refused[:3])
