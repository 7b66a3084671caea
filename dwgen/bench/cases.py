"""What one benchmark line times: a Problem (causal padding and a fused SiLU are its own fields, written as
tune.py writes them: --padding causal, --activation silu) and the directions (fwd, bwd, fwd+bwd), read from
suite lines with the benchmark's own flag, --backward."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path

from dwgen.problem import Problem, ProblemError
from dwgen.suite import problem_from_args, read_suite

# fwd: the forward alone; fwd+bwd: forward then backward (grad_x, grad_weight, grad_bias), as a training step
# runs them; bwd: the difference of the two, timed in the same rounds (BASELINES.md measures it that way).
DIRECTIONS = ("fwd", "bwd", "fwd+bwd")


@dataclass(frozen=True)
class Case(Problem):
    """A Problem as a model runs it. backward: time the backward and the whole step beside the forward, on
    inputs that require grad. graph: time it as CUDA-graph replays even where its data outgrow L2, for a step
    whose host work (an autograd backward costs 150 µs or more of CPU) outlasts its GPU work, where plain calls
    would time the host."""

    backward: bool = False
    graph: bool = False

    def __post_init__(self) -> None:
        for name in ("backward", "graph"):
            if type(getattr(self, name)) is not bool:
                raise ProblemError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.graph and not self.backward:  # the forward bench graphs by size alone: it would be ignored
            raise ProblemError("--graph applies to training lines only: add --backward, or drop --graph")
        super().__post_init__()

    @property
    def plain(self) -> bool:
        """A forward alone: the forward bench times it, with every contender that can run its problem."""
        return not self.backward

    @property
    def directions(self) -> tuple[str, ...]:
        return DIRECTIONS if self.backward else ("fwd",)

    @property
    def problem(self) -> Problem:
        """The plain Problem of the same sizes, K, stride, paddings, dilation, dtype, bias, layout and activation."""
        return Problem(**{f.name: getattr(self, f.name) for f in fields(Problem)})

    def row_key(self, direction: str) -> str:
        """The `problem` of a row that times this case in a direction. Rows timed with gradients name their
        direction, so that a reader that finds rows by problem key (search/report.py) never takes a
        backward time, or a forward timed for training, for the forward bench's own."""
        return self.key if self.plain else f"{self.key}_{direction}"


def add_case_arguments(ap: argparse.ArgumentParser) -> None:
    """The benchmark's flag beyond the problem flags of dwgen/suite.py."""
    ap.add_argument("--backward", action="store_true", help="time bwd and fwd+bwd beside fwd")
    ap.add_argument("--graph", action="store_true", help="time as CUDA-graph replays (a host-bound step)")


def case_from_args(a: argparse.Namespace) -> Case:
    return Case(**problem_from_args(a).to_dict(), backward=a.backward, graph=a.graph)


def read_cases(path: Path) -> list[Case]:
    """The cases of a suite file: tune.py's problem flags, and the benchmark's own."""
    return read_suite(path, add_case_arguments, case_from_args)
