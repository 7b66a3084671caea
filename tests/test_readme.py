"""The README stays true: its commands are the ones CI runs, its table is the committed results."""
from __future__ import annotations

import json

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()
TUNE = "pip install -r requirements.txt && python tune.py --shape 32x512x8192"
TEST = "pip install -r requirements.txt && python -m pytest"


def test_two_commands_are_there_and_ci_runs_the_test_one():
    assert TUNE in README and TEST in README
    ci = (ROOT / ".ci" / "run").read_text()
    assert "pip install -q -r requirements.txt && python -m pytest" in ci


def test_results_table_matches_committed_results():
    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    md = (ROOT / "benchmarks" / "results.md").read_text().strip()
    assert md in README, "paste benchmarks/results.md into the README's results section"
    for rows in results["suites"].values():
        for r in rows:
            if r.get("ms") is not None:
                assert f"{r['ms']:.4f} ({r['x_copy']:.2f}x" in md, r


def test_results_cover_every_suite_problem_and_contender():
    from dwgen.bench.cases import read_cases
    from dwgen.bench.contenders import CONTENDERS

    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    for stem in ("suite", "untuned"):
        keys = {c.row_key(d) for c in read_cases(ROOT / "benchmarks" / f"{stem}.txt") for d in c.directions}
        rows = results["suites"][stem]
        assert {r["problem"] for r in rows} == keys
        for key in keys:
            impls = {r["implementation"]: r for r in rows if r["problem"] == key}
            assert {"copy_", "pytorch", "dwgen"} <= set(impls) <= set(CONTENDERS) | {"copy_"}
            assert impls["dwgen"]["correct"], key


def test_names_nothing_outside_the_repository():
    import re

    assert "../" not in README
    named = set(re.findall(r"`((?:scripts|dwgen|search|benchmarks|docs|templates|generated)/[\w./-]*)`", README))
    assert "scripts/fetch-gpu-wheels.sh" in named
    for path in named:
        assert (ROOT / path).exists(), path
