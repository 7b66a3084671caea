"""Quick probe of training speed on the GPU host (not the benchmark): forward, backward and both, for
dwgen and PyTorch, as x copy_ of the forward's bytes. Prints one table. python scripts/probe-train.py"""
from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
import generated  # noqa: E402

CASES = [  # B, C, L, K, dtype, layout, padding, activation
    (32, 512, 8192, 3, torch.float32, "bcl", 1, None),
    (32, 512, 8192, 3, torch.bfloat16, "bcl", 1, None),
    (8, 4096, 2048, 4, torch.bfloat16, "bcl", "causal", "silu"),
    (8, 4096, 2048, 4, torch.bfloat16, "blc", "causal", "silu"),
    (16, 1024, 4096, 7, torch.float32, "bcl", 3, None),
    (32, 512, 1024, 31, torch.float16, "bcl", 15, None),  # Conformer: the split backward (ncu case 5)
]


def timed(fn, reps=30):
    flush = torch.empty(256 * 1024 * 1024 // 4, device="cuda")
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def probe(B, C, L, K, dt, layout, pad, act, profile: bool) -> None:
    x0 = torch.randn(B, L, C, device="cuda", dtype=dt).transpose(1, 2) if layout == "blc" else \
        torch.randn(B, C, L, device="cuda", dtype=dt)
    w0 = torch.randn(C, 1, K, device="cuda", dtype=dt) * 0.3
    x, w = (t.detach().requires_grad_() for t in (x0, w0))
    b = None  # no bias, as benchmarks/training.txt: a bias would take the generic kernels, not the tuned ones
    src = x0.detach().clone()
    dst = torch.empty_like(src)
    copy = timed(lambda: dst.copy_(src))

    def dw():
        return generated.depthwise_conv1d(x, w, b, padding=pad, activation=act)

    def pt():
        if pad == "causal":
            y = F.conv1d(x, w, b, padding=K - 1, groups=C)[..., :L]
        else:
            y = F.conv1d(x, w, b, padding=pad, groups=C)
        return F.silu(y) if act == "silu" else y

    rows = []
    for f in (dw, pt):
        gy = torch.randn_like(f())
        with torch.no_grad():
            tf = timed(f)

        def step(f=f, gy=gy):
            x.grad = w.grad = None  # as the baselines: no accumulation into old gradients
            torch.autograd.backward(f(), gy)

        tfb = timed(step)
        rows += [tf / copy, (tfb - tf) / copy, tfb / copy]
    name = f"{B}x{C}x{L} K{K} {str(dt)[6:]} {layout} p={pad} {act or ''}"
    print(f"{name:44s} {copy:8.3f} " + " ".join(f"{r:6.2f}x" for r in rows))
    if profile:  # which kernels the backward ran, and for how long each
        y = dw()
        gy = torch.randn_like(y)
        x.grad = w.grad = None
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            torch.autograd.backward(y, gy)
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                print(f"    {e.key[:70]:70s} {e.device_time_total / max(e.count, 1):9.1f} us")


def main():
    generated.build()
    heads = ("copy ms", "dw fwd", "dw bwd", "dw f+b", "pt fwd", "pt bwd", "pt f+b")
    print(f"{'problem':44s} {heads[0]:>8s} " + " ".join(f"{h:>7s}" for h in heads[1:]))
    for case in CASES:
        probe(*case, profile="--profile" in sys.argv)


if __name__ == "__main__":
    main()
