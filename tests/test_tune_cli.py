"""tune.py's command line: one clear line for every mistake, suites parsed with the same flags."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dwgen.suite import read_suite
from tests.conftest import ROOT, has_gpu


def run(*args):
    return subprocess.run([sys.executable, str(ROOT / "tune.py"), *args], capture_output=True, text=True, cwd=ROOT)


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU message")
def test_without_gpu_one_line_and_nonzero(tmp_path):
    out = run("--shape", "2x4x64", "--runs-dir", str(tmp_path))
    assert out.returncode == 1
    assert out.stderr.strip().splitlines() == [
        "tune.py: no CUDA GPU found: tuning needs one (`--dry-run` compiles the space without a GPU)"]
    assert not (tmp_path / "dwgen.db").exists()


def test_suite_files_parse(tmp_path):
    problems = read_suite(ROOT / "benchmarks" / "suite.txt")
    assert len(problems) == 11 and problems[0].key == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"
    assert problems[5].stride == 2
    bad = tmp_path / "bad.txt"
    bad.write_text("--shape 2x2x64\n--shape 2x2 # broken\n")
    with pytest.raises(Exception, match=r"bad.txt:2: malformed shape"):
        read_suite(bad)


@pytest.mark.nvcc
def test_dry_run_compiles_a_small_space(tmp_path):
    # K31 on a short row leaves a small space; the whole of it compiles without a GPU
    out = run("--shape", "1x1x128", "--kernel-size", "31", "--dry-run", "--runs-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "built" in out.stdout and "FAILED" not in out.stdout
