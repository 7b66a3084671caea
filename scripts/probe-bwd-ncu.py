"""One backward of a probe case, for ncu (python scripts/probe-bwd-ncu.py CASE_INDEX); not a benchmark.

No bias, as benchmarks/training.txt: with one the call would take the generic kernels, not the tuned ones.
"""
import sys

import torch

sys.path.insert(0, ".")
sys.path.insert(0, "scripts")
import generated  # noqa: E402

B, C, L, K, dt, layout, pad, act = __import__("probe-train").CASES[int(sys.argv[1])]
x0 = torch.randn(B, L, C, device="cuda", dtype=dt).transpose(1, 2) if layout == "blc" else \
    torch.randn(B, C, L, device="cuda", dtype=dt)
x = x0.requires_grad_()
w = (torch.randn(C, 1, K, device="cuda", dtype=dt) * 0.3).requires_grad_()
for _ in range(2):
    y = generated.depthwise_conv1d(x, w, None, padding=pad, activation=act)
    torch.autograd.backward(y, torch.randn_like(y))
torch.cuda.synchronize()
