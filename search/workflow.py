"""Wiring of a tuning run: per problem a study, builds, a GPU worker, search and decision; then one freeze."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dwgen import build as builder
from dwgen import freeze as frz
from dwgen import render
from dwgen.problem import Problem
from dwgen.progress import Progress
from dwgen.show import range_text
from dwgen.space import Variant, direction_key, family_of_config, make_config, violations
from dwgen.worker import RUN_TIMEOUT_S
from search import loop, standin
from search import study as st
from search.parallel import Plan

ROOT = Path(__file__).resolve().parent.parent
if TYPE_CHECKING:
    from optuna.storages import BaseStorage


class UserError(RuntimeError):
    """Something the user can fix; printed as one line."""


def gpu_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU found: tuning needs one (`--dry-run` compiles the space without a GPU)")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def gpu_builder(runs_dir: Path, jobs: int | None, timeout_s: float = builder.COMPILE_TIMEOUT_S):
    """The builder for this machine's GPU, with its cache under runs_dir; UserError when there is no GPU or nvcc."""
    arch = gpu_arch()
    try:
        builder.nvcc_version()
    except builder.ToolchainError as e:
        raise UserError(str(e)) from e
    return make_builder(runs_dir / "build", arch, jobs, timeout_s)


def make_builder(cache_dir: Path, arch: str, jobs: int | None, timeout_s: float = builder.COMPILE_TIMEOUT_S,
                 source: Callable[[Variant], str] = render.render_variant):
    """Builds variants with nvcc for `arch`, each killed after `timeout_s`; `source` turns a variant into
    CUDA text (tests hand in dwgen.faults.source, which also writes the faulty ones)."""
    def build(variants: list[Variant], on_done=None):
        return builder.compile_many(
            [(v.name, source(v), builder.build_key(v.digest, arch)) for v in variants],
            cache_dir, arch=arch, workers=jobs, on_done=on_done, timeout_s=timeout_s)
    return build


def _manifest_designs(out_dir: Path) -> tuple[list[dict], list[dict]]:
    """generated/'s manifest entries, current or not, and the designs of the entries a freeze dropped as stale
    (frz.freeze keeps those under "retired"); none from a manifest of another schema. One read."""
    m = frz.read_manifest(out_dir)
    if m.get("schema") != frz.SCHEMA:
        return [], []
    return m.get("entries", []), m.get("retired", [])


def _frozen_entries(out_dir: Path, retired: bool = False) -> list[dict]:
    """generated/'s manifest entries, current or not; with `retired`, then the retired designs."""
    entries, gone = _manifest_designs(out_dir)
    return entries + (gone if retired else [])


def _frozen_entry(problem: Problem, out_dir: Path, direction: str = "fwd", retired: bool = False) -> dict | None:
    """generated/'s manifest entry for this problem in a direction, current or not (or retired, if asked)."""
    return next((e for e in _frozen_entries(out_dir, retired)
                 if e["key"] == problem.key and frz.entry_direction(e) == direction), None)


def _warn_outranked(problems: list[Problem], out_dir: Path, direction: str, log=print) -> None:
    """A stand-in whose signature generated/ lends another tuned problem's kernel for (standin.outranked_by) is
    not what untuned sizes run: say so before the search, so that nobody reads its tune as a test of lending."""
    m = frz.read_manifest(out_dir)
    if m.get("schema") != frz.SCHEMA:
        return
    for p in problems:
        key = standin.outranked_by(p, m.get("entries", []), m.get("kernels", []), direction)
        if key:
            log(f"stand-in: generated/ lends {key}'s kernel to the untuned sizes of {direction_key(p, direction)}'s "
                "signature (the largest tuned problem's, the first by key on a tie): this tune does not change "
                "what they run")


def frozen_variant(problem: Problem, out_dir: Path, direction: str = "fwd") -> Variant | None:
    """The variant generated/ holds for this problem in a direction, if its code still matches the templates."""
    e = _frozen_entry(problem, out_dir, direction)
    return frz.entry_variant(e) if e and frz.entry_variant(e).digest == e["digest"] else None


def _config_for(problem: Problem, e: dict, direction: str):
    """An entry's design as a config of `problem`, or None where it is of an older space or breaks a
    restriction of this problem."""
    try:
        config = make_config(problem, e["config"], direction)
    except (TypeError, ValueError):
        return None  # a config of an older space: nothing to carry over
    return None if violations(problem, config, direction) else config


def previous_config(problem: Problem, out_dir: Path, direction: str = "fwd"):
    """The config generated/ last froze for this problem, even when the templates have changed since (and a
    freeze has dropped the entry as stale since): a re-tune tries it first, so a larger space or an unlucky
    search does not lose a design that won before."""
    e = _frozen_entry(problem, out_dir, direction, retired=True)
    return None if e is None else _config_for(problem, e, direction)


# How many designs frozen for other problems a study asks after its own: a short search (12 trials) missed the
# design that won the same shape with SiLU (Mamba's (B, L, C) backward, tenth session: 2.22x against 1.84x).
SIBLING_SEEDS = 2
# A re-tune keeps the frozen design unless a finalist beats it by more than this in the interleaved re-timing:
# finalists 1% apart trade places between runs (the Mamba backward's 0.1372-0.1384 ms, the twelfth session),
# and each trade churns generated/ and what users run for nothing measurable.
KEEP_FROZEN_WITHIN = 0.01


def seed_twins(problem: Problem, config, direction: str = "fwd") -> list:
    """The frozen design's twins (Family.twins) that are valid here: asked right after it, one trial each."""
    return [c for c in family_of_config(problem, config, direction).twins(config)
            if not violations(problem, c, direction)]


def sibling_configs(problem: Problem, out_dir: Path, direction: str = "fwd", besides: Sequence = ()) -> list:
    """Designs generated/ froze for other problems of this direction, dtype and layout that are valid for
    this one and not among `besides`, nearest first (the same kernel size, then the same activation, then a
    current entry's before a retired one's), at most SIBLING_SEEDS."""
    near: list[tuple[tuple, object]] = []
    entries, gone = _manifest_designs(out_dir)
    for i, e in enumerate(entries + gone):
        q = e.get("problem", {})
        if (e["key"] == problem.key or frz.entry_direction(e) != direction or q.get("dtype") != problem.dtype
                or q.get("layout") != problem.layout):
            continue
        config = _config_for(problem, e, direction)
        if config is not None:
            near.append(((q.get("kernel_size") != problem.kernel_size, q.get("activation") != problem.activation,
                          i >= len(entries), e["key"]), config))
    out: list = []
    for _, config in sorted(near, key=lambda n: n[0]):
        if config not in out and config not in besides:
            out.append(config)
    return out[:SIBLING_SEEDS]


def tune_problem(problem: Problem, *, trials: int, timeout_s: float | None, sampler: str, seed: int,
                 storage: str | BaseStorage | None, build, frozen: Variant | None, seeds: tuple = (),
                 log=print, quiet: bool = False, report_dir: Path | None = None,
                 run_timeout_s: float = RUN_TIMEOUT_S, workers: tuple[Plan, list[str]] | None = None,
                 direction: str = "fwd", stand_in: bool = False) -> frz.Winner | None:
    """Search one problem's variants of a direction and decide its winner; None when no variant was correct.

    With `report_dir`, the study's report (report.md and its plots) is written there at the end.
    `run_timeout_s` bounds each call of the GPU worker (checking and timing one variant). With `workers`
    (a plan and GPUs), the search runs in one worker process per GPU on the study, and this process
    re-times the finalists on its first GPU once they are done. With `stand_in`, the finalists are weighed at
    other sizes of the signature too (search.standin): the winner is lent to every size."""
    from dwgen.worker import BwdGpuWorker, GpuWorker

    t_start = time.perf_counter()
    study = st.open_study(problem, storage, sampler, seed, direction)
    log(f"== {direction_key(problem, direction)}: study {study.study_name}")
    # `trials` is what the study should hold measured: the same command run again after a kill or a time-out
    # measures what is left of it, not `trials` more
    done = st.measured_as_rendered(study, problem)
    trials = max(0, trials - done)
    if done:
        log(f"{done} variants measured before; {trials} more to measure")
    worker = (BwdGpuWorker if direction == "bwd" else GpuWorker)(problem, run_timeout_s)
    try:
        if workers is None:
            machine = _baselines(worker, log, direction)
            with Progress(trials, "search", quiet=quiet) as progress:
                known, stats = loop.search(problem, study, build, worker, trials=trials, timeout_s=timeout_s,
                                           seeds=seeds, log=log, progress=progress)
            summary = _stats_lines(stats, worker)
        else:
            plan, gpus = workers
            known, summary = _search_on_workers(problem, study, replace(plan, trials=trials), gpus, seeds=seeds,
                                                log=log, quiet=quiet)
            machine = _baselines(worker, log, direction)
        others = standin.OtherSizes(problem, worker, log) if stand_in else None
        decided = loop.decide(known, build, worker, extra=[frozen] if frozen else [], keep=frozen,
                              keep_within=KEEP_FROZEN_WITHIN, elsewhere=others)
    finally:
        worker.close()
    for line in summary:
        log(line)
    log(f"problem wall {time.perf_counter() - t_start:.1f} s")
    if decided is None:
        key = direction_key(problem, direction)
        if others and others.died:
            log(f"no winner for {key}: its finalists could not be weighed at its other sizes; run it again")
        elif others and others.relative:
            log(f"no finalist of {key} passed at its other sizes "
                f"({', '.join(standin.shape_text(q) for q in others.sizes)}): nothing to lend")
        else:
            log(f"no correct variant found for {key}")
        if report_dir is not None:
            write_report(study, problem, report_dir, None, log)
        return None
    v, r, times = decided
    log("re-timed finalists, interleaved (ms): " + ", ".join(f"{k} {t:.4f}" for k, t in times.items()))
    kernels = {k: t for k, t in times.items() if k not in ("copy_", "torch")}
    score = standin.combined(kernels, others.relative) if others and others.timed else None
    if score:
        log("stand-in: each finalist's time over the fastest's, geometric mean over the sizes: "
            + ", ".join(f"{k} {r:.3f}" for k, r in score.items()))
    if frozen is not None and frozen.name in times:
        gap = times[frozen.name] / min(kernels.values()) - 1
        line = f"frozen {frozen.name}: {times[frozen.name]:.4f} ms, {gap * 100:+.1f}% against this search's best"
        if score:
            gap = score[frozen.name] / min(score.values()) - 1
            line += f" here, {gap * 100:+.1f}% over the sizes"
        why = "its mean over the sizes within the noise of the best's" if score else "within the re-timing's noise"
        log(line + (f" (kept: {why})" if v.name == frozen.name and gap > 0 else ""))
    log(f"winner {v.name}: {r.kernel_ms:.4f} ms, {r.x_copy:.3f}x copy ({r.copy_ms:.4f} ms), "
        f"{r.speedup:.2f}x faster than PyTorch ({r.torch_ms:.4f} ms)")
    if report_dir is not None:
        write_report(study, problem, report_dir, r, log)
    return frz.Winner(v, r, machine, stand_in=others.evidence(v.name, score[v.name]) if score else None)


def _baselines(worker, log, direction: str = "fwd") -> dict:
    """The machine, and the copy_ and PyTorch times the variants are measured against (logged): for the
    backward, copy_ of the forward's bytes and PyTorch's backward alone."""
    machine = worker.machine()
    base = worker.baselines()
    copy, torch_ = (("copy_ of the forward's bytes", "PyTorch's backward (autograd.grad)") if direction == "bwd"
                    else ("copy_ of the same bytes", "PyTorch eager"))
    log(f"{machine['gpu']}: {copy} {base['copy_ms']:.4f} ms, {torch_} {base['torch_ms']:.4f} ms "
        f"({base['copy_ms'] / base['torch_ms'] * 100:.0f}% of copy speed)")
    return machine


def _stats_lines(stats: loop.SearchStats, worker) -> list[str]:
    return [f"variants: {stats.asked} asked, {stats.skipped} skipped by restrictions, {stats.duplicates} duplicates, "
            f"{stats.built} built ({stats.build_failed} failed), {stats.correct} correct and timed; "
            f"failures {stats.failures or 'none'}",
            f"compile wall {stats.compile_wall_s:.1f} s, check+time wall {stats.evaluate_wall_s:.1f} s, "
            f"worker restarts {worker.restarts}"]


def _search_on_workers(problem: Problem, study, plan: Plan, gpus: list[str], *, seeds: tuple, log,
                       quiet: bool) -> tuple[dict, list[str]]:
    """The search of tune.py --workers: one worker process per GPU; returns what the study holds then."""
    from search import parallel

    loop.enqueue_seeds(study, problem, seeds)  # here, before the workers race to do it
    codes = parallel.run_workers(plan, gpus, study, log=log, quiet=quiet)
    swept = st.sweep_stale(study)  # what a worker that died left running
    direction = st.study_direction(study)
    known = {d: (Variant(problem, c, direction), r) for d, (c, r) in st.measured(study, problem).items()}
    shares = parallel.measured_by(study)
    each = ", ".join(f"{w or '(no worker)'} measured {n}" for w, n in sorted(shares.items()))
    closed = f"; {len(swept)} trials left running were closed" if swept else ""
    lines = [f"workers: {each}; exit codes {codes}{closed}",
             f"variants: {len(known)} measured in the study, {sum(r.ok for _, r in known.values())} correct"]
    return known, lines


def write_report(study, problem: Problem, out_dir: Path, winner, log=print) -> Path | None:
    """The problem's report; a report that cannot be made is one line in the log, never a failed tune."""
    try:
        from search import report

        path = report.write_report(study, direction_key(problem, st.study_direction(study)), out_dir, winner=winner)
    except Exception as e:  # no matplotlib, a plot that fails: the search's results stand without it
        first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        log(f"report not written for {problem.key}: {type(e).__name__}: {first}")
        return None
    log(f"report: {path}")
    return path


def freeze_gated(winners: list[frz.Winner], out_dir: Path, generic: dict | None = None, log=print) -> dict:
    """Freeze into a copy of out_dir, run the gate on that copy's built module, and only then into out_dir.

    The gate runs in its own process (a kernel that kills its CUDA context costs the gate, not the tune);
    when any check fails, out_dir is left exactly as it was."""
    with tempfile.TemporaryDirectory(prefix="dwgen-stage-") as tmp:
        stage = Path(tmp) / "generated"
        if Path(out_dir).exists():
            shutil.copytree(out_dir, stage)
        frz.freeze(winners, stage, log=log, generic=generic)
        log(f"gate: building the frozen module and checking every kernel through it ({stage})")
        proc = subprocess.run([sys.executable, "-m", "dwgen.gate", str(stage)], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for line in proc.stdout.splitlines():
            if line.startswith(("FAILED", "gate:")) or proc.returncode:
                log(line)
        if proc.returncode != 0:
            raise UserError(f"the frozen module failed its gate; {out_dir} is unchanged (see the lines above)")
    return frz.freeze(winners, out_dir, log=log, generic=generic)


def tune(problems: list[Problem], *, trials: int, timeout_s: float | None, sampler: str, seed: int,
         storage: str | None, runs_dir: Path, out_dir: Path, freeze: bool, jobs: int | None, log=print,
         quiet: bool = False, report: Callable[[list[frz.Winner]], None] | None = None, workers: int = 1,
         compile_timeout_s: float = builder.COMPILE_TIMEOUT_S, run_timeout_s: float = RUN_TIMEOUT_S,
         direction: str = "fwd", seeds_from: Path | None = None, stand_in: bool = False) -> int:
    """Tune each problem's kernels of a direction (fwd, or bwd: the fused backward) and freeze the winners
    beside what generated/ holds; 0 when every problem found a winner.

    Each study first asks the design frozen for its problem in `seeds_from` (default out_dir), stale or not (or
    retired: dropped by a freeze as stale, its design kept), then its twins (seed_twins), then up to
    SIBLING_SEEDS designs frozen there for nearby problems (sibling_configs).

    `quiet` hides the progress bar; `report`, when given, receives the winners at the end (for --json).
    `workers` > 1 searches with one process per visible GPU on each problem's study. `stand_in`: every problem
    stands in for its signature's sizes (tune_problem)."""
    from dwgen.dryrun import no_variant_reason

    for p in problems:  # tune.py refuses these first; here for other callers
        reason = no_variant_reason(p, direction) or (standin.lent_reason(p) if stand_in else None)
        if reason:
            raise UserError(f"{p.key}: {reason}")
    build = gpu_builder(runs_dir, jobs, compile_timeout_s)
    if storage is None:
        storage = st.default_storage(runs_dir)
    elif storage == "memory":
        if workers > 1:
            raise UserError("--workers needs a storage its workers share: leave --storage out (an SQLite file "
                            "under --runs-dir), or give postgresql://... or journal:///FILE")
        storage = None
    gpus = _worker_gpus(workers) if workers > 1 else None
    log(f"tuning {len(problems)} problem(s) on {gpu_arch()}"
        + (f" with {workers} workers" if gpus else "") + f"; storage {storage or 'in memory'}")
    if stand_in:
        _warn_outranked(problems, out_dir, direction, log)
    try:
        opened = st.open_storage(storage) if storage else None
    except st.StorageError as e:
        raise UserError(str(e)) from e
    winners: list[frz.Winner] = []
    for p in problems:
        previous = previous_config(p, seeds_from or out_dir, direction)
        own = [previous] + seed_twins(p, previous, direction) if previous else []
        siblings = sibling_configs(p, seeds_from or out_dir, direction, besides=own)
        seeds = (*own, *siblings)
        if len(seeds) > 1:
            log(f"{direction_key(p, direction)}: asks first "
                + ", ".join(Variant(p, c, direction).name for c in seeds)
                + " (frozen here, its twins across its family's newer axes, and designs frozen for nearby problems)")
        plan = Plan(p, storage, trials, sampler, seed, str(runs_dir), timeout_s, jobs, compile_timeout_s,
                    run_timeout_s, direction) if gpus else None
        w = tune_problem(p, trials=trials, timeout_s=timeout_s, sampler=sampler, seed=seed, storage=opened,
                         build=build, frozen=frozen_variant(p, out_dir, direction),
                         seeds=seeds, log=log, quiet=quiet,
                         report_dir=runs_dir / direction_key(p, direction), run_timeout_s=run_timeout_s,
                         workers=(plan, gpus) if gpus else None, direction=direction, stand_in=stand_in)
        if w is not None:
            winners.append(w)
    log("")
    elsewhere = any(w.stand_in for w in winners)  # --stand-in: each winner's x copy at the other sizes too
    log(f"{'problem':44s} {'winner':40s} {'ms':>9s} {'x copy':>7s} {'vs torch':>8s}"
        + (f" {'other sizes':>12s}" if elsewhere else ""))
    for w in winners:
        r, key = w.result, direction_key(w.variant.problem, w.variant.direction)
        xs = range_text((t["x_copy"] for t in w.stand_in["sizes"].values()), 3) if w.stand_in else "-"
        log(f"{key:44s} {w.variant.name:40s} {r.kernel_ms:9.4f} {r.x_copy:7.3f} {r.speedup:7.2f}x"
            + (f" {xs:>12s}" if elsewhere else ""))
    if freeze and winners:
        freeze_gated(winners, out_dir, log=log)
        log(f"froze {len(winners)} winner(s) into {out_dir}")
    if report is not None:
        report(winners)
    return 0 if len(winners) == len(problems) else 1


def _worker_gpus(workers: int) -> list[str]:
    """The GPUs of tune.py --workers N: the first N this process sees; UserError when there are fewer."""
    import torch

    from search import parallel

    count = torch.cuda.device_count()
    if workers > count:
        raise UserError(f"--workers {workers} needs {workers} GPUs and {count} are visible: give --workers {count} "
                        "or fewer (one worker per GPU)")
    return parallel.visible_gpus(workers)
