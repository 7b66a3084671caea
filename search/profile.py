"""python -m search.profile: launch named variants on one problem and nothing else, for a profiler to watch.

Each variant is built and launched `--launches` times on the problem's inputs, one after another. Nothing is
checked or timed here (python -m search.compare does both); this only gives Nsight Compute clean launches
of the real shape, which a search's check of small edge shapes would not:

    ncu -k regex:dw1d --launch-skip 1 -c 1 python -m search.profile --shape 32x512x1024 -k 31 --padding 15 NAME
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dwgen import cli
from dwgen.problem import ProblemError
from dwgen.space import variant_from_name
from dwgen.suite import add_problem_arguments, problem_from_args


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python -m search.profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(ap)
    ap.add_argument("names", nargs="+", help="variant names, e.g. dw1d_f32_k3_t128_v4_o2_l1")
    ap.add_argument("--launches", type=cli.int_range(1), default=3,
                    help="launches per variant (default 3)")
    a = ap.parse_args(argv)
    try:
        problem = problem_from_args(a)
        variants = [variant_from_name(n, problem) for n in a.names]
    except (ProblemError, ValueError) as e:
        print(f"python -m search.profile: {e}", file=sys.stderr)
        return 2

    import torch

    from dwgen.check import empty_output, make_inputs
    from dwgen.worker import Candidate, Launcher
    from search import workflow

    try:
        build = workflow.gpu_builder(Path("runs"), None)
    except workflow.UserError as e:
        print(f"python -m search.profile: {e}", file=sys.stderr)
        return 1
    x, w, b = make_inputs(problem, 0)
    y = empty_output(problem)
    for v, built in zip(variants, build(variants), strict=True):
        if not built.ok:
            print(f"{v.name}: {built.status} (log beside {built.log_path})", file=sys.stderr)
            return 1
        launcher = Launcher(Candidate(v, built.library))
        launch = launcher.prepare(problem, x, w, b, y)
        for _ in range(a.launches):
            launch()
        torch.cuda.synchronize()
        launcher.unload()
        print(f"{v.name}: {a.launches} launches of {v.config.threads} threads a block", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
