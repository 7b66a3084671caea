"""The generic backward on the GPU: grad_x, grad_weight and grad_bias against float64 autograd, any layout.

Tolerance, per element: |got - ref| <= u * |ref| + FP32_TOL * scale + floor, where u is the storage type's
unit roundoff (0 for fp32: the outputs' last rounding), floor its subnormal step (fp16), and scale the same
sum taken over absolute values (sum |w| |g| for grad_x, sum |g| |x| for grad_weight, sum |g| for grad_bias),
so a long reduction (grad_weight adds B * Lout terms) gets room in proportion to what it adds up while a
missing or doubled term of that size still fails. With SiLU, |g| is taken as |gy| * (1 + sum |w| |x| + |b|):
g's own error follows z's, whose rounding grows with the terms z adds up. fp32 accumulates every dtype, so
FP32_TOL (about 170 ulps of fp32) holds for all; 16-bit results must also be within 2x PyTorch's own error
(the same op on the same 16-bit inputs) against the float64 reference.
"""
from __future__ import annotations

import ctypes
import functools
import random
import zlib
from dataclasses import dataclass

import pytest

from dwgen import build, render
from dwgen.dtypes import DTYPES, torch_dtype

pytestmark = pytest.mark.gpu

FP32_TOL = 1e-5
UNIT_ROUNDOFF = {"fp32": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}
KINDS = ("in", "in", "in", "in", "out", "out", "out", "out") + ("i64",) * 9 + ("in", "in", "in", "out")
LAYOUTS = ("bcl", "blc", "slice")
GUARD = 64  # NaN elements before and after every tensor's storage


@dataclass(frozen=True)
class Case:
    B: int
    C: int
    L: int
    K: int
    S: int
    P: int  # left padding
    R: int  # right padding (the kernel only sees it through Lout)
    D: int
    dtype: str = "fp32"
    bias: bool = True
    act: int = 0
    x_layout: str = "bcl"
    gy_layout: str = "bcl"
    gx_layout: str = "bcl"

    @property
    def Lout(self) -> int:
        return max(0, (self.L + self.P + self.R - self.D * (self.K - 1) - 1) // self.S + 1)

    @property
    def key(self) -> str:
        return (f"{self.B}x{self.C}x{self.L}_k{self.K}s{self.S}p{self.P}r{self.R}d{self.D}_{self.dtype}"
                f"{'_b' if self.bias else ''}{'_silu' if self.act else ''}_{self.x_layout}-{self.gy_layout}"
                f"-{self.gx_layout}")


def random_cases(n: int, seed: int = 2024) -> list[Case]:
    rng = random.Random(seed)
    out: list[Case] = []
    while len(out) < n:
        k = rng.choice([1, 2, 3, 4, 5, 7, 9, 15, 31, 64, rng.randint(1, 64), rng.randint(65, 70)])
        s, d = rng.choice([1, 1, 2, 3, 4]), rng.choice([1, 1, 2, 3, 8])
        reach = d * (k - 1) + 1
        p, r = rng.randint(0, reach + 2), rng.choice([0, rng.randint(0, reach + 2)])
        length = rng.randint(max(1, reach - p - r), max(2, reach - p - r) + rng.choice([5, 50, 700]))
        out.append(Case(rng.randint(1, 3), rng.choice([1, 2, 5, 8, rng.randint(1, 40)]), length, k, s, p, r, d,
                        list(DTYPES)[len(out) % len(DTYPES)], rng.random() < 0.5, rng.randint(0, 1),
                        rng.choice(LAYOUTS), rng.choice(LAYOUTS), rng.choice(LAYOUTS)))
    return out


# Shapes a random draw could miss: K = 1, L < K with padding, a stride past the kernel, one output, many
# chunks in the reduction (B * Lout past 4096 and few channels), the transposed layout everywhere.
EDGES = [
    Case(1, 1, 1, 1, 1, 0, 0, 1),
    Case(2, 3, 3, 7, 1, 3, 3, 1, "bf16", act=1),
    Case(2, 4, 50, 2, 5, 0, 0, 1, "fp16", gx_layout="slice"),
    Case(1, 2, 9, 5, 1, 0, 0, 2, act=1),  # Lout = 1
    Case(3, 2, 9000, 4, 1, 3, 0, 1, "fp32", act=1, x_layout="blc", gy_layout="blc", gx_layout="blc"),
    Case(2, 3, 20000, 9, 3, 4, 4, 2, "bf16", bias=False, x_layout="slice", gy_layout="blc"),
    Case(1, 7, 5000, 64, 2, 63, 63, 1, "fp16", act=1, gy_layout="slice"),
]
CASES = EDGES + random_cases(60)


def build_library(dtype: str, where):
    """The dtype's library, built by the search's own nvcc path; (launch function, workspace function)."""
    import torch

    from dwgen.driver import Library

    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    name = render.bwd_any_name(dtype)
    b = build.compile_library(name, render.render_bwd_any(dtype), build.build_key(render.bwd_any_digest(dtype), arch),
                              where, arch)
    assert b.ok, b.log
    ws = ctypes.CDLL(b.library)[f"dwgen_workspace_{name}"]
    ws.restype, ws.argtypes = ctypes.c_longlong, [ctypes.c_longlong] * 9  # B, C, L, Lout, K, S, P, D, act
    return Library(b.library, f"dwgen_launch_{name}", KINDS), ws


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    """dtype -> (launch, workspace), each library built on first use."""
    where = tmp_path_factory.mktemp("bwd-any")

    @functools.cache
    def get(dtype: str):
        return build_library(dtype, where)

    return get


def guarded(shape: tuple[int, int, int], layout: str, dtype, fill: float = float("nan")):
    """A (B, C, N) view in the given memory layout over a flat buffer with NaN bands; (buffer, view).

    bcl: contiguous; blc: (B, N, C) memory; slice: every other channel and element, one element in."""
    import torch

    B, C, N = shape
    if layout == "bcl":
        strides, offset = (C * N, N, 1), 0
    elif layout == "blc":
        strides, offset = (N * C, 1, C), 0
    else:
        strides, offset = ((2 * C + 1) * (2 * N + 3), 2 * (2 * N + 3), 2), 2 * N + 4
    extent = offset + 1 + sum((n - 1) * s for n, s in zip(shape, strides, strict=True)) if B * C * N else 0
    buf = torch.full((extent + 2 * GUARD,), fill, device="cuda", dtype=dtype)
    return buf, buf.as_strided(shape, strides, GUARD + offset)


def placed(values, layout: str):
    _, view = guarded(tuple(values.shape), layout, values.dtype)
    view.copy_(values)
    return view


def inputs(c: Case, seed: int):
    import torch

    dt = torch_dtype(c.dtype)
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(c.B, c.C, c.L, generator=g, device="cuda").to(dt)
    w = torch.randn(c.C, c.K, generator=g, device="cuda").to(dt)
    b = torch.randn(c.C, generator=g, device="cuda").to(dt) if c.bias else None
    gy = torch.randn(c.B, c.C, c.Lout, generator=g, device="cuda").to(dt)
    return placed(x, c.x_layout), w, b, placed(gy, c.gy_layout)


def launch(libs, c: Case, x, w, b, gy, work_fill: float = float("nan")):
    """The library's backward into NaN-filled outputs (grad_x in c.gx_layout) and a NaN (or work_fill) workspace."""
    import torch

    lib, ws = libs(c.dtype)
    dt = torch_dtype(c.dtype)
    gx_buf, gx = guarded((c.B, c.C, c.L), c.gx_layout, dt)
    gw = torch.full((c.C, c.K), float("nan"), device="cuda", dtype=dt)
    gb = torch.full((c.C,), float("nan"), device="cuda", dtype=dt)
    floats = ws(c.B, c.C, c.L, c.Lout, c.K, c.S, c.P, c.D, c.act)
    assert floats >= c.C * (c.K + 1) + (c.B * c.C * c.Lout if c.act == 1 else 0)  # the gated grad_out: SiLU only
    work = torch.full((max(1, floats),), work_fill, device="cuda", dtype=torch.float32)
    strides = [torch.tensor(t.stride(), dtype=torch.int64) for t in (x, gy, gx)]  # host arrays of 3
    lib.prepare(gy, x, w, b, gx, gw, gb, work, c.B, c.C, c.L, c.Lout, c.K, c.S, c.P, c.D, c.act, *strides)()
    torch.cuda.synchronize()
    # every element of grad_x's view written, nothing else in its buffer
    outside = gx_buf.clone()
    outside.as_strided(gx.shape, gx.stride(), gx.storage_offset()).fill_(0)
    assert bool(torch.isnan(outside).sum() == outside.numel() - gx.numel()), f"{c.key}: wrote outside grad_x"
    return gx, gw, gb


def autograd(c: Case, x, w, b, gy):
    """(grad_x, grad_weight (C, K), grad_bias (C,)) of F.conv1d (+ SiLU), asymmetric padding by F.pad."""
    import torch
    import torch.nn.functional as F

    x, w = x.detach().clone().requires_grad_(), w.detach().clone().view(c.C, 1, c.K).requires_grad_()
    b = (b if b is not None else torch.zeros(c.C, device="cuda", dtype=x.dtype)).detach().clone().requires_grad_()
    z = F.conv1d(F.pad(x, (c.P, c.R)), w, b, stride=c.S, dilation=c.D, groups=c.C)
    assert z.shape[-1] == c.Lout
    (F.silu(z) if c.act else z).backward(gy)
    return x.grad, w.grad.view(c.C, c.K), b.grad


def references(c: Case, x, w, b, gy):
    """float64 (grad_x, grad_weight, grad_bias) and the error scale of each (see the module docstring)."""
    import torch.nn.functional as F

    xd, wd, gyd = x.double(), w.double(), gy.double()
    bd = b.double() if b is not None else None
    ref = autograd(c, xd, wd, bd, gyd)
    g = gyd.abs()
    if c.act:
        zabs = F.conv1d(F.pad(xd.abs(), (c.P, c.R)), wd.abs().view(c.C, 1, c.K), None if bd is None else bd.abs(),
                        stride=c.S, dilation=c.D, groups=c.C)
        g = g * (1 + zabs)
    scale = autograd(Case(**{**c.__dict__, "act": 0}), xd.abs(), wd.abs(), None, g)
    return ref, scale


def assert_close(c: Case, got, ref, scale, torch_err=None):

    u, floor = UNIT_ROUNDOFF[c.dtype], DTYPES[c.dtype].absolute_floor
    for what, o, r, s in zip(("grad_x", "grad_weight", "grad_bias"), got, ref, scale, strict=True):
        err = (o.double() - r).abs()
        bad = ~(err <= u * r.abs() + FP32_TOL * s + floor)  # NaN (never written) compares false
        if bool(bad.any()):
            i = tuple(int(v) for v in bad.nonzero()[0])
            pytest.fail(f"{c.key}: {what}{list(i)} = {float(o[i]):.7g}, want {float(r[i]):.7g} "
                        f"(scale {float(s[i]):.4g}, {int(bad.sum())} of {bad.numel()} off)")
        if torch_err is not None and err.numel():
            theirs = torch_err[what]
            assert float(err.max()) <= 2 * theirs + 1e-6 * float(r.abs().max()), (
                f"{c.key}: {what} error {float(err.max()):.3g} > 2x PyTorch's {theirs:.3g}")


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.key)
def test_matches_float64_autograd(libs, c):
    x, w, b, gy = inputs(c, seed=zlib.crc32(c.key.encode()))
    got = launch(libs, c, x, w, b, gy)
    ref, scale = references(c, x, w, b, gy)
    torch_err = None
    if c.dtype != "fp32":  # PyTorch's own backward on the same 16-bit inputs
        theirs = autograd(c, x, w, b, gy)
        torch_err = {what: float((t.double() - r).abs().max()) if t.numel() else 0.0
                     for what, t, r in zip(("grad_x", "grad_weight", "grad_bias"), theirs, ref, strict=True)}
    assert_close(c, got, ref, scale, torch_err)


def bits(t):
    """The raw bits of t, so that equal means bitwise equal (NaN included, -0 apart from 0)."""
    import torch

    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_bitwise_reproducible_whatever_the_workspace_held(libs, dtype):
    import torch

    # 2048 blocks: 16 channels, 128 chunks of 4096 outputs each
    c = Case(4, 16, 131072, 7, 1, 3, 3, 2, dtype, act=1, x_layout="blc", gx_layout="slice")
    x, w, b, gy = inputs(c, seed=7)
    first = launch(libs, c, x, w, b, gy)
    second = launch(libs, c, x, w, b, gy, work_fill=1e30)
    for a, z in zip(first, second, strict=True):
        assert torch.equal(bits(a), bits(z))
    assert_close(c, first, *references(c, x, w, b, gy))


@pytest.mark.parametrize("B, C, L, K, P", [(0, 3, 10, 4, 1), (2, 3, 2, 5, 0), (2, 0, 10, 3, 1)])
def test_empty_problems_write_zeros_and_launch_nothing_empty(libs, B, C, L, K, P):
    import torch

    c = Case(B, C, L, K, 1, P, 0, 1, act=1)
    x, w, b, gy = inputs(c, seed=0)
    gx, gw, gb = launch(libs, c, x, w, b, gy)  # a zero-block launch would fail with an invalid configuration
    for t in (gx, gw, gb):
        assert torch.equal(t, torch.zeros_like(t))


def test_indices_past_2_31(libs):
    """B * C * L over 2**31: the last channels' gradients (channels are independent) against float64.

    x (in (B, L, C) memory) and grad_x hold their last channels past element 2**31; about 30 GB at the peak."""
    import torch

    if torch.cuda.get_device_properties(0).total_memory < 48 * 2**30:
        pytest.skip("needs a GPU of 48 GiB or more")
    c = Case(1, 16400, 1 << 17, 5, 2, 2, 2, 3, "bf16", act=1, x_layout="blc")
    assert c.B * c.C * c.L > 2**31
    x, w, b, gy = inputs(c, seed=3)
    got = launch(libs, c, x, w, b, gy)
    tail = slice(c.C - 3, c.C)
    sub = Case(**{**c.__dict__, "C": 3})
    sx, sw, sb, sgy = (t[:, tail].contiguous() if t.dim() == 3 else t[tail].contiguous() for t in (x, w, b, gy))
    assert_close(sub, (got[0][:, tail], got[1][tail], got[2][tail]), *references(sub, sx, sw, sb, sgy))
    del got
    torch.cuda.empty_cache()
