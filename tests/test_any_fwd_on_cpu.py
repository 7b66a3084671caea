"""The generic forward (templates/dw1d_any.cu.j2) run on the CPU (tests/cuda_on_cpu.h) against float64: its row
kernel (rows contiguous along the length) at stride and dilation 1, where a window slides four taps at a time, and
otherwise; its loop kernel over a (B, L, C) x (channels fastest), strided views and spans past shared memory; the
loop kernel's 32-bit quotients by a multiply-high against plain division."""
from __future__ import annotations

import subprocess

import pytest

from dwgen import render
from dwgen.dtypes import torch_dtype
from tests.cuda_on_cpu import build_generic, build_walking, raw, run_both_schedules, strided_raw

MAIN = r"""
#include <cstdio>
#include <cstdlib>
#include <cstring>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
// argv: input file, output file, B, C, L, Lout, K, S, P, D, act, bias, then x's and y's strides
int main(int argc, char** argv) {
    if (argc != 19) return 2;
    long long v[16];
    for (int i = 0; i < 16; ++i) v[i] = std::atoll(argv[3 + i]);
    const long long B = v[0], C = v[1], L = v[2], Lout = v[3], K = v[4], S = v[5], P = v[6], D = v[7], act = v[8];
    const long long xs[3] = {v[10], v[11], v[12]}, ys[3] = {v[13], v[14], v[15]};
    const long long e = sizeof(T_);
    // x's storage: from element 0 to its last element by its strides
    const long long xn = (B - 1) * xs[0] + (C - 1) * xs[1] + (L - 1) * xs[2] + 1, yn = B * C * Lout;
    FILE* in = std::fopen(argv[1], "rb");
    void* x = std::aligned_alloc(64, (xn * e + 63) / 64 * 64 + 64);
    void* w = std::aligned_alloc(64, (C * K * e + 63) / 64 * 64 + 64);
    void* b = std::aligned_alloc(64, (C * e + 63) / 64 * 64 + 64);
    const long long ybytes = (yn * e + 63) / 64 * 64 + 64;
    void* y = std::aligned_alloc(64, ybytes);
    std::memset(y, 0xff, ybytes);  // NaN in every type: an output left unwritten shows, and so does a write past y
    if (std::fread(x, e, xn, in) != static_cast<size_t>(xn) ||
        std::fread(w, e, C * K, in) != static_cast<size_t>(C * K) ||
        std::fread(b, e, C, in) != static_cast<size_t>(C)) return 3;
    if (CAT(dwgen_launch_, NAME)(x, w, v[9] ? b : nullptr, y, B, C, L, Lout, K, S, P, D, act, xs, ys, nullptr) != 0)
        return 4;
    for (long long i = yn * e; i < ybytes; ++i)
        if (static_cast<unsigned char*>(y)[i] != 0xff) return 5;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(y, e, yn, out);
    std::fclose(out);
    return 0;
}
"""


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("any_fwd")
    out = {dtype: build_generic(render.any_name(dtype), render.render_any(dtype), dtype, MAIN, tmp)
           for dtype in ("fp32", "bf16")}
    return out, tmp


def run(binaries, dtype, x, w, b, k, stride, left, right, dilation, act=0, layout_out="bcl"):
    """The generic forward on x (any strides), its result in (B, C, L) or (B, L, C) memory."""
    import torch

    exes, tmp = binaries
    bsz, ch, length = x.shape
    lout = (length + left + right - dilation * (k - 1) - 1) // stride + 1
    (tmp / "in").write_bytes(strided_raw(x)[0] + raw(w) + raw(b if b is not None else torch.zeros(ch, dtype=x.dtype)))
    ys = (ch * lout, lout, 1) if layout_out == "bcl" else (ch * lout, 1, ch)
    args = [bsz, ch, length, lout, k, stride, left, dilation, act, int(b is not None), *x.stride(), *ys]
    proc = run_both_schedules([exes[dtype], tmp / "in", tmp / "out", *args], tmp / "out")
    assert proc.returncode == 0, proc.stderr[-2000:]
    flat = torch.frombuffer(bytearray((tmp / "out").read_bytes()), dtype=torch.uint8).view(x.dtype)
    return flat.view(bsz, ch, lout) if layout_out == "bcl" else flat.view(bsz, lout, ch).transpose(1, 2)


def reference(x, w, b, stride, left, right, dilation, act=0):
    import torch
    import torch.nn.functional as F

    xp = F.pad(x.double(), (left, right))
    y = F.conv1d(xp, w.double(), None if b is None else b.double(), stride, 0, dilation, groups=x.shape[1])
    return y * torch.sigmoid(y) if act else y


def tolerance(dtype):
    return 1e-5 if dtype == "fp32" else 2.0**-7


def assert_same_infinities(y, ref, tol):
    """NaN and inf where the float64 reference has them, and within tol elsewhere."""
    import torch

    assert torch.equal(torch.isnan(y), torch.isnan(ref)) and torch.equal(torch.isinf(y), torch.isinf(ref))
    finite = torch.isfinite(ref)
    assert ((y - ref)[finite].abs().max() / ref[finite].abs().max()).item() <= tol


def check(binaries, dtype, x, w, b, k, stride, left, right, dilation, act=0, layout_out="bcl"):
    y = run(binaries, dtype, x, w, b, k, stride, left, right, dilation, act, layout_out).double()
    ref = reference(x, w, b, stride, left, right, dilation, act)
    assert y.shape == ref.shape
    tol = tolerance(dtype)
    err = ((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
    assert err <= tol, (dtype, x.shape, k, stride, left, right, dilation, err)


def inputs(dtype, bsz, ch, length, k, bias=True, seed=0):
    import torch

    g = torch.Generator().manual_seed(seed)
    t = torch_dtype(dtype)
    x = torch.randn(bsz, ch, length, generator=g).to(t)
    w = torch.randn(ch, 1, k, generator=g).to(t)
    return x, w, (torch.randn(ch, generator=g).to(t) if bias else None)


# (B, C, L, K, stride, left, right, dilation): the row kernel's window (stride and dilation 1, every K % 4,
# tiles of 1024 and a partial one, paddings past the halo, causal), then its general loop (a stride, a dilation)
ROWS = [(2, 3, 1500, 1, 1, 0, 0, 1), (2, 3, 1500, 2, 1, 1, 0, 1), (1, 2, 2100, 5, 1, 2, 2, 1),
        (2, 2, 1030, 13, 1, 6, 6, 1), (1, 3, 700, 31, 1, 30, 0, 1), (1, 1, 40, 31, 1, 40, 3, 1),
        (2, 2, 999, 64, 1, 31, 32, 1), (1, 3, 1800, 3, 2, 1, 1, 1), (2, 2, 3001, 5, 3, 4, 0, 2),
        (1, 2, 900, 7, 4, 9, 9, 8)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", ROWS, ids=lambda c: "x".join(map(str, c)))
def test_the_row_kernel_matches_float64(binaries, dtype, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    x, w, b = inputs(dtype, bsz, ch, length, k, bias=length % 2 == 0)
    check(binaries, dtype, x, w, b, k, stride, left, right, dilation, act=int(k == 5))


@pytest.mark.parametrize("k", range(1, 18))
def test_each_unrolled_window_and_the_loop_past_them_match_float64(binaries, k):
    """The window kernel: K 1 to 16 take their own unrolled window (window_fixed), 17 the loop; two tiles."""
    x, w, b = inputs("fp32", 1, 2, 1100, k, seed=k)
    check(binaries, "fp32", x, w, b, k, 1, (k - 1) // 2, k // 2, 1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_window_past_the_span_filled_ahead_takes_the_rows_kernel(binaries, dtype):
    """K 1100 at stride and dilation 1: a span past AHEAD_FLOATS, so the rows kernel's window, walked over rows
    off vector boundaries."""
    x, w, b = inputs(dtype, 1, 2, 2601, 1100, seed=3)
    check(binaries, dtype, x[..., 1:], w, b, 1100, 1, 549, 550, 1)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_b_l_c_x_takes_the_channel_kernel_and_the_loop_past_its_weights(binaries, dtype):
    x, w, b = inputs(dtype, 2, 24, 333, 9)
    blc = x.transpose(1, 2).contiguous().transpose(1, 2)
    check(binaries, dtype, blc, w, b, 9, 1, 4, 4, 1, layout_out="blc")
    x, w, b = inputs(dtype, 2, 16, 500, 3, seed=1)
    check(binaries, dtype, x.transpose(1, 2).contiguous().transpose(1, 2), w, b, 3, 3, 1, 1, 2, layout_out="blc")
    # more channels than a block's threads
    x, w, b = inputs(dtype, 1, render.ANY_THREADS + 44, 40, 5, seed=5)
    check(binaries, dtype, x.transpose(1, 2).contiguous().transpose(1, 2), w, b, 5, 2, 2, 2, 1, layout_out="blc")
    # past the channel kernel's weights (K * 16 bytes of a vector's taps over 16 KB): the loop, channels fastest
    x, w, b = inputs(dtype, 1, 16, 1200, 1100, seed=6)
    check(binaries, dtype, x.transpose(1, 2).contiguous().transpose(1, 2), w, b, 1100, 1, 549, 550, 1,
          layout_out="blc")


# (B, C, L, K, stride, left, right, dilation) over (B, L, C): the channel kernel by 16-byte vectors (C a multiple
# of 8) and one element at a time (C odd), tiles narrower than a warp's width (few channels) and channels past one
# tile, strides 1 to 4, dilations to 8, K to 64 (the weights' room halves the tile), causal and longer outputs
CHANNELS = [(2, 24, 333, 9, 1, 4, 4, 1), (1, 8, 97, 3, 3, 1, 1, 1), (2, 40, 260, 5, 2, 4, 0, 2),
            (1, 264, 50, 4, 1, 3, 0, 1), (1, 7, 130, 7, 4, 9, 9, 8), (2, 16, 100, 64, 1, 40, 23, 1),
            (1, 1032, 41, 33, 2, 16, 16, 1), (1, 13, 20, 3, 1, 30, 30, 1), (3, 32, 1, 1, 1, 0, 0, 1)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", CHANNELS, ids=lambda c: "x".join(map(str, c)))
def test_the_channel_kernel_matches_float64(binaries, dtype, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    x, w, b = inputs(dtype, bsz, ch, length, k, bias=ch % 2 == 0, seed=ch)
    blc = x.transpose(1, 2).contiguous().transpose(1, 2)
    check(binaries, dtype, blc, w, b, k, stride, left, right, dilation, act=int(k == 5), layout_out="blc")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_channel_kernel_reads_a_view_off_the_vector_boundary(binaries, dtype):
    """Channels 1 to C of a (B, L, C + 1) tensor: x starts one element into a vector (one element at a time), with
    and without the sliding window; a partial last step."""
    x, w, b = inputs(dtype, 2, 33, 400, 5, seed=7)
    view = x.transpose(1, 2).contiguous().transpose(1, 2)[:, 1:, :]
    check(binaries, dtype, view, w[1:], b[1:], 5, 2, 2, 2, 1, layout_out="blc")
    x, w, b = inputs(dtype, 2, 16, 3001, 7, seed=8)
    check(binaries, dtype, x.transpose(1, 2).contiguous().transpose(1, 2)[:, 1:, :], w[1:], b[1:], 7, 1, 6, 0, 1,
          act=1, layout_out="blc")


@pytest.mark.parametrize("dilation", [1, 2], ids=["slide", "taps"])
def test_a_channel_block_walks_several_steps_of_a_long_row(binaries, dilation):
    """One tile of two channels and a row of 2.2M outputs: more steps (1024 outputs each) than CHAN_BLOCKS blocks,
    so each block walks two of them, with and without the sliding window."""
    x, w, b = inputs("fp32", 1, 2, 2_200_000, 5, seed=9)
    check(binaries, "fp32", x.transpose(1, 2).contiguous().transpose(1, 2), w, b, 5, 1, 2 * dilation,
          2 * dilation, dilation, layout_out="blc")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_the_sliding_window_keeps_an_inf_past_the_last_tap_out_and_one_inside_in(binaries, dtype):
    """Stride and dilation 1 over (B, L, C): the window loads positions past the last tap's reach (a group of four
    taps at a time): an infinite input there must not meet a tap past K; one the taps reach gives PyTorch's inf or
    NaN where the float64 reference has them."""
    for k in (5, 6, 7, 8):
        x, w, b = inputs(dtype, 1, 8, 64, k, seed=k)
        x[0, :, 40] = float("inf")
        x[0, 3, 41] = float("-inf")
        blc = x.transpose(1, 2).contiguous().transpose(1, 2)
        y = run(binaries, dtype, blc, w, b, k, 1, k // 2, k - 1 - k // 2, 1, layout_out="blc").double()
        assert_same_infinities(y, reference(x, w, b, 1, k // 2, k - 1 - k // 2, 1), tolerance(dtype))


def test_strided_views_and_spans_past_shared_memory_take_the_loop_kernel(binaries):
    import torch

    x, w, b = inputs("fp32", 2, 3, 2000, 5, seed=2)
    check(binaries, "fp32", x[..., ::2], w, b, 5, 1, 2, 2, 1)  # every other element: stride 2 along the length
    x, w, b = inputs("fp32", 1, 2, 9000, 64, seed=3)
    assert render.ANY_SMEM_FLOATS < 1023 * 4 + 63 * 40  # stride 4, dilation 40: the span does not fit
    check(binaries, "fp32", x, w, b, 64, 4, 10, 10, 40)
    assert torch.isfinite(x).all()


def test_an_inf_past_the_last_tap_stays_out_of_the_sum(binaries):
    """The window's last step loads taps past K: they must not be multiplied in (0 * Inf is NaN)."""
    x, w, b = inputs("fp32", 1, 1, 1100, 5, seed=4)
    x[0, 0, 600] = float("inf")
    y = run(binaries, "fp32", x, w, b, 5, 1, 2, 2, 1).double()
    assert_same_infinities(y, reference(x, w, b, 1, 2, 2, 1), 1e-5)



@pytest.fixture(scope="module")
def walking(tmp_path_factory):
    """The generic forward, each block of its row kernel walking all its row's tiles."""
    tmp = tmp_path_factory.mktemp("any_fwd_walk")
    return build_walking(render.any_name, render.render_any, MAIN, tmp), tmp


# (B, C, L, K, stride, left, right, dilation): four tiles a block through the window, two at stride 2, three at
# dilation 2 (the spread kernel); paddings of more than two tiles a side, so that whole spans lie before the row's
# start and past its end (the offsets from a block's first tile), through the window, the spread kernel (dilation 3)
# and at stride 3 with dilation 2; stride 4 with dilation 8, and a span past AHEAD_FLOATS at stride 1
WALKS = [(2, 3, 3500, 5, 1, 2, 2, 1), (1, 2, 2900, 7, 2, 3, 3, 1), (2, 2, 2600, 4, 1, 3, 3, 2),
         (1, 2, 1000, 5, 1, 2500, 2300, 1), (1, 2, 1000, 3, 1, 2600, 2400, 3), (1, 2, 1000, 3, 3, 3100, 2900, 2),
         (1, 1, 9000, 2, 4, 1, 1, 8), (1, 1, 2500, 1100, 1, 549, 550, 1)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", WALKS, ids=lambda c: "x".join(map(str, c)))
def test_a_block_walking_a_rows_tiles_matches_float64(walking, dtype, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    x, w, b = inputs(dtype, bsz, ch, length + 1, k)
    # rows one element off any vector boundary: the fill's vectors start inside a row's first tile
    check(walking, dtype, x[..., 1:], w, b, k, stride, left, right, dilation)


def _drawn_row_problems(count: int, seed: int) -> list[tuple]:
    """(B, C, L, K, stride, left, right, dilation, offset) drawn over the row kernels' parameters: strides 1-4,
    dilations to 8 (never both 1: the window kernel has its own tests), K to 64, rows from 1 to 5000 long, paddings
    to past the halo, x one element off a vector boundary or not."""
    import random

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        s, d = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3, 5, 8])
        d = 2 if s == 1 and d == 1 else d
        k, length = rng.choice([1, 2, 3, 4, 5, 7, 9, 16, 31, 64]), rng.choice([1, 5, 33, 700, 1500, 3001, 5000])
        halo = d * (k - 1)
        left, right = rng.randint(0, halo + 3), rng.randint(0, halo + 3)
        right += max(0, halo + 1 - length - left - right)  # at least one output
        out.append((rng.choice([1, 2]), rng.choice([1, 3]), length, k, s, left, right, d, rng.choice([0, 1])))
    return out


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", _drawn_row_problems(40, seed=7), ids=lambda c: "x".join(map(str, c)))
def test_drawn_strided_and_dilated_row_problems_match_float64(walking, dtype, case):
    """Each block walking its row's tiles, as the GPU's long rows do."""
    bsz, ch, length, k, stride, left, right, dilation, offset = case
    x, w, b = inputs(dtype, bsz, ch, length + offset, k, seed=length + k)
    check(walking, dtype, x[..., offset:], w, b, k, stride, left, right, dilation, act=int(k == 5))


@pytest.fixture(scope="module")
def at_once(tmp_path_factory):
    """The generic forward with its walks ahead's reach cut to under two tiles and no taps for the async walk, so
    that every row problem takes the rows kernel (which fills a span and then sums it), each block walking all its
    row's tiles; at full size only spans past the async walk's buffers or its taps reach it."""
    tmp = tmp_path_factory.mktemp("any_fwd_at_once")
    cuts = {"constexpr long long WINDOW_REACH = 1LL << 30;": "constexpr long long WINDOW_REACH = 1LL << 11;",
            "constexpr int ASYNC_WEIGHTS = 256;": "constexpr int ASYNC_WEIGHTS = 0;"}

    def cut(dtype):
        source = render.render_any(dtype)
        for old, new in cuts.items():
            assert source.count(old) == 1
            source = source.replace(old, new)
        return source

    return build_walking(render.any_name, cut, MAIN, tmp), tmp


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("case", ROWS[:3] + ROWS[-3:] + WALKS[1:6], ids=lambda c: "x".join(map(str, c)))
def test_the_rows_kernel_filling_at_once_matches_float64(at_once, dtype, case):
    bsz, ch, length, k, stride, left, right, dilation = case
    x, w, b = inputs(dtype, bsz, ch, length + 1, k, seed=11)
    check(at_once, dtype, x[..., 1:], w, b, k, stride, left, right, dilation, act=int(k == 5))

DIVISION = r"""
#include <cstdio>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
// The narrow loop kernel's quotient against plain division, every divisor and dividend below 2^31 of interest:
// small divisors, powers of two and their neighbours, the largest, and pseudo-random ones; prints the mismatches.
int main() {
    using namespace CAT(NAME, _ns);
    const long long top = 0x7fffffffLL;
    unsigned long long state = 12345;
    auto rnd = [&]() {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        return (long long)(state >> 33);
    };
    long long divisors[8000], bad = 0, checked = 0, nd = 0;
    for (long long d = 1; d <= 5000; ++d) divisors[nd++] = d;
    for (int s = 1; s <= 30; ++s) for (long long e = -1; e <= 1; ++e) divisors[nd++] = (1LL << s) + e;
    divisors[nd++] = top;
    for (int i = 0; i < 1000; ++i) divisors[nd++] = rnd() % top + 1;
    for (long long i = 0; i < nd; ++i) {
        const long long d = divisors[i];
        const DivNarrow by = narrow(d);
        auto probe = [&](long long n) {
            if (n < 0 || n > top) return;
            ++checked;
            if (by.q(static_cast<int>(n)) != n / d && bad++ < 5) std::printf("d %lld n %lld\n", d, n);
        };
        for (long long n = 0; n < 300; ++n) probe(n), probe(top - n);
        for (long long k = 1; k < 40; ++k) probe(k * d - 1), probe(k * d), probe(top / d * d - k);
        for (int j = 0; j < 200; ++j) probe(rnd() % (top + 1));
    }
    std::printf("checked %lld bad %lld\n", checked, bad);
    return bad != 0;
}
"""


def test_the_narrow_quotient_is_exact_below_2_to_the_31(tmp_path):
    exe = build_generic(render.any_name("fp32"), render.render_any("fp32"), "fp32", DIVISION, tmp_path)
    proc = subprocess.run([str(exe)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "bad 0" in proc.stdout and int(proc.stdout.split()[1]) > 5_000_000
