"""The tune's report from a study of fake results: report.md, its PNGs, what it borrows and what it refuses."""
from __future__ import annotations

import json

import optuna
import pytest

from search import loop, report
from search import study as st
from tests.test_search import PROBLEM, FakeBuilder, FakeEvaluator

pytest.importorskip("matplotlib")


def fake_study(tmp_path, trials=40):
    storage = st.default_storage(tmp_path)
    study = st.open_study(PROBLEM, storage, "tpe", 0)
    loop.search(PROBLEM, study, FakeBuilder(), FakeEvaluator(wrong={"shfl"}), trials=trials, batch=4,
                log=lambda s: None)
    return storage, study


def pngs_named(md: str) -> list[str]:
    import re

    return re.findall(r"\]\(([\w.-]+\.png)\)", md)


def test_report_names_every_png_and_each_is_a_png(tmp_path):
    _, study = fake_study(tmp_path)
    assert any(t.user_attrs.get(st.SKIP_ATTR) for t in study.trials), "the fake study should hold skips"
    path = report.write_report(study, PROBLEM.key, tmp_path / PROBLEM.key, bench_results=tmp_path / "none.json")
    md = path.read_text()
    names = pngs_named(md)
    assert set(names) == {"history.png", "importances.png", "params.png", "winner.png"}
    assert sorted(names) == sorted(p.name for p in path.parent.glob("*.png"))
    for n in names:
        assert (path.parent / n).read_bytes().startswith(b"\x89PNG"), n
    assert "torch.compile and naive CUDA kernel: not measured by the tune" in md


def test_skipped_failed_and_duplicate_trials_are_not_measurements(tmp_path):
    _, study = fake_study(tmp_path)
    measured = report.measured_trials(study)
    assert measured and all(m.result.ok and m.result.kernel_ms < st.SKIP_PENALTY_MS for m in measured)
    assert len({m.result.digest for m in measured}) == len(measured)


def test_bench_rows_are_borrowed_only_when_there(tmp_path):
    _, study = fake_study(tmp_path, trials=12)
    results = {"machine": {"gpu": "GPU", "date": "today"}, "suites": {"s": [
        {"problem": PROBLEM.key, "implementation": "torch.compile", "ms": 4.5, "correct": True},
        {"problem": PROBLEM.key, "implementation": "cuda (naive)", "ms": None, "correct": False},
        {"problem": "other", "implementation": "cuda (naive)", "ms": 3.0, "correct": True}]}}
    (tmp_path / "results.json").write_text(json.dumps(results))
    best = min(report.measured_trials(study), key=lambda m: m.result.kernel_ms).result
    bars = report.winner_bars(best, 1.0, 5.0, report.bench_row(PROBLEM.key, tmp_path / "results.json"))
    assert [(b[0].split("\n")[0], b[1]) for b in bars] == [("dwgen", best.kernel_ms), ("copy_", 1.0),
                                                            ("PyTorch", 5.0), ("torch.compile", 4.5)]
    md = report.write_report(study, PROBLEM.key, tmp_path / "r", bench_results=tmp_path / "results.json").read_text()
    assert "The torch.compile (grey) comes from `python -m dwgen.bench`" in md
    assert "naive CUDA kernel: not measured" in md


def test_importances_need_two_measured_trials(tmp_path):
    _, study = fake_study(tmp_path, trials=1)
    measured = report.measured_trials(study)[:1]
    imp, why = report.importances(study, measured)
    assert imp == {} and "at least 2" in why


def test_report_from_storage_finds_the_study_by_key(tmp_path):
    storage, _ = fake_study(tmp_path, trials=8)
    path = report.report_from_storage(storage, PROBLEM.key, tmp_path / "runs", bench_results=tmp_path / "x.json")
    assert path == tmp_path / "runs" / PROBLEM.key / "report.md" and path.exists()
    with pytest.raises(report.ReportError, match=r"no study of 8x64x2048.*close: " + PROBLEM.key):
        report.find_study(storage, PROBLEM.key.replace("2047", "2048"))


def test_a_study_with_nothing_measured_is_refused(tmp_path):
    study = optuna.create_study(study_name="dwgen-x-empty")
    with pytest.raises(report.ReportError, match="no correct, timed trial"):
        report.write_report(study, "empty", tmp_path)


def test_tune_py_report_rebuilds_and_refuses_in_one_line(tmp_path, capsys):
    from search.cli import main

    fake_study(tmp_path, trials=8)
    assert main(["report", PROBLEM.key, "--runs-dir", str(tmp_path)]) == 0
    assert (tmp_path / PROBLEM.key / "report.md").exists()
    capsys.readouterr()
    assert main(["report", "8x64x2048_k5", "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tune.py report: no study of 8x64x2048_k5") and err.count("\n") == 1, err
    assert main(["report", PROBLEM.key, "--runs-dir", str(tmp_path / "nowhere")]) == 2
    assert "no study storage at" in capsys.readouterr().err


def test_a_report_that_fails_is_one_log_line_not_a_failed_tune(tmp_path, monkeypatch):
    from search import workflow

    _, study = fake_study(tmp_path, trials=8)

    def broken(*a, **kw):
        raise RuntimeError("no display\nsecond line")

    monkeypatch.setattr(report, "plot_history", broken)
    lines: list[str] = []
    assert workflow.write_report(study, PROBLEM, tmp_path / "r", None, log=lines.append) is None
    assert lines == [f"report not written for {PROBLEM.key}: RuntimeError: no display"]
    assert workflow.write_report(optuna.create_study(), PROBLEM, tmp_path / "e", None, log=lines.append) is None
    assert "nothing to plot" in lines[-1]


def test_a_tune_writes_its_report_at_the_end_of_each_problem(tmp_path, monkeypatch):
    from dwgen import worker
    from search import workflow

    class FakeWorker(FakeEvaluator):
        restarts = 0

        def __init__(self, problem, timeout_s=None):
            super().__init__()

        def machine(self):
            return {"gpu": "FAKE"}

        def baselines(self):
            return {"copy_ms": 1.0, "torch_ms": 5.0}

        def close(self):
            pass

    monkeypatch.setattr(worker, "GpuWorker", FakeWorker)
    lines: list[str] = []
    w = workflow.tune_problem(PROBLEM, trials=8, timeout_s=None, sampler="tpe", seed=0,
                              storage=st.default_storage(tmp_path), build=FakeBuilder(), frozen=None,
                              log=lines.append, quiet=True, report_dir=tmp_path / PROBLEM.key)
    md = (tmp_path / PROBLEM.key / "report.md").read_text()
    assert lines[-1] == f"report: {tmp_path / PROBLEM.key / 'report.md'}"
    assert f"Winner (re-timed against the other finalists): `{w.variant.name}`" in md
