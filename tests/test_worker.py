"""The GPU worker's protocol without a GPU: the child's loop (run here in a thread, its benches faked) and the
parent's switch to another problem."""
from __future__ import annotations

import multiprocessing as mp
import threading
import types

import pytest

from dwgen import worker
from dwgen.problem import Problem

FIRST, SECOND = Problem(2, 32, 1000), Problem(3, 16, 4099, 3, 1, 2, bias=True)


class FakeBench:
    """A child's bench that says which problem it serves and what it was asked."""

    made: list = []

    def __init__(self, problem):
        self.problem = problem
        FakeBench.made.append(problem)

    def evaluate(self, cand, edges=True, timed=True):
        return {"problem": self.problem.key, "cand": cand, "edges": edges, "timed": timed}

    def baselines(self):
        return {"copy_ms": 1.0, "problem": self.problem.key}


@pytest.fixture
def child(monkeypatch):
    """A pipe to _serve running in a thread with FakeBench for both directions."""
    FakeBench.made = []
    monkeypatch.setattr(worker, "_Bench", FakeBench)
    monkeypatch.setattr(worker, "_BwdBench", FakeBench)
    parent, there = mp.Pipe()
    t = threading.Thread(target=worker._serve, args=(there, FIRST), daemon=True)
    t.start()
    assert parent.recv() == ("ready", "")

    def ask(op, arg=None):
        parent.send((op, arg))
        return parent.recv()

    yield ask
    parent.send(("stop", None))
    t.join(5)


def test_the_child_checks_without_timing_and_serves_another_problem(child):
    assert child("check", ("cand", False)) == ("ok", {"problem": FIRST.key, "cand": "cand", "edges": False,
                                                      "timed": False})
    assert child("evaluate", "cand")[1]["timed"] is True  # the search's evaluate: checked on edges, timed
    assert child("problem", SECOND) == ("ok", None)
    assert child("baselines") == ("ok", {"copy_ms": 1.0, "problem": SECOND.key})  # the new problem's own
    assert child("check", ("cand", True))[1]["problem"] == SECOND.key
    assert FakeBench.made == [FIRST, SECOND]


def test_evaluate_leaves_out_edge_problems_and_timing_when_asked(monkeypatch):
    """_BenchBase.evaluate: edges off checks the problem alone; timed off returns before any timing."""
    import torch

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    asked = []

    class Bench(worker._BenchBase):
        def __init__(self):  # the real one starts CUDA
            self.problem = FIRST

        def launcher(self, cand):
            return types.SimpleNamespace(unload=lambda: None)

        def checks(self, launcher, edges=True):
            asked.append(edges)
            yield types.SimpleNamespace(ok=True, max_rel_error=0.5)

        def stream_check(self, launcher):
            return types.SimpleNamespace(ok=True, max_rel_error=0.0)

        def timed(self, launcher):
            raise AssertionError("timed although timed=False")

    assert Bench().evaluate("cand", edges=False, timed=False) == {"status": "ok", "max_rel_error": 0.5}
    assert asked == [False]


def test_switch_asks_a_running_child_only(monkeypatch):
    w = worker.GpuWorker(FIRST)
    calls = []
    monkeypatch.setattr(w, "call", lambda op, arg=None: calls.append((op, arg)))
    w.switch(SECOND)  # nothing started: the first call starts a child on SECOND
    assert w.problem == SECOND and calls == []
    w._proc = types.SimpleNamespace(is_alive=lambda: True)
    w.switch(SECOND)  # the same problem: nothing to ask
    w.switch(FIRST)
    assert calls == [("problem", FIRST)] and w.problem == FIRST

    def dies(op, arg=None):
        raise worker.WorkerDied("gone")

    monkeypatch.setattr(w, "call", dies)
    w.switch(SECOND)  # a child that died on the switch: the next call starts one on SECOND
    assert w.problem == SECOND
