"""How fast can a strided forward be? Bandwidth probes that read x and write a third (or a half, a quarter) of it, on
the GPU (not a benchmark of dwgen's kernels; python scripts/probe-stride-roof.py).

A stride-S forward reads x once and writes Lout = L / S outputs; dwgen's bench weighs it against a copy_ of as many
bytes ((L + Lout) / 2 elements a row read and written), so a kernel that moves only those bytes may still run
slower than that copy_ where reads outnumber writes. Access patterns, each a kernel of 16-byte loads and stores
over 16-bit data (8 elements a vector):
  own     a thread reads S consecutive vectors (the pattern of dw1d.cu.j2's l1 and async halos, where each thread's
          outputs come from its own run of inputs) and writes one vector
  spread  a warp's S loads each cover 512 contiguous bytes (thread t reads vectors t, t + 32, t + 64 of its warp's
          span), then writes one vector: what a kernel that regroups through shuffles or shared memory would load
  read    the spread loads alone (a store nothing takes): what reading x costs by itself
  copy    read one vector, write one vector over all of x (a copy_ of x, written the same way)
Each is timed beside that copy_ in shuffled rounds (median, and the 10th-90th percentiles of the ratio to copy_).
"""
from __future__ import annotations

import random
import statistics
import sys

import cupy as cp
import torch

SOURCE = r"""
#include <cuda_bf16.h>
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
// x read alone (a warp's 512 contiguous bytes a load, S loads a thread), one store a thread only where the sum is a
// value no random x makes: the read stream's own rate
extern "C" __global__ void readonly(const uint4* __restrict__ x, uint4* __restrict__ y, long long nout, int S) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= nout) return;
    const long long warp0 = (i & ~31LL) * S;
    const int lane = threadIdx.x & 31;
    unsigned r = 0;
    for (int m = 0; m < S; ++m) { uint4 c = x[warp0 + 32 * m + lane]; r ^= c.x ^ c.y ^ c.z ^ c.w; }
    if (r == 0x9e3779b9u) y[i] = make_uint4(r, r, r, r);
}
extern "C" __global__ void copyv(const uint4* __restrict__ x, uint4* __restrict__ y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
"""


def main() -> int:
    mod = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    own, spread, copyv = mod.get_function("own"), mod.get_function("spread"), mod.get_function("copyv")
    readonly = mod.get_function("readonly")
    shapes = [(8, 1024, 6000, 3), (4, 1536, 5000, 3), (4, 1536, 5000, 2), (4, 1536, 5000, 4), (8, 1024, 6144, 3)]
    print("shape stride | copy_ ms (the bench's baseline: (in + out) / 2 elements read and written) | "
          "pattern: ms, x copy_ (p10-p90)")
    for b, c, length, s in shapes:
        n = b * c * length  # 16-bit elements
        nvec = n // 8
        nout = nvec // s // 32 * 32
        xt = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        src = torch.randn((n + n // s) // 2, device="cuda", dtype=torch.bfloat16)  # dwgen.bench.copy_operands
        dst = torch.empty_like(src)
        x = cp.asarray(xt.view(torch.int16))
        y = cp.empty(nout * 8, dtype=cp.int16)  # nout vectors of 8
        yc = cp.empty(n, dtype=cp.int16)
        runs = {
            "copy_": lambda: dst.copy_(src),
            "copy": lambda: copyv(((nvec + 255) // 256,), (256,), (x, yc, cp.int64(nvec))),
            "own": lambda: own(((nout + 255) // 256,), (256,), (x, y, cp.int64(nout), cp.int32(s))),
            "spread": lambda: spread(((nout + 255) // 256,), (256,), (x, y, cp.int64(nout), cp.int32(s))),
            "read": lambda: readonly(((nout + 255) // 256,), (256,), (x, y, cp.int64(nout), cp.int32(s))),
        }
        times = {k: [] for k in runs}
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(3):
            for f in runs.values():
                f()
        torch.cuda.synchronize()
        for _ in range(60):
            order = list(runs)
            random.shuffle(order)
            for k in order:
                start.record()
                runs[k]()
                end.record()
                end.synchronize()
                times[k].append(start.elapsed_time(end))
        base = statistics.median(times["copy_"])
        cells = []
        for k in ("copy", "own", "spread", "read"):
            ratios = sorted(t / c_ for t, c_ in zip(times[k], times["copy_"]))
            p10, p90 = ratios[len(ratios) // 10], ratios[len(ratios) * 9 // 10]
            cells.append(f"{k} {statistics.median(times[k]):.4f} {statistics.median(ratios):.3f} ({p10:.3f}-{p90:.3f})")
        print(f"{b}x{c}x{length} S{s} | {base:.4f} | " + " | ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
