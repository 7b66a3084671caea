"""How fast can a strided forward's bytes move? Bare kernels that read x and write a third (a half, a quarter) of it,
timed the way dwgen's bench times a problem, on the GPU (not a benchmark of dwgen's kernels):

    python scripts/probe-stride-roof.py [--with-dwgen]

A stride-S forward reads x once and writes Lout = L / S outputs; the bench weighs it against a copy_ of as many
bytes ((L + Lout) / 2 elements a row read and written, dwgen.bench.copy_operands). Where reads outnumber writes,
a kernel that moves only those bytes need not run as fast as that copy_. Each pattern is a kernel of 16-byte
loads and stores over 16-bit data (8 elements a vector):
  own     a thread reads S consecutive vectors (the pattern of dw1d.cu.j2's l1 and async halos, where each thread's
          outputs come from its own run of inputs) and writes one vector
  spread  a warp's S loads each cover 512 contiguous bytes (thread t reads vectors t, t + 32, t + 64 of its warp's
          span), then writes one vector: what a kernel that regroups through shuffles or shared memory would load
  read    the spread loads alone (a store nothing takes): x's bytes only, fewer than copy_ moves
With --with-dwgen, the frozen module's own call on the problem (K 3, padding 1) runs in the same rounds (its first
import builds generated/). Timing is dwgen.bench's: interleaved rounds, L2 flushed before each launch where the
problem's bytes would fit it four times over; each ratio is the median over rounds of a side's time over copy_'s in
the same round, with the 10th-90th percentiles.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ["--shape 8x1024x6000 --kernel-size 3 --padding 1 --stride 3 --dtype bf16",
          "--shape 4x1536x5000 --kernel-size 3 --padding 1 --stride 3 --dtype bf16",
          "--shape 4x1536x5000 --kernel-size 3 --padding 1 --stride 2 --dtype bf16",
          "--shape 4x1536x5000 --kernel-size 3 --padding 1 --stride 4 --dtype bf16",
          "--shape 8x1024x6144 --kernel-size 3 --padding 1 --stride 3 --dtype bf16"]

SOURCE = r"""
extern "C" __global__ void own(const uint4* __restrict__ x, uint4* __restrict__ y, long long nout, int S) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nout) return;
    uint4 a = x[i * S], b = x[i * S + 1];
    uint4 r = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
    if (S > 2) { uint4 c = x[i * S + 2]; r.x ^= c.x; r.y ^= c.y; r.z ^= c.z; r.w ^= c.w; }
    if (S > 3) { uint4 c = x[i * S + 3]; r.x ^= c.x; r.y ^= c.y; r.z ^= c.z; r.w ^= c.w; }
    y[i] = r;
}
extern "C" __global__ void spread(const uint4* __restrict__ x, uint4* __restrict__ y, long long nout, int S) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nout) return;
    const long long warp0 = (i & ~31LL) * S;
    const int lane = threadIdx.x & 31;
    uint4 a = x[warp0 + lane], b = x[warp0 + 32 + lane];
    uint4 r = make_uint4(a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w);
    if (S > 2) { uint4 c = x[warp0 + 64 + lane]; r.x ^= c.x; r.y ^= c.y; r.z ^= c.z; r.w ^= c.w; }
    if (S > 3) { uint4 c = x[warp0 + 96 + lane]; r.x ^= c.x; r.y ^= c.y; r.z ^= c.z; r.w ^= c.w; }
    y[i] = r;
}
// x read alone, one store a thread only where the loads XOR to a value no random x makes: the reads' own rate
extern "C" __global__ void readonly(const uint4* __restrict__ x, uint4* __restrict__ y, long long nout, int S) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nout) return;
    const long long warp0 = (i & ~31LL) * S;
    const int lane = threadIdx.x & 31;
    unsigned r = 0;
    for (int m = 0; m < S; ++m) { uint4 c = x[warp0 + 32 * m + lane]; r ^= c.x ^ c.y ^ c.z ^ c.w; }
    if (r == 0x9e3779b9u) y[i] = make_uint4(r, r, r, r);
}
"""


def sizes(p) -> tuple[int, int]:
    """x's 16-bit elements and the output vectors the kernels write (whole warps). Every kernel reads vectors below
    nout * S, which must lie inside x's n / 8 (tests/test_probe_stride_roof.py)."""
    n = p.rows * p.length
    return n, n // 8 // p.stride // 32 * 32


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/probe-stride-roof.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--with-dwgen", action="store_true", help="time generated/'s call on each problem too")
    a = ap.parse_args(argv)
    import cupy as cp
    import torch

    from dwgen import bench
    from dwgen.suite import add_problem_arguments, problem_from_args

    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    kernels = {k: mod.get_function(f) for k, f in (("own", "own"), ("spread", "spread"), ("read", "readonly"))}
    parse = argparse.ArgumentParser()
    add_problem_arguments(parse)
    print("problem | copy_ ms (bench.copy_operands) | side: ms, x copy_ median (p10-p90)")
    for line in SHAPES:
        p = problem_from_args(parse.parse_args(shlex.split(line)))
        s, (n, nout) = p.stride, sizes(p)
        xt = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        x = cp.asarray(xt.view(torch.int16))
        y = cp.empty(nout * 8, dtype=cp.int16)
        grid = ((nout + 255) // 256,)
        fns = {"copy_": bench.copy_operands(p)}
        args = (x, y, cp.int64(nout), cp.int32(s))
        for name, k in kernels.items():
            fns[name] = lambda k=k, g=grid, args=args: k(g, (256,), args)
        if a.with_dwgen:
            from generated import depthwise_conv1d

            xd = xt.view(p.batch, p.channels, p.length)
            wd = torch.randn(p.channels, 1, p.kernel_size, device="cuda", dtype=torch.bfloat16)
            fns["dwgen"] = lambda xd=xd, wd=wd, p=p: depthwise_conv1d(xd, wd, None, stride=p.stride, padding=p.padding)
        times, rounds = bench.time_rounds(fns, flush=bench.needs_flush(p))
        copy = times["copy_"]
        cells = []
        for name, t in times.items():
            if name != "copy_":
                lo, mid, hi = bench.ratio_spread(t, copy)
                cells.append(f"{name} {t.median_ms:.4f} {mid:.3f} ({lo:.3f}-{hi:.3f})")
        print(f"{p.key} | {copy.median_ms:.4f} ({rounds} rounds) | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
