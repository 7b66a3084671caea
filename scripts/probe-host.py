"""Host time of one call (µs of CPU to issue it) on a small problem, dwgen beside F.conv1d in one process.

A quick look for the GPU host, not the bench: python scripts/probe-host.py [--shape 1x768x512] [--k 3]
Each figure is the median of 9 rounds of 200 calls, with its 10th-90th percentile spread; the rows take
turns within each round.
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
    a = ap.parse_args()
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


if __name__ == "__main__":
    main()
