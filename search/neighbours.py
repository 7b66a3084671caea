"""The valid variants nearest a sampler's proposal, for asks that would otherwise go to waste.

The model-based samplers propose points of the whole product of the axes; the restrictions reject most of it
(over 95% of the backward's, whose walk and register axes apply to few designs), and once a search has
measured the good region the proposals repeat measured variants. Each such ask costs a trial in storage and
a sampler update (about 0.07 s), and a small space could take a thousand asks to find its last few
variants. The search loop tells a wasted proposal as before (a rejected one penalised, so the model learns
where the space is) and, once several asks in a row were wasted, asks next the unmeasured valid variant that
differs from the last proposal in the fewest axes."""
from __future__ import annotations

from collections.abc import Collection, Container
from functools import cached_property

from dwgen.problem import Problem
from dwgen.space import Variant, enumerate_space, trial_params


def valid_params(problem: Problem, direction: str = "fwd") -> list[tuple[str, Variant, dict]]:
    """Every valid variant of the problem in the space's order, with its digest and its tune parameters (a
    digest reads the templates: about 0.2 ms a variant)."""
    return [(v.digest, v, trial_params(problem, v.config, direction)) for v in enumerate_space(problem, direction)]


class Neighbours:
    def __init__(self, problem: Problem, direction: str = "fwd"):
        self._problem, self._direction = problem, direction
        self._variants = enumerate_space(problem, direction)

    def __len__(self) -> int:
        return len(self._variants)

    @cached_property
    def _space(self) -> list[tuple[str, Variant, dict]]:
        """Each variant's digest and parameters, worked out once and only when first asked (a digest renders
        the variant's source: about a second for a forward space of 4000)."""
        return valid_params(self._problem, self._direction)

    def nearest(self, params: dict, taken: Container[str]) -> Variant | None:
        """The valid variant not in `taken` (digests) whose parameters differ from `params` in the fewest
        axes (the first in the space's order among equals); None when every one is taken."""
        best, fewest = None, None
        for digest, v, vp in self._space:
            if digest in taken:
                continue
            differ = sum(params.get(k) != value for k, value in vp.items())
            if fewest is None or differ < fewest:
                best, fewest = v, differ
        return best

    def all_taken(self, taken: Collection[str]) -> bool:
        return len(taken) >= len(self._variants) and all(digest in taken for digest, _, _ in self._space)
