"""Samplers by name; each takes a seed so that a search can be repeated."""
from __future__ import annotations

from collections.abc import Callable

import optuna

from dwgen.space import AXES


class AskTellGridSampler(optuna.samplers.GridSampler):
    """GridSampler for ask/tell use: its after_trial calls Study.stop(), which raises outside
    Study.optimize(); the search loop asks is_exhausted() itself instead."""

    def after_trial(self, study, trial, state, values) -> None:
        pass


SAMPLERS: dict[str, Callable[[int], optuna.samplers.BaseSampler]] = {
    # Few startup trials: the known-good variants are enqueued first and seed the model.
    "tpe": lambda seed: optuna.samplers.TPESampler(seed=seed, n_startup_trials=16, multivariate=True,
                                                   constant_liar=True),
    "random": lambda seed: optuna.samplers.RandomSampler(seed=seed),
    "grid": lambda seed: AskTellGridSampler({k: list(v) for k, v in AXES.items()}, seed=seed),
}


def make_sampler(name: str, seed: int) -> optuna.samplers.BaseSampler:
    if name not in SAMPLERS:
        raise ValueError(f"unknown sampler {name!r}: choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](seed)
