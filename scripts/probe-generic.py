"""The generic kernels (templates/dw1d_any.cu.j2, dw1d_bwd_any.cu.j2) through the committed module, for Nsight
Compute (not a benchmark): the untuned-signature rows of benchmarks/untuned.txt and the K15 backward (the op's
backward called directly), each call made once outside and once inside an NVTX range named probe.

    ncu --nvtx --nvtx-include probe/ python scripts/probe-generic.py
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from generated import depthwise_conv1d  # noqa: E402

# (B, C, L, K, padding, stride, dilation, dtype, layout, backward)
CASES = [(16, 512, 2000, 15, 7, 1, 1, torch.float16, "bcl", True),
         (8, 1024, 4000, 5, 4, 1, 2, torch.float32, "bcl", False),
         (8, 1024, 6000, 3, 1, 3, 1, torch.bfloat16, "blc", False),
         (8, 1024, 6000, 3, 1, 3, 1, torch.bfloat16, "bcl", False)]


def step(case) -> None:
    b, c, length, k, pad, stride, dil, dtype, layout, backward = case
    x = torch.randn(b, c, length, device="cuda", dtype=dtype)
    if layout == "blc":
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = torch.randn(c, 1, k, device="cuda", dtype=dtype)
    y = depthwise_conv1d(x, w, None, stride, pad, dil)
    if backward:  # the op's backward called here, not by autograd's thread: NVTX ranges are per thread
        torch.ops.dwgen.depthwise_conv1d_backward(torch.randn_like(y), x, w, None, stride, pad, pad, dil, 0)


for case in CASES:
    step(case)  # builds, and the first call's one-time work stays outside the range
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")
    step(case)
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
print("probed", len(CASES), "cases")
