"""The generic backward (templates/dw1d_bwd_any.cu.j2) run on the CPU (tests/cuda_on_cpu.h) against float64
autograd: its staged kernels (stride 1, any dilation: grad_x and the weight partials from shared memory, chunks
crossing rows), the unstaged ones they fall back to (a stride, a span past shared memory, rows shorter than a
block), SiLU's gated gradient, and strided (B, L, C) views."""
from __future__ import annotations

import pytest

from dwgen import render
from dwgen.dtypes import torch_dtype
from tests.cuda_on_cpu import build_generic, build_walking, raw, run_both_schedules, strided_raw

MAIN = r"""
#include <cstdio>
#include <cstdlib>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
static void* alloc(long long n) { return std::aligned_alloc(64, static_cast<size_t>((n + 63) / 64 * 64 + 64)); }
static void* slurp(FILE* f, long long n) {
    void* p = alloc(n);
    if (n > 0 && std::fread(p, 1, static_cast<size_t>(n), f) != static_cast<size_t>(n)) std::exit(3);
    return p;
}
// argv: input file, output file, B, C, L, Lout, K, S, P, D, act, bias, then the strides of x, grad_out, grad_x,
// and the elements of x's and grad_out's storage
int main(int argc, char** argv) {
    if (argc != 24) return 2;
    long long v[21];
    for (int i = 0; i < 21; ++i) v[i] = std::atoll(argv[3 + i]);
    const long long B = v[0], C = v[1], L = v[2], Lout = v[3], K = v[4], S = v[5], P = v[6], D = v[7], act = v[8];
    const long long xs[3] = {v[10], v[11], v[12]}, gys[3] = {v[13], v[14], v[15]}, gxs[3] = {v[16], v[17], v[18]};
    const long long e = sizeof(T_), xn = v[19], gyn = v[20];
    FILE* in = std::fopen(argv[1], "rb");
    void* x = slurp(in, xn * e);
    void* gy = slurp(in, gyn * e);
    void* w = slurp(in, C * K * e);
    void* b = slurp(in, C * e);
    void* gx = alloc(B * C * L * e);
    void* gw = alloc(C * K * e);
    void* gb = alloc(C * e);
    void* work = alloc(CAT(dwgen_workspace_, NAME)(B, C, L, Lout, K, S, P, D, act) * 4);
    if (CAT(dwgen_launch_, NAME)(gy, x, w, v[9] ? b : nullptr, gx, gw, gb, work, B, C, L, Lout, K, S, P, D, act, xs,
                                 gys, gxs, nullptr) != 0) return 4;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(gx, e, B * C * L, out);
    std::fwrite(gw, e, C * K, out);
    std::fwrite(gb, e, C, out);
    std::fclose(out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bwd_any")
    out = {dtype: build_generic(render.bwd_any_name(dtype), render.render_bwd_any(dtype), dtype, MAIN, tmp)
           for dtype in ("fp32", "bf16")}
    return out, tmp


def run(binaries, dtype, x, gy, w, b, k, stride, left, dilation, act):
    """grad_x (B, C, L contiguous), grad_w and grad_b of the generic backward; x and gy with any strides."""
    import torch

    exes, tmp = binaries
    bsz, ch, length = x.shape
    lout = gy.shape[2]
    xb, xn = strided_raw(x)
    gb_, gyn = strided_raw(gy)
    (tmp / "in").write_bytes(xb + gb_ + raw(w) + raw(b if b is not None else torch.zeros(ch, dtype=x.dtype)))
    args = [bsz, ch, length, lout, k, stride, left, dilation, act, int(b is not None), *x.stride(), *gy.stride(),
            ch * length, length, 1, xn, gyn]
    proc = run_both_schedules([exes[dtype], tmp / "in", tmp / "out", *args], tmp / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    flat = torch.frombuffer(bytearray((tmp / "out").read_bytes()), dtype=torch.uint8).view(x.dtype)
    n = bsz * ch * length
    return flat[:n].view(bsz, ch, length), flat[n:n + ch * k].view(ch, 1, k), flat[n + ch * k:]


def reference(x, gy, w, b, stride, left, right, dilation, act):
    import torch
    import torch.nn.functional as F

    xd, wd = x.double().requires_grad_(), w.double().requires_grad_()
    bd = (b if b is not None else torch.zeros(x.shape[1], dtype=x.dtype)).double().requires_grad_()
    y = F.conv1d(F.pad(xd, (left, right)), wd, bd, stride, 0, dilation, groups=x.shape[1])
    if act:
        y = F.silu(y)
    y.backward(gy.double())
    return xd.grad, wd.grad, bd.grad


def check(binaries, dtype, bsz, ch, length, k, stride, left, right, dilation, act=0, bias=True, layout="bcl", seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch_dtype(dtype)
    x = torch.randn(bsz, ch, length, generator=g).to(t)
    w = torch.randn(ch, 1, k, generator=g).to(t)
    b = torch.randn(ch, generator=g).to(t) if bias else None
    lout = (length + left + right - dilation * (k - 1) - 1) // stride + 1
    gy = torch.randn(bsz, ch, lout, generator=g).to(t)
    if layout == "blc":
        x, gy = (v.transpose(1, 2).contiguous().transpose(1, 2) for v in (x, gy))
    got = run(binaries, dtype, x, gy, w, b, k, stride, left, dilation, act)
    ref = reference(x, gy, w, b, stride, left, right, dilation, act)
    tol = 1e-5 if dtype == "fp32" else 2.0**-7
    for name, a, r in zip(("grad_x", "grad_w", "grad_b"), got, ref, strict=True):
        err = ((a.double() - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
        assert err <= tol, (name, dtype, x.shape, k, stride, left, right, dilation, act, err)


# (B, C, L, K, stride, left, right, dilation): staged (stride 1: one chunk crossing rows, two chunks, K past
# TAPS, causal, a dilation, K 1, a long reach past one pass of the weight sums; K 3 over 1701 outputs, whose
# last segment ends inside a step of four; K 2 at dilation 3 and K 1 at dilation 2, whose taps take two and
# four warps each; K 40 at dilation 1, two passes of groups of four taps), then unstaged (a stride, a reach past
# shared memory, rows shorter than a block's threads, where grad_x stays staged and the partials do not)
CASES = [(2, 2, 1500, 15, 1, 7, 7, 1), (3, 2, 2000, 4, 1, 3, 0, 1), (1, 3, 1100, 31, 1, 15, 15, 1),
         (2, 2, 900, 5, 1, 8, 0, 2), (1, 2, 700, 1, 1, 0, 0, 1), (1, 1, 2500, 64, 1, 30, 30, 40),
         (2, 3, 1701, 3, 1, 1, 1, 1), (1, 2, 2200, 2, 1, 1, 0, 3), (1, 2, 700, 1, 1, 0, 0, 2),
         (1, 2, 1400, 40, 1, 20, 19, 1),
         (2, 2, 1300, 3, 2, 1, 1, 1), (1, 1, 6000, 9, 1, 4, 4, 600), (3, 2, 200, 7, 1, 3, 3, 1)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, c)))
def test_the_generic_backward_matches_float64(binaries, dtype, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    check(binaries, dtype, bsz, ch, length, k, stride, left, right, dilation, bias=length % 2 == 0)



@pytest.fixture(scope="module")
def walking(tmp_path_factory):
    """The generic backward, each block of grad_x_rows walking all its row's tiles."""
    tmp = tmp_path_factory.mktemp("bwd_any_walk")
    return build_walking(render.bwd_any_name, render.render_bwd_any, MAIN, tmp), tmp


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", [(2, 3, 3299, 5, 1, 2, 2, 1), (1, 3, 2600, 3, 1, 1, 1, 2)],
                         ids=lambda c: "x".join(map(str, c)))
def test_a_block_walking_a_rows_tiles_matches_float64(walking, dtype, case):
    """Four and three tiles a block; grad_out's rows of 3299 elements start off vector boundaries."""
    bsz, ch, length, k, stride, left, right, dilation = case
    check(walking, dtype, bsz, ch, length, k, stride, left, right, dilation, seed=4)


NARROW = "B * Lout <= 0x7fffffffLL ? narrow(Lout)"  # where the launch picks the weight sums' 32-bit quotients


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The generic backward with the weight sums' 64-bit segment division, which only B * Lout >= 2^31 reaches."""
    tmp = tmp_path_factory.mktemp("bwd_any_wide")
    source = render.render_bwd_any("fp32")
    assert NARROW in source
    exe = build_generic(render.bwd_any_name("fp32"), source.replace(NARROW, "false ? narrow(Lout)"), "fp32", MAIN, tmp)
    return {"fp32": exe}, tmp


@pytest.mark.parametrize("case", [(3, 2, 2000, 4, 1, 3, 0, 1), (2, 2, 1500, 15, 1, 7, 7, 1)],
                         ids=lambda c: "x".join(map(str, c)))
def test_the_weight_sums_64_bit_segments_match_float64(wide, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    check(wide, "fp32", bsz, ch, length, k, stride, left, right, dilation, seed=5)


@pytest.mark.parametrize("k", [6, 8, 10, 11, 12, 14, 16, 17])
def test_grad_x_through_the_unrolled_windows_matches_float64(binaries, k):
    """grad_x_rows's window at the filter lengths CASES leaves out (every K % 4, whole steps and tails)."""
    check(binaries, "fp32", 1, 2, 1100, k, 1, (k - 1) // 2, k // 2, 1, seed=k)


def test_a_window_past_the_span_filled_ahead_takes_grad_x_rows(binaries):
    """K 1100 at dilation 1: a span past AHEAD_FLOATS, so grad_x_rows's window rather than grad_x_window's."""
    check(binaries, "fp32", 1, 2, 2600, 1100, 1, 549, 550, 1, seed=3)


def test_silu_and_b_l_c_views_through_the_staged_kernels(binaries):
    check(binaries, "fp32", 2, 3, 1200, 9, 1, 8, 0, 1, act=1, seed=1)  # the gated gradient from the fp32 buffer
    check(binaries, "bf16", 2, 8, 1000, 6, 1, 3, 2, 1, layout="blc", seed=2)
    check(binaries, "fp32", 2, 4, 300, 4, 3, 3, 0, 2, act=1, layout="blc", seed=3)


def test_the_staging_rule():
    """Stride 1 with a reach (K - 1) * D inside shared memory beside a tile: what CASES relies on."""
    room = render.ANY_SMEM_FLOATS - 2 * render.BWD_ANY_THREADS * 4
    assert 63 * 40 <= room < 8 * 600


def test_an_inf_no_tap_reads_stays_out_of_the_weight_sums(binaries):
    """Causal K5: x's last element feeds only the last tap's gradient. The staged weight sums step four outputs
    at a time; the row's last step, past its last output, must not multiply that Inf by a zero g (NaN)."""
    import torch

    g = torch.Generator().manual_seed(7)
    x = torch.randn(1, 2, 1302, generator=g)  # 1302 outputs: the last segment of 278 ends inside a step of four
    x[:, :, -1] = float("inf")
    w, b = torch.randn(2, 1, 5, generator=g), torch.randn(2, generator=g)
    gy = torch.randn(1, 2, 1302, generator=g)
    got = run(binaries, "fp32", x, gy, w, b, 5, 1, 4, 1, 0)
    ref = reference(x, gy, w, b, 1, 4, 0, 1, 0)
    for a, r in zip(got, ref, strict=True):
        finite = torch.isfinite(r)
        assert torch.equal(torch.isfinite(a), finite)
        assert ((a.double() - r)[finite].abs().max() / r[finite].abs().max()).item() <= 1e-5
    assert torch.isfinite(ref[1][:, :, :4]).all() and not torch.isfinite(ref[1][:, :, 4]).any()
