"""Problems described by command-line flags: the flags themselves, and suite files of one problem per line."""
from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from pathlib import Path

from dwgen import cli
from dwgen.problem import ACTIVATIONS, KNOWN_DTYPES, LAYOUTS, Problem, ProblemError, causal_padding

# What dwgen's kernels are written for; beyond these a tune has nothing to build (K and dilation make the
# register window, stride the load pattern).
KERNEL_SIZES = (1, 64)
STRIDES = (1, 4)
DILATIONS = (1, 8)


def add_problem_arguments(ap: argparse.ArgumentParser) -> list[argparse.Action]:
    """Add the flags that describe one problem; returns their actions."""
    return [ap.add_argument("--shape", help="BxCxL, e.g. 32x512x8192"),
            ap.add_argument("--kernel-size", "-k", type=cli.int_range(*KERNEL_SIZES), default=3,
                            help=f"K, {KERNEL_SIZES[0]} to {KERNEL_SIZES[1]} (default 3)"),
            ap.add_argument("--stride", type=cli.int_range(*STRIDES), default=1,
                            help=f"{STRIDES[0]} to {STRIDES[1]} (default 1)"),
            ap.add_argument("--padding", type=cli.padding, default=None,
                            help="an integer (both sides), 'same' ((K-1)/2*dilation, odd K only) or 'causal' "
                            "(dilation*(K-1) on the left, none on the right: output length L); "
                            "default: (K-1)//2*dilation"),
            ap.add_argument("--dilation", type=cli.int_range(*DILATIONS), default=1,
                            help=f"{DILATIONS[0]} to {DILATIONS[1]} (default 1)"),
            ap.add_argument("--bias", action=argparse.BooleanOptionalAction, default=False),
            ap.add_argument("--dtype", default="fp32", help=f"one of {', '.join(KNOWN_DTYPES)}"),
            ap.add_argument("--layout", default="bcl", help=f"memory order of x and y: {' or '.join(LAYOUTS)} "
                            "(blc: (B, L, C) in memory, passed as x.transpose(1, 2))"),
            ap.add_argument("--activation", choices=ACTIVATIONS, default="none",
                            help="applied to the result inside the kernels: none (default) or silu")]


def problem_from_args(a: argparse.Namespace) -> Problem:
    if not a.shape:
        raise ProblemError("no --shape BxCxL given")
    if a.padding == "same" and a.kernel_size % 2 == 0:
        raise ProblemError(f"--padding same needs an odd kernel size (K={a.kernel_size} cannot be centred); "
                           "give --padding N")
    right = None  # the same as the left
    if isinstance(a.padding, int):
        padding = a.padding
    elif a.padding == "causal":
        padding, right = causal_padding(a.kernel_size, a.dilation), 0
    else:  # 'same' (odd K), or no --padding
        padding = (a.kernel_size - 1) // 2 * a.dilation
    return Problem.from_shape(a.shape, kernel_size=a.kernel_size, stride=a.stride, padding=padding,
                              padding_right=right, dilation=a.dilation, dtype=a.dtype, bias=a.bias, layout=a.layout,
                              activation=a.activation)


class _LineParser(cli.OneLineParser):
    def error(self, message: str):  # a bad suite line is reported with its place, not by exiting
        raise ProblemError(message)


def read_suite(path: Path, extra: Callable[[argparse.ArgumentParser], object] | None = None,
               make: Callable[[argparse.Namespace], Problem] = problem_from_args) -> list[Problem]:
    """Problems of a suite file: one per line in the problem flags above; '#' starts a comment.

    A reader with flags of its own (the benchmark's) adds them with `extra` and builds each line with `make`."""
    if not path.exists():
        raise ProblemError(f"suite file {path} not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"cannot read suite file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    parser = _LineParser(add_help=False)
    add_problem_arguments(parser)
    if extra is not None:
        extra(parser)
    problems = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        try:
            problems.append(make(parser.parse_args(shlex.split(line))))
        except (ProblemError, ValueError) as e:  # ValueError: shlex's unclosed quotation
            raise ProblemError(f"{path}:{n}: {e}: {line}") from None
    if not problems:
        raise ProblemError(f"suite file {path} lists no problems")
    return problems
