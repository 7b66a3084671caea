"""Every fault of dwgen.faults in one search beside real variants: each is a failed trial with its reason, the
worker is replaced where it must be, the search finishes, a real variant wins, and the GPU serves the next
problem."""
from __future__ import annotations

import re
import time

import pytest

from dwgen import faults
from dwgen.faults import FAULTS, FaultVariant
from dwgen.problem import Problem
from dwgen.space import Variant, known_good
from dwgen.worker import Candidate, GpuWorker
from search import loop
from search import study as st
from search.workflow import make_builder

pytestmark = pytest.mark.gpu

P = Problem(4, 64, 4096)
NEXT = Problem(2, 32, 1000, 5, 1, 2, bias=True)
RUN_TIMEOUT_S = 30.0  # the kernel that never ends costs this much
COMPILE_TIMEOUT_S = 30.0  # and the compile that never ends this much; real variants take a few seconds


def arch() -> str:
    import torch

    return "sm_{}{}".format(*torch.cuda.get_device_capability())


def test_a_search_survives_every_fault(tmp_path):
    build = make_builder(tmp_path / "build", arch(), jobs=None, timeout_s=COMPILE_TIMEOUT_S, source=faults.source)
    extra = faults.faults_for(P)
    study = st.open_study(P, st.default_storage(tmp_path), "tpe", 0)
    worker = GpuWorker(P, timeout_s=RUN_TIMEOUT_S)
    lines: list[str] = []
    t0 = time.monotonic()
    try:
        known, stats = loop.search(P, study, build, worker, trials=6, batch=3, extra=extra, log=lines.append)
        decided = loop.decide(known, build, worker)
    finally:
        worker.close()
    print("\n".join(lines), f"\n{time.monotonic() - t0:.0f} s, worker restarts {worker.restarts}")

    for v in extra:
        r = known[v.digest][1]
        want = FAULTS[v.fault]
        assert r.status == want.status and re.search(want.reason, r.message), (v.fault, r.status, r.message)
    recorded = {st.trial_result(t).name: st.trial_result(t) for t in study.trials if t.user_attrs.get(st.EXTRA_ATTR)}
    assert {v.name for v in extra} == set(recorded) and not any(r.ok for r in recorded.values())
    # oob_write, misaligned and hang poison or stall their worker; launch_resources takes it down too
    assert worker.restarts >= 3
    assert stats.evaluated == 6 and stats.correct == 6, stats
    winner, result, _ = decided
    assert not isinstance(winner, FaultVariant) and result.ok


def test_the_gpu_serves_the_next_problem_after_the_faults(tmp_path):
    # What a hung kernel, an illegal address and a misaligned store leave behind, if anything, shows here.
    build = make_builder(tmp_path / "build", arch(), jobs=None, timeout_s=COMPILE_TIMEOUT_S, source=faults.source)
    bad = [v for v in faults.faults_for(P) if v.fault in ("hang", "oob_write", "misaligned")]
    worker = GpuWorker(P, timeout_s=RUN_TIMEOUT_S)
    try:
        for v, r in zip(bad, loop.check_each(worker, bad, build(bad)), strict=True):
            assert not r[0].ok, v.fault
    finally:
        worker.close()
    good = Variant(NEXT, known_good(NEXT)[0])
    worker = GpuWorker(NEXT, timeout_s=RUN_TIMEOUT_S)
    try:
        (b,) = build([good])
        r = worker.evaluate(Candidate(good, b.library), loop.build_result(good, b))
    finally:
        worker.close()
    assert r.ok and r.kernel_ms > 0, r.message
