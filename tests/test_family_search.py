"""A tune over several families: the grid sampler proposes every valid variant of the three forward families of
a 16-bit (B, C, L) problem once, and TPE's asks over the mixed space name configs of each family."""
from __future__ import annotations

import optuna

from dwgen.problem import Problem
from dwgen.space import Variant, enumerate_space, make_config, violations
from search import study as st
from search.samplers import SpaceSampler

P = Problem(2, 16, 1024, 31, 1, 15, dtype="fp16")


def test_the_grid_walks_both_families_once():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sampler = SpaceSampler(P, 0)
    study = optuna.create_study(sampler=sampler)
    dists = st.distributions(P)
    seen: list[str] = []
    while not sampler.is_exhausted(study):
        trial = study.ask(dists)
        config = make_config(P, trial.params)
        assert not violations(P, config)
        seen.append(Variant(P, config).digest)
        study.tell(trial, 1.0)
    assert sorted(seen) == sorted(v.digest for v in enumerate_space(P))
    assert {Variant(P, make_config(P, t.params)).family.name for t in study.trials} == {"dw1d", "dw1d_tc", "dw1d_lane"}


def test_tpe_asks_name_configs_of_either_family():
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, multivariate=True, n_startup_trials=5))
    dists = st.distributions(P)
    families = set()
    for _ in range(30):
        trial = study.ask(dists)
        families.add(Variant(P, make_config(P, trial.params)).family.name)
        study.tell(trial, 1.0)
    assert families == {"dw1d", "dw1d_tc", "dw1d_lane"}
