"""What one benchmark line times: a Problem, plus causal padding, a fused SiLU, and the directions (fwd, bwd,
fwd+bwd), read from suite lines with the benchmark's own flags (--causal, --activation silu, --backward)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

from dwgen.problem import Problem, ProblemError
from dwgen.suite import problem_from_args, read_suite

# fwd: the forward alone; fwd+bwd: forward then backward (grad_x, grad_weight, grad_bias), as a training step
# runs them; bwd: the difference of the two, timed in the same rounds (BASELINES.md measures it that way).
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")
ACTIVATIONS = ("silu",)


@dataclass(frozen=True)
class Case(Problem):
    """A Problem as a model runs it. causal: `padding` (which must be dilation*(K-1)) on the left only, so
    the output has the input's length (Mamba's and Hyena's convs); activation: "silu" after the bias, or
    None; backward: time the backward and the whole step beside the forward, on inputs that require grad."""

    causal: bool = False
    activation: str | None = None
    backward: bool = False

    def __post_init__(self) -> None:
        if type(self.causal) is not bool or type(self.backward) is not bool:
            raise ProblemError(f"causal and backward must be True or False, got {self.causal!r}, {self.backward!r}")
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ProblemError(f"unknown activation {self.activation!r}: choose {', '.join(ACTIVATIONS)} or none")
        if self.causal and self.padding != self.dilation * (self.kernel_size - 1):
            raise ProblemError(f"a causal conv pads dilation*(K-1) = {self.dilation * (self.kernel_size - 1)} on "
                               f"the left, got padding {self.padding}")
        super().__post_init__()

    @property
    def pads(self) -> tuple[int, int]:
        """(left, right) padding."""
        return (self.padding, 0) if self.causal else (self.padding, self.padding)

    @property
    def out_length(self) -> int:
        left, right = self.pads
        return (self.length + left + right - self.dilation * (self.kernel_size - 1) - 1) // self.stride + 1

    @property
    def key(self) -> str:
        """Problem's key, then what sets a case apart: `_causal` (its p is the left padding), `_silu`."""
        return super().key + ("_causal" if self.causal else "") + (f"_{self.activation}" if self.activation else "")

    @property
    def plain(self) -> bool:
        """A forward that Problem alone describes: every contender of the forward bench can run it."""
        return not (self.causal or self.activation or self.backward)

    @property
    def directions(self) -> tuple[str, ...]:
        return DIRECTIONS if self.backward else ("fwd",)

    @property
    def problem(self) -> Problem:
        """The plain Problem of the same sizes, K, stride, padding, dilation, dtype, bias and layout."""
        return Problem(**{f.name: getattr(self, f.name) for f in fields(Problem)})

    def row_key(self, direction: str) -> str:
        """The `problem` of a row that times this case in a direction. Rows timed with gradients name their
        direction, so that a reader that finds rows by problem key (search/report.py) never takes a
        backward time, or a forward timed for training, for the forward bench's own."""
        return self.key if self.plain else f"{self.key}_{direction}"


def add_case_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's flags beyond the problem flags of dwgen/suite.py."""
    ap.add_argument("--causal", action="store_true",
                    help="pad dilation*(K-1) on the left only (output length = input length); no --padding with it")
    ap.add_argument("--activation", choices=ACTIVATIONS, default=None, help="fused after the bias")
    ap.add_argument("--backward", action="store_true", help="time bwd and fwd+bwd beside fwd")


def case_from_args(a: argparse.Namespace) -> Case:
    if a.causal:
        if a.padding is not None:
            raise ProblemError("--causal pads dilation*(K-1) on the left: give no --padding with it")
        a = argparse.Namespace(**{**vars(a), "padding": a.dilation * (a.kernel_size - 1)})
    p = problem_from_args(a)
    return Case(**p.to_dict(), causal=a.causal, activation=a.activation, backward=a.backward)


def read_cases(path: Path) -> list[Case]:
    """The cases of a suite file: tune.py's problem flags, and the benchmark's own."""
    return read_suite(path, add_case_arguments, case_from_args)

