"""tune.py --stand-in on the GPU: a small strided stand-in's finalists are checked and re-timed at its other sizes
through the real GPU worker, and the winner is one of those that ran there."""
from __future__ import annotations

import re

import pytest

from dwgen.problem import Problem
from search import standin, workflow

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # compiles a few variants

P = Problem(2, 256, 3000, kernel_size=3, stride=3, padding=1, dtype="bf16")


def test_a_stand_in_tune_weighs_its_finalists_at_the_other_sizes(tmp_path):
    lines: list[str] = []
    winners: list = []
    rc = workflow.tune([P], trials=4, timeout_s=None, sampler="tpe", seed=0, storage="memory",
                       runs_dir=tmp_path / "runs", out_dir=tmp_path / "generated", freeze=False, jobs=None,
                       quiet=True, log=lines.append, report=winners.extend, stand_in=True)
    (w,) = winners
    assert rc == 0 and w.result.ok and w.variant.problem == P
    for q in standin.other_sizes(P):
        timed = [s for s in lines if s.startswith(f"stand-in: re-timed at {standin.shape_text(q)}")]
        assert len(timed) == 1, "\n".join(lines)
        assert w.variant.name in timed[0] and re.search(r"copy_ \d", timed[0])
    assert any(s.startswith("stand-in: each finalist's time over the fastest's") for s in lines)
    sizes = w.stand_in["sizes"]  # what the manifest records of it, from the real worker's re-timing
    assert list(sizes) == [standin.shape_text(q) for q in standin.other_sizes(P)]
    assert all(t["kernel_ms"] > 0 and t["x_copy"] == t["kernel_ms"] / t["copy_ms"] for t in sizes.values())
