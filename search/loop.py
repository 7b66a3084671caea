"""The search loop: ask a batch, filter and de-duplicate, build in parallel, check and time, tell."""
from __future__ import annotations

import math
import os
import re
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import optuna
from optuna.trial import TrialState

from dwgen.build import Build
from dwgen.problem import Problem
from dwgen.progress import Progress, best_text
from dwgen.result import Result
from dwgen.space import Variant, known_good, make_config, trial_params, violations
from dwgen.worker import Candidate
from search import standin
from search import study as st
from search.neighbours import Neighbours
from search.samplers import SpaceSampler

FINALISTS = 5
RETIME_ROUNDS = 60
# Stop asking once this many asks in a row brought nothing new: a guard, since the search stops when every
# valid variant is measured (the grid sampler proposes only valid ones; the others' wasted proposals are
# followed by their nearest unmeasured valid variant: search/neighbours.py).
MAX_IDLE_ASKS = 500
# After this many wasted asks in a row, the next ask is the nearest unmeasured valid variant to the last
# proposal. Not sooner: where the sampler mostly lands on new variants (the forward's spaces), its choices
# stay its own (redirecting every wasted ask moved the median rank of the best found at 32 trials from 9
# to 18 of 1684 on a synthetic (B, L, C) forward objective, 20 seeds).
NEIGHBOUR_AFTER = 4


class Evaluator(Protocol):
    def evaluate(self, cand: Candidate, base: Result) -> Result: ...

    def retime(self, cands: list[Candidate], rounds: int) -> dict[str, float]: ...


class Builder(Protocol):
    """Builds variants in parallel; `on_done` sees each build as it finishes, so a long batch shows progress."""

    def __call__(self, variants: list[Variant], on_done: Callable[[Build], None] | None = None) -> list[Build]: ...


@dataclass
class SearchStats:
    asked: int = 0
    skipped: int = 0
    duplicates: int = 0
    built: int = 0
    build_failed: int = 0
    compile_wall_s: float = 0.0
    evaluated: int = 0
    correct: int = 0
    evaluate_wall_s: float = 0.0
    failures: dict[str, int] = field(default_factory=dict)
    extras: int = 0  # extra variants evaluated (passed in beside the sampler's: tests' faults)


_ERROR_LINE = re.compile(r"\berror\b", re.IGNORECASE)


def failure_line(log: str) -> str:
    """The line of a build log that says why: the compiler's first error, else its last line (the log's
    first line is the command, whose file names may hold the word)."""
    lines = [line.strip() for line in log.strip().splitlines()]
    said = lines[1:] if len(lines) > 1 else lines
    return next((line for line in said if _ERROR_LINE.search(line)), said[-1] if said else "")


def build_result(v: Variant, b: Build) -> Result:
    b = b.for_activation(v.problem.activation)  # the figures of the kernel this problem runs
    status = "ok" if b.ok else b.status
    msg = "" if b.ok else f"{failure_line(b.log)} (source and log beside {b.log_path})"
    return Result(v.name, v.digest, status, message=msg, registers=b.registers, spill_bytes=b.spill_bytes,
                  smem_bytes=b.smem_bytes, compile_s=b.seconds, direction=v.direction)


def search(problem: Problem, study: optuna.Study, build: Builder, evaluator: Evaluator, *, trials: int,
           timeout_s: float | None = None, batch: int | None = None, seeds: Sequence = (),
           log: Callable[[str], None] = print, progress: Progress | None = None, extra: Sequence = (),
           worker: str | None = None) -> tuple[dict[str, tuple[Variant, Result]], SearchStats]:
    """Evaluate up to `trials` new variants; returns every variant measured in this study, by digest.

    A new study tries `seeds` first (such as the previous winner), then the known-good designs.
    `progress` (total: `trials`) counts the variants evaluated and shows the best so far.
    Trials a killed tuner left RUNNING are closed first (search.study.sweep_stale).
    `extra` variants are built and evaluated before the sampler's, beside them and outside the space (tests
    pass dwgen.faults' variants); each is a trial without params, told no value. `worker` names this tuner
    on its trials when several share the study (tune.py --workers); a variant another tuner has claimed
    first is left to it."""
    owner = st.new_owner()
    try:
        return _search(problem, study, build, evaluator, trials, timeout_s, batch, seeds, log, progress, owner,
                       list(extra), worker)
    finally:
        st.release(owner)


def _evaluate_extras(study: optuna.Study, build: Builder, evaluator: Evaluator, extra: list,
                     known: dict[str, tuple[Variant, Result]], stats: SearchStats, worker: str | None,
                     log: Callable[[str], None], progress: Progress) -> None:
    """Build and evaluate the extra variants this study has not measured yet, each told as a trial of its own."""
    todo = [v for v in extra if v.digest not in known]
    if not todo:
        return
    t0 = time.perf_counter()
    builds = build(todo, on_done=_batch_ticker(progress, len(todo)))
    stats.compile_wall_s += time.perf_counter() - t0
    progress.describe("checking+timing")
    t0 = time.perf_counter()
    for v, b in zip(todo, builds, strict=True):
        stats.built += 1
        stats.build_failed += not b.ok
        result = check_one(evaluator, v, b)
        st.record_extra(study, result, worker)
        known[v.digest] = (v, result)
        stats.extras += 1
        if not result.ok:
            stats.failures[result.status] = stats.failures.get(result.status, 0) + 1
        log(f"[extra] {result.summary()}")
    stats.evaluate_wall_s += time.perf_counter() - t0


def _leave_to_others(study: optuna.Study, pending: dict[str, tuple[optuna.Trial, Variant]],
                     known: dict[str, tuple[Variant, Result]], stats: SearchStats) -> None:
    """Drop from the batch the variants another tuner claimed first: a duplicate of its result when it has
    one, a skip (not penalised) while it is still measuring."""
    firsts = st.first_claims(study, {trial.number: digest for digest, (trial, _) in pending.items()})
    for digest, (trial, v) in list(pending.items()):
        other = firsts[trial.number]
        if other is None:
            continue
        del pending[digest]
        stats.duplicates += 1
        result = st.trial_result(other) if other.state != TrialState.RUNNING else None
        if result is not None:
            st.record(study, trial, result, duplicate=True)
            known[digest] = (v, result)
        else:
            st.record_skip(study, trial, ["measured_by_another_tuner"], penalize=False)


def _search(problem: Problem, study: optuna.Study, build: Builder, evaluator: Evaluator, trials: int,
            timeout_s: float | None, batch: int | None, seeds: Sequence, log: Callable[[str], None],
            progress: Progress | None, owner: str, extra: list,
            worker: str | None) -> tuple[dict[str, tuple[Variant, Result]], SearchStats]:
    batch = batch or max(4, min(32, os.cpu_count() or 4))
    stats = SearchStats()
    progress = progress or Progress(trials, "search", quiet=True)
    log = progress.wrap(log)
    swept = st.sweep_stale(study)
    if swept:
        log(f"closed {len(swept)} trials a stopped tuner left running (unmeasured ones are asked again)")
    direction = st.study_direction(study)  # fwd or bwd: which family's variants this study measures
    known = {d: (Variant(problem, c, direction), r) for d, (c, r) in st.measured(study, problem).items()}
    if known:
        log(f"resuming: {len(known)} variants already measured in study {study.study_name}")
    enqueue_seeds(study, problem, seeds, measured=known.keys())
    extras_done = st.measured_extras(study)
    known.update({v.digest: (v, extras_done[v.digest]) for v in extra if v.digest in extras_done})
    _evaluate_extras(study, build, evaluator, extra, known, stats, worker, log, progress)
    sampler = study.sampler
    distributions = st.distributions(problem, direction)
    deadline = time.monotonic() + timeout_s if timeout_s else None
    idle = 0
    exhausted = False
    neighbours = None if isinstance(sampler, SpaceSampler) else Neighbours(problem, direction)
    redirected: set[str] = set()  # variants enqueued in place of a wasted proposal, each once

    def ask_nearest_instead(params: dict, pending: dict) -> None:
        """After NEIGHBOUR_AFTER wasted asks in a row, enqueue the unmeasured valid variant nearest the last
        proposal (the next ask takes it)."""
        if neighbours is None or idle < NEIGHBOUR_AFTER:
            return
        v = neighbours.nearest(params, known.keys() | pending.keys() | redirected)
        if v is not None:
            study.enqueue_trial(trial_params(problem, v.config, direction))
            redirected.add(v.digest)
    best_result = min((r for _, r in known.values() if r.ok), key=lambda r: r.kernel_ms, default=None)
    best = best_result.kernel_ms if best_result else None
    if best_result:
        progress.set_note(best_text(best, best_result.x_copy, best_result.speedup))
    while stats.evaluated < trials and not exhausted and idle < MAX_IDLE_ASKS:
        if deadline and time.monotonic() > deadline:
            log("timeout reached")
            break
        pending: dict[str, tuple[optuna.Trial, Variant]] = {}
        want = min(batch, trials - stats.evaluated)
        while len(pending) < want and idle < MAX_IDLE_ASKS:
            if (isinstance(sampler, SpaceSampler) and sampler.is_exhausted(study)) or (
                    neighbours is not None and neighbours.all_taken(known.keys() | pending.keys())):
                exhausted = True
                break
            trial = study.ask(distributions)
            stats.asked += 1
            idle += 1
            config = make_config(problem, trial.params, direction)
            bad = violations(problem, config, direction)
            if bad:
                st.record_skip(study, trial, bad)
                stats.skipped += 1
                ask_nearest_instead(trial.params, pending)
                continue
            v = Variant(problem, config, direction)
            if v.digest in known:
                st.record(study, trial, known[v.digest][1], duplicate=True)
                stats.duplicates += 1
                ask_nearest_instead(trial.params, pending)
            elif v.digest in pending:
                st.record_skip(study, trial, ["duplicate_in_batch"], penalize=False)  # valid, maybe fast
                stats.duplicates += 1
                ask_nearest_instead(trial.params, pending)
            else:
                st.claim(trial, owner, v.digest, worker)
                pending[v.digest] = (trial, v)
                idle = 0
        _leave_to_others(study, pending, known, stats)
        if not pending:
            continue
        t0 = time.perf_counter()
        builds = build([v for _, v in pending.values()], on_done=_batch_ticker(progress, len(pending)))
        stats.compile_wall_s += time.perf_counter() - t0
        progress.describe("checking+timing")
        t0 = time.perf_counter()
        for (trial, v), b in zip(pending.values(), builds, strict=True):
            stats.built += 1
            if not b.ok:
                stats.build_failed += 1
            result = check_one(evaluator, v, b)
            st.record(study, trial, result)
            known[v.digest] = (v, result)
            stats.evaluated += 1
            if result.ok:
                stats.correct += 1
                if best is None or result.kernel_ms < best:
                    best = result.kernel_ms
                    progress.set_note(best_text(best, result.x_copy, result.speedup))
            else:
                stats.failures[result.status] = stats.failures.get(result.status, 0) + 1
            log(f"[{stats.evaluated:4d}/{trials}] {result.summary()}" + (f"  (best {best:.4f} ms)" if best else ""))
            progress.advance()
        stats.evaluate_wall_s += time.perf_counter() - t0
    if exhausted and neighbours is not None:
        log(f"every valid variant of the space is measured ({len(known)})")
    return known, stats


def enqueue_seeds(study: optuna.Study, problem: Problem, seeds: Sequence = (),
                  measured: Collection[str] | None = None) -> None:
    """Ask `seeds` first, then the known-good designs of the study's direction, each once (a seed that is also
    known-good too), unless the study measured it as the templates render it now or holds it asked: a study
    kept across a template change (its name does not change with them) asks them again, a resume does not.
    `measured`: the digests the study measured, where the caller has read them already."""
    direction = st.study_direction(study)
    done = st.measured(study, problem).keys() if measured is None else measured
    asked = st.asked_params(study)
    for c in [*seeds, *known_good(problem, direction)]:
        params = trial_params(problem, c, direction)
        if Variant(problem, c, direction).digest not in done and params not in asked:
            study.enqueue_trial(params)
            asked.append(params)


def _batch_ticker(progress: Progress, n: int) -> Callable[[Build], None]:
    """A build callback that shows how far the batch of `n` has compiled."""
    done = 0
    progress.describe(f"compiling batch 0/{n}")

    def tick(_: Build) -> None:
        nonlocal done
        done += 1
        progress.describe(f"compiling batch {done}/{n}")
    return tick


def check_one(evaluator: Evaluator, v: Variant, b: Build) -> Result:
    """A build's result: put through the evaluator's gate and timing when it compiled."""
    r = build_result(v, b)
    return evaluator.evaluate(Candidate(v, b.library), r) if b.ok else r


def check_each(evaluator: Evaluator, variants: list[Variant],
               builds: list[Build]) -> list[tuple[Result, Candidate | None]]:
    """Each built variant through the evaluator's gate and timing: its result, and its candidate when correct."""
    out = []
    for v, b in zip(variants, builds, strict=True):
        r = check_one(evaluator, v, b)
        out.append((r, Candidate(v, b.library) if r.ok else None))
    return out


def finalists(known: dict[str, tuple[Variant, Result]], n: int = FINALISTS) -> list[tuple[Variant, Result]]:
    ok = [(v, r) for v, r in known.values() if r.ok]
    return sorted(ok, key=lambda vr: vr[1].kernel_ms)[:n]


def decide(known: dict[str, tuple[Variant, Result]], build: Builder, evaluator: Evaluator,
           rounds: int = RETIME_ROUNDS, extra: list[Variant] = (), keep: Variant | None = None,
           keep_within: float = 0.0,
           elsewhere: Callable[[list[Candidate], int], dict[str, list[float]]] | None = None,
           ) -> tuple[Variant, Result, dict[str, float]] | None:
    """Re-time the best few interleaved with copy_ and PyTorch, and declare the winner on those times.

    `extra` variants (the one frozen before, say) are re-timed alongside for comparison when they
    passed the check in this study; they can win like any finalist. `keep` (the frozen design) stays the
    winner unless another beats it by more than `keep_within` (a fraction of its time).
    `elsewhere` (a stand-in's other sizes: search.standin.OtherSizes) gives the re-timed candidates' times
    relative to the fastest at each other size; each then scores the geometric mean over all sizes
    (standin.combined), and None comes back when every finalist failed somewhere.
    """
    top = finalists(known)
    if not top:
        return None
    names = {v.name for v, _ in top}
    top += [known[v.digest] for v in extra if v.digest in known and known[v.digest][1].ok and v.name not in names]
    builds = build([v for v, _ in top])  # cached: costs nothing unless resumed on another machine
    cands = [Candidate(v, b.library) for (v, _), b in zip(top, builds, strict=True) if b.ok]
    times = evaluator.retime(cands, rounds)
    scored = [(v, r) for v, r in top if v.name in times]
    score = {v.name: times[v.name] for v, _ in scored}
    if elsewhere is not None:
        score = standin.combined(score, elsewhere([c for c in cands if c.variant.name in score], rounds))
    v, r = min(scored, key=lambda vr: score[vr[0].name])
    if score[v.name] == math.inf:
        return None  # every finalist failed its check at one of the stand-in's other sizes
    if keep is not None and keep.name in score and score[keep.name] <= score[v.name] * (1 + keep_within):
        v, r = next((kv, kr) for kv, kr in scored if kv.name == keep.name)
    winner = r.with_(kernel_ms=times[v.name], copy_ms=times["copy_"], torch_ms=times["torch"], reps=rounds)
    return v, winner, times
