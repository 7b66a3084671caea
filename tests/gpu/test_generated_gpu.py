"""The committed frozen module against the float64 reference on random problems."""
from __future__ import annotations

import random

import pytest

from dwgen import check, freeze
from dwgen.problem import Problem
from tests.conftest import ROOT

pytestmark = pytest.mark.gpu


def random_problems(n: int = 12) -> list[Problem]:
    rng = random.Random(1234)
    out = []
    while len(out) < n:
        k = rng.choice([1, 2, 3, 4, 5, 7, 9, 31])
        try:
            out.append(Problem(rng.randint(1, 4), rng.randint(1, 96), rng.randint(1, 5000), k,
                               rng.choice([1, 1, 2, 3]), rng.randint(0, k), rng.choice([1, 1, 2]),
                               bias=rng.random() < 0.5))
        except Exception:
            continue
    return out


def run_and_compare(p: Problem, x=None, seed: int = 0):
    import torch

    import generated

    x0, w, b = check.make_inputs(p, seed)
    x = x0 if x is None else x
    y = generated.depthwise_conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation)
    torch.cuda.synchronize()
    ref, scale = check.reference(p, x, w, b)
    outcome = check.compare(p, y, ref, scale)
    assert outcome.ok, outcome.message
    return generated.kernel_for(x, w, b, p.stride, p.padding, p.dilation)


MANIFEST = freeze.read_manifest(ROOT / "generated")


def expected_generic(p: Problem) -> str:
    fast = MANIFEST["generic"]["fast"]
    if p.stride == 1 and p.dilation == 1 and str(p.kernel_size) in fast:
        return fast[str(p.kernel_size)]
    return MANIFEST["generic"]["scalar"]["name"]


def test_tuned_problems_run_their_tuned_kernel():
    for e in MANIFEST["entries"]:
        p = Problem(**e["problem"])
        for seed in (0, 1):
            assert run_and_compare(p, seed=seed) == e["kernel"]


@pytest.mark.parametrize("p", random_problems(24), ids=lambda p: p.key)
def test_generic_paths_match_reference(p):
    assert run_and_compare(p) == expected_generic(p)


def test_misaligned_and_strided_inputs():
    import torch

    import generated

    e = next(e for e in MANIFEST["entries"] if e["key"].startswith("32x512x8192_"))
    p = Problem(**e["problem"])
    x, _, _ = check.make_inputs(p, 5)
    flat = torch.empty(x.numel() + 1, device="cuda")
    shifted = flat[1:].view_as(x)  # contiguous, but 4 bytes off the vector boundary
    shifted.copy_(x)
    assert run_and_compare(p, shifted, seed=5) == MANIFEST["generic"]["scalar"]["name"]

    wide = torch.randn(p.batch, p.channels, p.length * 2, device="cuda")[..., ::2]  # not contiguous
    _, w, b = check.make_inputs(p, 6)
    y = generated.depthwise_conv1d(wide, w, b, p.stride, p.padding, p.dilation)
    ref, scale = check.reference(p, wide.contiguous(), w, b)
    outcome = check.compare(p, y, ref, scale)
    assert outcome.ok, outcome.message
    assert generated.kernel_for(wide, w, b, p.stride, p.padding, p.dilation) == e["kernel"]
