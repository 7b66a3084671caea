"""Problems described by command-line flags: the flags themselves, and suite files of one problem per line."""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path

from dwgen.problem import KNOWN_DTYPES, LAYOUTS, Problem, ProblemError


def add_problem_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", help="BxCxL, e.g. 32x512x8192")
    ap.add_argument("--kernel-size", "-k", type=int, default=3)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--padding", type=int, default=None, help="default: (K-1)/2*dilation, 'same' for odd K")
    ap.add_argument("--dilation", type=int, default=1)
    ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--dtype", default="fp32", help=f"one of {', '.join(KNOWN_DTYPES)}")
    ap.add_argument("--layout", default="bcl", help=f"memory order of x and y: {' or '.join(LAYOUTS)} "
                    "(blc: (B, L, C) in memory, passed as x.transpose(1, 2))")


def problem_from_args(a: argparse.Namespace) -> Problem:
    if not a.shape:
        raise ProblemError("no --shape BxCxL given")
    padding = a.padding if a.padding is not None else (a.kernel_size - 1) // 2 * a.dilation
    return Problem.from_shape(a.shape, kernel_size=a.kernel_size, stride=a.stride, padding=padding,
                              dilation=a.dilation, dtype=a.dtype, bias=a.bias, layout=a.layout)


class _LineParser(argparse.ArgumentParser):
    def error(self, message: str):  # a bad suite line is reported with its place, not by exiting
        raise ProblemError(message)


def read_suite(path: Path) -> list[Problem]:
    """Problems of a suite file: one per line in the problem flags above; '#' starts a comment."""
    if not path.exists():
        raise ProblemError(f"suite file {path} not found")
    parser = _LineParser(add_help=False)
    add_problem_arguments(parser)
    problems = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            problems.append(problem_from_args(parser.parse_args(shlex.split(line))))
        except ProblemError as e:
            raise ProblemError(f"{path}:{n}: {e}: {line}") from None
    if not problems:
        raise ProblemError(f"suite file {path} lists no problems")
    return problems
