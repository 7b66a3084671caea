"""Backward variants, built and put through the backward worker's check and timing on the GPU, as tune.py
--direction bwd does: each correct one timed beside copy_ and PyTorch's backward, a broken one caught."""
from __future__ import annotations

import random

import pytest

from dwgen import build, render
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import enumerate_space
from dwgen.worker import BwdGpuWorker, Candidate

pytestmark = pytest.mark.gpu

PROBLEMS = [
    Problem(4, 64, 1000),
    Problem(2, 32, 4097, 7, 1, 3, dtype="fp16", bias=True),
    Problem(3, 16, 1024, 31, 1, 15, dtype="bf16"),
    Problem(2, 8, 999, 5, 1, 4, 2),  # dilation 2
    Problem(4, 256, 1000, 4, 1, 3, dtype="bf16", layout="blc"),
    Problem(3, 96, 513, 3, 1, 1, layout="blc", bias=True),
]


def _arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _built(vs, tmp_path):
    arch = _arch()
    return build.compile_many([(v.name, render.render_variant(v), build.build_key(v.digest, arch)) for v in vs],
                              tmp_path, arch=arch)


def _evaluated(worker, vs, builds) -> list[Result]:
    """Each built variant through the worker's check (and timing), as the search puts it."""
    assert all(b.ok for b in builds), [b.log for b in builds if not b.ok]
    return [worker.evaluate(Candidate(v, b.library), Result(v.name, v.digest, "ok", direction="bwd"))
            for v, b in zip(vs, builds, strict=True)]


def _all_pass(p, vs, tmp_path) -> None:
    """Each variant built and put through the worker's check on p (and its edge problems), none failing and no
    worker restarted."""
    worker = BwdGpuWorker(p)
    try:
        results = _evaluated(worker, vs, _built(vs, tmp_path))
        assert not [r.summary() for r in results if not r.ok]
    finally:
        worker.close()
    assert worker.restarts == 0


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_sampled_backward_variants_pass_the_workers_check(p, tmp_path):
    space = enumerate_space(p, "bwd")
    vs = random.Random(0).sample(space, min(5, len(space)))
    builds = _built(vs, tmp_path)
    worker = BwdGpuWorker(p)
    try:
        results = _evaluated(worker, vs, builds)
        bad = [r.summary() for r in results if not r.ok]
        assert not bad, bad
        assert all(r.direction == "bwd" and r.kernel_ms > 0 and r.copy_ms > 0 and r.torch_ms > 0
                   and 0 <= r.max_rel_error < float("inf") for r in results)
        cands = [Candidate(v, b.library) for v, b in zip(vs[:2], builds[:2], strict=True)]
        times = worker.retime(cands, 5)
        assert set(times) == {"copy_", "torch", *(c.variant.name for c in cands)} and min(times.values()) > 0
    finally:
        worker.close()
    assert worker.restarts == 0


# The split backward (weight-gradient kernel on CUDA or tensor cores, grad_x on tensor cores): Conformer's K31
# and a causal, dilated bf16 K17 with bias, two variants of each weight-gradient kernel (the worker checks
# them on their edge problems too).
SPLIT_PROBLEMS = [Problem(4, 32, 1024, 31, 1, 15, dtype="fp16"),
                  Problem(3, 16, 999, 17, 1, 32, 2, dtype="bf16", bias=True, padding_right=0)]


@pytest.mark.parametrize("p", SPLIT_PROBLEMS, ids=lambda p: p.key)
def test_sampled_split_backward_variants_pass_the_workers_check(p, tmp_path):
    space = [v for v in enumerate_space(p, "bwd") if v.family.name == "dw1d_bwdtc"]
    vs = [v for kind in ("fma", "mma") for v in random.Random(1).sample(
        [v for v in space if v.config.wgrad == kind], 2)]  # both weight-gradient kernels
    _all_pass(p, vs, tmp_path)


# The causal families, each on three problems: the lane backward over (B, C, L) (rows of whole vectors, halos
# by warp shuffles) and the walking backward over (B, L, C) (channels in whole vectors): Mamba's conv with
# SiLU, a dilated fp32 one with bias, fp16 rows of several chunks or blocks; each variant also on its family's
# edge problems.
CAUSAL_CASES = [("dw1d_bwdlane", 2, p) for p in (
    Problem(4, 32, 2048, 4, 1, 3, dtype="bf16", padding_right=0, activation="silu"),
    Problem(3, 16, 1000, 3, 1, 4, 2, bias=True, padding_right=0),
    Problem(2, 24, 4104, 4, 1, 3, dtype="fp16", bias=True, padding_right=0, activation="silu"))] + [
    ("dw1d_bwdwalk", 3, p) for p in (
        Problem(4, 256, 2048, 4, 1, 3, dtype="bf16", layout="blc", padding_right=0, activation="silu"),
        Problem(3, 96, 1000, 3, 1, 4, 2, bias=True, layout="blc", padding_right=0),
        Problem(2, 128, 4100, 4, 1, 3, dtype="fp16", bias=True, layout="blc", padding_right=0, activation="silu"))]


@pytest.mark.parametrize("family,seed,p", CAUSAL_CASES, ids=[f"{f}-{p.key}" for f, _, p in CAUSAL_CASES])
def test_sampled_causal_backward_variants_pass_the_workers_check(family, seed, p, tmp_path):
    space = [v for v in enumerate_space(p, "bwd") if v.family.name == family]
    vs = random.Random(seed).sample(space, min(4, len(space)))
    _all_pass(p, vs, tmp_path)


def test_a_forward_library_is_no_backward_kernel(tmp_path):
    """A library whose launch is not the backward's (here, no such symbol) fails the candidate, not the search."""
    p = Problem(4, 64, 1000)
    fwd, bwd = enumerate_space(p)[0], enumerate_space(p, "bwd")[0]
    (b,) = _built([fwd], tmp_path)
    worker = BwdGpuWorker(p)
    try:
        r = worker.evaluate(Candidate(bwd, b.library), Result(bwd.name, bwd.digest, "ok", direction="bwd"))
        assert not r.ok and r.status in ("crashed", "launch_error")
        (good,) = _built([bwd], tmp_path)
        assert worker.evaluate(Candidate(bwd, good.library), Result(bwd.name, bwd.digest, "ok", direction="bwd")).ok
    finally:
        worker.close()


def test_the_stream_check_catches_a_backward_launched_elsewhere(tmp_path):
    import torch

    from dwgen import check
    from dwgen.worker import BwdLauncher

    p = Problem(4, 64, 1000)
    v = enumerate_space(p, "bwd")[0]
    (b,) = _built([v], tmp_path)
    launcher = BwdLauncher(Candidate(v, b.library))
    other = torch.cuda.Stream()

    def on_its_stream(q, x, w, b, gy, gx, gw, gb):
        launcher.prepare(q, gy, x, w, b, gx, gw, gb)()

    def elsewhere(q, x, w, b, gy, gx, gw, gb):
        with torch.cuda.stream(other):  # not the stream the caller gave it
            launcher.prepare(q, gy, x, w, b, gx, gw, gb)()

    try:
        assert check.check_backward_stream(p, on_its_stream).ok
        bad = check.check_backward_stream(p, elsewhere)
        assert not bad.ok and "stream it was given" in bad.message
    finally:
        torch.cuda.synchronize()
        launcher.unload()
