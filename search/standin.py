"""A stand-in problem (tune.py --stand-in): tuned on one size, its winner is lent to every size of its signature
(generated/'s lent tables), so its finalists are weighed at other sizes as well.

Why: the fiftieth session's re-tune of the fp16 K4 stride 4 stand-in (4x1536x5000) chose a streaming design 2%
ahead there, which read 1.08x -> 1.13x copy on an untuned 8x1024x6000 problem of the same signature. One size
cannot tell a size-dependent design apart. One more size was not enough either (fifty-first session): at
8x1536x3968 a row design was 4% ahead of the committed one, which search.compare then measured 2-5% ahead at three
other sizes and tied at the stand-in's. So the finalists are weighed at three other sizes of different shapes, by
the geometric mean of their relative times.
"""
from __future__ import annotations

import math
from dataclasses import replace

from dwgen.problem import Problem, ProblemError
from dwgen.result import Result
from dwgen.worker import Candidate


def _multiple_of_64(n: float) -> int:
    return max(64, int(n) // 64 * 64)


def _half_channels(c: int) -> int:
    """Half the channels, kept a multiple of 8 (a (B, L, C) kernel's vector of channels: the dispatcher lends it
    only where C is a multiple of that, so a size that is not would test a call it never gets)."""
    return c // 2 // 8 * 8 if c >= 16 else c


def other_sizes(p: Problem) -> list[Problem]:
    """The sizes a stand-in's finalists are weighed at besides its own: more rows and shorter ones (twice the
    batch, four fifths of the length), many short rows (four times the batch, half the channels, three fifths of
    the length) and few long ones (half the batch, rounded up, twice the length): the grid's rows and a row's
    tiles both change. Lengths are multiples of 64 (a 16-bit row stays whole 16-byte vectors); at the
    stand-ins' sizes each has 1 to 1.6 times their elements (more for a batch of 1 or few channels).
    benchmarks/signatures.txt's test keeps them apart from the benchmark's rows, which must stay a test of
    lending, not its target."""
    return [replace(p, batch=2 * p.batch, length=_multiple_of_64(p.length * 4 / 5)),
            replace(p, batch=4 * p.batch, channels=_half_channels(p.channels),
                    length=_multiple_of_64(p.length * 3 / 5)),
            replace(p, batch=(p.batch + 1) // 2, length=_multiple_of_64(p.length * 2))]


def lent_reason(p: Problem) -> str | None:
    """Why p cannot stand in for its signature (None when it can): only signatures past the fast generic kernels
    (a stride, a dilation, K past 16) borrow a tuned kernel; the others run generic kernels. The rule is the
    frozen dispatcher's own, so that the two cannot disagree. Its other sizes must be problems too."""
    from dwgen import frozen_dispatch  # imports torch: not at search.loop's import

    if frozen_dispatch._has_fast_generic(p.kernel_size, p.stride, p.dilation):
        return (f"--stand-in: K{p.kernel_size} at stride 1 and dilation 1 runs the fast generic kernels when untuned, "
                "so nothing is lent; leave --stand-in out for it")
    try:
        other_sizes(p)
    except ProblemError as e:
        return f"--stand-in: one of the sizes its finalists are weighed at is no problem: {e}"
    return None


def outranked_by(p: Problem, entries: list[dict], kernels: list[dict], direction: str = "fwd") -> str | None:
    """The key of another tuned problem of p's signature whose kernel generated/ lends before p's, or None:
    the frozen dispatcher's lent tables take, of a signature's usable entries whose launch takes sizes at run
    time, the first by size (B * C * L, largest first) and then by key, so a tie can outrank p too. `entries`
    and `kernels` are a manifest's. It does not ask which GPU an entry was measured on (one from another
    architecture is not lent there). A stand-in tune is then no test of what untuned sizes run: tune.py says so."""
    from dwgen import frozen_dispatch as fd  # imports torch: not at search.loop's import

    def rank(problem: dict) -> tuple:
        key = fd._entry_key(problem)
        return (-key[0] * key[1] * key[2], key)

    def signature(problem: dict) -> tuple:
        return fd._signature(dict(zip(fd._KEY_FIELDS, fd._entry_key(problem), strict=True)))

    lendable = {k["name"] for k in kernels if isinstance(k, dict) and k.get("sizes_at_run_time")}
    mine = p.to_dict()
    my_signature, my_rank = signature(mine), rank(mine)
    before = [e for e in entries
              if fd._entry_problem(e) is None and e.get("direction", "fwd") == direction
              and e["kernel"] in lendable and e.get("key") != p.key
              and signature(e["problem"]) == my_signature and rank(e["problem"]) < my_rank]
    return min(before, key=lambda e: rank(e["problem"]))["key"] if before else None


def combined(here: dict[str, float], there: dict[str, list[float]]) -> dict[str, float]:
    """Each finalist's score: the geometric mean, over the stand-in's size (`here`: times) and the other sizes
    (`there`: times over the fastest's at each, infinity for one that failed its check at any), of its time over
    the fastest's. A finalist missing from `there` (its launch takes fixed sizes, so it would not be lent) scores
    infinity while another has times there, and the fastest here is then taken over those alone: a finalist that
    cannot win must not move the others' scores. When none has, the stand-in's own times decide, as for any
    problem (those that failed elsewhere left out)."""
    timed = [k for k, rs in there.items() if k in here and all(math.isfinite(r) for r in rs)]
    pool = timed or [k for k in here if k not in there]
    fastest = min((here[k] for k in pool), default=math.inf)
    out = {}
    for k, t in here.items():
        if k not in pool:
            out[k] = math.inf
        else:
            rs = [t / fastest, *there.get(k, [])]
            out[k] = math.exp(sum(math.log(r) for r in rs) / len(rs))
    return out


def shape_text(p: Problem) -> str:
    return f"{p.batch}x{p.channels}x{p.length}"


class OtherSizes:
    """loop.decide's `elsewhere` for a stand-in: first check each candidate whose launch takes sizes at run time at
    every one of other_sizes(problem) (float64, NaN-poisoned outputs, its stream; through `worker`, switched to
    each size), then re-time those that passed everywhere, interleaved with copy_, at each size; switch back.
    Returns each lendable candidate's times over the fastest's at each size (infinity for one that failed
    anywhere). When the worker dies re-timing, or cannot start at a size, every candidate scores infinity,
    fixed-size ones too, so that decide declares no winner: a one-off failure must neither hand the signature to
    a kernel that is not lent nor freeze one that was not weighed. The last answer stays in `relative`, for the
    log; `timed` says whether any candidate has times at every size."""

    def __init__(self, problem: Problem, worker, log=print):
        self.problem, self.sizes, self.worker, self.log = problem, other_sizes(problem), worker, log
        self.relative: dict[str, list[float]] = {}
        self.times: dict[str, dict[str, float]] = {}  # size -> its re-timing (ms, copy_ too) once all sizes ran
        self.died = False

    def __call__(self, cands: list[Candidate], rounds: int) -> dict[str, list[float]]:
        lendable = [c for c in cands if c.variant.family.sizes_at_run_time]
        self.relative = {c.variant.name: [math.inf] for c in lendable}
        self.times = {}
        if not lendable:
            self.log("stand-in: no finalist's launch takes sizes at run time; "
                     f"{shape_text(self.problem)} decides alone")
            return self.relative
        passed = list(lendable)
        timed: list[dict[str, float]] = []
        try:
            for q in self.sizes:  # every check before any timing: a finalist wrong anywhere is timed nowhere
                self.worker.switch(q)
                for c in list(passed):
                    base = Result(c.variant.name, c.variant.digest, "ok", direction=c.variant.direction)
                    r = self.worker.check(c, base, edges=False)
                    if r.status != "ok":  # it would be lent to sizes it gets wrong: it cannot win
                        passed.remove(c)
                        self.log(f"stand-in: {c.variant.name} {r.status} at {shape_text(q)}: {r.message}")
            for q in self.sizes if passed else ():
                self.worker.switch(q)
                timed.append(self.worker.retime(passed, rounds))
                self.log(f"stand-in: re-timed at {shape_text(q)}, interleaved (ms): "
                         + ", ".join(f"{k} {t:.4f}" for k, t in timed[-1].items()))
        except RuntimeError as e:  # WorkerDied, or a worker that could not start at a size
            self.died = True
            self.log(f"stand-in: the worker died weighing the finalists ({e}); no winner from this run")
            self.relative = {c.variant.name: [math.inf] for c in cands}
            return self.relative
        finally:
            self.worker.switch(self.problem)
        if passed:  # else none passed everywhere, so none was timed at the other sizes: no evidence
            self.times = {shape_text(q): t for q, t in zip(self.sizes, timed, strict=True)}
        fastest = [min(t[c.variant.name] for c in passed) for t in timed]
        for c in passed:
            self.relative[c.variant.name] = [t[c.variant.name] / f for t, f in zip(timed, fastest, strict=True)]
        return self.relative

    def evidence(self, name: str, score: float) -> dict | None:
        """What the manifest records of a stand-in's winner (freeze.Winner.stand_in): its score (the geometric
        mean of its time over the fastest's, stand-in's size included) and, at each other size, its time, copy_'s
        and their ratio; None when it was not timed at every size."""
        if not self.times or any(name not in t for t in self.times.values()):
            return None
        return {"score": score, "sizes": {size: {"kernel_ms": t[name], "copy_ms": t["copy_"],
                                                 "x_copy": t[name] / t["copy_"]} for size, t in self.times.items()}}

    @property
    def timed(self) -> bool:
        return any(all(math.isfinite(r) for r in rs) for rs in self.relative.values())
