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
