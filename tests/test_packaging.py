"""pyproject.toml: the packages and data it names exist, dwgen-tune resolves to tune.py's main, deps match."""
from __future__ import annotations

import importlib
import re

import pytest

from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib")  # Python 3.11+
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_dwgen_tune_entry_point_resolves_to_tune_py_main():
    import tune

    module, _, attr = PYPROJECT["project"]["scripts"]["dwgen-tune"].partition(":")
    run = getattr(importlib.import_module(module), attr)
    assert callable(run) and run.__module__ == tune.main.__module__ == module


def test_dwgen_tune_runs_what_tune_py_runs(monkeypatch, capsys):
    import search.cli

    monkeypatch.setattr("sys.argv", ["dwgen-tune", "show", "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"])
    assert search.cli.run() == 0
    assert "dw1d_f32_k3_t128_v4_o2_l1" in capsys.readouterr().out


def test_packages_and_their_data_are_there():
    setuptools = PYPROJECT["tool"]["setuptools"]
    for pkg in setuptools["packages"]:
        assert (ROOT / pkg.replace(".", "/")).is_dir(), pkg
    for pkg, patterns in setuptools["package-data"].items():
        for pattern in patterns:
            if not pattern.startswith("."):
                assert list((ROOT / pkg).glob(pattern)), f"{pkg}/{pattern} matches nothing"


def test_dependencies_are_requirements_runtime_lines():
    # requirements.txt stays what CI installs; the package must not ask for something else
    lines = [ln.split("#")[0].strip() for ln in (ROOT / "requirements.txt").read_text().splitlines()]
    runtime = [ln for ln in lines if ln and not ln.startswith("pytest")]
    assert sorted(PYPROJECT["project"]["dependencies"]) == sorted(runtime)
    assert PYPROJECT["project"]["optional-dependencies"]["test"] == [ln for ln in lines if ln.startswith("pytest")]


def test_version_is_a_plain_version():
    assert re.fullmatch(r"\d+\.\d+\.\d+", PYPROJECT["project"]["version"])
