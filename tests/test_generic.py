"""search.generic's candidate designs: each one a valid, distinct kernel for every generic (dtype, layout, K)."""
import json

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

    def fake_choose(k, dtype, layout, build, log=print, direction="fwd"):
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


@pytest.mark.parametrize("once", [False, True])
def test_choices_freeze_after_each_dtype_and_layout_or_once(monkeypatch, tmp_path, capsys, once):
    from dwgen import freeze
    from search import generic, workflow

    frozen = []
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs, jobs: None)
    monkeypatch.setattr(generic, "choose_or_reuse", lambda k, d, lay, build, runs, direction="fwd": {
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
    assert rec["x_copy"] == scores[row_name] and rec["candidates"] == scores


def test_choose_measures_each_shape_drops_a_failed_candidate_and_decides(monkeypatch):
    from types import SimpleNamespace

    from dwgen import worker
    from search import generic, loop

    variants = generic.candidate_variants(9, "fp16", "bcl")
    tc_name = next(v.name for v in variants if v.family.name == "dw1d_tc")
    broken = next(v.name for v in variants if v.family.name != "dw1d_tc")
    ratio = {v.name: 1.2 for v in variants} | {tc_name: 1.0}  # tensor cores 17% ahead: chosen

    class FakeWorker:
        def __init__(self, p):
            self.p = p

        def machine(self):
            return {"gpu": "fake"}

        def retime(self, passed, rounds):
            return {"copy_": 2.0} | {c.variant.name: 2.0 * ratio[c.variant.name] for c in passed}

        def close(self):
            pass

    def fake_check_each(w, vs, builds):
        for v in vs:
            ok = not (v.name == broken and w.p.bias)  # fails its check on the second shape only
            yield SimpleNamespace(name=v.name, summary=lambda: "wrong"), SimpleNamespace(variant=v) if ok else None

    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    monkeypatch.setattr(loop, "check_each", fake_check_each)
    lines = []
    rec = generic.choose(9, "fp16", "bcl", lambda vs: None, log=lines.append)
    shapes = [p.key for p in generic.training_problems(9, "fp16", "bcl")]
    assert rec["kernel"] == tc_name and rec["geomean_x_copy"] == pytest.approx(1.0)
    assert rec["x_copy"] == dict.fromkeys(shapes, 1.0) and rec["machine"] == {"gpu": "fake"}
    assert broken not in rec["candidates"] and len(rec["candidates"]) == len(variants) - 1
    assert all(list(xs) == shapes for xs in rec["candidates"].values())
    assert any("wrong" in line for line in lines)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_backward_candidates_are_valid_distinct_and_hold_the_first_design(dtype, layout):
    """Every K has the fused backward's first design (today's fast generic backward) among its candidates, and
    short filters several more; all of the family whose launch takes any sizes."""
    from dwgen.families import bwd
    from dwgen.space import generic_problem

    for k in GENERIC_KERNEL_SIZES:
        variants = candidate_variants(k, dtype, layout, "bwd")
        names = [v.name for v in variants]
        assert len(set(names)) == len(names), names
        assert all(v.direction == "bwd" and v.family.name == "dw1d_bwd" for v in variants)
        assert bwd.generic_config(generic_problem(k, dtype, layout)) in [v.config for v in variants]
        assert len(names) >= (4 if k <= 8 else 2), f"{dtype} {layout} K{k}: only {names}"


def test_backward_records_have_their_own_names_and_the_forwards_keep_theirs(tmp_path):
    from search.generic import record_path

    # the forward's name as the thirty-first session's bf16 K3 record carried it (reused to re-freeze in the 33rd-34th)
    assert record_path(tmp_path, 3, "bf16", "bcl").name == "bf16_bcl_k3-609eba5bc382.json"
    assert record_path(tmp_path, 3, "bf16", "bcl", "bwd").name.startswith("bf16_bcl_k3_bwd-")


def test_backward_choices_are_kept_under_their_own_keys(monkeypatch, tmp_path, capsys):
    from dwgen import freeze
    from search import generic, workflow

    frozen, asked = [], []
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs, jobs: None)

    def fake(k, d, lay, build, runs, direction="fwd"):
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
