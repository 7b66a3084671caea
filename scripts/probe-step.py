"""Where a training step's time goes beside its kernels (GPU host; a diagnosis, not the benchmark).

For training lines of benchmarks/training.txt (all plain-timed ones by default, or --lines N,M: 1-based among
the file's lines), dwgen's forward and forward+backward exactly as the bench calls them, timed interleaved with
copy_ in one process twice: as plain calls (what the bench records) and as CUDA-graph replays (the same kernels
with no host in between). Then one profiled step: each kernel's duration and the idle gap before it. A plain
step slower than its replay by more than the spread is waiting on the host between its launches.

    python scripts/probe-step.py [--lines 3,4] [--compile-first]

--compile-first runs the torch.compile contender's step on each case before measuring, as the bench does
before timing dwgen, to see whether what compile leaves in the process slows dwgen's host work.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dwgen import bench, check  # noqa: E402
from dwgen.bench import contenders  # noqa: E402
from dwgen.bench.cases import read_cases  # noqa: E402


def kernel_timeline(step) -> list[tuple[str, float, float]]:
    """(kernel name, µs, µs idle since the previous kernel ended) for one profiled call of step."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        prof.export_chrome_trace(f.name)
        events = json.loads(Path(f.name).read_text())["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    out, end = [], None
    for e in kernels:
        out.append((e["name"], e["dur"], 0.0 if end is None else e["ts"] - end))
        end = e["ts"] + e["dur"]
    return out


def probe(case, compile_first: bool) -> None:
    import torch

    x, w, b = check.make_inputs(case, 0)
    leaves = [t.requires_grad_() for t in (x, w, b) if t is not None]
    gy = check.in_layout(torch.randn(case.batch, case.channels, case.out_length, device="cuda").to(x.dtype),
                         case.layout)
    if compile_first:
        compiled = contenders.compiled_training(case)
        for _ in range(3):
            torch.autograd.grad(compiled(x, w, b), leaves, gy)
        torch.cuda.synchronize()
    forward = contenders.dwgen_training(case)
    fwd = lambda: forward(x, w, b)  # noqa: E731
    step = lambda: torch.autograd.grad(forward(x, w, b), leaves, gy)  # noqa: E731
    fns = {"copy_": bench.copy_operands(case), "fwd": fwd, "step": step}
    fns.update({f"{k} graph": bench.graphed(fn) for k, fn in list(fns.items())})
    times, rounds = bench.time_rounds(fns, flush=bench.needs_flush(case))
    host = bench.host_us_per_call(step)
    print(f"{case.key}  ({rounds} rounds; step host {host:.1f} us)")
    for form in ("", " graph"):
        copy_t, fwd_t, step_t = (times[k + form] for k in ("copy_", "fwd", "step"))
        bwd_t = bench.difference(step_t, fwd_t)
        cells = []
        for n, t in (("fwd", fwd_t), ("bwd", bwd_t), ("step", step_t)):
            lo, _, hi = bench.ratio_spread(t, copy_t)
            cells.append(f"{n} {t.median_ms:.4f} ({t.median_ms / copy_t.median_ms:.3f}x, {lo:.3f}-{hi:.3f})")
        print(f"  {form.strip() or 'plain':5s}  copy_ {copy_t.median_ms:.4f} ms   " + "   ".join(cells))
    step()  # under the profiler the host runs slower: the gap before the backward is mostly the profiler's
    for name, dur, gap in kernel_timeline(step):
        print(f"    {name[:64]:64s} {dur:8.1f} us  gap before {gap:6.1f} us")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/probe-step.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", default="", help="1-based indices among benchmarks/training.txt's cases")
    ap.add_argument("--compile-first", action="store_true")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("probe-step: needs a CUDA GPU", file=sys.stderr)
        return 2
    cases = read_cases(ROOT / "benchmarks" / "training.txt")
    try:
        picked = [cases[int(i) - 1] for i in a.lines.split(",")] if a.lines else \
            [c for c in cases if not (c.graph or bench.latency_bound(c))]
    except (ValueError, IndexError):
        print(f"probe-step: --lines takes indices 1 to {len(cases)}, comma-separated", file=sys.stderr)
        return 2
    import generated

    generated.build()
    for case in picked:
        probe(case, a.compile_first)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
