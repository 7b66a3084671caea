"""The benchmark's bar chart from results.json, without a GPU."""
from __future__ import annotations

import json

import pytest

from dwgen.bench import plot
from tests.conftest import ROOT

pytest.importorskip("matplotlib")
RESULTS = ROOT / "benchmarks" / "results.json"


def test_chart_of_the_committed_results_is_a_png(tmp_path):
    out = plot.plot(json.loads(RESULTS.read_text()), tmp_path / "r.png")
    assert out.read_bytes().startswith(b"\x89PNG")
    assert (ROOT / "benchmarks" / "results.png").read_bytes().startswith(b"\x89PNG")


def test_every_problem_of_the_results_is_a_group():
    results = json.loads(RESULTS.read_text())
    groups = plot.rows_by_problem(results)
    assert len(groups) == len({(s, r["problem"]) for s, rows in results["suites"].items() for r in rows})
    assert all("copy_" in impls and "dwgen" in impls for _, _, impls in groups)


def test_command_line_writes_beside_the_results_and_refuses_a_bad_file(tmp_path, capsys):
    (tmp_path / "results.json").write_text(RESULTS.read_text())
    assert plot.main([str(tmp_path / "results.json")]) == 0
    assert (tmp_path / "results.png").read_bytes().startswith(b"\x89PNG")
    (tmp_path / "bad.json").write_text("{}")
    assert plot.main([str(tmp_path / "bad.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("python -m dwgen.bench.plot: cannot read") and err.count("\n") == 1
