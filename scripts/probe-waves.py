"""Which kernel the frozen module runs on each row of a suite file, launched a few times so that Nsight Compute
can read its grid, occupancy and waves (run it under `ncu --section LaunchStats --section Occupancy`), and, with
--time, each row's median time beside copy_ of the same bytes (x copy): how an untuned row's ratio moves with
the wave fill of its grid (docs/perf-notes.md, fifty-eighth session)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dwgen.bench import Timer  # noqa: E402
from dwgen.check import make_inputs  # noqa: E402
from dwgen.problem import ProblemError  # noqa: E402
from dwgen.suite import read_suite  # noqa: E402


def probe_row(p, timed: bool, rounds: int) -> None:
    import torch

    import generated

    x, w, b = make_inputs(p, seed=1)
    act = p.activation if p.activation != "none" else None
    kw = dict(stride=p.stride, padding=p.padding_arg, dilation=p.dilation, activation=act)
    name = generated.kernel_for(x, w, b, **kw)

    def call():
        return generated.depthwise_conv1d(x, w, b, **kw)

    if not timed:
        call()  # one launch a row for ncu
        torch.cuda.synchronize()
        print(f"{p.key} | {name}", flush=True)
        return
    y = call()
    src, dst = x.new_empty(x.numel()), y.new_empty(max(x.numel(), y.numel()))

    def copy():
        return dst[:src.numel()].copy_(src)

    timer = Timer(flush=False)
    ks, cs = [], []
    for _ in range(5):  # alternate the two in blocks, so drifts reach both
        ks.append(timer.time(call, reps=rounds // 5).median_ms)
        cs.append(timer.time(copy, reps=rounds // 5).median_ms)
    k, c = sorted(ks)[2], sorted(cs)[2]
    print(f"{p.key} | {name} | {k:.4f} ms | copy {c:.4f} | {k / c:.3f}x", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("file")
    ap.add_argument("--time", action="store_true", help="time each row beside copy_ (no ncu)")
    ap.add_argument("--rounds", type=int, default=60)
    a = ap.parse_args()
    try:
        problems = read_suite(Path(a.file))
    except ProblemError as e:
        print(f"probe-waves: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("probe-waves: needs a CUDA GPU (it runs the frozen module)", file=sys.stderr)
        return 2
    for p in problems:
        probe_row(p, a.time, a.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
