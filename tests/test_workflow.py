"""tune.py's wiring of a backward tune (--direction bwd), with a fake builder and a fake GPU worker: its own
study and runs folder, the backward worker, winners frozen beside the forward's and seeding the next tune."""
from __future__ import annotations

import pytest

from dwgen import freeze
from dwgen.families import bwd
from dwgen.problem import Problem
from search import study as st
from search import workflow
from tests.test_search import FakeBuilder, fake_bwd_time

PROBLEM = Problem(8, 64, 4096)


class FakeBwdWorker:
    """What tune_problem asks of BwdGpuWorker, answered without a GPU; remembers every instance."""

    made: list = []

    def __init__(self, problem, timeout_s=None):
        self.problem, self.evaluated, self.retimed, self.restarts = problem, [], [], 0
        FakeBwdWorker.made.append(self)

    def machine(self) -> dict:
        return {"gpu": "Fake GPU", "capability": "9.0", "driver": "0", "torch": "0", "cuda": "0", "date": "today"}

    def baselines(self) -> dict:
        return {"copy_ms": 1.0, "torch_ms": 6.0}

    def evaluate(self, cand, base):
        assert cand.variant.direction == base.direction == "bwd"
        self.evaluated.append(cand.variant)
        return base.with_(kernel_ms=fake_bwd_time(cand.variant), copy_ms=1.0, torch_ms=6.0, reps=20)

    def retime(self, cands, rounds):
        self.retimed.append([c.variant for c in cands])
        return {"copy_": 1.0, "torch": 6.0, **{c.variant.name: fake_bwd_time(c.variant) for c in cands}}

    def close(self) -> None:
        pass


class NoForwardWorker:
    def __init__(self, problem, timeout_s=None):
        raise AssertionError("a backward tune started the forward's worker")


@pytest.fixture
def fake_gpu(monkeypatch):
    from dwgen import worker

    FakeBwdWorker.made = []
    monkeypatch.setattr(workflow, "gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs_dir, jobs, timeout_s=None: FakeBuilder())
    monkeypatch.setattr(worker, "BwdGpuWorker", FakeBwdWorker)
    monkeypatch.setattr(worker, "GpuWorker", NoForwardWorker)


def tune(tmp_path, trials=6, problems=(PROBLEM,), out=None) -> tuple[int, list]:
    winners: list = []
    rc = workflow.tune(list(problems), trials=trials, timeout_s=None, sampler="tpe", seed=0, storage=None,
                       runs_dir=tmp_path / "runs", out_dir=out or tmp_path / "generated", freeze=False, jobs=1,
                       log=lambda s: None, quiet=True, report=winners.extend, direction="bwd")
    return rc, winners


def test_a_backward_tune_has_its_own_study_worker_and_report(tmp_path, fake_gpu):
    import optuna

    rc, winners = tune(tmp_path)
    assert rc == 0 and len(winners) == 1 and len(FakeBwdWorker.made) == 1
    (w,) = winners
    assert w.variant.direction == w.result.direction == "bwd" and isinstance(w.variant.config, bwd.Config)
    assert w.result.kernel_ms == min(fake_bwd_time(v) for v in FakeBwdWorker.made[0].evaluated)
    assert w.result.torch_ms == 6.0 and w.machine["gpu"] == "Fake GPU"
    storage = st.default_storage(tmp_path / "runs")
    assert optuna.get_all_study_names(storage) == [st.study_name(PROBLEM, "bwd")]
    key = f"{PROBLEM.key}_bwd"
    assert (tmp_path / "runs" / key / "report.md").read_text().startswith(f"# {key}")
    from search import report

    assert report.report_from_storage(storage, key, tmp_path / "again",
                                      bench_results=tmp_path / "none.json").exists()  # tune.py report KEY_bwd
    with pytest.raises(report.ReportError, match="no study of"):
        report.report_from_storage(storage, PROBLEM.key, tmp_path / "again")  # no forward study of it


def test_a_frozen_backward_winner_seeds_and_joins_the_next_tune(tmp_path, fake_gpu):
    from dwgen.result import Result
    from dwgen.space import Variant, known_good

    # frozen before: a design that is not the fakes' best, nor a known-good one the search asks first anyway
    v = Variant(PROBLEM, bwd.Config(threads=128, outs=4), "bwd")
    assert v.config not in known_good(PROBLEM, "bwd")
    r = Result(v.name, v.digest, "ok", kernel_ms=fake_bwd_time(v), copy_ms=1.0, torch_ms=6.0, direction="bwd")
    out = tmp_path / "generated"
    freeze.freeze([freeze.Winner(v, r, FakeBwdWorker(PROBLEM).machine())], out, log=lambda s: None)
    assert workflow.frozen_variant(PROBLEM, out, "bwd") == v
    assert workflow.previous_config(PROBLEM, out, "bwd") == v.config
    assert workflow.frozen_variant(PROBLEM, out) is None and workflow.previous_config(PROBLEM, out) is None
    FakeBwdWorker.made = []
    rc, (w,) = tune(tmp_path, out=out)
    worker = FakeBwdWorker.made[0]
    assert rc == 0 and worker.evaluated[0] == v  # asked first, before the known-good designs
    assert v in worker.retimed[0] and w.variant != v  # re-timed beside the finalists, and beaten by the best


def test_a_design_frozen_for_a_nearby_problem_is_asked_after_the_own(tmp_path, fake_gpu):
    from dwgen.result import Result
    from dwgen.space import Variant, known_good

    nearby = Variant(Problem(8, 64, 2048), bwd.Config(threads=128, outs=4), "bwd")  # another length, same K
    assert nearby.config not in known_good(PROBLEM, "bwd")
    r = Result(nearby.name, nearby.digest, "ok", kernel_ms=1.0, copy_ms=1.0, torch_ms=6.0, direction="bwd")
    out = tmp_path / "generated"
    freeze.freeze([freeze.Winner(nearby, r, FakeBwdWorker(PROBLEM).machine())], out, log=lambda s: None)
    FakeBwdWorker.made = []
    rc, _ = tune(tmp_path, out=out)
    assert rc == 0 and FakeBwdWorker.made[0].evaluated[0] == Variant(PROBLEM, nearby.config, "bwd")


def test_a_strided_problem_is_refused_before_any_work(tmp_path, fake_gpu):
    with pytest.raises(workflow.UserError, match="the fused backward is stride 1 only"):
        tune(tmp_path, problems=(PROBLEM, Problem(4, 64, 1000, 3, 2, 1)))
    assert FakeBwdWorker.made == [] and not (tmp_path / "runs").exists()


def test_trials_is_what_the_study_holds_the_same_command_measures_what_is_left(tmp_path, fake_gpu):
    from dwgen.result import Result
    from dwgen.space import enumerate_space, trial_params

    rc, _ = tune(tmp_path, trials=6)
    assert rc == 0 and len(FakeBwdWorker.made[-1].evaluated) == 6
    rc, (w,) = tune(tmp_path, trials=6)  # run again (as after a time-out past the search): nothing to measure
    assert rc == 0 and FakeBwdWorker.made[-1].evaluated == [] and FakeBwdWorker.made[-1].retimed
    rc, _ = tune(tmp_path, trials=9)  # asked for more: the 3 it lacks
    assert rc == 0 and len(FakeBwdWorker.made[-1].evaluated) == 3
    # a variant measured before a template change (its digest no longer the one its config renders) is another
    # kernel: it does not count toward the trials
    study = st.open_study(PROBLEM, st.default_storage(tmp_path / "runs"), "tpe", 0, "bwd")
    v = next(v for v in enumerate_space(PROBLEM, "bwd") if v.digest not in {
        st.trial_result(t).digest for t in study.trials if st.trial_result(t)})
    study.enqueue_trial(trial_params(PROBLEM, v.config, "bwd"))
    trial = study.ask(st.distributions(PROBLEM, "bwd"))
    st.record(study, trial, Result(v.name, "0" * 64, "ok", kernel_ms=1.0, copy_ms=1.0, torch_ms=6.0, direction="bwd"))
    assert st.measured_as_rendered(study, PROBLEM) == 9 and len(st.measured(study, PROBLEM)) == 10
    rc, _ = tune(tmp_path, trials=10)
    assert rc == 0 and len(FakeBwdWorker.made[-1].evaluated) == 1


def test_a_frozen_channel_design_is_asked_beside_its_twin_across_the_rename_axis():
    from dataclasses import replace

    from dwgen.families import bcl, blc

    p = Problem(8, 1024, 4000, 9, padding=4, dtype="fp16", layout="blc")
    c = blc.Config(threads=128, vec=4, outs=4, steps=16, cthreads=32)
    assert workflow.seed_twins(p, c) == [replace(c, rename=True)]
    assert workflow.seed_twins(p, replace(c, rename=True)) == [c]
    assert workflow.seed_twins(PROBLEM, bcl.Config()) == []  # a family without twins
    wide = blc.Config(threads=128, vec=8, outs=8, steps=16, cthreads=16)  # K31: its window fits neither way
    assert workflow.seed_twins(Problem(2, 256, 4000, 31, padding=15, dtype="bf16", layout="blc"), wide) == []


def test_a_seeded_forward_tune_asks_the_frozen_design_then_its_twin(tmp_path, monkeypatch):
    from dataclasses import replace

    from dwgen.families import blc
    from dwgen.result import Result
    from dwgen.space import Variant

    p = Problem(8, 1024, 4000, 9, padding=4, dtype="fp16", layout="blc")
    v = Variant(p, blc.Config(threads=128, vec=4, outs=4, steps=16, cthreads=32))
    out = tmp_path / "generated"
    r = Result(v.name, v.digest, "ok", kernel_ms=1.0, copy_ms=1.0, torch_ms=6.0)
    freeze.freeze([freeze.Winner(v, r, FakeBwdWorker(p).machine())], out, log=lambda s: None)
    asked, logged = [], []
    monkeypatch.setattr(workflow, "gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs_dir, jobs, timeout_s=None: FakeBuilder())
    monkeypatch.setattr(workflow, "tune_problem", lambda problem, **kw: asked.append(kw["seeds"]))
    workflow.tune([p], trials=2, timeout_s=None, sampler="tpe", seed=0, storage=None, runs_dir=tmp_path / "runs",
                  out_dir=out, freeze=False, jobs=1, log=logged.append, quiet=True)
    (seeds,) = asked
    assert seeds[:2] == (v.config, replace(v.config, rename=True))
    assert any(f"{v.name}_rn" in line for line in logged)  # said before the search starts
