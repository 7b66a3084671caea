"""Every variant of a sample, built and put through the worker's correctness gate on the GPU."""
from __future__ import annotations

import random

import pytest

from dwgen import build, render
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import HALOS, enumerate_space
from dwgen.worker import Candidate, GpuWorker

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Problem(4, 64, 1000),
    Problem(2, 32, 4096, 7, 1, 3, bias=True),
    Problem(4, 64, 2048, 4, 1, 3),  # output length 2051: scalar variants only
    Problem(2, 16, 4096, 3, 2, 1),
    Problem(3, 8, 1024, 31, 1, 15),  # odd batch: a two-row block gets one row at the end
    Problem(2, 8, 999, 5, 1, 4, 2),
]


# Code paths a random sample could miss: one variant of each halo, and a block walking several rows with
# each halo a row walk takes.
FEATURES = [(f"halo {h}", lambda v, h=h: v.config.halo == h) for h in HALOS] + [
    (f"rows {h}", lambda v, h=h: v.config.batches > 1 and v.config.halo == h) for h in HALOS]


def sample(p: Problem, n: int = 10):
    vs = enumerate_space(p)
    rng = random.Random(0)
    picked, widest_first = [], sorted(vs, key=lambda v: -v.config.vec)  # vectors exercise the offset cases
    for _, has in FEATURES:
        v = next((v for v in widest_first if has(v) and v not in picked), None)
        if v is not None:
            picked.append(v)
    return picked + rng.sample([v for v in vs if v not in picked], min(n, len(vs) - len(picked)))


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
        results = [worker.evaluate(Candidate(v, b.cubin), Result(v.name, v.digest, "ok"))
                   for v, b in zip(vs, builds, strict=True)]
    finally:
        worker.close()
    bad = [r.summary() for r in results if not r.ok]
    assert not bad, bad
    # Every result here passed, so every one must say how close it came; a missing error is a failure.
    errors = {r.name: r.max_rel_error for r in results}
    assert all(e is not None and e < 1e-5 for e in errors.values()), errors
