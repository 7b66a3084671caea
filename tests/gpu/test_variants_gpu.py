"""Every variant of a sample, built and put through the worker's correctness gate on the GPU."""
from __future__ import annotations

import random

import pytest

from dwgen import build, render
from dwgen.families.bcl import HALOS
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import enumerate_space, families_of
from dwgen.worker import Candidate, GpuWorker

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Problem(4, 64, 1000),
    Problem(2, 32, 4096, 7, 1, 3, bias=True),
    Problem(4, 64, 2048, 4, 1, 3),  # output length 2051: rows are not whole vectors
    Problem(2, 16, 4096, 3, 2, 1),
    Problem(3, 8, 1024, 31, 1, 15),  # odd batch: a two-row block gets one row at the end
    Problem(2, 8, 999, 5, 1, 4, 2),
    Problem(4, 64, 1000, dtype="bf16"),
    Problem(2, 32, 4097, 7, 1, 3, dtype="fp16", bias=True),
    Problem(3, 16, 1024, 31, 1, 15, dtype="bf16"),
    Problem(2, 16, 3001, 3, 2, 1, dtype="fp16"),
    Problem(4, 256, 1000, 4, 1, 3, dtype="bf16", layout="blc"),
    Problem(2, 64, 999, 5, 2, 4, 2, dtype="fp16", layout="blc", bias=True),
    Problem(3, 96, 513, 3, 1, 1, dtype="fp32", layout="blc"),
    # a 16-bit (B, L, C) walk long enough for the ring's designs, rows ending mid-step, causal SiLU
    Problem(2, 128, 1001, 9, 1, 8, dtype="fp16", layout="blc", padding_right=0, activation="silu"),
    # Mamba's conv over (B, C, L): causal, SiLU (the lane family's spread runs among its designs)
    Problem(3, 16, 2048, 4, 1, 3, dtype="bf16", padding_right=0, activation="silu"),
]


# Code paths a random sample could miss: one (B, C, L) variant of each halo, and a block walking several
# rows with each halo a row walk takes.
FEATURES = [(f"halo {h}", lambda v, h=h: v.config.halo == h) for h in HALOS] + [
    (f"rows {h}", lambda v, h=h: v.config.batches > 1 and v.config.halo == h) for h in HALOS]


def sample(p: Problem, n: int = 10, per_family: int = 3):
    """The primary family's feature variants, a few of each other family that serves p (tensor-core, lane), then
    n more at random from the whole space."""
    vs = enumerate_space(p)
    rng = random.Random(0)
    primary, *others = families_of(p)
    own = [v for v in vs if v.family == primary]
    picked, widest_first = [], sorted(own, key=lambda v: -v.config.vec)  # vectors exercise the offset cases
    if p.layout == "bcl":
        for _, has in FEATURES:
            v = next((v for v in widest_first if has(v) and v not in picked), None)
            if v is not None:
                picked.append(v)
    else:  # the widest design, then each ring depth (its cp.async order on the device itself), each renamed too
        picked.append(widest_first[0])
        for ring in (2, 4):
            for rename in (False, True):
                v = next((v for v in widest_first if (v.config.ring, v.config.rename) == (ring, rename)
                          and v not in picked), None)
                if v is not None:
                    picked.append(v)
    for family in others:
        theirs = [v for v in vs if v.family == family]
        picked += rng.sample(theirs, min(per_family, len(theirs)))
    rest = [v for v in vs if v not in picked]
    return picked + rng.sample(rest, min(n, len(rest)))


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_sampled_variants_pass_the_gate(p, tmp_path):
    import torch

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    vs = sample(p)
    builds = build.compile_many([(v.name, render.render_variant(v), build.build_key(v.digest, arch)) for v in vs],
                                tmp_path, arch=arch)
    worker = GpuWorker(p)
    try:
        results = [worker.evaluate(Candidate(v, b.library), Result(v.name, v.digest, "ok"))
                   for v, b in zip(vs, builds, strict=True)]
    finally:
        worker.close()
    bad = [r.summary() for r in results if not r.ok]
    assert not bad, bad
    # Every result here passed, so every one must say how close it came; a missing error is a failure
    # (fp16 outputs below the normal range may exceed the relative bound by their absolute floor).
    errors = {r.name: r.max_rel_error for r in results}
    assert all(e is not None and e < float("inf") for e in errors.values()), errors
