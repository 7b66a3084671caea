"""A stand-in problem (tune.py --stand-in): tuned on one size, its winner is lent to every size of its signature
(generated/'s lent tables), so its finalists are weighed at a second size as well.

Why: the fiftieth session's re-tune of the fp16 K4 stride 4 stand-in (4x1536x5000) chose a streaming design 2%
ahead there, which read 1.08x -> 1.13x copy on an untuned 8x1024x6000 problem of the same signature. One size
cannot tell a size-dependent design apart; a second one can.
"""
from __future__ import annotations

import math
from dataclasses import replace

from dwgen import frozen_dispatch
from dwgen.problem import Problem, ProblemError
from dwgen.result import Result
from dwgen.worker import Candidate


def lent_reason(p: Problem) -> str | None:
    """Why p cannot stand in for its signature (None when it can): only signatures past the fast generic kernels
    (a stride, a dilation, K past 16) borrow a tuned kernel; the others run generic kernels. The rule is the
    frozen dispatcher's own, so that the two cannot disagree. Its second size must be a problem too."""
    if frozen_dispatch._has_fast_generic(p.kernel_size, p.stride, p.dilation):
        return (f"--stand-in: K{p.kernel_size} at stride 1 and dilation 1 runs the fast generic kernels when untuned, "
                "so nothing is lent; leave --stand-in out for it")
    try:
        second_size(p)
    except ProblemError as e:
        return f"--stand-in: its second size ({2 * p.batch}x{p.channels}x{_second_length(p)}) is no problem: {e}"
    return None


def _second_length(p: Problem) -> int:
    return max(64, p.length * 4 // 5 // 64 * 64)


def second_size(p: Problem) -> Problem:
    """The other size a stand-in's finalists are weighed at: twice the batch and four fifths of the length, rounded
    down to a multiple of 64 (so a 16-bit row stays whole 16-byte vectors), about 1.6 times the elements.
    benchmarks/signatures.txt's test keeps these apart from the benchmark's rows, which must stay a test of
    lending, not its target."""
    return replace(p, batch=2 * p.batch, length=_second_length(p))


def worse_of_two(here: dict[str, float], there: dict[str, float]) -> dict[str, float]:
    """Each finalist's score: its time over the fastest's at the stand-in's size (`here`), or at the second size
    (`there`: relative already; infinity for one that failed its check there), whichever is worse. A finalist
    missing from `there` (its launch takes fixed sizes, so it would not be lent) scores infinity while another
    has a time there, and the fastest here is then taken over those alone: a finalist that cannot win must not
    move the others' scores. When none has a time there, the stand-in's own times decide, as for any problem."""
    timed_there = [k for k, r in there.items() if math.isfinite(r) and k in here]
    fastest = min(here[k] for k in timed_there) if timed_there else min(here.values())
    if not timed_there:
        return {k: max(t / fastest, there.get(k, 0.0)) for k, t in here.items()}
    return {k: max(t / fastest, there.get(k, math.inf)) for k, t in here.items()}


class SecondSize:
    """loop.decide's `elsewhere` for a stand-in: switch `worker` to second_size(problem), check each candidate
    whose launch takes sizes at run time there (float64, NaN-poisoned outputs, its stream; no timing before a
    pass), re-time those that passed interleaved with copy_, switch back, and return each one's time over the
    fastest's there (infinity for one that failed there, or for all when the worker died re-timing them). The
    last answer stays in `relative`, for the log."""

    def __init__(self, problem: Problem, worker, log=print):
        self.problem, self.other, self.worker, self.log = problem, second_size(problem), worker, log
        self.relative: dict[str, float] = {}

    def __call__(self, cands: list[Candidate], rounds: int) -> dict[str, float]:
        from dwgen.worker import WorkerDied

        where = shape_text(self.other)
        lendable = [c for c in cands if c.variant.family.sizes_at_run_time]
        self.relative = {c.variant.name: math.inf for c in lendable}
        if not lendable:
            self.log(f"stand-in: no finalist's launch takes sizes at run time; {shape_text(self.problem)} decides alone")
            return self.relative
        self.worker.switch(self.other)
        try:
            passed = []
            for c in lendable:
                base = Result(c.variant.name, c.variant.digest, "ok", direction=c.variant.direction)
                r = self.worker.check(c, base, edges=False)
                if r.status == "ok":
                    passed.append(c)
                else:  # it would be lent to sizes it gets wrong: it cannot win
                    self.log(f"stand-in: {c.variant.name} {r.status} at {where}: {r.message}")
            times = self.worker.retime(passed, rounds) if passed else {}
        except WorkerDied as e:
            self.log(f"stand-in: the worker died re-timing at {where} ({e}); no finalist is lent from this run")
            return self.relative
        finally:
            self.worker.switch(self.problem)
        if passed:
            self.log(f"stand-in: re-timed at {where}, interleaved (ms): "
                     + ", ".join(f"{k} {t:.4f}" for k, t in times.items()))
            fastest = min(times[c.variant.name] for c in passed)
            self.relative.update({c.variant.name: times[c.variant.name] / fastest for c in passed})
        return self.relative


def shape_text(p: Problem) -> str:
    return f"{p.batch}x{p.channels}x{p.length}"
