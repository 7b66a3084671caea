"""python -m search.compare: check and time chosen variants of one problem side by side (no study, no freeze).

For kernel experiments: name variants (as tune.py prints them), optionally widen each along some axes
with --vary, and get one interleaved re-timing of all that passed the check, with registers and spills.

    python -m search.compare --shape 16x1024x4096 -k 7 dw1d_f32_k7_t128_v4_o2_row_l1 --vary halo,run
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from dwgen import cli
from dwgen.problem import ProblemError
from dwgen.space import Variant, family_of, variant_from_name, violations
from dwgen.suite import add_problem_arguments, problem_from_args

RETIME_ROUNDS = 60


def widen(variants: list[Variant], axes: list[str]) -> list[Variant]:
    """Each variant, and its neighbours along `axes` that the restrictions allow; no repeats."""
    out: dict[str, Variant] = {}
    for v in variants:
        grown = [v.config]
        for axis in axes:
            grown = [dataclasses.replace(c, **{axis: value}) for c in grown for value in v.family.axes[axis]]
        for c in grown:
            if not violations(v.problem, c):
                w = Variant(v.problem, c)
                out.setdefault(w.digest, w)
    return list(out.values())


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python -m search.compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(ap)
    ap.add_argument("names", nargs="+", help="variant names, e.g. dw1d_f32_k3_t128_v4_o2_l1")
    ap.add_argument("--vary", default="", help="comma-separated axes of the problem's family to widen each variant "
                    "along, e.g. threads,halo")
    ap.add_argument("--rounds", type=cli.int_range(1), default=RETIME_ROUNDS)
    ap.add_argument("--jobs", type=cli.int_range(1), default=None)
    a = ap.parse_args(argv)
    axes = [x for x in a.vary.split(",") if x]
    try:
        problem = problem_from_args(a)
        family_axes = family_of(problem).axes
        unknown = [x for x in axes if x not in family_axes]
        if unknown:
            raise ProblemError(f"unknown axis {unknown[0]!r} in --vary; choose from {', '.join(family_axes)}")
        variants = [variant_from_name(n, problem) for n in a.names]
    except (ProblemError, ValueError) as e:
        print(f"python -m search.compare: {e}", file=sys.stderr)
        return 2
    variants = widen(variants, axes)

    from dwgen.worker import GpuWorker
    from search import workflow
    from search.loop import check_each

    try:
        build = workflow.gpu_builder(Path("runs"), a.jobs)
    except workflow.UserError as e:
        print(f"python -m search.compare: {e}", file=sys.stderr)
        return 1
    print(f"{problem.key}: {len(variants)} variants", flush=True)
    builds = build(variants)
    worker = GpuWorker(problem)
    results, cands = {}, []
    try:
        for r, cand in check_each(worker, variants, builds):
            results[r.name] = r
            print(r.summary(), flush=True)
            if cand is not None:
                cands.append(cand)
        times = worker.retime(cands, a.rounds) if cands else {}
    finally:
        worker.close()
    if not times:
        print("no variant passed its check")
        return 1
    copy_ms = times["copy_"]
    print(f"\n{problem.key}: re-timed interleaved, {a.rounds} rounds; copy_ {copy_ms:.4f} ms, "
          f"PyTorch {times['torch']:.4f} ms")
    print(f"{'variant':48s} {'ms':>8s} {'x copy':>7s} {'regs':>5s} {'spill':>6s}")
    for name in sorted((n for n in times if n in results), key=times.get):
        r = results[name]
        print(f"{name:48s} {times[name]:8.4f} {times[name] / copy_ms:7.3f} {r.registers:5d} {r.spill_bytes:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
