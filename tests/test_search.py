"""The search loop with a fake builder and evaluator: dedupe, resume, seeding, samplers, crashes."""
from __future__ import annotations

import json

import pytest

from dwgen.build import Build
from dwgen.families.bcl import Config
from dwgen.freeze import SCHEMA
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import enumerate_space, known_good
from search import loop
from search import study as st
from search.samplers import SAMPLERS

PROBLEM = Problem(8, 64, 2047)  # rows not whole vectors: the window family alone (fake times model its axes)


def fake_time(v) -> float:
    c = v.config
    return 1.0 + abs(c.threads - 256) / 1000 + (4 - c.vec) / 10 + (c.halo != "l1") / 20 + c.outs / 100


class FakeEvaluator:
    def __init__(self, wrong=(), crash_after=None):
        self.calls: list[str] = []
        self.wrong = set(wrong)
        self.crash_after = crash_after

    def evaluate(self, cand, base: Result) -> Result:
        if self.crash_after is not None and len(self.calls) >= self.crash_after:
            raise KeyboardInterrupt  # the whole tuning process dies mid-search
        self.calls.append(cand.variant.digest)
        if cand.variant.config.halo in self.wrong:
            return base.with_(status="wrong", message="mismatch")
        return base.with_(kernel_ms=fake_time(cand.variant), copy_ms=1.0, torch_ms=5.0, reps=20)

    def retime(self, cands, rounds):
        return {"copy_": 1.0, "torch": 5.0, **{c.variant.name: fake_time(c.variant) for c in cands}}


class FakeBuilder:
    def __init__(self, fail_halo=None):
        self.built: list[str] = []
        self.fail_halo = fail_halo

    def __call__(self, variants, on_done=None):
        out = []
        for v in variants:
            self.built.append(v.digest)
            if self.fail_halo is not None and getattr(v.config, "halo", None) == self.fail_halo:
                out.append(Build(v.name, "compile_error", log="ptxas error: too many resources", log_path="x.log"))
            else:
                out.append(Build(v.name, "ok", library=f"/nowhere/{v.name}.so", registers=32, spill_bytes=0))
            if on_done:
                on_done(out[-1])
        return out


def open_study(tmp_path, sampler="tpe", seed=0):
    return st.open_study(PROBLEM, st.default_storage(tmp_path), sampler, seed)


def run(tmp_path, trials, evaluator=None, builder=None, sampler="tpe", seed=0, seeds=()):
    evaluator = evaluator or FakeEvaluator()
    builder = builder or FakeBuilder()
    study = open_study(tmp_path, sampler, seed)
    known, stats = loop.search(PROBLEM, study, builder, evaluator, trials=trials, batch=4, seeds=seeds,
                               log=lambda s: None)
    return known, stats, evaluator, builder, study


def test_known_good_first_and_never_twice(tmp_path):
    known, stats, ev, b, _ = run(tmp_path, trials=20)
    assert stats.evaluated == 20 == len(ev.calls) == len(set(ev.calls)) == len(b.built)
    first = [known[d][0].config for d in ev.calls[: len(known_good(PROBLEM))]]
    assert first == known_good(PROBLEM)


def test_seeds_before_known_good(tmp_path):
    previous = Config(threads=512, vec=2, outs=1, halo="smem")
    known, _, ev, _, _ = run(tmp_path, trials=12, seeds=[previous, known_good(PROBLEM)[0]])
    first = [known[d][0].config for d in ev.calls[: 1 + len(known_good(PROBLEM))]]
    assert first == [previous, *known_good(PROBLEM)]  # a seed that is also known-good is tried once


def test_a_kept_study_asks_its_seeds_again_after_a_template_change_a_resume_does_not(tmp_path):
    from dwgen.space import Variant, trial_params

    previous = Config(threads=512, vec=2, outs=1, halo="smem")
    v = Variant(PROBLEM, previous)
    study = open_study(tmp_path)  # the seed measured once, as older templates rendered it (another digest)
    study.enqueue_trial(trial_params(PROBLEM, previous, "fwd"))
    st.record(study, study.ask(st.distributions(PROBLEM, "fwd")),
              Result(v.name, "0" * 64, "ok", kernel_ms=1.0, copy_ms=1.0, torch_ms=5.0))
    _, _, first, _, _ = run(tmp_path, trials=4, seeds=[previous])
    assert first.calls[0] == v.digest  # asked first again: its kernel is another one now
    _, _, again, _, _ = run(tmp_path, trials=4, seeds=[previous])  # a resume: nothing measured is asked again
    assert len(again.calls) == 4 and not set(again.calls) & set(first.calls)


def test_previous_config_survives_a_template_change(tmp_path):
    from search.workflow import previous_config

    def manifest(config):
        entry = {"key": PROBLEM.key, "config": config, "digest": "from-older-templates"}
        (tmp_path / "manifest.json").write_text(json.dumps({"schema": SCHEMA, "entries": [entry]}))

    assert previous_config(PROBLEM, tmp_path) is None  # nothing frozen yet
    manifest({"threads": 64, "vec": 4, "outs": 2, "halo": "l1"})
    assert previous_config(PROBLEM, tmp_path) == Config(threads=64, vec=4, outs=2, halo="l1")
    manifest({"threads": 64, "vec": 4, "outs": 2, "halo": "l1", "retired_axis": 1})
    assert previous_config(PROBLEM, tmp_path) is None
    manifest({"threads": 1024, "vec": 4, "outs": 4, "run": 4, "halo": "shfl"})  # not valid for this problem
    assert previous_config(PROBLEM, tmp_path) is None


def test_designs_frozen_for_nearby_problems_are_asked_after_the_own(tmp_path):
    from search.workflow import SIBLING_SEEDS, sibling_configs

    def entry(p, config, direction="fwd"):
        return {"key": p.key, "problem": p.to_dict(), "config": config, "digest": "any", "direction": direction}

    own = {"threads": 64, "vec": 4, "outs": 2, "halo": "l1"}
    same_k = {"threads": 128, "vec": 4, "outs": 2, "halo": "l1"}
    other_k = {"threads": 256, "vec": 4, "outs": 1, "halo": "l1"}
    entries = [entry(Problem(8, 64, 4096, 7, 1, 3), other_k),  # another kernel size: after the same one
               entry(PROBLEM, own),  # the problem's own design: previous_config's, not a sibling
               entry(Problem(2, 32, 512), same_k),
               entry(Problem(4, 64, 1024), same_k),  # the same design twice is asked once
               entry(Problem(2, 32, 512, dtype="bf16"), {"threads": 512, "vec": 8, "outs": 1, "halo": "l1"}),
               entry(Problem(4, 64, 1024), {"threads": 1024, "vec": 4, "outs": 4, "run": 4, "halo": "shfl"}),
               entry(Problem(2, 32, 512), {"threads": 128, "outs": 4}, "bwd")]
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": SCHEMA, "entries": entries}))
    assert SIBLING_SEEDS == 2
    assert sibling_configs(PROBLEM, tmp_path) == [Config(**same_k), Config(**other_k)]
    # a sibling's design that is the problem's own already leaves its place to the next one
    assert sibling_configs(PROBLEM, tmp_path, besides=[Config(**same_k)]) == [Config(**other_k)]
    # neither another dtype's design (a bf16 one) nor one invalid here (1024 threads) nor another direction's
    (tmp_path / "manifest.json").write_text(json.dumps({"schema": SCHEMA, "entries": entries[4:]}))
    assert sibling_configs(PROBLEM, tmp_path) == []


def test_resume_continues_without_repeating(tmp_path):
    run(tmp_path, trials=12)
    known, stats, ev, b, study = run(tmp_path, trials=12)
    assert len(ev.calls) == 12
    assert len(st.measured(study, PROBLEM)) == 24 == len(known)


def test_crash_mid_search_leaves_study_resumable(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, trials=30, evaluator=FakeEvaluator(crash_after=7))
    study = open_study(tmp_path)
    assert len(st.measured(study, PROBLEM)) == 7
    known, stats, ev, _, _ = run(tmp_path, trials=5)
    assert len(known) == 12 and not set(ev.calls) & set(list(known)[:7])


def test_same_seed_same_sequence(tmp_path):
    a = run(tmp_path / "a", trials=15, seed=3)[2].calls
    b = run(tmp_path / "b", trials=15, seed=3)[2].calls
    c = run(tmp_path / "c", trials=15, seed=4)[2].calls
    assert a == b
    assert a != c


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_every_sampler_finds_correct_variants(tmp_path, sampler):
    known, stats, ev, _, _ = run(tmp_path, trials=16, sampler=sampler)
    assert stats.evaluated == 16 and stats.correct == 16
    v, r, times = loop.decide(known, FakeBuilder(), ev)
    assert r.ok and r.kernel_ms == min(fake_time(v) for v, _ in known.values())


class ScaledRetime(FakeEvaluator):
    """Re-times one variant `factor` times its fake time (the others as they are)."""

    def __init__(self, name: str, factor: float):
        super().__init__()
        self.name, self.factor = name, factor

    def retime(self, cands, rounds):
        times = super().retime(cands, rounds)
        times[self.name] *= self.factor
        return times


@pytest.mark.parametrize("slower,kept", [(1.005, True), (1.0099, True), (1.02, False)])
def test_the_frozen_design_stays_unless_beaten_by_more_than_the_noise(tmp_path, slower, kept):
    known, _, _, _, _ = run(tmp_path, trials=16)
    best = min((v for v, _ in known.values()), key=fake_time)
    frozen = sorted((v for v, _ in known.values()), key=fake_time)[5]  # not a finalist: re-timed as the extra
    ev = ScaledRetime(frozen.name, fake_time(best) / fake_time(frozen) * slower)
    v, r, times = loop.decide(known, FakeBuilder(), ev, extra=[frozen], keep=frozen, keep_within=0.01)
    assert v.name == (frozen.name if kept else best.name)
    assert r.kernel_ms == times[v.name]
    # without `keep`, the fastest re-timing wins as before
    assert loop.decide(known, FakeBuilder(), ev, extra=[frozen])[0].name == best.name


def test_grid_sampler_stops_when_space_is_exhausted(tmp_path):
    p = Problem(1, 2, 63, 3, 2, 1)  # odd lengths: vec 1 only, few variants
    study = st.open_study(p, None, "grid", 0)
    ev = FakeEvaluator()
    known, stats = loop.search(p, study, FakeBuilder(), ev, trials=10_000, batch=8, log=lambda s: None)
    assert stats.evaluated == len(enumerate_space(p)) == len(set(ev.calls))


def test_failures_are_recorded_never_chosen(tmp_path):
    known, stats, ev, _, study = run(tmp_path, trials=30, evaluator=FakeEvaluator(wrong={"shfl"}),
                                     builder=FakeBuilder(fail_halo="smem"))
    statuses = {r.status for _, r in known.values()}
    assert statuses <= {"ok", "wrong", "compile_error"}
    assert stats.build_failed == sum(r.status == "compile_error" for _, r in known.values())
    assert all(v.config.halo not in ("shfl", "smem") for v, _ in loop.finalists(known))
    failed = [r for _, r in st.measured(study, PROBLEM).values() if not r.ok]
    assert failed and all(r.message for r in failed)


def test_invalid_is_penalised_but_a_batch_duplicate_is_not(tmp_path):
    from optuna.trial import TrialState

    _, _, _, _, study = run(tmp_path, trials=30)
    for t in study.get_trials(deepcopy=False):
        reasons = t.user_attrs.get(st.SKIP_ATTR)
        if reasons == ["duplicate_in_batch"]:
            assert t.state == TrialState.FAIL
        elif reasons:
            assert t.state == TrialState.COMPLETE and t.value == st.SKIP_PENALTY_MS


def test_check_each_gates_every_build():
    vs = [next(v for v in enumerate_space(PROBLEM) if v.config.halo == h) for h in ("l1", "smem", "shfl")]
    ev = FakeEvaluator(wrong={"shfl"})
    out = loop.check_each(ev, vs, FakeBuilder(fail_halo="smem")(vs))
    assert [r.status for r, _ in out] == ["ok", "compile_error", "wrong"]
    assert [c is not None for _, c in out] == [True, False, False]
    assert ev.calls == [vs[0].digest, vs[2].digest]  # a failed build is never evaluated


def test_progress_counts_evaluations_and_shows_the_best(tmp_path):
    import io

    from dwgen.progress import Progress

    out = io.StringIO()  # not a terminal: plain lines
    progress = Progress(12, "search", stream=out, every_s=3600, clock_fn=lambda: 0.0)
    known, stats = loop.search(PROBLEM, open_study(tmp_path), FakeBuilder(), FakeEvaluator(), trials=12, batch=4,
                               log=lambda s: None, progress=progress)
    best = min(r.kernel_ms for _, r in known.values() if r.ok)
    assert progress.done == stats.evaluated == 12
    # the fake evaluator's copy_ takes 1 ms and PyTorch 5 ms
    assert out.getvalue().splitlines() == [
        f"checking+timing: 12/12 variants, best {best:.4f} ms, {best:.2f}x copy, {5 / best:.2f}x PyTorch, 0:00 elapsed"]


# The backward: its own family's space, its own study, results that say they are backward ones.
BWD_PROBLEM = Problem(8, 64, 4096, 3, 1, 2)  # padding 2: neither causal nor centred, the fused family alone


def fake_bwd_time(v) -> float:
    return 2.0 + abs(v.config.threads - 256) / 1000 + abs(v.config.outs - 8) / 100


class FakeBwdEvaluator(FakeEvaluator):
    def evaluate(self, cand, base: Result) -> Result:
        assert cand.variant.direction == "bwd" and base.direction == "bwd"
        self.calls.append(cand.variant.digest)
        return base.with_(kernel_ms=fake_bwd_time(cand.variant), copy_ms=1.0, torch_ms=6.0, reps=20)

    def retime(self, cands, rounds):
        return {"copy_": 1.0, "torch": 6.0, **{c.variant.name: fake_bwd_time(c.variant) for c in cands}}


def test_study_names_carry_the_direction(tmp_path):
    # the forward's name is what it was before backward studies existed: stored forward studies resume
    assert st.study_name(BWD_PROBLEM) == st.study_name(BWD_PROBLEM, "fwd") == f"dwgen-{st.SPACE_TAG}-{BWD_PROBLEM.key}"
    assert st.study_name(BWD_PROBLEM, "bwd") == f"dwgen-{st.SPACE_TAG}-{BWD_PROBLEM.key}_bwd"
    storage = st.default_storage(tmp_path)
    fwd = st.open_study(BWD_PROBLEM, storage, "tpe", 0)
    bwd = st.open_study(BWD_PROBLEM, storage, "tpe", 0, "bwd")
    assert fwd.study_name != bwd.study_name
    assert (st.study_direction(fwd), st.study_direction(bwd)) == ("fwd", "bwd")
    again = st.open_study(BWD_PROBLEM, storage, "random", 1, "bwd")  # resumed: the direction is stored with it
    assert again.study_name == bwd.study_name and st.study_direction(again) == "bwd"
    with pytest.raises(ValueError, match="measures bwd variants, not fwd"):
        import optuna

        optuna.create_study(study_name=st.study_name(BWD_PROBLEM), storage=storage, load_if_exists=True) \
            .set_user_attr(st.DIRECTION_ATTR, "bwd")  # a forward study's name holding backward results
        st.open_study(BWD_PROBLEM, storage, "tpe", 0)


@pytest.mark.parametrize("sampler", sorted(SAMPLERS))
def test_a_backward_search_measures_the_backward_family(tmp_path, sampler):
    from dwgen.families import bwd

    storage = st.default_storage(tmp_path)
    study = st.open_study(BWD_PROBLEM, storage, sampler, 0, "bwd")
    ev = FakeBwdEvaluator()
    known, stats = loop.search(BWD_PROBLEM, study, FakeBuilder(), ev, trials=8, batch=4, log=lambda s: None)
    space = {v.digest: v for v in enumerate_space(BWD_PROBLEM, "bwd")}
    assert stats.evaluated == 8 == len(known) and set(known) <= set(space)
    assert all(v.direction == "bwd" and isinstance(v.config, bwd.Config) and r.direction == "bwd"
               for v, r in known.values())
    if sampler != "grid":  # the grid sampler walks the space in its own order
        first = [known[d][0].config for d in ev.calls[:len(known_good(BWD_PROBLEM, "bwd"))]]
        assert first == known_good(BWD_PROBLEM, "bwd")
    v, r, times = loop.decide(known, FakeBuilder(), ev)
    assert v.direction == r.direction == "bwd" and r.kernel_ms == min(fake_bwd_time(v) for v, _ in known.values())
    assert r.torch_ms == 6.0 and r.speedup == 6.0 / r.kernel_ms
    # read back from storage as backward variants, and the forward study of the same problem holds none
    assert set(st.measured(st.open_study(BWD_PROBLEM, storage, sampler, 0, "bwd"), BWD_PROBLEM)) == set(known)
    assert st.measured(st.open_study(BWD_PROBLEM, storage, sampler, 0), BWD_PROBLEM) == {}


def test_grid_sampler_walks_the_whole_backward_space():
    p = Problem(2, 8, 1002)  # rows not whole 16-byte vectors: the fused family alone
    study = st.open_study(p, None, "grid", 0, "bwd")
    ev = FakeBwdEvaluator()
    known, stats = loop.search(p, study, FakeBuilder(), ev, trials=10_000, batch=8, log=lambda s: None)
    # 3 designs, 2 stages, each walking 1, 2, 4 or 8 tiles where the batch's rows of a channel hold them, in
    # a row or across rows (20), and the raw stage's 128-thread ones again with a ceiling of 56 registers
    # (7): 27 in all
    assert stats.evaluated == len(enumerate_space(p, "bwd")) == len(set(ev.calls)) == 27


def test_results_of_the_other_direction_are_not_read_back():
    study = st.open_study(BWD_PROBLEM, None, "tpe", 0, "bwd")
    v = enumerate_space(BWD_PROBLEM, "bwd")[0]
    trial = study.ask(st.distributions(BWD_PROBLEM, "bwd"))
    st.record(study, trial, Result(v.name, v.digest, "ok", kernel_ms=1.0, direction="fwd"))  # mislabelled
    assert st.measured(study, BWD_PROBLEM) == {}
    trial = study.ask(st.distributions(BWD_PROBLEM, "bwd"))
    st.record(study, trial, Result(v.name, v.digest, "ok", kernel_ms=1.0, direction="bwd"))
    assert list(st.measured(study, BWD_PROBLEM)) == [v.digest]


def test_a_result_without_a_direction_reads_as_a_forward_one():
    r = Result("dw1d_f32_k3_t128_v4_o2_l1", "d" * 64, "ok", kernel_ms=1.0)
    stored = {k: v for k, v in r.to_dict().items() if k != "direction"}  # as written before the field existed
    assert Result.from_dict(stored).direction == "fwd" and Result.from_dict(r.to_dict()) == r
    with pytest.raises(ValueError, match="unknown direction"):
        Result("x", "d", "ok", direction="up")


def test_a_model_sampler_measures_a_small_space_whole_and_stops():
    # 1x768x512's backward: a few valid variants in a product of the axes hundreds of times larger. A run of
    # NEIGHBOUR_AFTER proposals the restrictions reject (or that repeat measured variants) is followed by the
    # nearest unmeasured valid one, and the search ends when none is left: before, the TPE sampler took 1757 asks
    # (2 minutes of storage and sampler updates) to find 9 of the 11 variants this problem had with the
    # walk and register axes of docs/proposed/bwdwalk-regs.diff
    p = Problem(1, 768, 512)
    space = enumerate_space(p, "bwd")
    study = st.open_study(p, None, "tpe", 0, "bwd")
    lines: list[str] = []
    known, stats = loop.search(p, study, FakeBuilder(), FakeBwdEvaluator(), trials=100, batch=8, log=lines.append)
    assert stats.evaluated == len(known) == len(space) and {v.digest for v in space} == set(known)
    assert stats.asked <= (loop.NEIGHBOUR_AFTER + 1) * len(space)
    assert f"every valid variant of the space is measured ({len(space)})" in lines
    # resumed, it has nothing left to ask
    _, again = loop.search(p, study, FakeBuilder(), FakeBwdEvaluator(), trials=100, batch=8, log=lambda s: None)
    assert again.asked == again.evaluated == 0


def test_a_rejected_proposal_is_followed_by_its_nearest_valid_variant(tmp_path):
    from search.neighbours import Neighbours

    p = Problem(4, 64, 1000)
    n = Neighbours(p, "bwd")
    space = enumerate_space(p, "bwd")
    assert len(n) == len(space)
    # 512 threads of 2 outputs make a tile of 1024 positions, longer than the row; 128 or 256 threads are one
    # axis off (the first in the space's order wins the tie)
    proposal = {"threads": 512, "outs": 2, "tc": 1, "stage": "raw", "tiles": 2}
    assert n.nearest(proposal, set()).name == "dw1d_bwd_f32_k3_t128_o2_raw_b2"
    taken = {v.digest for v in space if v.name != "dw1d_bwd_f32_k3_t128_o4"}
    assert n.nearest(proposal, taken).name == "dw1d_bwd_f32_k3_t128_o4" and not n.all_taken(taken)
    assert n.nearest(proposal, {v.digest for v in space}) is None and n.all_taken({v.digest for v in space})
