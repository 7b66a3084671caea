"""Host time of one call (µs of CPU to issue it) on a small problem, dwgen beside F.conv1d in one process.

A quick look for the GPU host, not the bench: python scripts/probe-host.py [--shape 1x768x512] [--k 3]
Each figure is the median of 9 rounds of 200 calls, with its 10th-90th percentile spread; the rows take
turns within each round.

--after graphs,compile,triton,memory re-times four rows after each of those steps in turn, in the same process,
to find what in the bench's process inflates host times: CUDA graphs captured (as the bench's graph rows), a
torch.compile'd convolution with its backward (the bench's torch.compile contender), the simple Triton kernel
(its JIT), and a large allocation cycle (the caching allocator's state after the bench's big rows).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import generated  # noqa: E402


def host_us(rows: dict, calls: int = 200, rounds: int = 9) -> dict[str, tuple[float, float, float]]:
    """Median and 10th-90th percentile µs per call of each row, the rows interleaved round by round so that a
    host's drift (other tenants, clocks) lands on all of them alike."""
    for fn in rows.values():
        fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in rows}
    for _ in range(rounds):
        for name, fn in rows.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - t0) / calls * 1e6)
            torch.cuda.synchronize()
    out = {}
    for name, s in samples.items():
        q = statistics.quantiles(sorted(s), n=10)
        out[name] = (statistics.median(s), q[0], q[-1])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="1x768x512")
    ap.add_argument("--k", type=int, default=3)
    ap.add_argument("--after", default="", help=f"comma-separated steps among {', '.join(STAGES)}")
    a = ap.parse_args()
    unknown = [s for s in a.after.split(",") if s and s not in STAGES]
    if unknown:
        ap.error(f"unknown step(s) {unknown}; choose from {', '.join(STAGES)}")
    b, c, n = map(int, a.shape.split("x"))
    x = torch.randn(b, c, n, device="cuda")
    w = torch.randn(c, 1, a.k, device="cuda")
    pad = (a.k - 1) // 2
    wp = torch.nn.Parameter(w.clone())
    xg = x.clone().requires_grad_()
    layer = generated.DepthwiseConv1d(c, a.k, padding=pad, bias=False, device="cuda")
    generated.depthwise_conv1d(x, w, None, 1, pad)  # builds and loads the extension, registering the op
    op = torch.ops.dwgen.depthwise_conv1d.default
    direct = generated.build().forward
    bwd = torch.ops.dwgen.depthwise_conv1d_backward.default
    gy = torch.randn(b, c, n + 2 * pad - a.k + 1, device="cuda")
    rows = {
        "F.conv1d": lambda: F.conv1d(x, w, None, 1, pad, 1, c),
        "dwgen plain call": lambda: generated.depthwise_conv1d(x, w, None, 1, pad),
        "torch.ops.dwgen (.default)": lambda: op(x, w, None, 1, pad, pad, 1, 0),
        "C++ forward, direct binding": lambda: direct(x, w, None, 1, pad, pad, 1, 0),
        "x.new_empty (the output alone)": lambda: x.new_empty(x.shape),
        "dwgen causal": lambda: generated.depthwise_conv1d(x, w, None, 1, "causal"),
        "F.conv1d, grad": lambda: F.conv1d(xg, wp, None, 1, pad, 1, c),
        "dwgen, grad": lambda: generated.depthwise_conv1d(xg, wp, None, 1, pad),
        "layer, grad": lambda: layer(xg),
        # a training step's host work: the forward, then autograd's backward through the engine, in a fresh
        # process (the bench's training rows, taken after its other contenders ran, read 2-4x more)
        "F.conv1d fwd+bwd": lambda: torch.autograd.grad(F.conv1d(xg, wp, None, 1, pad, 1, c), (xg, wp), gy),
        "dwgen fwd+bwd": lambda: torch.autograd.grad(generated.depthwise_conv1d(xg, wp, None, 1, pad), (xg, wp), gy),
        "dwgen backward op alone": lambda: bwd(gy, x, w, None, 1, pad, pad, 1, 0),
    }
    print(f"host µs per call, {a.shape} K{a.k} fp32 (median, p10-p90 over 9 rounds of 200 calls, rows interleaved)")
    for name, (m, lo, hi) in host_us(rows).items():
        print(f"{name:30s} {m:7.2f}  ({lo:.2f}-{hi:.2f})")
    if a.after:
        watched = ("F.conv1d", "dwgen plain call", "F.conv1d fwd+bwd", "dwgen fwd+bwd")
        print(f"\nafter each step, in turn: {', '.join(watched)}")
        for stage in ["fresh", *a.after.split(",")]:
            if stage != "fresh":
                STAGES[stage](x, w, pad)
            got = host_us({k: rows[k] for k in watched})
            print(f"{stage:10s} " + "  ".join(f"{got[k][0]:7.2f}" for k in watched))


def _graphs(x, w, pad) -> None:
    """50 CUDA graphs of dwgen calls on new inputs, kept alive (the bench keeps its graphs until the row ends),
    captured as the bench captures them (dwgen.bench.graphed)."""
    from dwgen import bench

    keep = []
    for i in range(50):
        xi = torch.randn(2, 64 + i, 1000, device="cuda")
        wi = torch.randn(64 + i, 1, 3, device="cuda")
        keep.append((bench.graphed(lambda xi=xi, wi=wi: generated.depthwise_conv1d(xi, wi, None, 1, 1)), xi, wi))
    _KEPT.append(keep)


def _compile(x, w, pad) -> None:
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    f = torch.compile(lambda a, b: F.conv1d(a, b, None, 1, pad, 1, a.shape[1]), dynamic=False)
    for _ in range(3):
        torch.autograd.grad(f(xg, wg), (xg, wg), torch.ones_like(x))
    torch.cuda.synchronize()
    _KEPT.append(f)


def _triton(x, w, pad) -> None:
    from dwgen.bench import contenders
    from dwgen.problem import Problem

    p = Problem(x.shape[0], x.shape[1], x.shape[2], w.shape[2], 1, pad, 1)
    run = contenders.triton_simple(p, x, w, None)
    for _ in range(3):
        run()
    torch.cuda.synchronize()


def _memory(x, w, pad) -> None:
    big = [torch.empty(1 << 30, dtype=torch.uint8, device="cuda") for _ in range(16)]
    del big


_KEPT: list = []
STAGES = {"graphs": _graphs, "compile": _compile, "triton": _triton, "memory": _memory}


if __name__ == "__main__":
    main()
