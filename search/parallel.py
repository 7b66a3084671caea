"""Several tuners on one study: one process per GPU of this host (tune.py --workers N), and the tuner each runs
(`python -m search.parallel`). Hosts that share a storage (PostgreSQL, or a journal file on a shared file
system) join the same study the same way; each trial records which tuner measured it."""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import optuna
from optuna.trial import TrialState

from dwgen import cli
from dwgen.build import COMPILE_TIMEOUT_S
from dwgen.problem import Problem
from dwgen.progress import Progress
from dwgen.worker import RUN_TIMEOUT_S
from search import loop
from search import study as st

ROOT = Path(__file__).resolve().parent.parent
POLL_S = 2.0  # how often the parent counts the study's measured trials for its progress bar


@dataclass(frozen=True)
class Plan:
    """What every worker process of one problem's tune is given (the GPU and the share of trials aside)."""

    problem: Problem
    storage: str  # a URL every worker opens for itself
    trials: int
    sampler: str
    seed: int
    runs_dir: str
    timeout_s: float | None = None
    jobs: int | None = None
    compile_timeout_s: float = COMPILE_TIMEOUT_S
    run_timeout_s: float = RUN_TIMEOUT_S
    direction: str = "fwd"  # whose variants: the forward's, or the fused backward's (tune.py --direction bwd)


def split(trials: int, n: int) -> list[int]:
    """Each of n workers' share of `trials`, as even as integers allow."""
    return [trials // n + (i < trials % n) for i in range(n)]


def visible_gpus(count: int) -> list[str]:
    """The devices this process may use, as CUDA_VISIBLE_DEVICES names them (or their indices when unset)."""
    names = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    return names[:count] if names else [str(i) for i in range(count)]


def worker_name(gpu: str) -> str:
    """How a worker signs its trials: the host and the GPU it ran on."""
    return f"{socket.gethostname()}:gpu{gpu}"


def worker_argv(plan: Plan, index: int, gpu: str, trials: int) -> list[str]:
    """The command line of worker `index` (python -m search.parallel ...)."""
    argv = [sys.executable, "-m", "search.parallel", "--problem", json.dumps(asdict(plan.problem)),
            "--storage", plan.storage, "--trials", str(trials), "--sampler", plan.sampler,
            "--seed", str((plan.seed + index) % 2**32), "--worker", worker_name(gpu), "--runs-dir", plan.runs_dir,
            "--compile-timeout", repr(plan.compile_timeout_s), "--run-timeout", repr(plan.run_timeout_s),
            "--direction", plan.direction]
    if plan.timeout_s is not None:
        argv += ["--timeout", repr(plan.timeout_s)]
    if plan.jobs is not None:
        argv += ["--jobs", str(plan.jobs)]
    return argv


def measured_by(study: optuna.Study) -> Counter:
    """How many variants each worker measured in the study (duplicates, skips and extras not counted)."""
    out: Counter = Counter()
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
        if st.trial_result(t) is not None and not t.user_attrs.get("duplicate") and \
                not t.user_attrs.get(st.EXTRA_ATTR):
            out[t.user_attrs.get(st.WORKER_ATTR, "")] += 1
    return out


def run_workers(plan: Plan, gpus: list[str], study: optuna.Study, *, log: Callable[[str], None] = print,
                quiet: bool = False,
                argv: Callable[[Plan, int, str, int], list[str]] | None = None) -> list[int]:
    """Run one worker process per GPU on the plan's study, each seeing only its GPU; returns their exit codes.

    Each worker's output goes to RUNS_DIR/PROBLEM/worker-I.log; the progress shown is the study's count of
    measured variants. `argv` makes a worker's command line (tests run fake workers)."""
    logs = Path(plan.runs_dir) / plan.problem.key
    logs.mkdir(parents=True, exist_ok=True)
    argv = argv or worker_argv
    if plan.jobs is None:  # the cores shared among the workers' nvcc runs, not each taking them all
        plan = replace(plan, jobs=max(1, (os.cpu_count() or 1) // len(gpus)))
    before = sum(measured_by(study).values())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    procs = []
    try:
        for i, (gpu, trials) in enumerate(zip(gpus, split(plan.trials, len(gpus)), strict=True)):
            if trials == 0:
                continue
            with open(logs / f"worker-{i}.log", "w") as out:
                procs.append((i, gpu, subprocess.Popen(argv(plan, i, gpu, trials), stdout=out,
                                                       stderr=subprocess.STDOUT,
                                                       env=dict(env, CUDA_VISIBLE_DEVICES=gpu))))
        log(f"{len(procs)} workers on GPUs {', '.join(g for _, g, _ in procs)}; their logs: {logs}/worker-*.log")
        with Progress(plan.trials, f"search on {len(procs)} GPUs", quiet=quiet) as progress:
            running = [p for _, _, p in procs]
            while running:
                try:
                    running[0].wait(POLL_S)
                except subprocess.TimeoutExpired:
                    pass
                running = [p for p in running if p.poll() is None]
                progress.advance(sum(measured_by(study).values()) - before - progress.done)
    finally:
        for _, _, p in procs:  # Ctrl-C or an error here: no worker is left running on
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    codes = []
    for i, gpu, p in procs:
        codes.append(p.returncode)
        if p.returncode != 0:
            tail = (logs / f"worker-{i}.log").read_text(errors="replace").strip().splitlines()[-3:]
            log(f"worker {i} (GPU {gpu}) exited with {p.returncode}: " + " | ".join(tail))
    return codes


def run_worker(problem: Problem, storage, build, evaluator, *, trials: int, sampler: str, seed: int, worker: str,
               timeout_s: float | None = None, log: Callable[[str], None] = print,
               direction: str = "fwd") -> loop.SearchStats:
    """One worker's search on the shared study of a direction: its share of new variants, each signed with
    `worker`."""
    study = st.open_study(problem, storage, sampler, seed, direction)
    _, stats = loop.search(problem, study, build, evaluator, trials=trials, timeout_s=timeout_s, log=log,
                           worker=worker)
    return stats


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = cli.OneLineParser(prog="python -m search.parallel", description="One worker of tune.py --workers: "
                           "searches a problem's study on the GPU it sees (started by tune.py, not by hand).")
    ap.add_argument("--problem", required=True, help="the problem as JSON (Problem's fields)")
    ap.add_argument("--storage", type=cli.storage, required=True)
    ap.add_argument("--trials", type=cli.int_range(1), required=True)
    ap.add_argument("--sampler", default="tpe")
    ap.add_argument("--seed", type=cli.int_range(0), default=0)
    ap.add_argument("--worker", required=True, help="the name this worker signs its trials with")
    ap.add_argument("--runs-dir", type=cli.directory, default=ROOT / "runs")
    ap.add_argument("--timeout", type=cli.positive_seconds, default=None)
    ap.add_argument("--jobs", type=cli.int_range(1), default=None)
    ap.add_argument("--compile-timeout", type=cli.positive_seconds, default=COMPILE_TIMEOUT_S)
    ap.add_argument("--run-timeout", type=cli.positive_seconds, default=RUN_TIMEOUT_S)
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    from dwgen.worker import BwdGpuWorker, GpuWorker
    from search import workflow

    a = parse_args(argv)
    problem = Problem(**json.loads(a.problem))
    try:
        storage = st.open_storage(a.storage)
        build = workflow.gpu_builder(a.runs_dir, a.jobs, a.compile_timeout)
    except (st.StorageError, workflow.UserError) as e:
        print(f"python -m search.parallel: {e}", file=sys.stderr)
        return 1
    evaluator = (BwdGpuWorker if a.direction == "bwd" else GpuWorker)(problem, a.run_timeout)
    try:
        stats = run_worker(problem, storage, build, evaluator, trials=a.trials, sampler=a.sampler, seed=a.seed,
                           worker=a.worker, timeout_s=a.timeout, log=lambda s: print(s, flush=True),
                           direction=a.direction)
    finally:
        evaluator.close()
    print(f"{a.worker}: {stats.evaluated} evaluated ({stats.correct} correct), {stats.duplicates} left to other "
          f"workers or measured before, worker restarts {evaluator.restarts}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
