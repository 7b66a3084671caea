"""Samplers by name; each takes a seed so that a search can be repeated."""
from __future__ import annotations

import random
from collections.abc import Callable

import optuna

from dwgen.problem import Problem
from dwgen.space import Variant, make_config, tune_axes
from search.neighbours import valid_params


class SpaceSampler(optuna.samplers.BaseSampler):
    """Exhaustive search: every valid variant of one problem exactly once, in a seeded random order.

    Optuna's GridSampler walks the whole product of the axes, and the restrictions reject most of it (two
    thirds for the target shape, over 99% for small problems), so its asks went to waste and a run of
    rejected asks could end the search early. This proposes only valid configs; a resumed study carries on
    with those it has not seen."""

    def __init__(self, problem: Problem, seed: int, direction: str = "fwd"):
        self._problem, self._direction = problem, direction
        axes = tune_axes(problem, direction)
        self._order = [(digest, params) for digest, _, params in valid_params(problem, direction)]
        random.Random(seed).shuffle(self._order)
        self._space = {a: optuna.distributions.CategoricalDistribution(list(vals)) for a, vals in axes.items()}
        # what a proposal says of the axes of the families it does not choose
        self._filler = {a: vals[0] for a, vals in axes.items()}
        self._fallback = optuna.samplers.RandomSampler(seed=seed)
        self._seen: dict[int, str | None] = {}  # trial number -> the variant its params name

    def _digest(self, params: dict) -> str | None:
        try:
            return Variant(self._problem, make_config(self._problem, params, self._direction), self._direction).digest
        except (KeyError, ValueError):
            return None

    def _next(self, study: optuna.Study) -> dict | None:
        # Trials being evaluated hold their params already, so a batch of asks never repeats one.
        for t in study.get_trials(deepcopy=False):
            if t.params and t.number not in self._seen:
                self._seen[t.number] = self._digest(t.params)
        seen = set(self._seen.values())
        return next((params for digest, params in self._order if digest not in seen), None)

    def is_exhausted(self, study: optuna.Study) -> bool:
        return self._next(study) is None

    def infer_relative_search_space(self, study, trial) -> dict:
        return dict(self._space)

    def sample_relative(self, study, trial, search_space) -> dict:
        nxt = self._next(study)
        return {} if nxt is None else {**self._filler, **nxt}

    def sample_independent(self, study, trial, param_name, param_distribution):
        # Only reached once the space is used up (the search loop stops asking before that).
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


# Each takes the seed, the problem and the direction (whose family's space the grid sampler walks).
SAMPLERS: dict[str, Callable[[int, Problem, str], optuna.samplers.BaseSampler]] = {
    # Few startup trials: the known-good variants are enqueued first and seed the model.
    "tpe": lambda seed, problem, direction: optuna.samplers.TPESampler(seed=seed, n_startup_trials=16,
                                                                       multivariate=True, constant_liar=True),
    "random": lambda seed, problem, direction: optuna.samplers.RandomSampler(seed=seed),
    "grid": lambda seed, problem, direction: SpaceSampler(problem, seed, direction),
}


def make_sampler(name: str, seed: int, problem: Problem, direction: str = "fwd") -> optuna.samplers.BaseSampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](seed, problem, direction)
