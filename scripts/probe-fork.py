"""The frozen split backward (fp16 32x512x1024 K31 P15: grad_x beside the weight gradient on a second stream)
timed four ways, as plain calls and as CUDA-graph replays, each with and without the L2 flush that the tune
and the bench apply below 4x L2, with copy_ of the forward's bytes timed the same way beside it. A quick look
for docs/proposed/README.md's plan 2, not the bench:

    python scripts/probe-fork.py [--rounds 200]

Why: the side-by-side launch gained 8% in the tune's plain calls and 19% in the bench's graph replays; a plain
call forks and joins through events, which a replay resolves as graph edges. Each row is the median over
rounds, the four forms interleaved round by round, with its 10th-90th percentile spread.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import generated  # noqa: E402
from dwgen import bench  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(prog="python scripts/probe-fork.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=200)
    a = ap.parse_args()
    generated.build()
    B, C, L, K, P = 32, 512, 1024, 31, 15
    g = torch.Generator(device="cuda").manual_seed(0)
    x, gy = (torch.randn(B, C, L, device="cuda", generator=g).half() for _ in range(2))
    w = torch.randn(C, 1, K, device="cuda", generator=g).half()
    b = torch.randn(C, device="cuda", generator=g).half()
    src = torch.randn(x.numel(), device="cuda", generator=g).half()  # the forward's bytes: x read, y written
    dst = torch.empty_like(src)
    op = torch.ops.dwgen.depthwise_conv1d_backward

    def backward():
        op(gy, x, w, b, 1, P, P, 1, 0)

    def copy():
        dst.copy_(src)

    # the bench's own capture (bench.graphed), so that a replay here is what the bench times
    forms = {"backward plain": backward, "backward graph": bench.graphed(backward), "copy_ plain": copy,
             "copy_ graph": bench.graphed(copy)}
    print(f"fp16 {B}x{C}x{L} K{K} P{P} backward, the frozen module's; {a.rounds} rounds")
    print(f"{'form':<16} {'L2 flush':>8} {'median ms':>10} {'p10-p90':>16} {'x copy_':>8}")
    for flush in (True, False):
        timings = bench.Timer(flush=flush).time_interleaved(forms, a.rounds)  # each rep flushed (or not)
        ms = {name: list(t.samples) for name, t in timings.items()}
        for name, t in ms.items():
            q = statistics.quantiles(t, n=10)
            copy_ms = statistics.median(ms["copy_ " + name.split()[1]])
            print(f"{name:<16} {'yes' if flush else 'no':>8} {statistics.median(t):>10.4f} "
                  f"{q[0]:>7.4f}-{q[-1]:<8.4f} {statistics.median(t) / copy_ms:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
