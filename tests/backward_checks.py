"""The backward checks a search worker asks of a candidate, read without a GPU: each call to check.check_backward
that _BwdBench.checks makes (its problem: sizes, padding, activation) is noted instead of run."""
from __future__ import annotations

import types

import pytest


def asked(variant, problem) -> list:
    """The problems the worker's checks of `variant`, measured on `problem`, hand to check.check_backward."""
    from dwgen import check, worker

    seen = []

    def noted(q, run, seeds=None, cache=None):  # check_backward's signature: a change there fails here
        seen.append(q)

    mp = pytest.MonkeyPatch()
    mp.setattr(check, "check_backward", noted)
    try:
        bench = object.__new__(worker._BwdBench)  # its __init__ needs a GPU; checks() reads the problem alone
        bench.problem = problem
        list(bench.checks(types.SimpleNamespace(variant=variant)))
    finally:
        mp.undo()
    return seen
