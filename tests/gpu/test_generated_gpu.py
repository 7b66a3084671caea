"""The committed frozen module against the float64 reference: tuned problems, 200+ random ones, edge inputs."""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from dwgen import check, freeze
from dwgen.dtypes import DTYPES, torch_dtype
from dwgen.frozen_dispatch import FAST_MAX_K
from dwgen.problem import Problem, ProblemError
from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

MANIFEST = freeze.read_manifest(ROOT / "generated")


def random_problems(n: int, seed: int = 1234) -> list[Problem]:
    """Problems across every dtype, layout, K 1-64, stride 1-4, dilation 1-8, padding and odd lengths."""
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        k = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 4, 15, 31, 64, rng.randint(1, 64)])
        stride = rng.choice([1, 1, 1, 2, 3, 4])
        dilation = rng.choice([1, 1, 1, 2, 3, 8])
        try:
            out.append(Problem(rng.randint(1, 4), rng.choice([1, 3, 8, 16, 24, 64, 96, rng.randint(1, 200)]),
                               rng.randint(1, 5000), k, stride, rng.randint(0, k * dilation), dilation,
                               rng.choice(list(DTYPES)), rng.random() < 0.5, rng.choice(["bcl", "blc"])))
        except ProblemError:
            continue
    return out


def frozen_check(p: Problem, shift: bool = False, seed: int = 0):
    """depthwise_conv1d on fresh inputs of p (x misaligned by one element when asked) against float64."""
    import torch

    import generated
    from dwgen.gate import misaligned

    x, w, b = check.make_inputs(p, seed)
    if shift:
        x = misaligned(x)
    y = generated.depthwise_conv1d(x, w, b, **p.call_kwargs)
    torch.cuda.synchronize()
    ref, scale = check.reference(p, x, w, b)
    outcome = check.compare(p, y, ref, scale)
    assert outcome.ok, outcome.message
    # the result keeps x's memory order: no hidden transpose on either side
    assert y.transpose(1, 2).is_contiguous() if effective_layout(p) == "blc" else y.is_contiguous()
    return generated.kernel_for(x, w, b, **p.call_kwargs)


def effective_layout(p: Problem) -> str:
    """A (B, L, C) tensor with one channel or one position is (B, C, L) contiguous too, and is taken as such."""
    return "bcl" if p.channels == 1 or p.length == 1 else p.layout


def lender_signature(e: dict) -> tuple:
    p = Problem(**e["problem"])
    return (p.kernel_size, p.stride, p.dilation, p.dtype, effective_layout(p), p.activation, e["direction"])


def lenders() -> list[dict]:
    """The entries the dispatcher uses whose kernel may lend (K past 16, a stride or a dilation; a launch that takes
    sizes at run time), largest problem first, ties by the tables' key: the first of a signature lends."""
    import generated

    t = generated.tables()
    kernels = {k["name"]: k for k in MANIFEST["kernels"]}
    used = [e for e in MANIFEST["entries"]
            if generated._entry_key(e["problem"]) in (t.tuned if e["direction"] == "fwd" else t.tuned_bwd)]
    return sorted((e for e in used if kernels[e["kernel"]]["sizes_at_run_time"] and (
        e["problem"]["kernel_size"] > FAST_MAX_K or e["problem"]["stride"] > 1 or e["problem"]["dilation"] > 1)),
        key=lambda e: (-e["problem"]["batch"] * e["problem"]["channels"] * e["problem"]["length"],
                       generated._entry_key(e["problem"])))


def expected_generic(p: Problem, shift: bool = False) -> str:
    """The kernel an untuned forward problem runs (x one element off a 16-byte boundary when shift): the fast
    generic kernel of its dtype, layout and K, else (K past 16, a stride or a dilation) the tuned kernel of the
    largest problem of its signature whose launch takes any size, for paddings up to the halo a side; else the
    scalar kernel."""
    kernels = {k["name"]: k for k in MANIFEST["kernels"]}
    fast = MANIFEST["generic"]["fast"]
    key = f"{p.dtype}_{effective_layout(p)}_k{p.kernel_size}"
    if p.stride == 1 and p.dilation == 1 and p.kernel_size <= FAST_MAX_K:
        candidate = fast.get(key)
    else:
        largest = next((e for e in lenders() if lender_signature(e) == (
            p.kernel_size, p.stride, p.dilation, p.dtype, effective_layout(p), p.activation, "fwd")), None)
        fits = max(p.padding, p.padding_right) <= (p.kernel_size - 1) * p.dilation
        candidate = largest["kernel"] if largest is not None and fits else None
    if candidate is not None:
        kernel = kernels[candidate]
        takes_shifted = kernel["peels_misalignment"] or kernel["align_bytes"] <= p.elem_bytes
        if p.channels % kernel["channel_multiple"] == 0 and (not shift or takes_shifted):
            return candidate
    return MANIFEST["generic"]["scalar"][p.dtype]["name"]


def frozen_check_backward(p: Problem) -> str:
    """The frozen module's backward op on fresh inputs of p (gradients NaN-filled first) against float64, with
    and without SiLU; returns the backward kernel the module chooses for p."""
    import torch

    import generated

    generated.build()
    op = torch.ops.dwgen.depthwise_conv1d_backward.default
    for activation in ("none", "silu"):
        outcome = check.check_backward(replace(p, activation=activation), check.through_backward_op(op))
        assert outcome.ok, outcome.message
    x, w, b = check.make_inputs(p, 0)
    return generated.kernel_for(x, w, b, **p.call_kwargs, direction="bwd")


def test_tuned_problems_run_their_tuned_kernel():
    directions = {e["direction"] for e in MANIFEST["entries"]}
    assert "fwd" in directions, "no tuned forward entry in generated/manifest.json"
    for e in MANIFEST["entries"]:
        p = Problem(**e["problem"])
        if e["direction"] == "bwd":
            assert frozen_check_backward(p) == e["kernel"], p.key
            continue
        for seed in (0, 1):
            assert frozen_check(p, seed=seed) == e["kernel"], p.key


def test_tuned_problems_with_the_other_bias_run_the_tuned_kernel():
    """Bias is a run-time argument of every kernel: a Conformer K31 layer with bias (nn.Conv1d's default) on a
    problem tuned without one ran the scalar generic backward at 44x copy before the dispatcher took the other
    bias's tuned kernel."""
    tuned = {(e["key"], e["direction"]) for e in MANIFEST["entries"]}
    asked = 0
    for e in MANIFEST["entries"]:
        q = replace(Problem(**e["problem"]), bias=not e["problem"]["bias"])
        if (q.key, e["direction"]) in tuned:
            continue
        asked += 1
        if e["direction"] == "bwd":
            assert frozen_check_backward(q) == e["kernel"], q.key
        else:
            assert frozen_check(q) == e["kernel"], q.key
    assert asked > 0


PROBLEMS = random_problems(240)


@pytest.mark.parametrize("p", PROBLEMS, ids=lambda p: p.key)
def test_random_problems_match_reference(p):
    assert frozen_check(p) == expected_generic(p)


@pytest.mark.parametrize("p", PROBLEMS[:40], ids=lambda p: p.key)
def test_misaligned_inputs(p):
    """x[..., 1:]-style views: (B, C, L) kernels peel the head; (B, L, C) ones hand over to the scalar kernel,
    unless the kernel they would run reads single elements (a lent one of 1-element vectors, as at K31)."""
    assert frozen_check(p, shift=True) == expected_generic(p, shift=True)


def test_misaligned_target_keeps_its_vectorised_kernel():
    e = next(e for e in MANIFEST["entries"] if e["key"].startswith("32x512x8192_k3_s1_p1_d1_fp32_bcl"))
    assert frozen_check(Problem(**e["problem"]), shift=True, seed=5) == e["kernel"]


def test_misaligned_x_on_a_tuned_problem_is_computed_by_a_kernel_that_takes_it():
    """A tuned forward whose kernel needs a 16-byte aligned x (the lane family) hands a misaligned x to the fast
    generic kernel, which peels the head, not to the scalar one; a tuned kernel that peels keeps it. Both match
    float64."""
    kernels = {k["name"]: k for k in MANIFEST["kernels"]}
    aligned_only = 0
    for e in MANIFEST["entries"]:
        p = Problem(**e["problem"])
        if e["direction"] != "fwd" or effective_layout(p) != "bcl":
            continue
        peels = kernels[e["kernel"]]["peels_misalignment"]
        aligned_only += not peels
        expected = e["kernel"] if peels else expected_generic(p, shift=True)
        assert frozen_check(p, shift=True) == expected, p.key
    assert aligned_only > 0


def test_untuned_problems_of_a_tuned_signature_past_the_fast_kernels_run_its_tuned_kernel():
    """K past 16, a stride or a dilation has no fast generic kernel: an untuned problem of a tuned problem's
    signature (another batch, width and length; its padding as far as the halo, causal, the halo on both sides)
    runs that tuning's kernel, forward and backward, and matches float64; past the halo it runs the scalar
    kernel."""
    kernels = {k["name"]: k for k in MANIFEST["kernels"]}
    tuned = {(e["key"], e["direction"]) for e in MANIFEST["entries"]}
    largest = {}  # (signature, direction) -> the entry that lends its kernel
    for e in lenders():
        largest.setdefault(lender_signature(e), e)
    lent = 0
    for e in largest.values():
        p = Problem(**e["problem"])
        halo = (p.kernel_size - 1) * p.dilation
        multiple = kernels[e["kernel"]]["channel_multiple"]
        for q in (replace(p, batch=3, channels=7 * multiple, length=1999 + halo, padding=min(p.padding, halo),
                          padding_right=min(p.padding_right, halo)),
                  replace(p, batch=2, channels=5 * multiple, length=3001 + halo, padding=halo, padding_right=0),
                  replace(p, batch=1, channels=3 * multiple, length=1501 + halo, padding=halo, padding_right=halo)):
            if (q.key, e["direction"]) in tuned:
                continue
            lent += 1
            if e["direction"] == "bwd":
                assert frozen_check_backward(q) == e["kernel"], q.key
            else:
                assert frozen_check(q) == expected_generic(q) == e["kernel"], q.key
        if e["direction"] == "fwd":
            past = replace(p, batch=2, channels=3 * multiple, length=999, padding=halo + 1, padding_right=halo + 1)
            assert frozen_check(past) == MANIFEST["generic"]["scalar"][p.dtype]["name"], past.key
    assert lent > 0


def test_strided_inputs_are_read_through_their_strides():
    import torch

    import generated

    p = Problem(2, 16, 1000, 5, 1, 2, dtype="bf16")
    wide = torch.randn(p.batch, p.channels, p.length * 2, device="cuda").to(torch.bfloat16)[..., ::2]
    _, w, b = check.make_inputs(p, 6)
    y = generated.depthwise_conv1d(wide, w, b, p.stride, p.padding, p.dilation)
    ref, scale = check.reference(p, wide, w, b)
    assert check.compare(p, y, ref, scale).ok
    scalar = MANIFEST["generic"]["scalar"]["bf16"]["name"]
    assert generated.kernel_for(wide, w, b, p.stride, p.padding, p.dilation) == scalar


def test_layout_is_read_from_every_stride_as_the_dispatcher_does():
    """One batch of (B, L, C) memory whose batch stride is not C * L: torch calls its transpose contiguous (a size-1
    dimension's stride is ignored), the C++ dispatcher's layout_of does not, so the scalar kernel runs it and
    kernel_for says so. A backward whose grad_out is (B, C, L) while x is (B, L, C) runs the scalar one too."""
    import torch

    import generated

    p = Problem(1, 64, 1000, 3, 1, 1, dtype="bf16", layout="blc")
    x, w, b = check.make_inputs(p, 3)
    odd = torch.empty(x.numel() + 8, device="cuda", dtype=x.dtype).as_strided(tuple(x.shape), (7, 1, 64))
    odd.copy_(x)
    assert odd.transpose(1, 2).is_contiguous() and not odd.is_contiguous()
    y = generated.depthwise_conv1d(odd, w, b, p.stride, p.padding, p.dilation)
    ref, scale = check.reference(p, odd, w, b)
    assert check.compare(p, y, ref, scale).ok
    assert generated.kernel_for(odd, w, b, p.stride, p.padding) == MANIFEST["generic"]["scalar"]["bf16"]["name"]

    generated.build()
    op = check.through_backward_op(torch.ops.dwgen.depthwise_conv1d_backward.default)
    outcome = check.check_backward(p, lambda q, x, w, b, gy, *grads: op(q, x, w, b, gy.contiguous(), *grads))
    assert outcome.ok, outcome.message
    gy = check.grad_output(p, 0, x.device)
    scalar_bwd = MANIFEST["generic"]["scalar_bwd"]["bf16"]["name"]
    assert generated.kernel_for(x, w, b, p.stride, p.padding, direction="bwd", grad_out=gy.contiguous()) == scalar_bwd
    assert generated.kernel_for(x, w, b, p.stride, p.padding, direction="bwd", grad_out=gy) != scalar_bwd


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_empty_inputs_return_empty_results(dtype):
    import torch

    import generated

    x = torch.empty(0, 8, 100, device="cuda", dtype=torch_dtype(dtype))
    w = torch.randn(8, 1, 3, device="cuda").to(x.dtype)
    y = generated.depthwise_conv1d(x, w, padding=1)
    assert y.shape == (0, 8, 100) and y.dtype == x.dtype


@pytest.mark.parametrize("layout", ["bcl", "blc"])
def test_64_bit_indexing_past_2_to_the_31_elements(layout):
    """2**31 + 1024 fp16 elements: the generic kernels (the row kernel over (B, C, L), the loop over (B, L, C))
    reach them through 64-bit offsets (the loop kernel's 64-bit instance, since its indices do not fit 32 bits);
    check the channel whose elements lie past 2**31 (all of it, or every other one)."""
    import torch
    import torch.nn.functional as F

    import generated

    length = 2**30 + 512
    if layout == "bcl":
        x = torch.randn(1, 2, length, device="cuda", dtype=torch.float16)
    else:
        x = torch.randn(1, length, 2, device="cuda", dtype=torch.float16).transpose(1, 2)
    w = torch.randn(2, 1, 3, device="cuda", dtype=torch.float16)
    y = generated.depthwise_conv1d(x, w, padding=1)
    ref = F.conv1d(x[:, 1:].double(), w[1:].double(), padding=1)
    scale = F.conv1d(x[:, 1:].double().abs(), w[1:].double().abs(), padding=1)
    outcome = check.compare(Problem(1, 1, length, 3, 1, 1, dtype="fp16"), y[:, 1:], ref, scale)
    assert outcome.ok, outcome.message


def test_16_bit_error_at_most_twice_pytorchs():
    """On the same inputs, dwgen's relative error against float64 is at most twice PyTorch's own."""
    import torch

    import generated

    for p in (Problem(8, 512, 4096, 3, 1, 1, dtype="bf16"), Problem(8, 512, 1024, 31, 1, 15, dtype="fp16"),
              Problem(4, 1024, 2048, 4, 1, 3, dtype="bf16", layout="blc")):
        x, w, b = check.make_inputs(p, 0)
        ref, _ = check.reference(p, x, w, b)
        ours = generated.depthwise_conv1d(x, w, b, p.stride, p.padding, p.dilation).double()
        theirs = check.torch_conv(p, x, w, b).double()
        norm = torch.linalg.vector_norm
        e_ours, e_theirs = float(norm(ours - ref) / norm(ref)), float(norm(theirs - ref) / norm(ref))
        assert e_ours <= 2 * e_theirs, (p.key, e_ours, e_theirs)


@pytest.mark.skipif(not shutil.which("compute-sanitizer"), reason="needs compute-sanitizer")
def test_memcheck_finds_no_errors(tmp_path):
    """The frozen module under compute-sanitizer memcheck on a spread of problems and kernels: 0 errors."""
    code = ("import torch, generated\n"
            "from dwgen import check\n"
            "from tests.gpu.test_generated_gpu import random_problems\n"
            "from dwgen.problem import Problem\n"
            "import json\n"
            "m = json.load(open('generated/manifest.json'))\n"
            "ps = [Problem(**e['problem']) for e in m['entries']] + random_problems(40, seed=99)\n"
            "for p in ps:\n"
            "    x, w, b = check.make_inputs(p, 0)\n"
            "    generated.depthwise_conv1d(x, w, b, **p.call_kwargs)\n"
            "torch.cuda.synchronize()\n"
            "print('ran', len(ps))\n")
    env = dict(os.environ, PYTORCH_NO_CUDA_MEMORY_CACHING="1")
    out = subprocess.run(["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", sys.executable, "-c",
                          code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    (tmp_path / "memcheck.log").write_text(out.stdout + out.stderr)
    assert out.returncode == 0, (out.stdout + out.stderr)[-3000:]
    assert "ERROR SUMMARY: 0 errors" in out.stdout + out.stderr


@pytest.mark.parametrize("layout", ["bcl", "blc"])
def test_misaligned_weight_and_bias_views(layout):
    """Weight and bias views that start off a 16-byte boundary give the right result."""
    import torch

    import generated

    p = Problem(2, 64, 1000, 4, 1, 3, dtype="bf16", bias=True, layout=layout)
    x, w, b = check.make_inputs(p, 7)
    wflat = torch.empty(w.numel() + 1, device="cuda", dtype=w.dtype)
    bflat = torch.empty(b.numel() + 1, device="cuda", dtype=b.dtype)
    wv, bv = wflat[1:].view_as(w), bflat[1:].view_as(b)
    wv.copy_(w)
    bv.copy_(b)
    y = generated.depthwise_conv1d(x, wv, bv, p.stride, p.padding, p.dilation)
    ref, scale = check.reference(p, x, w, b)
    outcome = check.compare(p, y, ref, scale)
    assert outcome.ok, outcome.message
