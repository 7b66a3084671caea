"""--json on tune.py and python -m dwgen.bench: stdout is one JSON document, the log goes to stderr."""
from __future__ import annotations

import json

import torch

import dwgen.bench.__main__ as bench_main
from dwgen import dryrun, worker
from dwgen.build import Build
from dwgen.families.bcl import Config
from dwgen.freeze import Winner
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.show import winner_row
from dwgen.space import Variant
from search import workflow
from tune import main

P = Problem(32, 512, 8192)
MACHINE = {"gpu": "NVIDIA H200", "date": "2026-11-30"}


def winner() -> Winner:
    v = Variant(P, Config(threads=128, vec=4, outs=2, halo="l1"))
    r = Result(v.name, v.digest, "ok", kernel_ms=0.25, copy_ms=0.25, torch_ms=1.25)
    return Winner(v, r, MACHINE)


def test_winner_row_matches_show_rows():
    row = winner_row(winner(), frozen=False)
    assert row["problem"] == P.key and row["kernel"] == winner().variant.name and row["frozen"] is False
    assert (row["ms"], row["x_copy"], row["speedup_vs_torch"]) == (0.25, 1.0, 5.0)
    assert (row["dtype"], row["layout"], row["direction"], row["gpu"]) == ("fp32", "bcl", "fwd", "NVIDIA H200")


def test_tune_json_prints_the_winners_and_logs_to_stderr(monkeypatch, capsys):
    def fake_tune(problems, *, log, report, freeze, **kw):
        log("searching ...")
        report([winner()])
        return 0

    monkeypatch.setattr(workflow, "tune", fake_tune)
    assert main(["--shape", "32x512x8192", "--json", "--no-freeze"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert [(r["problem"], r["frozen"]) for r in rows] == [(P.key, False)]
    assert "searching ..." in err and "done in" in err


def test_dry_run_json_prints_the_builds(monkeypatch, capsys):
    def fake_dry_run(problem, *, log, report, **kw):
        log("compiling ...")
        report(problem, [Build("a", "ok", registers=40, spill_bytes=0), Build("b", "compile_error")])
        return 1

    monkeypatch.setattr(dryrun, "dry_run", fake_dry_run)
    assert main(["--shape", "32x512x8192", "--dry-run", "--json"]) == 1
    out, err = capsys.readouterr()
    assert [(r["variant"], r["status"], r["registers"]) for r in json.loads(out)] == [
        ("a", "ok", 40), ("b", "compile_error", -1)]
    assert "compiling ..." in err


def test_bench_json(monkeypatch, tmp_path, capsys):
    suite = tmp_path / "s.txt"
    suite.write_text("--shape 2x4x64\n")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(worker, "machine_info", lambda: {**MACHINE, "driver": "x", "torch": "x", "cuda": "x"})
    monkeypatch.setattr(bench_main, "measure", lambda p, names: [
        {"problem": p.key, "shape": "2x4x64", "kernel_size": 3, "stride": 1, "padding": 1, "dilation": 1,
         "bias": False, "implementation": "copy_", "ms": 0.01, "x_copy": 1.0, "correct": True}])
    assert bench_main.main(["--suite", str(suite), "--out", str(tmp_path), "--json"]) == 0
    out, err = capsys.readouterr()
    results = json.loads(out)
    assert results["suites"]["s"][0]["problem"] == "2x4x64_k3_s1_p1_d1_fp32_bcl_nobias"
    assert results == json.loads((tmp_path / "results.json").read_text())
    assert "2x4x64_k3_s1_p1_d1_fp32_bcl_nobias ..." in err
