"""search.generic's candidate designs: each one a valid, distinct kernel for every generic (dtype, layout, K)."""
import json
import types

import pytest

from dwgen.dtypes import DTYPES
from dwgen.problem import LAYOUTS
from dwgen.space import GENERIC_KERNEL_SIZES
from search.generic import candidate_variants, candidates


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_candidates_are_valid_and_distinct(dtype, layout):
    for k in GENERIC_KERNEL_SIZES:
        names = [v.name for v in candidate_variants(k, dtype, layout)]
        assert len(names) >= 3, f"{dtype} {layout} K{k}: only {names}"
        assert len(set(names)) == len(names), names


def test_16bit_row_candidates_include_the_tensor_core_family_at_every_k():
    for dtype in ("bf16", "fp16"):
        for k in GENERIC_KERNEL_SIZES:
            assert sum(v.family.name == "dw1d_tc" for v in candidate_variants(k, dtype, "bcl")) == 3, (dtype, k)
    assert not any(v.family.name == "dw1d_tc" for v in candidate_variants(15, "fp32", "bcl"))


def test_16bit_row_candidates_include_the_register_cap():
    # bf16 K7's tuned winner was the capped design; the generic choice must be able to find it too.
    for dtype in ("bf16", "fp16"):
        assert any(getattr(c, "cap", False) for c in candidates(dtype, "bcl"))
    assert not any(getattr(c, "cap", False) for c in candidates("fp32", "bcl"))


def test_a_kept_measurement_is_reused_and_a_changed_candidate_list_is_not(tmp_path, monkeypatch):
    from search import generic

    calls = []

    def fake_choose(k, dtype, layout, build, log=print, direction="fwd", worker=None):
        calls.append((k, dtype, layout))
        return {"kernel": f"k{k}", "config": {}, "geomean_x_copy": 1.0}

    monkeypatch.setattr(generic, "choose", fake_choose)
    first = generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    again = generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    assert first == again and len(calls) == 1
    assert not list(tmp_path.rglob("*.tmp"))
    real = generic.candidates
    monkeypatch.setattr(generic, "candidates", lambda d, lay, direction="fwd": real(d, lay, direction)[:-1])
    generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    assert len(calls) == 2  # other candidates: measured anew, not read from the old record


def test_a_measurement_made_on_another_gpu_is_measured_again(tmp_path, monkeypatch):
    from search import generic

    calls, lines = [], []

    def fake_choose(k, dtype, layout, build, log=print, direction="fwd", worker=None):
        calls.append(k)
        return {"kernel": f"k{k}", "config": {}, "geomean_x_copy": 1.0, "machine": {"gpu": "NVIDIA H200"}}

    monkeypatch.setattr(generic, "choose", fake_choose)
    path = generic.record_path(tmp_path, 3, "bf16", "bcl")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kernel": "old", "config": {}, "machine": {"gpu": "NVIDIA H100 80GB HBM3"}}))
    monkeypatch.setattr(generic, "this_gpu", lambda: "NVIDIA H100 80GB HBM3")
    assert generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lines.append)["kernel"] == "old"
    monkeypatch.setattr(generic, "this_gpu", lambda: None)  # no GPU to ask (a dry run): kept as it is
    assert generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lines.append)["kernel"] == "old"
    assert calls == []
    monkeypatch.setattr(generic, "this_gpu", lambda: "NVIDIA H200")
    assert generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lines.append)["kernel"] == "k3"
    assert calls == [3] and any("made on NVIDIA H100 80GB HBM3; this GPU is NVIDIA H200" in s for s in lines)
    assert json.loads(path.read_text())["machine"]["gpu"] == "NVIDIA H200"  # the new one kept in its place


@pytest.mark.parametrize("once", [False, True])
def test_choices_freeze_after_each_dtype_and_layout_or_once(monkeypatch, tmp_path, capsys, once):
    from dwgen import freeze
    from search import generic, workflow

    frozen = []
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs, jobs: None)
    monkeypatch.setattr(generic, "choose_or_reuse", lambda k, d, lay, build, runs, direction="fwd", worker=None: {
        "kernel": f"{d}_{lay}_k{k}", "geomean_x_copy": 1.0})
    monkeypatch.setattr(workflow, "freeze_gated", lambda winners, out, generic: frozen.append(sorted(generic)))
    monkeypatch.setattr(freeze, "DEFAULT_DIR", tmp_path)
    argv = ["--kernel-sizes", "3,5", "--dtypes", "fp16,bf16", "--layouts", "bcl"] + (["--freeze-once"] if once else [])
    assert generic.main(argv) == 0
    keys = sorted(f"{d}_bcl_k{k}" for d in ("fp16", "bf16") for k in (3, 5))
    # each freeze holds every choice made so far; the last holds them all
    assert frozen[-1] == keys and len(frozen) == (1 if once else 2)
    assert "froze 4 generic choices" in capsys.readouterr().out


def test_a_tensor_core_design_must_win_by_the_margin():
    from search.generic import TC_MARGIN, pick

    tc_names = {"tc_a", "tc_b"}
    close = {"tc_a": 1.094, "tc_b": 1.11, "row": 1.103}  # bf16 K3's measurement: a 1% win
    assert pick(close, tc_names) == "row"
    clear = {"tc_a": 1.095, "row": 1.162, "other": 1.2}  # fp16 K9's: 6%
    assert pick(clear, tc_names) == "tc_a"
    assert pick({"tc_a": 1.0, "row": 1.0 / (1 - TC_MARGIN) + 1e-9}, tc_names) == "tc_a"
    assert pick({"tc_a": 1.0, "row": 0.99}, tc_names) == "row"  # a CUDA-core design that wins outright
    assert pick({"tc_a": 1.3, "tc_b": 1.2}, tc_names) == "tc_b"  # no CUDA-core design passed its check


def test_a_kept_measurement_is_decided_again_by_todays_rule(tmp_path):
    from search import generic

    names = {v.name: v for v in generic.candidate_variants(3, "bf16", "bcl")}
    tc_name = next(n for n, v in names.items() if v.family.name == "dw1d_tc")
    row_name = next(n for n, v in names.items() if v.family.name != "dw1d_tc")
    shapes = [p.key for p in generic.training_problems(3, "bf16", "bcl")]
    scores = {tc_name: dict.fromkeys(shapes, 1.10), row_name: dict.fromkeys(shapes, 1.11)}
    path = generic.record_path(tmp_path, 3, "bf16", "bcl")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"kernel": tc_name, "config": names[tc_name].config_dict, "machine": {},
                                "candidates": scores}))
    rec = generic.choose_or_reuse(3, "bf16", "bcl", None, tmp_path, log=lambda *_: None)
    assert rec["kernel"] == row_name and rec["config"] == names[row_name].config_dict
    anyshape = {p.key for p in generic.scope_problems(3, "bf16", "bcl")["any"]}  # what the design for every call weighs
    assert rec["x_copy"] == {key: x for key, x in scores[row_name].items() if key in anyshape}
    assert rec["candidates"] == scores


def _scores(k: int, dtype: str, x_copy: dict[str, float]) -> tuple[dict, dict]:
    """Each candidate's x copy on each training shape its scope takes (as choose measures them): a family's
    candidates at x_copy[family], the next one of the family 0.1 more; and the candidates by family."""
    from search import generic

    shapes = generic.scope_problems(k, dtype, "bcl", "bwd")
    by_family: dict[str, list[str]] = {}
    for v in generic.candidate_variants(k, dtype, "bcl", "bwd"):
        by_family.setdefault(v.family.name, []).append(v.name)
    scores = {}
    for family, names in by_family.items():
        for i, n in enumerate(sorted(names)):
            served = {p.key for ps in shapes.values() for p in ps
                      if generic.scope_admits({"dw1d_bwd": "any", "dw1d_bwdtc": "within_halo",
                                               "dw1d_bwdlane": "causal_or_centred"}[family], p)}
            scores[n] = dict.fromkeys(sorted(served), x_copy[family] + 0.1 * i)
    return scores, {f: sorted(ns) for f, ns in by_family.items()}


@pytest.mark.parametrize("k, fused, lane, split, narrow", [
    (15, 3.4, None, 2.0, ["dw1d_bwdtc"]),  # the split backward by more than the margin
    (15, 3.4, None, 3.3, []),  # by less
    (7, 2.5, 1.6, None, ["dw1d_bwdlane"]),  # the lane backward on the causal and centred shapes
    (7, 1.5, 1.6, None, []),
    (9, 2.6, 1.7, None, ["dw1d_bwdlane"]),  # K9: a halo of 8 within the lane runs; no split design below K10
])
def test_narrower_designs_that_win_on_their_scopes_shapes_are_chosen_beside_the_best_fused_one(k, fused, lane, split,
                                                                                                   narrow):
    """16-bit (B, C, L) backward: the fused designs take every call, the lane ones causal and centred calls (measured
    on those shapes only), the split ones calls within the halo without SiLU. The record's kernel is the best fused
    design whatever the others read; narrow lists, narrowest scope first, each scope's best where it is not fused."""
    from search import generic

    scores, names = _scores(k, "fp16", {"dw1d_bwd": fused, "dw1d_bwdlane": lane, "dw1d_bwdtc": split})
    variants = {v.name: v for v in generic.candidate_variants(k, "fp16", "bcl", "bwd")}
    rec = generic.decide(k, "fp16", "bcl", scores, {}, log=lambda *_: None, direction="bwd")
    assert rec["kernel"] == names["dw1d_bwd"][0] and rec["config"] == variants[rec["kernel"]].config_dict
    assert rec["geomean_x_copy"] == pytest.approx(fused) and rec["candidates"] == scores
    assert sorted(rec["x_copy"]) == sorted(p.key for p in generic.scope_problems(k, "fp16", "bcl", "bwd")["any"])
    got = rec.get("narrow", [])
    assert [n["kernel"] for n in got] == [names[f][0] for f in narrow]
    assert [n["scope"] for n in got] == [variants[n["kernel"]].family.generic_scope for n in got]
    assert all(n["config"] == variants[n["kernel"]].config_dict for n in got)


@pytest.mark.parametrize("fused, split, chosen", [
    ((2.0, 3.0), (2.6, 1.5), False),  # far ahead on the causal and centred shapes, behind on the others
    ((3.0, 1.5), (2.0, 2.5), False),  # the other way round
    ((3.0, 3.0), (2.0, 2.0), True),
    ((2.49, 2.11), (2.19, 2.07), True),  # bf16 K12 on an H100: 12% ahead on one pair, 2% on the other, 7% in all
    ((2.49, 2.11), (2.44, 2.07), False),  # ahead on each pair, within the tensor-core margin in all
    ((2.49, 2.07), (2.19, 2.08), False),  # far ahead on one pair, behind on the other
])
def test_a_narrow_design_must_win_on_every_group_of_shapes_it_would_serve(fused, split, chosen):
    """The split backward serves the causal and centred calls as well as the other calls within the halo: a
    geometric mean over all four shapes would hide a loss on two of them, so it must not be slower on either
    pair, and, a tensor-core design, beat the fused one by the margin over the four together."""
    from search import generic

    shapes = generic.scope_problems(15, "fp16", "bcl", "bwd")
    names = {v.name: v for v in generic.candidate_variants(15, "fp16", "bcl", "bwd")}

    def reads(n, pair):
        return {**dict.fromkeys((p.key for p in shapes["any"]), pair[0]),
                **dict.fromkeys((p.key for p in shapes["causal_or_centred"]), pair[1])}

    scores = {n: reads(n, fused if v.family.name == "dw1d_bwd" else split) for n, v in names.items()}
    rec = generic.decide(15, "fp16", "bcl", scores, {}, log=lambda *_: None, direction="bwd")
    assert ("narrow" in rec) is chosen
    if chosen:
        assert names[rec["narrow"][0]["kernel"]].family.name == "dw1d_bwdtc"
        assert sorted(rec["narrow"][0]["x_copy"]) == sorted(p.key for p in shapes["any"] + shapes["causal_or_centred"])


def test_at_odd_k_the_lane_design_must_also_win_on_the_centred_shape_every_design_is_measured_on():
    """fp16 K7: the first training shape (8x1024x4000, padded 3 a side) is centred on rows of whole vectors, so the
    lane designs are measured and will serve there too: a loss there keeps them out, however they read on their
    own pair."""
    from search import generic

    shapes = generic.scope_problems(7, "fp16", "bcl", "bwd")
    names = {v.name: v for v in generic.candidate_variants(7, "fp16", "bcl", "bwd")}
    first = shapes["any"][0].key
    scores = {}
    for n, v in names.items():
        if v.family.name == "dw1d_bwd":
            scores[n] = {p.key: 2.0 for p in shapes["any"] + shapes["causal_or_centred"]}
        else:
            scores[n] = {first: 3.0} | {p.key: 1.5 for p in shapes["causal_or_centred"]}
    rec = generic.decide(7, "fp16", "bcl", scores, {}, log=lambda *_: None, direction="bwd")
    assert "narrow" not in rec
    scores = {n: xs | ({first: 1.9} if names[n].family.name == "dw1d_bwdlane" else {}) for n, xs in scores.items()}
    rec = generic.decide(7, "fp16", "bcl", scores, {}, log=lambda *_: None, direction="bwd")
    assert names[rec["narrow"][0]["kernel"]].family.name == "dw1d_bwdlane" and first in rec["narrow"][0]["x_copy"]


def test_a_measurement_where_no_design_takes_the_whole_signature_passed_is_refused():
    from search import generic

    names = {v.name: v for v in generic.candidate_variants(15, "fp16", "bcl", "bwd")}
    shapes = [p.key for p in generic.training_problems(15, "fp16", "bcl")]
    scores = {n: dict.fromkeys(shapes, 2.0) for n, v in names.items() if v.family.name == "dw1d_bwdtc"}
    assert scores
    with pytest.raises(RuntimeError, match="fp16_bcl_k15_bwd"):
        generic.decide(15, "fp16", "bcl", scores, {}, log=lambda *_: None, direction="bwd")


def fake_worker(ratio: dict[str, float], fails=lambda p, name: False) -> type:
    """A worker whose re-timing reads each candidate at ratio[name] times a copy_ of 2.0, and whose check fails
    where fails(problem, name); it records each instance and each check (problem key, name, edges asked)."""
    from dwgen.result import Result

    class FakeWorker:
        made: list = []
        checked: list = []

        def __init__(self, p):
            self.p = p
            FakeWorker.made.append(self)

        def switch(self, p):
            self.p = p

        def machine(self):
            return {"gpu": "fake"}

        def check(self, cand, base: Result, edges=True):
            FakeWorker.checked.append((self.p.key, cand.variant.name, edges))
            return base.with_(status="wrong", message="wrong") if fails(self.p, cand.variant.name) else base

        def retime(self, passed, rounds):
            return {"copy_": 2.0} | {c.variant.name: 2.0 * ratio[c.variant.name] for c in passed}

        def close(self):
            pass

    return FakeWorker


def built(monkeypatch):
    """Every variant built (search.loop.build_result's Result without a compiler): choose's build argument."""
    from dwgen.result import Result
    from search import loop

    monkeypatch.setattr(loop, "build_result", lambda v, b: Result(v.name, v.digest, "ok", direction=v.direction))
    return lambda vs: [types.SimpleNamespace(ok=True, library=f"{v.name}.so") for v in vs]


def test_choose_measures_each_shape_drops_a_failed_candidate_and_decides(monkeypatch):
    from dwgen import worker
    from search import generic

    variants = generic.candidate_variants(9, "fp16", "bcl")
    tc_name = next(v.name for v in variants if v.family.name == "dw1d_tc")
    broken = next(v.name for v in variants if v.family.name != "dw1d_tc")
    ratio = {v.name: 1.2 for v in variants} | {tc_name: 1.0}  # tensor cores 17% ahead: chosen

    FakeWorker = fake_worker(ratio, fails=lambda p, name: name == broken and p.bias)  # fails on the second shape only
    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    lines = []
    rec = generic.choose(9, "fp16", "bcl", built(monkeypatch), log=lines.append)
    shapes = generic.training_problems(9, "fp16", "bcl")
    anyshape = [p.key for p in generic.scope_problems(9, "fp16", "bcl")["any"]]
    assert rec["kernel"] == tc_name and rec["geomean_x_copy"] == pytest.approx(1.0)
    assert rec["x_copy"] == dict.fromkeys(anyshape, 1.0) and rec["machine"] == {"gpu": "fake"}
    assert broken not in rec["candidates"] and len(rec["candidates"]) == len(variants) - 1
    scope = {v.name: v.family.generic_scope for v in variants}  # each measured on the shapes its scope takes
    assert all(list(xs) == [p.key for p in shapes if generic.scope_admits(scope[n], p)]
               for n, xs in rec["candidates"].items())
    assert any("wrong" in line for line in lines)
    # one worker for every shape; each candidate checked on each shape it is timed on, its edge problems at the
    # first only; a candidate that failed is not checked again
    assert len(FakeWorker.made) == 1
    for n in rec["candidates"]:
        mine = [(key, edges) for key, name, edges in FakeWorker.checked if name == n]
        assert [key for key, _ in mine] == list(rec["candidates"][n]) and [e for _, e in mine] == [True] + [False] * (
            len(mine) - 1)
    assert [key for key, name, _ in FakeWorker.checked if name == broken] == [p.key for p in shapes[:2]]


def test_choose_uses_the_worker_it_is_given(monkeypatch):
    from dwgen import worker
    from search import generic

    variants = generic.candidate_variants(3, "bf16", "blc")
    FakeWorker = fake_worker({v.name: 1.1 for v in variants})
    monkeypatch.setattr(worker, "GpuWorker", lambda p: pytest.fail("a worker of its own was started"))
    given = FakeWorker(generic.generic_problem(5, "fp32", "bcl"))
    generic.choose(3, "bf16", "blc", built(monkeypatch), log=lambda *_: None, worker=given)
    assert given.p == generic.training_problems(3, "bf16", "blc")[-1]  # switched to each shape in turn


def test_the_backward_measures_each_candidate_on_the_shapes_its_scope_takes(monkeypatch):
    """bf16 K8 (B, C, L): the fused designs on all four shapes, the lane ones on the causal and centred pair only;
    the lane design that wins there is chosen beside the fused one. (K10-16: the split ones on all four.)"""
    from dwgen import worker
    from search import generic

    variants = generic.candidate_variants(8, "bf16", "bcl", "bwd")
    lane = sorted(v.name for v in variants if v.family.name == "dw1d_bwdlane")
    ratio = {v.name: {"dw1d_bwd": 2.5, "dw1d_bwdlane": 1.6}[v.family.name] for v in variants}
    ratio[lane[0]] = 1.5
    family = {v.name: v.family.name for v in variants}

    FakeWorker = fake_worker(ratio)
    monkeypatch.setattr(worker, "BwdGpuWorker", FakeWorker)
    rec = generic.choose(8, "bf16", "bcl", built(monkeypatch), log=lambda *_: None, direction="bwd")
    shapes = generic.scope_problems(8, "bf16", "bcl", "bwd")
    asked: dict[str, set] = {}
    for key, name, _ in FakeWorker.checked:
        asked.setdefault(key, set()).add(family[name])
    assert asked == ({p.key: {"dw1d_bwd"} for p in shapes["any"]}
                     | {p.key: {"dw1d_bwd", "dw1d_bwdlane"} for p in shapes["causal_or_centred"]})
    assert rec["kernel"].startswith("dw1d_bwd_") and [n["kernel"] for n in rec["narrow"]] == [lane[0]]
    assert sorted(rec["candidates"][lane[0]]) == sorted(p.key for p in shapes["causal_or_centred"])


def test_the_checks_ask_a_lane_candidate_for_what_each_call_s_padding_takes():
    """A lane candidate is built on its scope's causal stand-in, whose launch takes SiLU; measured on a centred
    shape, its checks must ask no SiLU of the centred calls (they did: on the H100 every lane candidate failed
    with cudaErrorInvalidValue on the centred shapes and was dropped whole), and SiLU of the causal ones."""
    from dwgen.problem import Problem
    from search import generic
    from tests.backward_checks import asked

    shapes = generic.scope_problems(7, "bf16", "bcl", "bwd")["causal_or_centred"]
    lane = next(v for v in generic.candidate_variants(7, "bf16", "bcl", "bwd") if v.family.name == "dw1d_bwdlane")
    assert lane.problem.causal  # built on the stand-in
    for q in shapes:
        seen = [(c.causal, c.activation) for c in asked(lane, q)]
        assert (q.causal, q.activation) in seen
        assert all(causal or act == "none" for causal, act in seen), (q.key, seen)
        assert (True, "silu") in seen  # the stand-in's own edge problems are causal and take both
    assert {q.causal for q in shapes} == {True, False}
    assert isinstance(shapes[0], Problem)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_backward_candidates_are_valid_distinct_and_hold_the_first_design(dtype, layout):
    """Every K has the fused backward's first design (today's fast generic backward) among its candidates, and
    short filters several more, all of the family that takes every call of the key; over (B, C, L) the lane
    backward's designs up to K9 and for 16-bit from K10 the split backward's, over (B, L, C) the walk backward's
    (up to K4 in fp32, K9 in 16-bit: its registers) (chosen beside a fused one, for the calls their scopes admit),
    each on a stand-in its scope takes."""
    from dwgen.families import bwd, bwdtc, bwdwalk
    from dwgen.space import LEFT_HALO_SPAN, generic_problem, scope_admits, violations

    for k in GENERIC_KERNEL_SIZES:
        variants = candidate_variants(k, dtype, layout, "bwd")
        names = [v.name for v in variants]
        assert len(set(names)) == len(names), names
        assert all(v.direction == "bwd" for v in variants)
        families = {v.family.name for v in variants}
        want = {"dw1d_bwd"} | ({"dw1d_bwdlane"} if layout == "bcl" and k <= 9 else set()) | (
            {"dw1d_bwdtc"} if DTYPES[dtype].bytes == 2 and layout == "bcl" and k >= bwdtc.MIN_TAPS else set()) | (
            {"dw1d_bwdwalk"} if layout == "blc" and k <= (4 if dtype == "fp32" else 9) else set())
        assert families == want, f"{dtype} {layout} K{k}: {families}"
        walks = [v for v in variants if v.family.name == "dw1d_bwdwalk"]
        assert all(bwdwalk.Tiling(v.problem, v.config).span >= LEFT_HALO_SPAN for v in walks)  # the scope's grid rule
        fused = [v for v in variants if v.family.name == "dw1d_bwd"]
        assert bwd.generic_config(generic_problem(k, dtype, layout)) in [v.config for v in fused]
        assert len(fused) >= (4 if k <= 8 else 2), f"{dtype} {layout} K{k}: only {names}"
        assert all(v.family.generic_scope == "any" for v in fused)
        assert all(v.family.generic_scope in ("within_halo", "causal_or_centred", "left_halo")
                   for v in variants if v not in fused)
        assert all(scope_admits(v.family.generic_scope, v.problem) and not violations(v.problem, v.config, "bwd")
                   for v in variants)


@pytest.mark.parametrize("direction", ["fwd", "bwd"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("k", [1, 4, 9, 16])
def test_each_scope_is_measured_on_calls_it_takes_and_mamba_s_call_is_among_them(k, layout, direction):
    from dwgen.space import scope_admits
    from search.generic import scope_problems

    shapes = scope_problems(k, "bf16", layout, direction)
    assert all(scope_admits(scope, p) for scope, ps in shapes.items() for p in ps)
    # Mamba's call (causal, SiLU) on rows that are no whole number of 2048-long tiles: the choices made without
    # it read 1.87x (forward) and 2.20x (the lane backward) copy on 4x2048x3072 (docs/proposed items 17, 19); the
    # walk backward over (B, L, C) has no bench row of that call yet, and is measured without it
    for scope in {"fwd": ["any"], "bwd": {"bcl": ["causal_or_centred"], "blc": []}[layout]}[direction]:
        assert any(p.activation == "silu" and p.paddings == (k - 1, 0) and p.length % 2048 for p in shapes[scope])


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_forward_weighs_lane_row_walks_for_causal_and_centred_calls_where_their_halo_fits(dtype):
    """Over (B, C, L) the forward's candidates hold lane designs, each a row walk specialised to the scope's
    stand-in, at every K whose halo a lane's neighbour holds (16-bit K <= 9: 8-element vectors; fp32 K <= 5);
    a lane design that walks tiles never serves the scope (its grid counts a row's chunks)."""
    from dwgen.families import lane
    from dwgen.space import generic_problem, scope_stand_in, scope_violations

    for k in GENERIC_KERNEL_SIZES:
        lanes = [v for v in candidate_variants(k, dtype, "bcl") if v.family.name == "dw1d_lane"]
        reach = 9 if dtype != "fp32" else 5
        assert (len(lanes) == 4) == (k <= reach) and (not lanes) == (k > reach), (dtype, k)
        stand_in = scope_stand_in(generic_problem(k, dtype), "causal_or_centred")
        assert all(v.config.walk == "row" and v.problem == stand_in for v in lanes)
    assert not any(v.family.name == "dw1d_lane" for v in candidate_variants(4, dtype, "blc"))
    q = scope_stand_in(generic_problem(4, dtype), "causal_or_centred")
    assert scope_violations(q, lane.Config(threads=128, vecs=2, spread=True), "causal_or_centred")
    assert not scope_violations(q, lane.Config(threads=128, vecs=2, spread=True, walk="row"), "causal_or_centred")


def test_backward_records_have_their_own_names_and_the_forwards_keep_theirs(tmp_path):
    from search.generic import record_path

    # the forward's name as the forty-second session's bf16 K3 record will carry it (the lane forward's designs and
    # the causal and centred shapes they are weighed on, beside the forty-first's e58fc1e60dab, itself a third
    # training shape and a candidate more than the thirty-first's 609eba5bc382): a new name means new measurements
    assert record_path(tmp_path, 3, "bf16", "bcl").name == "bf16_bcl_k3-4e9c44e3bcf7.json"
    assert record_path(tmp_path, 3, "bf16", "bcl", "bwd").name.startswith("bf16_bcl_k3_bwd-")


def test_backward_choices_are_kept_under_their_own_keys(monkeypatch, tmp_path, capsys):
    from dwgen import freeze
    from search import generic, workflow

    frozen, asked = [], []
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs, jobs: None)

    def fake(k, d, lay, build, runs, direction="fwd", worker=None):
        asked.append(direction)
        return {"kernel": f"{d}_{lay}_k{k}_{direction}", "geomean_x_copy": 1.5}

    monkeypatch.setattr(generic, "choose_or_reuse", fake)
    monkeypatch.setattr(workflow, "freeze_gated", lambda winners, out, generic: frozen.append(sorted(generic)))
    monkeypatch.setattr(freeze, "DEFAULT_DIR", tmp_path)
    argv = ["--direction", "bwd", "--kernel-sizes", "4,15", "--dtypes", "bf16", "--layouts", "bcl", "--freeze-once"]
    assert generic.main(argv) == 0
    assert frozen == [["bf16_bcl_k15_bwd", "bf16_bcl_k4_bwd"]] and asked == ["bwd", "bwd"]


def test_a_measured_backward_design_becomes_the_fast_generic_backward_and_leaves_the_forward_alone():
    from dwgen.space import generic_variants

    variants = candidate_variants(4, "bf16", "bcl", "bwd")
    pick = next(v for v in variants if v.config.stage == "raw" and v.config.tiles == 4)
    chosen = {"bf16_bcl_k4_bwd": pick.config_dict}
    bwd_names = {v.name for v in generic_variants(chosen, "bwd")}
    assert pick.name in bwd_names
    assert pick.name not in {v.name for v in generic_variants(None, "bwd")}
    # K5 nobody measured takes K4's design where it fits (the nearest measured K)
    assert "dw1d_bwd_bf16_k5_t128_o8_raw_b4" in bwd_names
    assert {v.name for v in generic_variants(chosen)} == {v.name for v in generic_variants()}


def test_a_walk_design_of_short_blocks_never_serves_the_left_halo_scope():
    """The left_halo rule admits B * ceil(Lout / 1024) blocks along the walk's grid y; a walk design whose blocks
    cover fewer positions would be refused by its own launch on calls the rule admits, so it is neither a
    candidate nor rendered as a narrow kernel (the family's own restrictions pass it on the stand-in)."""
    from dwgen.families import bwdwalk
    from dwgen.space import generic_problem, narrow_variants, scope_stand_in, scope_violations, violations

    short = bwdwalk.Config(threads=128, ct=32, vec=4, seg=128, unroll=4, stages=3)  # 4 rows x 128 = 512
    q = scope_stand_in(generic_problem(4, "bf16", "blc"), "left_halo")
    assert not violations(q, short, "bwd") and scope_violations(q, short, "left_halo")
    assert not scope_violations(q, bwdwalk.KNOWN_GOOD[0], "left_halo")
    chosen = {"bf16_blc_k4_bwd": {"threads": 128, "outs": 16, "tc": 64, "stage": "async", "tiles": 4}}
    narrow = {"bf16_blc_k4_bwd": [{"family": "dw1d_bwdwalk", **short.__dict__}]}
    assert narrow_variants(chosen, narrow, "bwd") == []
    narrow = {"bf16_blc_k4_bwd": [{"family": "dw1d_bwdwalk", **bwdwalk.KNOWN_GOOD[0].__dict__}]}
    # every K follows the one measurement; the 4-channel design's state fits K <= 4
    assert [v.name for vs in narrow_variants(chosen, narrow, "bwd") for v in vs] == [
        f"dw1d_bwdwalk_bf16_k{k}_t256_c64_v4_s256_u4_a3" for k in (1, 2, 3, 4)]


def test_each_narrow_scope_follows_its_own_nearest_measurement():
    """fp16 (B, C, L) K12 lies 3 from K9 and from K15: its fused design follows K9 (the smaller on a tie), its split
    design K15's, since K9 could not weigh the split backward (K10 and up) and K9's lane design does not fit K12.
    A measured K that weighed a scope and chose none stops the walk: with K13 measured so, K10-14 have no split."""
    from dwgen.families import bwd, bwdlane, bwdtc
    from dwgen.space import generic_problem, narrow_variants

    fused = {"family": "dw1d_bwd", **bwd.Config(threads=128, outs=8, stage="raw", tiles=4).__dict__}
    lane = {"family": "dw1d_bwdlane", **bwdlane.Config(threads=128, outs=8, rows=2).__dict__}
    split = {"family": "dw1d_bwdtc", **bwdtc.Config(threads=64, run=16, span=4, wgrad="mma", warps=2, nt=2,
                                                    tile=1024).__dict__}
    chosen = {"fp16_bcl_k9_bwd": fused, "fp16_bcl_k15_bwd": fused}
    narrow = {"fp16_bcl_k9_bwd": [lane], "fp16_bcl_k15_bwd": [split]}

    def tables(chosen):
        return {generic_problem(vs[0].problem.kernel_size, "fp16").kernel_size: [v.family.name for v in vs]
                for vs in narrow_variants(chosen, narrow, "bwd") if vs[0].problem.dtype == "fp16"}

    assert tables(chosen) == {**{k: ["dw1d_bwdlane"] for k in range(1, 10)},
                              **{k: ["dw1d_bwdtc"] for k in range(10, 17)}}
    assert tables(chosen | {"fp16_bcl_k13_bwd": fused}) == {**{k: ["dw1d_bwdlane"] for k in range(1, 10)},
                                                            **{k: ["dw1d_bwdtc"] for k in (15, 16)}}


def test_a_dry_run_compiles_each_candidate_once_and_fails_when_one_does_not(capsys):
    """--dry-run hands every candidate of the keys to the builder (a design shared by two keys once) and says
    which failed; no GPU is asked for."""
    from types import SimpleNamespace

    from search.generic import dry_run

    seen = []

    def build(variants, on_done=None):
        seen.extend(v.name for v in variants)
        out = [SimpleNamespace(name=v.name, ok=i != 1, cached=False, seconds=1.0, status="ok" if i != 1
                               else "compile_error") for i, v in enumerate(variants)]
        for b in out:
            on_done(b)
        return out

    assert dry_run([3, 4], ["fp16"], ["bcl"], "bwd", build) == 1
    expected = {v.name for k in (3, 4) for v in candidate_variants(k, "fp16", "bcl", "bwd")}
    assert sorted(seen) == sorted(expected)
    assert "compile_error" in capsys.readouterr().out
    assert dry_run([3], ["fp16"], ["bcl"], "bwd", lambda vs, on_done=None: [
        SimpleNamespace(name=v.name, ok=True, cached=True, seconds=0.0, status="ok") for v in vs]) == 0


def test_the_frozen_modules_scope_rules_agree_with_the_search():
    """generated/ is torch-only, so it restates two rules of dwgen.space on manifest records: which family serves
    which scope (_NARROW_SCOPES against each family's GENERIC_SCOPE) and what keeps a design from its scope
    (_scope_refusal against scope_violations). Both sides are asked about every candidate design of every
    dtype, layout and direction, and about designs each rule refuses, on the stand-in the search checks them on."""
    from dwgen import frozen_dispatch
    from dwgen.families import bwdwalk, lane
    from dwgen.space import FAMILIES, Variant, family_of_config, generic_problem, scope_stand_in, scope_violations

    narrow = {f.name: f.generic_scope for fams in FAMILIES.values() for f in fams
              if f.generic_scope not in (None, "any")}
    assert frozen_dispatch._NARROW_SCOPES == narrow
    refused = {("bwd", "blc"): [bwdwalk.Config(threads=128, ct=32, vec=4, seg=128, unroll=4, stages=3)],
               ("fwd", "bcl"): [lane.Config(threads=64, vecs=4, spread=True), lane.Config(threads=128, vecs=1)]}
    asked = {"refused": 0, "kept": 0}
    for direction in ("fwd", "bwd"):
        for layout in LAYOUTS:
            for dtype in DTYPES:
                designs = [*candidates(dtype, layout, direction), *refused.get((direction, layout), [])]
                for c in designs:
                    p = generic_problem(4, dtype, layout)
                    family = family_of_config(p, c, direction)
                    if family.generic_scope in (None, "any"):
                        continue
                    q = scope_stand_in(p, family.generic_scope)
                    config = Variant(q, c, direction).config_dict
                    search_says = scope_violations(q, c, family.generic_scope)
                    frozen_says = frozen_dispatch._scope_refusal(config.get("family"), config)
                    assert (frozen_says is None) == (not search_says), (direction, dtype, layout, config)
                    asked["refused" if search_says else "kept"] += 1
    assert asked["refused"] >= 3 * 3 and asked["kept"] > 0  # both answers asked of both sides
