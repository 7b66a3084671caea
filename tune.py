#!/usr/bin/env python3
"""Tune a depthwise conv1d problem and freeze the winner into generated/ (argument parsing and wiring)."""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from dwgen.problem import KNOWN_DTYPES, Problem, ProblemError

ROOT = Path(__file__).resolve().parent


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--shape", help="BxCxL, e.g. 32x512x8192")
    ap.add_argument("--suite", type=Path, help="file of problems, one per line in these flags, e.g. "
                    "'--shape 16x1024x4096 --kernel-size 7'; all are tuned and frozen into one manifest")
    ap.add_argument("--kernel-size", "-k", type=int, default=3)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--padding", type=int, default=None, help="default: (K-1)/2*dilation, 'same' for odd K")
    ap.add_argument("--dilation", type=int, default=1)
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--dtype", default="fp32", help=f"one of {', '.join(KNOWN_DTYPES)} (fp32 only for now)")
    ap.add_argument("--trials", type=int, default=120, help="new variants to build and evaluate")
    ap.add_argument("--timeout", type=float, default=None, help="stop searching after this many seconds")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--storage", default=None,
                    help="Optuna storage URL (default: sqlite file under runs/); 'memory' keeps nothing")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs")
    ap.add_argument("--out", type=Path, default=ROOT / "generated", help="where the frozen module goes")
    ap.add_argument("--no-freeze", action="store_true", help="search and report, leave generated/ alone")
    ap.add_argument("--dry-run", action="store_true", help="render and nvcc-compile the space; no GPU needed")
    ap.add_argument("--arch", default="sm_90", help="target of --dry-run builds (search builds for the GPU)")
    ap.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes (default: all cores)")
    return ap.parse_args(argv)


def make_problem(a: argparse.Namespace) -> Problem:
    padding = a.padding if a.padding is not None else (a.kernel_size - 1) // 2 * a.dilation
    return Problem.from_shape(a.shape, kernel_size=a.kernel_size, stride=a.stride, padding=padding,
                              dilation=a.dilation, dtype=a.dtype, bias=a.bias)


def read_suite(path: Path) -> list[Problem]:
    """Problems of a suite file: one per line in tune.py's problem flags; '#' starts a comment."""
    if not path.exists():
        raise ProblemError(f"suite file {path} not found")
    problems = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            a = parse_args(shlex.split(line))
            if not a.shape:
                raise ProblemError("no --shape")
            problems.append(make_problem(a))
        except (ProblemError, SystemExit) as e:
            raise ProblemError(f"{path}:{n}: {e if isinstance(e, ProblemError) else 'bad flags'}: {line}") from None
    if not problems:
        raise ProblemError(f"suite file {path} lists no problems")
    return problems


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    try:
        if bool(a.shape) == bool(a.suite):
            raise ProblemError("give either --shape BxCxL or --suite FILE")
        problems = read_suite(a.suite) if a.suite else [make_problem(a)]
    except ProblemError as e:
        print(f"tune.py: {e}", file=sys.stderr)
        return 2
    from dwgen.build import ToolchainError
    from dwgen.dryrun import dry_run
    from search import workflow

    try:
        if a.dry_run:
            return max(dry_run(p, arch=a.arch, cache_dir=a.runs_dir / "build", jobs=a.jobs) for p in problems)
        return workflow.tune(problems, trials=a.trials, timeout_s=a.timeout, sampler=a.sampler, seed=a.seed,
                             storage=a.storage, runs_dir=a.runs_dir, out_dir=a.out, freeze=not a.no_freeze,
                             jobs=a.jobs)
    except (workflow.UserError, ToolchainError) as e:
        print(f"tune.py: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main(sys.argv[1:])
    if rc == 0:
        print(f"tune.py: done in {time.perf_counter() - t0:.1f} s wall")
    sys.exit(rc)
