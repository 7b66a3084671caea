"""scripts/renders-table.py reads the `renders` step's log into one line a problem."""
from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "renders-table.py"
spec = importlib.util.spec_from_file_location("renders_table", SCRIPT)
renders_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(renders_table)

LOG = """== .renders/base (round 1)
fp32 8x1024x4000 K5 D2     rc 0  0.1023 ms  memcpy 0.0642 ms  1.59x  hash d61ac2123e69de71  no error
bwd fp16 16x512x2000 K15   rc 0  0.1419 ms  hash aaaa  no error
== .renders/new (round 1)
fp32 8x1024x4000 K5 D2     rc 0  0.0841 ms  memcpy 0.0642 ms  1.31x  hash d61ac2123e69de71  no error
bwd fp16 16x512x2000 K15   rc 0  0.1420 ms  hash bbbb  no error
== .renders/base (round 2)
fp32 8x1024x4000 K5 D2     rc 0  0.1025 ms  memcpy 0.0642 ms  1.60x  hash d61ac2123e69de71  no error
"""


def test_each_problem_gets_each_renderings_range_and_whether_the_outputs_agree():
    lines = renders_table.table(LOG.splitlines(keepends=True))
    assert lines[0].split()[:3] == ["problem", "base", "new"]
    assert lines[1].split() == ["fp32", "8x1024x4000", "K5", "D2", "0.1023/0.1025", "0.0841/0.0841", "yes"]
    assert lines[2].split()[-1] == "NO"  # the two renderings' outputs hashed differently
    assert renders_table.table(LOG.splitlines(), ["new"])[1].split()[4] == "0.0841/0.0841"


def test_no_log_is_one_line_and_a_non_zero_exit(tmp_path, capsys):
    assert renders_table.main([str(tmp_path / "missing.log")]) == 1
    assert renders_table.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "missing.log" in err[0]
