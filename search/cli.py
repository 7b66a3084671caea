"""tune.py's command line (also `dwgen-tune` once installed): argument parsing and wiring, no logic of its own."""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from pathlib import Path

from dwgen import cli
from dwgen.build import COMPILE_TIMEOUT_S
from dwgen.problem import Problem, ProblemError
from dwgen.suite import add_problem_arguments, problem_from_args, read_suite
from dwgen.worker import RUN_TIMEOUT_S

ROOT = Path(__file__).resolve().parent.parent
DESCRIPTION = "Tune a depthwise conv1d problem and freeze the winner into generated/."


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = cli.OneLineParser(prog="tune.py", description=DESCRIPTION, epilog="tune.py show [PROBLEM] [--source] "
                           "[--json] [--not-on GPU] [--direction fwd|bwd] [--stand-ins|--no-stand-ins] [--suite] "
                           "[--generic]: what generated/ holds (tune.py show --help); tune.py report PROBLEM: "
                           "rebuild a tune's report (tune.py report --help)")
    problem_flags = add_problem_arguments(ap)
    ap.add_argument("--suite", type=Path, help="file of problems, one per line in these flags, e.g. "
                    "'--shape 16x1024x4096 --kernel-size 7'; all are tuned and frozen into one manifest")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="fwd",
                    help="which kernels to tune: fwd, the forward (default), or bwd, the fused backward (grad_x, "
                    "grad_weight and grad_bias; stride 1), frozen beside the forward")
    ap.add_argument("--trials", type=cli.int_range(1), default=120,
                    help="variants each study should hold measured (run again, it measures what is left)")
    ap.add_argument("--timeout", type=cli.positive_seconds, default=None,
                    help="stop searching after this many seconds")
    ap.add_argument("--sampler", default="tpe", choices=("tpe", "random", "grid"))
    # numpy, under Optuna's samplers, takes seeds of 32 bits
    ap.add_argument("--seed", type=cli.int_range(0, 2**32 - 1), default=0)
    ap.add_argument("--storage", type=cli.storage, default=None,
                    help="Optuna storage URL: sqlite:///FILE, postgresql://..., mysql://..., or journal:///FILE "
                    "(default: an sqlite file under runs/); 'memory' keeps nothing. Tuners on several hosts "
                    "join one study through PostgreSQL or a journal file on a shared file system")
    ap.add_argument("--workers", type=cli.int_range(1), default=1,
                    help="search with one process per GPU, on this many of the visible GPUs (default 1)")
    ap.add_argument("--compile-timeout", type=cli.positive_seconds, default=COMPILE_TIMEOUT_S,
                    help=f"seconds one variant may compile before nvcc is killed and the variant recorded as a "
                    f"timeout (default {COMPILE_TIMEOUT_S:g})")
    ap.add_argument("--run-timeout", type=cli.positive_seconds, default=RUN_TIMEOUT_S,
                    help=f"seconds checking and timing one variant may take before its GPU worker is killed and "
                    f"replaced, the variant recorded as a timeout (default {RUN_TIMEOUT_S:g})")
    ap.add_argument("--runs-dir", type=cli.directory, default=ROOT / "runs")
    ap.add_argument("--out", type=cli.directory, default=ROOT / "generated", help="where the frozen module goes")
    ap.add_argument("--seeds-from", type=cli.directory, default=None,
                    help="a frozen module whose winners each study asks first (default: --out's own; a freeze "
                    "keeps the designs of the stale entries it drops under its manifest's retired, and those are "
                    "asked too)")
    ap.add_argument("--stand-in", action="store_true",
                    help="each problem stands in for every size of its signature (a stride, a dilation or K past "
                    "16: generated/ lends its winner to them all, as for benchmarks/signatures.txt): its finalists "
                    "are also checked and re-timed at three other sizes, and the one whose time over the fastest's, "
                    "in the geometric mean over the four sizes, is least wins")
    ap.add_argument("--no-freeze", action="store_true", help="search and report, leave generated/ alone")
    ap.add_argument("--dry-run", action="store_true", help="render and nvcc-compile the space; no GPU needed")
    ap.add_argument("--arch", type=cli.arch, default="sm_90",
                    help="target of --dry-run builds (search builds for the GPU)")
    ap.add_argument("--jobs", type=cli.int_range(1), default=None, help="parallel nvcc processes (default: all cores)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar (nor progress lines when not a terminal)")
    ap.add_argument("--json", action="store_true", help="print the winners (with --dry-run: the builds) as JSON "
                    "on stdout; the log goes to stderr")
    a = ap.parse_args(argv)
    if a.suite:
        # A suite's problems come from its file; a problem flag beside it would be silently ignored.
        given = [f.option_strings[0] for f in problem_flags if f.dest != "shape" and getattr(a, f.dest) != f.default]
        if given:
            ap.error(f"{given[0]} does nothing with --suite: write it on the suite file's lines")
    return a


def _gpu_text(text: str) -> str:
    """--not-on's value: part of a GPU's name (an empty one would be in every name and keep nothing)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("give part of a GPU's name, e.g. --not-on H200")
    return text


def parse_show_args(argv: list[str]) -> argparse.Namespace:
    ap = cli.OneLineParser(prog="tune.py show", description="List what generated/ holds: problem, dtype, "
                                 "layout, direction, kernel, ms, x copy, speedup over PyTorch, GPU, date.")
    ap.add_argument("problem", nargs="?", help="one problem: its key, the start of one key (e.g. 32x512x8192) "
                    "or its kernel's name; KEY_bwd for its backward entry alone")
    ap.add_argument("--source", action="store_true", help="print the problem's frozen CUDA kernel")
    ap.add_argument("--json", action="store_true", help="print the rows (and --source text) as JSON")
    ap.add_argument("--out", type=Path, default=ROOT / "generated", help="the frozen module to read (tune's --out)")
    ap.add_argument("--not-on", metavar="GPU", type=_gpu_text, help="only entries measured on a GPU whose name "
                    "does not hold GPU (any case), e.g. --not-on H200 on an H200 host: the ones to re-tune there")
    ap.add_argument("--direction", choices=("fwd", "bwd"), help="only the forward or the backward entries")
    ap.add_argument("--stand-ins", action=argparse.BooleanOptionalAction, default=None,
                    help="only the stand-ins' winners (entries that record a tune.py --stand-in tune), or only the "
                    "others")
    ap.add_argument("--suite", action="store_true", help="a switch here (tune.py --suite takes the file): print "
                    "the entries as a suite file for tune.py --suite, its first line the flags that go with it; "
                    "all of one direction, stand-ins or not")
    ap.add_argument("--generic", action="store_true", help="list the measured generic choices (python -m "
                    "search.generic) instead of the tuned entries; with --suite, the search.generic calls that "
                    "measure them again")
    return ap.parse_args(argv)


def show(argv: list[str]) -> int:
    from dwgen import show as frozen

    a = parse_show_args(argv)
    only = frozen.Only(not_on=a.not_on, direction=a.direction, stand_ins=a.stand_ins)
    try:
        print(frozen.show(a.out, a.problem, with_source=a.source, as_json=a.json, only=only, as_suite=a.suite,
                          generic=a.generic))
    except frozen.ShowError as e:
        print(f"tune.py show: {e}", file=sys.stderr)
        return 2
    return 0


def parse_report_args(argv: list[str]) -> argparse.Namespace:
    ap = cli.OneLineParser(prog="tune.py report", description="Rebuild RUNS_DIR/PROBLEM/report.md and its plots "
                           "from the problem's stored study.")
    ap.add_argument("problem", help="the problem's key as the tune prints it, e.g. "
                    "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias")
    ap.add_argument("--storage", type=cli.storage, default=None,
                    help="the Optuna storage the tune used (default: the sqlite file under --runs-dir)")
    ap.add_argument("--runs-dir", type=cli.directory, default=ROOT / "runs", help="where the report goes")
    return ap.parse_args(argv)


def report(argv: list[str]) -> int:
    a = parse_report_args(argv)
    if a.storage == "memory":
        print("tune.py report: a study kept in memory is gone once its tune ends; name a stored one",
              file=sys.stderr)
        return 2
    from search import report as rep
    from search import study as st

    db = a.runs_dir / "dwgen.db"
    if a.storage is None and not db.exists():
        print(f"tune.py report: no study storage at {db}: tune the problem first, or give --storage",
              file=sys.stderr)
        return 2
    try:
        storage = st.open_storage(a.storage or st.default_storage(a.runs_dir))
        path = rep.report_from_storage(storage, a.problem, a.runs_dir)
    except st.StorageError as e:
        print(f"tune.py report: {e}", file=sys.stderr)
        return 1
    except rep.ReportError as e:
        print(f"tune.py report: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


def tunable(problems: list[Problem], direction: str, suite: Path | None, stand_in: bool = False) -> list[Problem]:
    """The problems a tune can search, refused before anything is compiled or searched: a search of an empty
    space would only end late with "no correct variant found", and a dry run would compile nothing and call
    that success. A suite's strided problems keep the generic backward: skipped with a note, not refused."""
    from dwgen.dryrun import BWD_STRIDE_ONE, no_variant_reason

    if stand_in:
        from search.standin import lent_reason

        for p in problems:
            reason = lent_reason(p)
            if reason:
                raise ProblemError(reason if len(problems) == 1 else f"{p.key}: {reason}")
    reasons = [no_variant_reason(p, direction) for p in problems]
    strided = [p for p, r in zip(problems, reasons, strict=True) if r == BWD_STRIDE_ONE]
    for p, reason in zip(problems, reasons, strict=True):
        if reason and not (reason == BWD_STRIDE_ONE and suite is not None):
            raise ProblemError(reason if len(problems) == 1 or p.key in reason else f"{p.key}: {reason}")
    if strided and len(strided) == len(problems):
        raise ProblemError(BWD_STRIDE_ONE + (f": no problem of {suite} has a fused backward to tune" if suite else ""))
    for p in strided:
        print(f"tune.py: skipping {p.key}: {BWD_STRIDE_ONE}", file=sys.stderr)
    return [p for p in problems if p not in strided]


def main(argv: list[str]) -> int:
    t0 = time.perf_counter()
    if argv[:1] == ["show"]:  # a subcommand before any flag: `python tune.py --shape ...` stays as it was
        return show(argv[1:])
    if argv[:1] == ["report"]:
        return report(argv[1:])
    a = parse_args(argv)
    try:
        if bool(a.shape) == bool(a.suite):
            raise ProblemError("give either --shape BxCxL or --suite FILE")
        problems = read_suite(a.suite) if a.suite else [problem_from_args(a)]
        problems = tunable(problems, a.direction, a.suite, a.stand_in)
    except ProblemError as e:
        print(f"tune.py: {e}", file=sys.stderr)
        return 2
    from dwgen.build import ToolchainError
    from dwgen.dryrun import build_rows, dry_run
    from dwgen.show import winner_row
    from search import workflow

    log = functools.partial(print, file=sys.stderr) if a.json else print  # --json: stdout holds only the JSON
    rows: list[dict] = []
    try:
        if a.dry_run:
            rc = max([dry_run(p, arch=a.arch, cache_dir=a.runs_dir / "build", jobs=a.jobs, quiet=a.quiet, log=log,
                              report=lambda q, builds: rows.extend(build_rows(q, builds)),
                              timeout_s=a.compile_timeout, direction=a.direction) for p in problems])
        else:
            rc = workflow.tune(problems, trials=a.trials, timeout_s=a.timeout, sampler=a.sampler, seed=a.seed,
                               storage=a.storage, runs_dir=a.runs_dir, out_dir=a.out, freeze=not a.no_freeze,
                               jobs=a.jobs, quiet=a.quiet, log=log,
                               report=lambda ws: rows.extend(winner_row(w, frozen=not a.no_freeze) for w in ws),
                               workers=a.workers, compile_timeout_s=a.compile_timeout,
                               run_timeout_s=a.run_timeout, direction=a.direction, seeds_from=a.seeds_from,
                               stand_in=a.stand_in)
    except (workflow.UserError, ToolchainError) as e:
        print(f"tune.py: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(rows, indent=2))
    if rc == 0:
        log(f"tune.py: done in {time.perf_counter() - t0:.1f} s wall")
    return rc


def run() -> int:
    """The console entry point: tune.py's main on this process's arguments."""
    try:
        return main(sys.argv[1:])
    except BrokenPipeError:  # `tune.py show | head` closed the pipe early: not worth a traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's documented way out
        return 1
