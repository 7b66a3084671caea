"""The benchmark's rows with a direction, without a GPU: cases read from suite lines, their bytes and keys,
the backward's timing as a difference, labels, the table and the chart of training rows."""
from __future__ import annotations

import json

import pytest
import torch

import dwgen.bench.__main__ as bench_main
from dwgen import bench, worker
from dwgen.bench import training
from dwgen.bench.cases import DIRECTIONS, Case, read_cases
from dwgen.bench.labels import problem_label
from dwgen.problem import Problem, ProblemError
from dwgen.suite import read_suite
from tests.conftest import ROOT


def test_training_suite_has_the_issues_rows():
    """Issue 10 item 5: the target in fp32 and bf16, and Mamba's causal K4 + SiLU in bf16 in both memory
    orders, each timed in every direction."""
    cases = {(c.batch, c.channels, c.length, c.kernel_size, c.dtype, c.layout, c.causal, c.activation)
             for c in read_cases(ROOT / "benchmarks" / "training.txt") if c.directions == DIRECTIONS}
    assert {(32, 512, 8192, 3, "fp32", "bcl", False, "none"), (32, 512, 8192, 3, "bf16", "bcl", False, "none"),
            (8, 4096, 2048, 4, "bf16", "bcl", True, "silu"), (8, 4096, 2048, 4, "bf16", "blc", True, "silu")} <= cases


def test_training_suite_times_every_stride_one_problem_of_the_suite():
    """Issue 10's targets hold in every dtype and layout of the suite: each problem the backward is tuned for
    (stride 1; tune.py --suite --direction bwd skips strided ones) has its training rows."""
    trained = {c.problem.key for c in read_cases(ROOT / "benchmarks" / "training.txt") if c.directions == DIRECTIONS}
    tuned = {p.key for p in read_suite(ROOT / "benchmarks" / "suite.txt") if p.stride == 1}
    assert tuned - trained == set()


@pytest.mark.parametrize("stem", ["suite", "untuned"])
def test_forward_suites_read_as_plain_cases_of_the_same_problems(stem):
    path = ROOT / "benchmarks" / f"{stem}.txt"
    cases = read_cases(path)
    assert all(c.plain and c.directions == ("fwd",) for c in cases)
    assert [c.problem for c in cases] == read_suite(path)
    assert [c.key for c in cases] == [p.key for p in read_suite(path)]
    assert all(type(c.problem) is Problem for c in cases)


def test_causal_case_pads_the_left_only_and_keeps_the_length(tmp_path):
    """Causal padding and SiLU are the Problem's own fields, spelled as tune.py spells them."""
    suite = tmp_path / "t.txt"
    suite.write_text("--shape 8x4096x2048 -k 4 --padding causal --activation silu --dtype bf16 --layout blc "
                     "--backward\n--shape 2x16x1000 -k 5 --dilation 2 --stride 2 --padding causal\n")
    mamba, strided = read_cases(suite)
    assert (mamba.padding, mamba.paddings, mamba.out_length, mamba.causal) == (3, (3, 0), 2048, True)
    # bytes of the forward: x read and y written once, B*C*(L + L) elements of 2 bytes
    assert mamba.min_bytes == 8 * 4096 * (2048 + 2048) * 2
    assert mamba.key == "8x4096x2048_k4_s1_p3_d1_bf16_blc_nobias_pr0_silu"
    assert mamba.problem == Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc", padding_right=0,
                                    activation="silu")
    assert mamba.row_key("fwd+bwd") == mamba.key + "_fwd+bwd"
    assert not mamba.plain and mamba.directions == ("fwd", "bwd", "fwd+bwd")
    # stride 2, dilation 2: 8 on the left, outputs at 0, 2, ..., 998; a forward alone: a plain forward row
    assert (strided.paddings, strided.out_length, strided.directions) == ((8, 0), 500, ("fwd",))
    assert strided.plain and strided.row_key("fwd") == strided.key == "2x16x1000_k5_s2_p8_d2_fp32_bcl_nobias_pr0"


def test_non_causal_training_case_keeps_problems_bytes_and_key_and_names_its_direction(tmp_path):
    suite = tmp_path / "t.txt"
    suite.write_text("--shape 32x512x8192 -k 3 --padding 1 --backward\n--shape 32x512x8192 -k 3 --padding 1 "
                     "--backward --graph\n")
    case, graphed = read_cases(suite)
    p = Problem(32, 512, 8192, 3, 1, 1)
    # --graph times the same problem as CUDA-graph replays: the key and rows are the problem's own
    assert not case.graph and graphed.graph and graphed.key == case.key == p.key
    assert (case.out_length, case.min_bytes, case.key) == (p.out_length, p.min_bytes, p.key)
    # a forward-suite row of the same problem keeps p.key: search/report.py finds the forward by it
    assert {case.row_key(d) for d in DIRECTIONS} == {f"{p.key}_fwd", f"{p.key}_bwd", f"{p.key}_fwd+bwd"}


@pytest.mark.parametrize(("line", "message"), [
    ("--shape 2x4x64 -k 4 --causal", "t.txt:1: unrecognized arguments: --causal"),  # one spelling: --padding causal
    ("--shape 2x4x64 -k 4 --padding left", "t.txt:1: argument --padding: 'left' is neither 'same', 'causal' nor"),
    ("--shape 2x4x64 --activation relu", "t.txt:1: argument --activation: invalid choice: 'relu'"),
    ("--shape 2x4x64 --direction bwd", "t.txt:1: unrecognized arguments: --direction bwd"),
    ("--shape 2x4x64 --graph", "t.txt:1: --graph applies to training lines only"),
])
def test_bad_case_lines_are_refused_with_their_place(tmp_path, line, message):
    suite = tmp_path / "t.txt"
    suite.write_text(line + "\n")
    with pytest.raises(ProblemError) as e:
        read_cases(suite)
    assert str(e.value).startswith(f"{tmp_path}/{message}") and "\n" not in str(e.value)


def test_case_refuses_what_a_problem_refuses():
    with pytest.raises(ProblemError, match="backward must be True or False"):
        Case(2, 4, 64, 4, backward=1)
    with pytest.raises(ProblemError, match="graph must be True or False"):
        Case(2, 4, 64, 4, backward=True, graph="yes")
    with pytest.raises(ProblemError, match="--graph applies to training lines only"):
        Case(2, 4, 64, 4, graph=True)
    with pytest.raises(ProblemError, match="unknown activation"):
        Case(2, 4, 64, 3, activation="gelu")
    assert Case(2, 4, 64, 4, padding=3, padding_right=0).out_length == 64


def test_backward_is_the_difference_of_the_same_rounds():
    total = bench.Timing(3.0, 2.9, 4, (3.0, 2.9, 3.2, 3.1))
    fwd = bench.Timing(1.0, 0.9, 4, (1.0, 0.9, 1.0, 1.3))
    bwd = bench.difference(total, fwd)
    assert bwd.samples == pytest.approx((2.0, 2.0, 2.2, 1.8)) and bwd.reps == 4
    assert bwd.median_ms == pytest.approx(2.0) and bwd.min_ms == pytest.approx(1.8)
    copy = bench.Timing(1.0, 1.0, 4, (1.0, 1.0, 1.0, 1.0))
    assert bench.ratio_spread(bwd, copy)[1] == pytest.approx(2.0)


def training_row(direction: str, impl: str, ms: float, **kw) -> dict:
    case = Case(8, 4096, 2048, 4, padding=3, dtype="bf16", layout="blc", padding_right=0, activation="silu",
                backward=True)
    return {"problem": case.row_key(direction), "shape": "8x4096x2048", "kernel_size": 4, "stride": 1, "padding": 3,
            "padding_right": 0, "dilation": 1, "bias": False, "dtype": "bf16", "layout": "blc", "causal": True,
            "activation": "silu", "backward": True, "direction": direction, "implementation": impl, "ms": ms,
            "x_copy": ms / 0.07, "correct": True, "timing": "plain", **kw}


def results_with_training_rows() -> dict:
    committed = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    rows = []
    for d, scale in (("fwd", 1.0), ("bwd", 3.0), ("fwd+bwd", 4.0)):
        rows += [training_row(d, "copy_", 0.07), training_row(d, "pytorch", 0.07 * 17 * scale, host_us=30.0),
                 training_row(d, "torch.compile", 0.07 * 16 * scale),
                 training_row(d, "dwgen", 0.07 * 1.1 * scale, host_us=12.0, speedup_vs_torch=15.5,
                              **({"kernel": "dw1d_bf16_k4_cl"} if d == "fwd" else {}))]
    return {**committed, "suites": {**committed["suites"], "training": rows}}


def test_labels_of_training_rows_name_causal_silu_and_direction():
    assert problem_label(training_row("fwd", "dwgen", 0.07)) == "8x4096x2048 bf16 (B,L,C) K4 causal SiLU fwd"
    assert problem_label(training_row("fwd+bwd", "dwgen", 0.3)) == "8x4096x2048 bf16 (B,L,C) K4 causal SiLU fwd+bwd"
    forward = json.loads((ROOT / "benchmarks" / "results.json").read_text())["suites"]["suite"][0]
    assert problem_label(forward) == "32x512x8192 fp32 K3 P1"  # forward rows read as before
    assert problem_label({**forward, "direction": "fwd"}) == "32x512x8192 fp32 K3 P1"
    # rows of this version name both paddings; an asymmetric one that is not causal reads LEFT+RIGHT
    assert problem_label({**forward, "padding_right": 1, "causal": False, "activation": "none"}) == \
        "32x512x8192 fp32 K3 P1"
    assert problem_label({**forward, "padding": 2, "padding_right": 0, "causal": False}) == "32x512x8192 fp32 K3 P2+0"


def test_table_of_training_rows():
    results = results_with_training_rows()
    md = bench_main.markdown(results)
    table = md.split("**training**")[1]
    header = table.strip().splitlines()[0]
    assert header == ("| problem | copy_ | pytorch | torch.compile | dwgen | dwgen kernel | dwgen vs PyTorch | "
                      "host µs: PyTorch / dwgen |")
    lines = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    assert [line.split(" | ")[0] for line in lines] == [
        f"| 8x4096x2048 bf16 (B,L,C) K4 causal SiLU {d}" for d in ("fwd", "bwd", "fwd+bwd")]
    assert "0.2310 (3.30x)" in lines[1] and "`dw1d_bf16_k4_cl`" in lines[0] and "30.0 / 12.0" in lines[2]
    assert "Rows with a direction time a training step's parts" in md.splitlines()[0]
    # the forward tables keep every contender's column, and the committed table reads as it did
    assert "| triton (simple) | cuda (naive) |" in md.split("**training**")[0]
    committed = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    assert bench_main.markdown(committed).strip() == (ROOT / "benchmarks" / "results.md").read_text().strip()


def test_chart_of_training_rows_has_a_group_per_direction(tmp_path):
    pytest.importorskip("matplotlib")
    from dwgen.bench import plot

    results = results_with_training_rows()
    groups = [(s, key) for s, key, _ in plot.rows_by_problem(results) if s == "training"]
    assert len(groups) == 3
    assert plot.plot(results, tmp_path / "r.png").read_bytes().startswith(b"\x89PNG")


def test_main_times_plain_lines_as_before_and_the_rest_as_training(monkeypatch, tmp_path):
    suite = tmp_path / "s.txt"
    suite.write_text("--shape 2x4x64\n--shape 2x4x64 -k 4 --padding causal --activation silu --backward\n"
                     "--shape 2x4x64 -k 4 --padding causal --activation silu\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker, "machine_info", lambda: {"gpu": "x", "driver": "x", "torch": "x", "cuda": "x",
                                                         "date": "x"})
    seen = []

    def fake(kind):
        def measure(p, names):
            seen.append((kind, type(p).__name__, p.key, tuple(names)))
            return []
        return measure

    monkeypatch.setattr(bench_main, "measure", fake("forward"))
    monkeypatch.setattr(training, "measure", fake("training"))
    monkeypatch.setattr(bench_main, "markdown", lambda results: "")
    assert bench_main.main(["--suite", str(suite), "--out", str(tmp_path), "--only", "pytorch,dwgen"]) == 0
    # a causal SiLU line without --backward is a forward problem like any other
    assert seen == [("forward", "Problem", "2x4x64_k3_s1_p1_d1_fp32_bcl_nobias", ("pytorch", "dwgen")),
                    ("training", "Case", "2x4x64_k4_s1_p3_d1_fp32_bcl_nobias_pr0_silu", ("pytorch", "dwgen")),
                    ("forward", "Problem", "2x4x64_k4_s1_p3_d1_fp32_bcl_nobias_pr0_silu", ("pytorch", "dwgen"))]


def test_training_measure_assembles_rows_of_every_direction(monkeypatch):
    """training.measure on the CPU, its timing faked: every direction's rows, bwd as the difference, ratios
    to copy_, speedups, host µs, and a contender whose result is off by 1% marked wrong."""
    from dwgen.bench import contenders

    case = Case(2, 8, 64, 4, padding=3, layout="blc", bias=True, padding_right=0, activation="silu", backward=True)
    ms = {"copy_": 1.0, "pytorch|fwd": 10.0, "pytorch|fwd+bwd": 30.0, "torch.compile|fwd": 9.0,
          "torch.compile|fwd+bwd": 27.0, "dwgen|fwd": 1.1, "dwgen|fwd+bwd": 3.6}

    def time_rounds(fns, flush):
        assert set(fns) == set(ms)
        return {k: bench.Timing(ms[k], ms[k], 3, (ms[k],) * 3) for k in fns}, 3

    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(bench, "latency_bound", lambda p: False)
    monkeypatch.setattr(bench, "needs_flush", lambda p: False)
    monkeypatch.setattr(bench, "copy_operands", lambda p: lambda: None)
    monkeypatch.setattr(bench, "host_us_per_call", lambda fn, calls=100: [fn(), 5.0][1])
    monkeypatch.setattr(bench, "time_rounds", time_rounds)
    monkeypatch.setattr(training, "_kernel", lambda case, x, w, b, direction="fwd": f"dw1d_{direction}_mock")
    monkeypatch.setitem(contenders.TRAINING, "dwgen", contenders.eager_training)  # a right answer
    monkeypatch.setitem(contenders.TRAINING, "torch.compile",
                        lambda c: lambda x, w, b: contenders.case_forward(c, x, w, b) * 1.01)  # a wrong one
    rows = training.measure(case, ["pytorch", "torch.compile", "triton (simple)", "dwgen"], device="cpu")
    got = {(r["direction"], r["implementation"]): r for r in rows}
    assert len(rows) == len(got) == 12 and {d for d, _ in got} == set(DIRECTIONS)
    assert {impl for _, impl in got} == {"copy_", "pytorch", "torch.compile", "dwgen"}
    assert all(r["problem"] == case.row_key(r["direction"]) and r["causal"] and r["activation"] == "silu"
               and (r["padding"], r["padding_right"]) == (3, 0) for r in rows)
    bwd = got["bwd", "dwgen"]
    assert bwd["ms"] == pytest.approx(2.5) and bwd["x_copy"] == pytest.approx(2.5)
    assert bwd["speedup_vs_torch"] == pytest.approx(20.0 / 2.5) and bwd["host_us"] == pytest.approx(0.0)
    assert got["fwd+bwd", "pytorch"]["x_copy"] == pytest.approx(30.0)
    assert got["fwd", "dwgen"]["kernel"] == "dw1d_fwd_mock" and got["bwd", "dwgen"]["kernel"] == "dw1d_bwd_mock"
    assert got["fwd+bwd", "dwgen"]["kernel"] == "dw1d_fwd_mock + dw1d_bwd_mock"
    assert got["fwd", "pytorch"]["correct"] and got["fwd+bwd", "dwgen"]["correct"]
    wrong = got["bwd", "torch.compile"]
    assert not wrong["correct"] and "y misses float64" in wrong["error"] and wrong["ms"] == pytest.approx(18.0)


def test_a_cell_outside_tolerance_shows_its_error_and_never_passes_quietly():
    from dwgen.bench.__main__ import cell

    ok = {"ms": 0.5, "x_copy": 1.25, "x_copy_p10": 1.2, "x_copy_p90": 1.3, "correct": True}
    assert cell(ok) == "0.5000 (1.25x, 1.20-1.30)"
    assert cell({**ok, "correct": False, "max_rel_error": 0.0069}) == "0.5000 (1.25x, 1.20-1.30) ‡ 6.9e-03"
    assert cell({**ok, "correct": False}).endswith(" ‡")  # a crash or mismatch without an error figure


def test_table_says_how_host_times_were_taken():
    """A run that took host times as medians over rounds says so; results from before (no host_rounds) do not."""
    results = results_with_training_rows()
    results.pop("host_rounds", None)
    assert "the median of" not in bench_main.markdown(results).splitlines()[0]
    results["host_rounds"] = 7
    assert "µs of CPU to issue it, the median of 7 rounds;" in bench_main.markdown(results).splitlines()[0]
