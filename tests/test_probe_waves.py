"""scripts/probe-waves.py on the CPU: its file is read as a suite (one clear line for a bad one) before it asks for
a GPU."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "probe-waves.py"), *args],
                          capture_output=True, text=True, cwd=ROOT)


def test_a_bad_row_is_one_line_naming_the_file_and_line(tmp_path):
    f = tmp_path / "rows.txt"
    f.write_text("# a comment\n--shape 8x4096x2048 --kernel-size 0\n")
    r = run(str(f))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and f"{f}:2:" in r.stderr


def test_a_missing_file_is_one_line():
    r = run("no-such-rows.txt")
    assert r.returncode == 2 and r.stderr.strip() == "probe-waves: suite file no-such-rows.txt not found"


def test_the_committed_rows_read_as_a_suite():
    from dwgen.suite import read_suite

    assert len(read_suite(ROOT / "scripts" / "waves-untuned.txt")) == 30
