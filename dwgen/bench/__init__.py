"""Timing: CUDA events, warm-up, L2 flush, medians, and the copy and PyTorch baselines of the same run."""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from dwgen.problem import Problem

MIN_REPS = 20
MAX_REPS = 2000
TARGET_MS = 50.0  # measure for about this long: more repetitions for short kernels (finalists are re-timed)
L2_FLUSH_BYTES = 256 * 1024 * 1024  # several times the H200's 60 MB L2
ROUND_BUDGET_MS = 300.0  # interleaved timing of one problem's contenders: about this much GPU time, 30-500 rounds


@dataclass(frozen=True)
class Timing:
    median_ms: float
    min_ms: float
    reps: int
    samples: tuple[float, ...] = ()  # every rep's ms, in order (interleaved timing keeps them per round)

    def to_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "reps": self.reps}


HOST_ROUNDS = 7  # rounds of calls whose median is a host-time figure
# calls a round: a training step launches up to ~10 kernels, so 20 stay far below the launch queue's ~1000; each
# round waits for its calls' GPU work, so calls cost device time (7 rounds of 100 took the bench from 64 s to 176 s)
HOST_CALLS = 20


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def time_rounds(fns: dict[str, Callable[[], object]], flush: bool) -> tuple[dict[str, Timing], int]:
    """Every callable timed interleaved, in as many rounds as fit ROUND_BUDGET_MS (30 to 500); and that count."""
    timer = Timer(flush=flush)
    est = sum(timer.time(fn, reps=5, warmup=2).median_ms for fn in fns.values())
    rounds = int(min(500, max(30, ROUND_BUDGET_MS / max(est, 1e-3))))
    return timer.time_interleaved(fns, rounds), rounds


def difference(total: Timing, part: Timing) -> Timing:
    """Round by round, total's time less part's (both timed interleaved in the same rounds): the backward
    as (forward+backward) - forward. Its min is that of the differences."""
    diffs = [t - p for t, p in zip(total.samples, part.samples, strict=True)]
    return Timing(statistics.median(diffs), min(diffs), len(diffs), tuple(diffs))


def ratio_spread(a: Timing, b: Timing) -> tuple[float, float, float]:
    """10th, 50th and 90th percentiles over rounds of a's time over b's in the same round."""
    ratios = [x / y for x, y in zip(a.samples, b.samples, strict=True)]
    return percentile(ratios, 10), percentile(ratios, 50), percentile(ratios, 90)


class Timer:
    """Times callables on the current CUDA device; flushes L2 before each rep when the data would fit."""

    def __init__(self, flush: bool):
        import torch

        self.flush_buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda") if flush else None

    def _once(self, fn: Callable[[], None]):
        import torch

        if self.flush_buf is not None:
            self.flush_buf.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        return start, end

    def time(self, fn: Callable[[], None], reps: int | None = None, warmup: int = 3) -> Timing:
        import torch

        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        if reps is None:
            probe = [self._once(fn) for _ in range(3)]
            torch.cuda.synchronize()
            est = max(min(s.elapsed_time(e) for s, e in probe), 1e-3)
            reps = int(min(MAX_REPS, max(MIN_REPS, TARGET_MS / est)))
        events = [self._once(fn) for _ in range(reps)]
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) for s, e in events]
        return Timing(statistics.median(times), min(times), reps)

    def time_interleaved(self, fns: dict[str, Callable[[], None]], rounds: int) -> dict[str, Timing]:
        """Time several callables round-robin so that drift in clocks or neighbours hits all alike."""
        import torch

        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        samples: dict[str, list] = {k: [] for k in fns}
        for _ in range(rounds):
            for k, fn in fns.items():
                samples[k].append(self._once(fn))
        torch.cuda.synchronize()
        out = {}
        for k, evs in samples.items():
            times = [s.elapsed_time(e) for s, e in evs]
            out[k] = Timing(statistics.median(times), min(times), len(times), tuple(times))
        return out


def graphed(fn: Callable[[], object]) -> Callable[[], None]:
    """fn captured once in a CUDA graph: a replay runs the same kernels without the host work of a call
    (argument checks, allocation, dispatch), so short kernels are timed on the GPU, not on Python."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up off the capture stream, as torch's graph docs ask
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def timed_form(fn: Callable[[], object], graphs: bool) -> tuple[Callable[[], object], str]:
    """(what to time, how): the call captured in a CUDA graph when asked and possible, else the plain call."""
    if not graphs:
        return fn, "plain"
    try:
        return graphed(fn), "graph"
    except Exception:  # e.g. a call that synchronises; its time then includes its host work
        import torch

        torch.cuda.synchronize()
        return fn, "plain (capture failed)"


def host_us_per_call(fn: Callable[[], object], calls: int = HOST_CALLS, rounds: int = HOST_ROUNDS) -> float:
    """Microseconds of CPU time to issue one call: the median over rounds of `calls` calls each, few enough
    that the launch queue never fills. Single rounds of 20 autograd steps read 89-142 µs in one process on the
    H200 (dwgen, 1x768x512), so one round alone would rank two contenders close to each other by chance."""
    import statistics
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per_call.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(per_call)


def _l2_bytes() -> int:
    import torch

    return getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 * 1024 * 1024)


def needs_flush(p: Problem) -> bool:
    return p.min_bytes < 4 * _l2_bytes()


def latency_bound(p: Problem) -> bool:
    """Data that fits in L2 takes microseconds to move: less than the host needs to issue a plain call.
    Such problems are timed as CUDA-graph replays; larger ones as plain calls, whose host time the GPU
    time hides. (Not graphs everywhere: on the H200 a captured copy_ of 512 MB, a memcpy node, took
    0.40 ms against 0.26 ms issued plainly, while one of 1 GB took the same either way.)"""
    return p.min_bytes < _l2_bytes()


def copy_operands(p: Problem):
    """A copy_ moving the bytes the op must move: (input + output elements) / 2 read and written."""
    import torch

    from dwgen.dtypes import torch_dtype

    n = (p.rows * (p.length + p.out_length)) // 2
    src = torch.randn(n, device="cuda", dtype=torch_dtype(p.dtype))
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def torch_forward(p: Problem, x, w, b):
    """The problem as PyTorch users write it: F.conv1d with its padding; a causal (or other right-short)
    padding at stride 1 as Mamba writes it, F.conv1d padded by the left padding on both sides and the first
    Lout outputs kept; any other asymmetric padding through F.pad; then SiLU where the problem has it."""
    import torch.nn.functional as F

    if p.symmetric:
        y = F.conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.channels)
    elif p.stride == 1 and p.padding_right < p.padding:
        y = F.conv1d(x, w, b, padding=p.padding, dilation=p.dilation, groups=p.channels)[..., :p.out_length]
    else:
        y = F.conv1d(F.pad(x, p.paddings), w, b, stride=p.stride, dilation=p.dilation, groups=p.channels)
    return F.silu(y) if p.activation == "silu" else y


def torch_operands(p: Problem, x, w, b):
    return lambda: torch_forward(p, x, w, b)


def torch_backward_operands(p: Problem, x, w, b, gy):
    """PyTorch's backward of the problem alone: torch.autograd.grad of x, weight and bias through F.conv1d's
    graph, recorded once and retained, so the time holds the backward's kernels and none of the forward's
    (the benchmark's training rows take fwd+bwd less fwd instead; this is one measurement, not a difference)."""
    import torch

    leaves = [t.detach().requires_grad_() for t in (x, w, b) if t is not None]
    with torch.enable_grad():
        y = torch_forward(p, leaves[0], leaves[1], leaves[2] if b is not None else None)
    return lambda: torch.autograd.grad(y, leaves, gy, retain_graph=True)
