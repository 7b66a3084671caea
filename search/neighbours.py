"""The valid variants nearest a sampler's proposal, for asks that would otherwise go to waste.

The model-based samplers propose points of the whole product of the axes; the restrictions reject most of it
(over 95% of the backward's, whose walk and register axes apply to few designs), and once a search has
measured the good region the proposals repeat measured variants. Each such ask costs a trial in storage and
a sampler update (about 0.07 s), and a small space could take a thousand asks to find its last few
variants. The search loop tells a wasted proposal as before (a rejected one penalised, so the model learns
where the space is) and, once several asks in a row were wasted, asks next the unmeasured valid variant that
differs from the last proposal in the fewest axes."""
from __future__ import annotations

from collections.abc import Container

from dwgen.problem import Problem
from dwgen.space import Variant, enumerate_space, trial_params


class Neighbours:
    def __init__(self, problem: Problem, direction: str = "fwd"):
        self._space = [(v, trial_params(problem, v.config, direction)) for v in enumerate_space(problem, direction)]

    def __len__(self) -> int:
        return len(self._space)

    def nearest(self, params: dict, taken: Container[str]) -> Variant | None:
        """The valid variant not in `taken` (digests) whose parameters differ from `params` in the fewest
        axes (the first in the space's order among equals); None when every one is taken."""
        best, fewest = None, None
        for v, vp in self._space:
            if v.digest in taken:
                continue
            differ = sum(params.get(k) != value for k, value in vp.items())
            if fewest is None or differ < fewest:
                best, fewest = v, differ
        return best

    def all_taken(self, taken: Container[str]) -> bool:
        return all(v.digest in taken for v, _ in self._space)
