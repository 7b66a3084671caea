"""A stand-in problem (tune.py --stand-in): tuned on one size, its winner is lent to every size of its signature
(generated/'s lent tables), so its finalists are weighed at a second size as well.

Why: the fiftieth session's re-tune of the fp16 K4 stride 4 stand-in (4x1536x5000) chose a streaming design 2%
ahead there, which read 1.08x -> 1.13x copy on an untuned 8x1024x6000 problem of the same signature. One size
cannot tell a size-dependent design apart; a second one can.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from dwgen import frozen_dispatch
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.worker import Candidate


def lent_reason(p: Problem) -> str | None:
    """Why p cannot stand in for its signature (None when it can): only signatures past the fast generic kernels
    (a stride, a dilation, K past 16) borrow a tuned kernel; the others run generic kernels. The rule is the
    frozen dispatcher's own, so that the two cannot disagree."""
    if frozen_dispatch._has_fast_generic(p.kernel_size, p.stride, p.dilation):
        return (f"--stand-in: K{p.kernel_size} at stride 1 and dilation 1 runs the fast generic kernels when untuned, "
                "so nothing is lent; leave --stand-in out for it")
    return None


def second_size(p: Problem) -> Problem:
    """The other size a stand-in's finalists are weighed at: twice the batch and four fifths of the length (kept
    a multiple of 64, so that 16-byte vectors stay aligned where they were), about 1.6 times the elements.
    Apart from the benchmark's untuned rows (8x1024x6000), which must stay a test of lending, not its target."""
    return replace(p, batch=2 * p.batch, length=max(64, p.length * 4 // 5 // 64 * 64))


def worse_of_two(here: dict[str, float], there: dict[str, float]) -> dict[str, float]:
    """Each finalist's score: its time over the fastest's at the stand-in's size (`here`), or at the second size
    (`there`: relative already; infinity for one that failed its check there), whichever is worse. A finalist
    missing from `there` (its launch takes fixed sizes, so it would not be lent) scores infinity while another
    has a time there; when none has, the stand-in's own times decide, as for any problem."""
    fastest = min(here.values())
    own = {k: t / fastest for k, t in here.items()}
    timed_there = any(math.isfinite(r) for r in there.values())
    return {k: max(r, there.get(k, math.inf if timed_there else r)) for k, r in own.items()}


def shape_text(p: Problem) -> str:
    return f"{p.batch}x{p.channels}x{p.length}"


def weigh_at(other: Problem, worker, rounds: int, log=print) -> Callable[[list[Candidate]], dict[str, float]]:
    """loop.decide's `elsewhere`: switch `worker` to `other`, check each candidate whose launch takes sizes at run
    time there (no timing before a pass), re-time those that passed interleaved with copy_, switch back, and
    return each one's time over the fastest's there (infinity for one that failed there)."""

    def weigh(cands: list[Candidate]) -> dict[str, float]:
        home = worker.problem
        lendable = [c for c in cands if c.variant.family.sizes_at_run_time]
        if not lendable:
            log(f"stand-in: no finalist's launch takes sizes at run time; {shape_text(home)} decides alone")
            return {}
        worker.switch(other)
        try:
            passed = []
            for c in lendable:
                base = Result(c.variant.name, c.variant.digest, "ok", direction=c.variant.direction)
                r = worker.check(c, base, edges=False)
                if r.status == "ok":
                    passed.append(c)
                else:  # it would be lent to sizes it gets wrong: it cannot win
                    log(f"stand-in: {c.variant.name} {r.status} at {shape_text(other)}: {r.message}")
            times = worker.retime(passed, rounds) if passed else {}
        finally:
            worker.switch(home)
        rel = {c.variant.name: math.inf for c in lendable}
        if passed:
            log(f"stand-in: re-timed at {shape_text(other)}, interleaved (ms): "
                + ", ".join(f"{k} {t:.4f}" for k, t in times.items()))
            fastest = min(times[c.variant.name] for c in passed)
            rel.update({c.variant.name: times[c.variant.name] / fastest for c in passed})
        return rel

    return weigh
