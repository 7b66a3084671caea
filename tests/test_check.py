"""The float64 references on the CPU: a problem's left and right padding and its activation are what the
reference computes, forward and backward, and what PyTorch's side of a timing computes."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from dwgen import bench, check
from dwgen.problem import Problem

CAUSAL = [Problem(2, 8, 50, 4, 1, 3, padding_right=0, activation="silu"),
          Problem(2, 8, 50, 4, 1, 3, padding_right=0, layout="blc", bias=True),
          Problem(1, 3, 41, 5, 2, 8, 2, padding_right=0, activation="silu", bias=True)]


def mamba(p: Problem, x, w, b):
    """A causal conv as Mamba writes it: padding on both sides, the first Lout outputs, then SiLU."""
    y = F.conv1d(x, w, b, padding=p.padding, dilation=p.dilation, groups=p.channels)[..., ::p.stride]
    y = y[..., :p.out_length]
    return F.silu(y) if p.activation == "silu" else y


@pytest.mark.parametrize("p", CAUSAL, ids=lambda p: p.key)
def test_forward_reference_is_the_causal_conv_and_its_activation(p):
    x, w, b = check.make_inputs(p, 0, device="cpu")
    ref, scale = check.reference(p, x, w, b)
    assert ref.shape == (p.batch, p.channels, p.length if p.stride == 1 else p.out_length) == scale.shape
    assert torch.allclose(ref, mamba(p, x.double(), w.double(), b.double() if b is not None else None))
    assert torch.allclose(bench.torch_forward(p, x, w, b).double(), ref.float().double(), atol=1e-5)


def test_forward_reference_of_any_asymmetric_padding_is_f_pad_then_conv():
    p = Problem(2, 4, 30, 3, 2, 0, 1, padding_right=2)
    x, w, b = check.make_inputs(p, 1, device="cpu")
    ref, _ = check.reference(p, x, w, b)
    assert torch.allclose(ref, F.conv1d(F.pad(x.double(), (0, 2)), w.double(), stride=2, groups=4))
    assert torch.allclose(bench.torch_forward(p, x, w, b).double(), ref, atol=1e-5)


def test_references_are_cached_per_activation():
    p = CAUSAL[1]
    cache = check.ReferenceCache(device="cpu")
    plain, silu = cache.get(p, 0), cache.get(replace(p, activation="silu"), 0)
    assert torch.equal(plain[0], silu[0]) and torch.allclose(silu[3], F.silu(plain[3]))


@pytest.mark.parametrize("p", CAUSAL, ids=lambda p: p.key)
def test_backward_reference_is_autograd_of_the_causal_conv(p):
    x, w, b = check.make_inputs(p, 0, device="cpu")
    gy = check.grad_output(p, 0, device="cpu")
    (gx, gw, gb), _ = check.backward_reference(p, x, w, b, gy)
    leaves = [t.double().requires_grad_() for t in (x, w, b) if t is not None]
    y = mamba(p, leaves[0], leaves[1], leaves[2] if b is not None else None)
    want = torch.autograd.grad(y, leaves, gy.double())
    assert torch.allclose(gx, want[0]) and torch.allclose(gw, want[1])
    if b is not None:
        assert torch.allclose(gb, want[2])
    torch_grads = bench.torch_backward_operands(p, x, w, b, gy)()
    assert torch.allclose(torch_grads[0].double(), want[0], atol=1e-4)


def test_the_backward_op_is_called_with_the_problems_paddings_and_activation():
    seen = []

    def op(gy, x, w, b, *args):
        seen.append(args)
        return x, w, torch.zeros(w.shape[0])

    p = CAUSAL[0]
    x, w, b = check.make_inputs(p, 0, device="cpu")
    gx, gw, gb = (torch.empty_like(t) for t in (x, w, torch.zeros(p.channels)))
    check.through_backward_op(op)(p, x, w, b, None, gx, gw, gb)
    assert seen == [(1, 3, 0, 1, 1)] and torch.equal(gx, x)


def test_backward_checks_reuse_cached_references_and_still_catch_a_wrong_gradient(monkeypatch):
    """check_backward with a BackwardReferenceCache computes float64 autograd once per (problem, seed), checks
    each run against it, and evicts the entry used longest ago."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    made = []
    real = check.backward_reference
    monkeypatch.setattr(check, "backward_reference", lambda q, *a: made.append(q) or real(q, *a))
    p = CAUSAL[1]

    def right(q, x, w, b, gy, gx, gw, gb):
        rx, rw, rb = bench.torch_backward_operands(q, x, w, b, gy)()
        gx.copy_(rx), gw.copy_(rw), gb.copy_(rb)

    def wrong(q, x, w, b, gy, gx, gw, gb):
        right(q, x, w, b, gy, gx, gw, gb)
        gw[1, 0, 2] += 0.5

    cache = check.BackwardReferenceCache(device="cpu", max_entries=2)
    assert check.check_backward(p, right, cache=cache).ok and check.check_backward(p, right, cache=cache).ok
    assert made == [p, p]  # seeds 0 and 1, once each
    out = check.check_backward(p, wrong, cache=cache)
    assert not out.ok and "seed 0" in out.message and "grad_weight" in out.message and len(made) == 2
    cache.get(p, 0)  # seed 0 used last: seed 1 goes first
    cache.get(p, 2)
    cache.get(p, 0)
    cache.get(p, 1)
    assert len(made) == 4


@pytest.mark.parametrize("kind", [check.ReferenceCache, check.BackwardReferenceCache], ids=lambda k: k.__name__)
def test_a_reference_cache_keeps_within_its_bytes(kind):
    p = CAUSAL[0]
    entry = kind(device="cpu").get(p, 0)
    size = sum(t.numel() * t.element_size() for t in check._tensors(entry))
    two = kind(device="cpu", max_bytes=2 * size)
    for seed in (0, 1, 2):
        two.get(p, seed)
    assert list(two._entries) == [(p, 1), (p, 2)]  # the third pushed the first out
    small = kind(device="cpu", max_bytes=size - 1)
    assert torch.equal(small.get(p, 0)[0], entry[0]) and not small._entries  # made, not kept
