"""tune.py --stand-in: a stand-in's finalists weighed at other sizes of its signature (search/standin.py), on
fakes (no GPU)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from dwgen.problem import Problem
from search import loop, standin
from tests.test_search import FakeBuilder, fake_time, run

STAND_IN = Problem(4, 1536, 5000, kernel_size=4, stride=4, padding=0, dtype="fp16")


def test_other_sizes_are_other_shapes_of_the_same_signature():
    sizes = standin.other_sizes(STAND_IN)
    assert [(q.batch, q.channels, q.length) for q in sizes] == [(8, 1536, 3968), (16, 768, 2944), (2, 1536, 9984)]
    elements = STAND_IN.batch * STAND_IN.channels * STAND_IN.length
    for q in sizes:
        assert q.length % 64 == 0 and 0.95 <= q.batch * q.channels * q.length / elements <= 1.6
        assert (q.kernel_size, q.stride, q.padding, q.dilation, q.dtype, q.layout) == (4, 4, 0, 1, "fp16", "bcl")
    assert min(q.length for q in standin.other_sizes(Problem(1, 8, 70))) == 64  # never below one 64-element span
    # half of 1544 channels is 772, no multiple of a (B, L, C) kernel's 8-channel vector: 768
    assert standin.other_sizes(Problem(4, 1544, 5000, stride=2, layout="blc"))[1].channels == 768


@pytest.mark.parametrize("kw,lent", [({"stride": 2}, True), ({"dilation": 2, "padding": 2}, True),
                                     ({"kernel_size": 31, "padding": 15}, True), ({}, False),
                                     ({"kernel_size": 16, "padding": 8}, False)])
def test_only_signatures_past_the_fast_generic_kernels_stand_in(kw, lent):
    reason = standin.lent_reason(Problem(4, 64, 1000, **kw))
    assert (reason is None) == lent
    if not lent:
        assert "fast generic" in reason and "\n" not in reason


def test_the_geometric_mean_over_the_sizes_scores_a_finalist():
    here = {"a": 1.00, "b": 1.02, "c": 1.10}
    assert standin.combined(here, {}) == pytest.approx({"a": 1.0, "b": 1.02, "c": 1.10})
    s = standin.combined(here, {"a": [1.05, 1.0, 1.0], "b": [1.0, 1.0, 1.0]})  # c not lendable
    assert s == pytest.approx({"a": 1.05 ** 0.25, "b": 1.02 ** 0.25, "c": math.inf})
    # one size against many: the fifty-first session's fp16 K4 stride 4 stand-in, roughly (x: 4% ahead at one
    # other size, 2-5% behind at the others, tied at the stand-in's own)
    s = standin.combined({"v4": 1.0, "x": 1.003}, {"v4": [1.04, 1.0, 1.0], "x": [1.0, 1.023, 1.052]})
    assert min(s, key=s.get) == "v4"
    # a failed check elsewhere rules a finalist out, even when no other was timed there
    assert standin.combined(here, {"a": [math.inf]}) == pytest.approx({"a": math.inf, "b": 1.0, "c": 1.10 / 1.02})
    # a finalist that cannot win (fixed sizes, or failed elsewhere) does not move the others' scores
    three = {"lane": 1.00, "a": 1.05, "b": 1.06}
    for h in (three, {k: t for k, t in three.items() if k != "lane"}):
        s = standin.combined(h, {"a": [1.04], "b": [1.0]})
        assert min(s, key=s.get) == "b" and s["b"] == pytest.approx((1.06 / 1.05) ** 0.5)


def _finalists(tmp_path):
    known, _, ev, _, _ = run(tmp_path, trials=16)
    top = [v for v, _ in loop.finalists(known)]
    return known, ev, top


def test_decide_picks_the_finalist_with_the_best_mean_over_the_sizes(tmp_path):
    known, ev, top = _finalists(tmp_path)
    best, second = top[0], top[1]
    # the own size's fastest is 5% behind at both other sizes: the runner-up (close here, fastest there) wins
    seen = []

    def elsewhere(cands, rounds):
        assert rounds == loop.RETIME_ROUNDS
        seen.extend(c.variant.name for c in cands)
        return {best.name: [1.05, 1.05], second.name: [1.0, 1.0]}

    v, r, times = loop.decide(known, FakeBuilder(), ev, elsewhere=elsewhere)
    assert fake_time(second) / fake_time(best) < 1.05  # the premise: within 5% here
    assert v.name == second.name and r.kernel_ms == times[second.name]  # the record keeps the stand-in's own time
    assert sorted(seen) == sorted(x.name for x in top)
    # a finalist the other sizes have no time for cannot win while another has times there
    v, _, _ = loop.decide(known, FakeBuilder(), ev, elsewhere=lambda cands, rounds: {top[3].name: [1.0]})
    assert v.name == top[3].name
    # none timed there: the stand-in's own times decide, as without other sizes
    assert loop.decide(known, FakeBuilder(), ev, elsewhere=lambda cands, rounds: {})[0].name == best.name
    # every finalist wrong somewhere: no winner, rather than one that would be lent to sizes it gets wrong
    assert loop.decide(known, FakeBuilder(), ev,
                       elsewhere=lambda cands, rounds: {c.variant.name: [math.inf] for c in cands}) is None


@pytest.mark.parametrize("behind,kept", [(1.005, True), (1.03, False)])
def test_the_frozen_design_stays_unless_beaten_on_the_mean_by_more_than_the_noise(tmp_path, behind, kept):
    known, ev, top = _finalists(tmp_path)
    frozen, rival = top[0], top[1]  # frozen fastest here, slower at the other size
    here = fake_time(rival) / fake_time(frozen)
    there = {frozen.name: [here * behind ** 2], rival.name: [1.0]}  # its mean: the rival's times behind
    v, _, _ = loop.decide(known, FakeBuilder(), ev, keep=frozen, keep_within=0.01,
                          elsewhere=lambda cands, rounds: there)
    assert v.name == (frozen.name if kept else rival.name)


class FakeWorker:
    """GpuWorker's check, retime and switch, with outcomes by name."""

    def __init__(self, home, wrong=(), times=None, fail_retime=False, no_start_at=None):
        self.problem, self.wrong, self.times, self.fail_retime = home, set(wrong), times or {}, fail_retime
        self.no_start_at = no_start_at
        self.switched, self.checked, self.retimed = [], [], []

    def switch(self, p):
        self.switched.append(p)
        self.problem = p

    def check(self, cand, base, edges=True):
        assert not edges  # edges were checked on the stand-in's own build
        if self.problem == self.no_start_at:
            raise RuntimeError("GPU worker failed to start: CUDA out of memory")
        self.checked.append((cand.variant.name, self.problem))
        if (cand.variant.name, self.problem) in self.wrong:
            return base.with_(status="wrong", message="mismatch at (0, 3, 17)")
        return base

    def retime(self, cands, rounds):
        from dwgen.worker import WorkerDied

        if self.fail_retime:
            raise WorkerDied("worker timed out", "timeout")
        self.retimed.append(([c.variant.name for c in cands], self.problem, rounds))
        # copy_ faster than any kernel, as on a GPU: a normalisation that took it in would show
        return {"copy_": 0.05, "torch": 5.0, **{c.variant.name: self.times[c.variant.name] for c in cands}}


def cand(name, lendable=True):
    v = SimpleNamespace(name=name, digest=name, direction="fwd", family=SimpleNamespace(sizes_at_run_time=lendable))
    return SimpleNamespace(variant=v, library=f"/nowhere/{name}.so")


def test_every_check_comes_before_any_timing_and_fixed_size_kernels_are_left_out():
    sizes = standin.other_sizes(STAND_IN)
    w = FakeWorker(STAND_IN, wrong={("bad", sizes[1])}, times={"a": 0.50, "b": 0.55, "bad": 0.1})
    lines = []
    weigh = standin.OtherSizes(STAND_IN, w, lines.append)
    rel = weigh([cand("a"), cand("b"), cand("bad"), cand("lane", False)], 7)
    assert rel == pytest.approx({"a": [1.0] * 3, "b": [1.1] * 3, "bad": [math.inf]}) and weigh.relative == rel
    # checked at each size, "bad" no more after it failed at the second; then timed: only what passed everywhere
    assert w.checked == [(n, sizes[0]) for n in ("a", "b", "bad")] + [(n, sizes[1]) for n in ("a", "b", "bad")] \
        + [(n, sizes[2]) for n in ("a", "b")]
    assert w.retimed == [(["a", "b"], q, 7) for q in sizes]  # as many rounds as at the stand-in's size
    assert w.switched == [*sizes, *sizes, STAND_IN] and w.problem == STAND_IN
    assert any("bad wrong at 16x768x2944" in s for s in lines)
    # the evidence the manifest records: each size's own re-timing, none for a finalist not timed everywhere
    assert weigh.evidence("a", 1.0) == {"score": 1.0, "sizes": {
        standin.shape_text(q): {"kernel_ms": 0.50, "copy_ms": 0.05, "x_copy": pytest.approx(10.0)} for q in sizes}}
    assert weigh.evidence("bad", 1.0) is None and weigh.evidence("lane", 1.0) is None


def test_when_every_finalist_fails_somewhere_none_is_timed_and_nothing_is_recorded():
    sizes = standin.other_sizes(STAND_IN)
    w = FakeWorker(STAND_IN, wrong={("a", sizes[0]), ("b", sizes[2])}, times={"a": 0.5, "b": 0.6})
    weigh = standin.OtherSizes(STAND_IN, w, lambda s: None)
    assert weigh([cand("a"), cand("b")], 7) == {"a": [math.inf], "b": [math.inf]}
    assert w.retimed == [] and weigh.times == {} and not weigh.timed and weigh.evidence("b", 1.0) is None


@pytest.mark.parametrize("how", ["retime", "start"])
def test_a_worker_that_dies_weighing_gives_no_winner_and_ends_no_tune(tmp_path, how):
    """Not even the fixed-size finalist, which would win on its own size alone: a one-off failure must not take
    the signature's lent kernel away."""
    w = FakeWorker(STAND_IN, times={"a": 0.5}, fail_retime=how == "retime",
                   no_start_at=standin.other_sizes(STAND_IN)[1] if how == "start" else None)
    lines = []
    weigh = standin.OtherSizes(STAND_IN, w, lines.append)
    assert weigh([cand("a"), cand("lane", False)], 7) == {"a": [math.inf], "lane": [math.inf]}
    assert weigh.died and not weigh.timed and w.problem == STAND_IN and "died" in lines[-1]
    assert weigh.times == {} and weigh.evidence("a", 1.0) is None
    known, ev, top = _finalists(tmp_path)
    assert loop.decide(known, FakeBuilder(), ev,
                       elsewhere=lambda cands, rounds: {c.variant.name: [math.inf] for c in cands}) is None
    lines = []
    w = FakeWorker(STAND_IN)
    assert standin.OtherSizes(STAND_IN, w, lines.append)([cand("lane", False)], 7) == {}
    assert w.switched == [] and "decides alone" in lines[0]


def test_a_stand_in_whose_other_sizes_have_no_output_is_refused():
    reason = standin.lent_reason(Problem(1, 8, 130, kernel_size=31, padding=0, dilation=4))
    assert reason.startswith("--stand-in: one of the sizes its finalists are weighed at is no problem: no output")
    assert "\n" not in reason


def test_tune_refuses_a_stand_in_that_nothing_is_lent_from(tmp_path, capsys):
    from search import cli

    rc = cli.main(["--shape", "4x64x1000", "--kernel-size", "3", "--stand-in", "--runs-dir", str(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.count("\n") == 0 and "--stand-in" in err and "fast generic" in err



def _time(variant, problem) -> float:
    """A fake time a variant takes: its own per design, in the reverse order at any size but the stand-in's."""
    t = 1.0 + int(variant.digest[:6], 16) % 997 / 1e4
    return t if problem == STRIDED else 2.2 - t


STRIDED = Problem(4, 64, 1024, kernel_size=3, stride=2, padding=1)


def _copy(problem) -> float:
    """copy_'s fake time: its own at each size, so that a figure taken at the wrong size shows."""
    return problem.batch * problem.channels * problem.length / 2**18


class FakeFwdWorker(FakeWorker):
    """What tune_problem asks of GpuWorker, with _time's sizes."""

    made: list = []

    def __init__(self, problem, timeout_s=None):
        super().__init__(problem)
        self.restarts = 0
        FakeFwdWorker.made.append(self)

    def machine(self) -> dict:
        return {"gpu": "Fake GPU", "capability": "9.0", "driver": "0", "torch": "0", "cuda": "0", "date": "today"}

    def baselines(self) -> dict:
        return {"copy_ms": 1.0, "torch_ms": 6.0}

    def evaluate(self, cand, base):
        return base.with_(kernel_ms=_time(cand.variant, self.problem), copy_ms=1.0, torch_ms=6.0, reps=20)

    def check(self, cand, base, edges=True):
        self.checked.append((cand.variant.name, self.problem))
        return base

    def retime(self, cands, rounds):
        self.retimed.append(({c.variant.name: _time(c.variant, self.problem) for c in cands}, self.problem))
        return {"copy_": _copy(self.problem), "torch": 6.0, **self.retimed[-1][0]}

    def close(self) -> None:
        pass


@pytest.mark.parametrize("stand_in", [False, True])
def test_a_stand_in_tune_weighs_its_finalists_at_the_other_sizes(tmp_path, monkeypatch, stand_in):
    from dwgen import worker
    from search import workflow

    FakeFwdWorker.made = []
    monkeypatch.setattr(workflow, "gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs_dir, jobs, timeout_s=None: FakeBuilder())
    monkeypatch.setattr(worker, "GpuWorker", FakeFwdWorker)
    winners: list = []
    lines: list[str] = []
    rc = workflow.tune([STRIDED], trials=10, timeout_s=None, sampler="tpe", seed=0, storage=None,
                       runs_dir=tmp_path / "runs", out_dir=tmp_path / "generated", freeze=False, jobs=1,
                       log=lines.append, quiet=True, report=winners.extend, stand_in=stand_in)
    (w,) = winners
    (fw,) = FakeFwdWorker.made
    here = fw.retimed[0][0]
    assert rc == 0 and fw.retimed[0][1] == STRIDED and w.result.kernel_ms == here[w.variant.name]
    if not stand_in:
        assert len(fw.retimed) == 1 and w.variant.name == min(here, key=here.get) and w.stand_in is None
        assert lines[-2].endswith("vs torch")  # the winners' table as before
        return
    sizes = standin.other_sizes(STRIDED)
    assert [q for _, q in fw.retimed[1:]] == sizes and fw.problem == STRIDED  # switched back after
    for there, q in fw.retimed[1:]:
        assert {n for n, c in fw.checked if c == q} >= set(there)  # every one timed there was checked there
    rel = {k: [t[k] / min(t.values()) for t, _ in fw.retimed[1:]] for k in fw.retimed[1][0]}
    score = standin.combined(here, rel)
    assert w.variant.name == min(score, key=score.get) != min(here, key=here.get)
    # what the manifest will record of it: its score, and its time and x copy at each other size
    assert w.stand_in["score"] == score[w.variant.name]
    assert list(w.stand_in["sizes"]) == [standin.shape_text(q) for q in sizes]
    for (there, q), t in zip(fw.retimed[1:], w.stand_in["sizes"].values(), strict=True):
        ms = there[w.variant.name]
        assert t == {"kernel_ms": ms, "copy_ms": _copy(q), "x_copy": ms / _copy(q)}
    assert any(s.startswith("stand-in: each finalist's time over the fastest's") and w.variant.name in s
               for s in lines)
    head, row = lines[-2:]  # the winners' table: x copy at the other sizes, least to most
    xs = [t["x_copy"] for t in w.stand_in["sizes"].values()]
    assert head.endswith("other sizes") and row.split()[-1] == f"{min(xs):.3f}-{max(xs):.3f}"


def test_the_search_loop_imports_no_torch():
    """standin's rule comes from the frozen dispatcher, which imports torch: only when a stand-in is checked."""
    import subprocess
    import sys

    code = "import sys, search.loop, search.workflow; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=standin.__file__.rsplit("/search/", 1)[0]).returncode == 0


def _entry(p: Problem, kernel: str, direction: str = "fwd") -> dict:
    return {"key": p.key, "kernel": kernel, "direction": direction, "problem": p.to_dict(),
            "machine": {"capability": "9.0"}}


def _lent_by_dispatcher(entries: list[dict], kernels: list[dict]) -> dict:
    """What the frozen dispatcher's own rule lends each signature (frozen_dispatch._lent_tables)."""
    from dwgen import frozen_dispatch as fd

    t = fd.Tables(kernels={k["name"]: (i, k) for i, k in enumerate(kernels)})
    for e in entries:
        (t.tuned if e["direction"] == "fwd" else t.tuned_bwd)[fd._entry_key(e["problem"])] = e["kernel"]
    fd._lent_tables(t)
    return t.lent


def test_the_stand_in_is_outranked_exactly_where_the_dispatcher_lends_another_kernel():
    """generated/ lends the kernel of the largest tuned problem of a signature whose launch takes sizes at run
    time (the first by key on a tie): a stand-in tune of another one is then no test of what untuned sizes run."""
    kernels = [{"name": n, "sizes_at_run_time": n != "fixed"} for n in ("a", "b", "c", "d", "e", "fixed")]
    s2 = dict(kernel_size=3, stride=2)
    bigger, tie_first = Problem(8, 64, 4096, **s2), Problem(4, 64, 1024, padding=0, **s2)
    entries = [_entry(Problem(8, 64, 1024, padding=1, **s2), "a"), _entry(bigger, "b"),
               _entry(Problem(16, 32, 4096, **s2), "c"),  # as large as `bigger`, after it by key
               _entry(Problem(64, 64, 4096, **s2), "fixed"),  # larger, but not lent
               _entry(Problem(64, 64, 4096, kernel_size=5, stride=2), "d")]  # another signature
    cases = [(STRIDED, entries, bigger.key), (bigger, entries, None),
             (Problem(16, 32, 4096, **s2), entries, bigger.key),
             (STRIDED, entries[2:], Problem(16, 32, 4096, **s2).key),
             (STRIDED, [_entry(tie_first, "e")], tie_first.key),
             (STRIDED, [_entry(Problem(64, 64, 4096, **s2), "fixed")], None),
             (STRIDED, [_entry(bigger, "b", direction="bwd")], None)]
    for p, es, want in cases:
        assert standin.outranked_by(p, es, kernels) == want, (p.key, want)
        lent = _lent_by_dispatcher([*es, _entry(p, "mine")], [*kernels, {"name": "mine", "sizes_at_run_time": True}])
        signature = next(iter(k for k in lent if k[:3] == (p.kernel_size, p.stride, p.dilation)), None)
        named = {e["key"]: e["kernel"] for e in es}
        assert lent[signature] == (named[want] if want else "mine"), (p.key, lent)
    assert standin.outranked_by(STRIDED, [{"key": "x", "kernel": "b"}, {"problem": {}}], kernels) is None  # malformed


def test_the_tune_says_when_a_larger_tuned_problem_is_lent_instead(tmp_path, monkeypatch):
    from dwgen import freeze as frz
    from search import workflow

    bigger = Problem(8, 64, 4096, kernel_size=3, stride=2)
    manifest = {"schema": frz.SCHEMA, "entries": [_entry(bigger, "b")],
                "kernels": [{"name": "b", "sizes_at_run_time": True}]}
    monkeypatch.setattr(frz, "read_manifest", lambda out_dir: manifest)
    lines: list[str] = []
    workflow._warn_outranked([STRIDED], tmp_path, "fwd", lines.append)
    (line,) = lines
    assert line.startswith("stand-in:") and bigger.key in line and STRIDED.key in line
    lines.clear()
    workflow._warn_outranked([bigger], tmp_path, "fwd", lines.append)
    assert lines == []
