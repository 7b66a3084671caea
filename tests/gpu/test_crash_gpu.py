"""A variant that kills the CUDA context costs that variant only: the search goes on."""
from __future__ import annotations

import pytest

from dwgen import build, contract, render
from dwgen.problem import Problem
from dwgen.worker import GpuWorker
from search import loop
from search import study as st

pytestmark = pytest.mark.gpu

P = Problem(4, 64, 4096)
# A kernel that writes far out of bounds, behind a launch function that keeps the contract.
CRASHING = ('#include <cuda_runtime.h>\n'
            'extern "C" __global__ void {name}(float* y) {{ y[(long long)blockIdx.x * 400000000LL] = 1.0f; }}\n'
            'extern "C" int {symbol}({params}) {{ {name}<<<64, 32, 0, (cudaStream_t)stream>>>((float*)y); '
            'return (int)cudaGetLastError(); }}\n')


def test_search_survives_a_crashing_variant(tmp_path):
    import torch

    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    victims: list[str] = []

    def builder(variants, on_done=None):
        jobs = []
        for v in variants:
            src = render.render_variant(v)
            if not victims:  # the first variant built is replaced by one that writes far out of bounds
                victims.append(v.digest)
                src = CRASHING.format(name=v.name, symbol=contract.launch_symbol(v.name), params=contract.cpp_params())
            jobs.append((v.name, src, build.build_key(v.digest, arch) + ("-crash" if v.digest in victims else "")))
        return build.compile_many(jobs, tmp_path, arch=arch, on_done=on_done)

    study = st.open_study(P, None, "random", 0)
    worker = GpuWorker(P)
    try:
        known, stats = loop.search(P, study, builder, worker, trials=6, batch=3, log=print)
    finally:
        worker.close()
    statuses = {d: r.status for d, (_, r) in known.items()}
    assert statuses[victims[0]] in ("crashed", "launch_error")
    assert stats.evaluated == 6 and stats.correct == 5 and worker.restarts >= 1


def test_one_worker_serves_several_problems_and_restarts_on_the_last(tmp_path):
    """search.generic's worker: checks (edge problems at the first problem only), switches problem in the same
    child, re-times there; a variant that kills the child costs that variant, and the next child starts on the
    problem switched to."""
    import torch

    from dwgen.worker import Candidate
    from search import workflow
    from search.generic import candidate_variants

    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    designs = [v for v in candidate_variants(3, "fp32", "bcl") if v.family.generic_scope == "any"][:2]
    crashing = designs[0]  # the same design, its source replaced by one that writes far out of bounds
    build = workflow.make_builder(tmp_path, arch, None)
    builds = build(designs)
    assert all(b.ok for b in builds)
    crash_build = workflow.make_builder(tmp_path / "crash", arch, None, source=lambda v: CRASHING.format(
        name=v.name, symbol=contract.launch_symbol(v.name), params=contract.cpp_params()))([crashing])[0]
    cands = [Candidate(v, b.library) for v, b in zip(designs, builds, strict=True)]
    first, second = Problem(2, 32, 1000, 3, 1, 1), Problem(3, 16, 4099, 3, 1, 2, bias=True)
    worker = GpuWorker(first)
    try:
        worker.switch(second)
        worker.switch(first)
        assert worker.starts == 0  # nothing started before the first call
        r = worker.check(cands[0], loop.build_result(designs[0], builds[0]))
        assert r.status == "ok" and r.kernel_ms is None and worker.starts == 1
        worker.switch(second)
        for c, v, b in zip(cands, designs, builds, strict=True):
            assert worker.check(c, loop.build_result(v, b), edges=False).status == "ok"
        times = worker.retime(cands, 5)
        assert set(times) == {"copy_", "torch", *(v.name for v in designs)} and worker.starts == 1
        dead = worker.check(Candidate(crashing, crash_build.library), loop.build_result(crashing, crash_build))
        assert dead.status in ("crashed", "launch_error")
        assert worker.check(cands[1], loop.build_result(designs[1], builds[1]), edges=False).status == "ok"
        assert worker.starts == 2 and worker.problem == second and worker.baselines()["copy_ms"] > 0
    finally:
        worker.close()
