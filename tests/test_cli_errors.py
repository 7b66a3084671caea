"""Every bad input of the README's "Bad input" table: one line on stderr, a non-zero exit, no traceback."""
from __future__ import annotations

import importlib
import shlex
import subprocess
import sys

import pytest

from dwgen.suite import problem_from_args, read_suite
from tests.conftest import ROOT, has_gpu

README = (ROOT / "README.md").read_text()
ENTRY_POINTS = {"tune.py": "tune", "python -m search.compare": "search.compare",
                "python -m search.generic": "search.generic", "python -m search.profile": "search.profile",
                "python -m dwgen.bench": "dwgen.bench.__main__"}
S = "--shape 2x2x64"
K3 = "--shape 4x8x1000 dw1d_f32_k3_t128_v4_o2_l1"

# (command as the README shows it, exit status, a part of the one line it must print). Files named here are
# made by the `files` fixture in the working directory of the test.
CASES = [
    ("tune.py --shape -1x2x3", 2, "malformed shape '-1x2x3'"),
    ("tune.py --shape 32x512", 2, "malformed shape '32x512'"),
    ("tune.py --shape 0x512x8192", 2, "batch must be a positive integer, got 0"),
    ("tune.py --shape 100000x100000x100000", 2, "2**31 or more elements"),
    ("tune.py --shape 2x2x2 -k 5 --padding 0", 2, "no output: length 2 with padding 0"),
    (f"tune.py {S} --kernel-size 100000 --dry-run", 2, "100000 is out of range: give an integer from 1 to 64"),
    (f"tune.py {S} --kernel-size 0", 2, "0 is out of range: give an integer from 1 to 64"),
    (f"tune.py {S} --kernel-size three", 2, "'three' is not an integer"),
    (f"tune.py {S} --stride 5", 2, "5 is out of range: give an integer from 1 to 4"),
    (f"tune.py {S} --dilation 9", 2, "9 is out of range: give an integer from 1 to 8"),
    ("tune.py --shape 2x2x4096 -k 64 --dilation 8 --dry-run", 2, "can be built (window_fits_registers)"),
    (f"tune.py {S} -k 4 --padding same", 2, "--padding same needs an odd kernel size"),
    (f"tune.py {S} --padding -1", 2, "-1 is out of range: give 'same', 'causal' or an integer of at least 0"),
    (f"tune.py {S} --padding half", 2, "'half' is neither 'same', 'causal' nor an integer"),
    (f"tune.py {S} --activation relu", 2, "argument --activation: invalid choice: 'relu' (choose from 'none', 'silu')"),
    (f"tune.py {S} --stand-in", 2, "--stand-in: K3 at stride 1 and dilation 1 runs the fast generic kernels"),
    (f"tune.py {S} --layout nhwc", 2, "unknown layout 'nhwc'"),
    (f"tune.py {S} --stride 2 --direction bwd", 2,
     "the fused backward is stride 1 only; other strides use the generic backward"),
    (f"tune.py {S} --direction up", 2, "invalid choice: 'up'"),
    (f"tune.py {S} --dtype fp64", 2, "unknown dtype 'fp64'"),
    (f"tune.py {S} --trials 0", 2, "0 is out of range: give an integer of at least 1"),
    (f"tune.py {S} --trials many", 2, "'many' is not an integer"),
    (f"tune.py {S} --timeout 0", 2, "0 is not a positive, finite number of seconds"),
    (f"tune.py {S} --timeout nan", 2, "nan is not a positive, finite number of seconds"),
    (f"tune.py {S} --jobs -1", 2, "-1 is out of range: give an integer of at least 1"),
    (f"tune.py {S} --jobs 0", 2, "0 is out of range: give an integer of at least 1"),
    (f"tune.py {S} --seed -1", 2, "-1 is out of range: give an integer from 0 to 4294967295"),
    (f"tune.py {S} --seed 4294967296", 2, "4294967296 is out of range"),
    (f"tune.py {S} --sampler annealing", 2, "invalid choice: 'annealing'"),
    (f"tune.py {S} --arch 90", 2, "'90' is not a GPU architecture"),
    (f"tune.py {S} --storage notaurl://x", 2, "'notaurl://x' is not a storage dwgen can open"),
    (f"tune.py {S} --storage runs/dwgen.db", 2, "'runs/dwgen.db' is not a storage dwgen can open"),
    (f"tune.py {S} --storage sqlite:///nodir/x.db", 1, "cannot open storage sqlite:///nodir/x.db"),
    (f"tune.py {S} --storage sqlite:///notdb.db", 1, "file is not a database"),
    (f"tune.py {S} --storage postgresql://localhost:1/dwgen", 1, "cannot open storage postgresql://localhost:1"),
    (f"tune.py {S} --storage journal://x.journal", 2, "'journal://x.journal' is not a storage dwgen can open"),
    (f"tune.py {S} --storage journal:///nodir/x.journal", 1, "no folder for the journal file 'nodir/x.journal'"),
    (f"tune.py {S} --workers 0", 2, "argument --workers: 0 is out of range: give an integer of at least 1"),
    (f"tune.py {S} --workers 2 --storage memory", 1, "--workers needs a storage its workers share"),
    (f"tune.py {S} --compile-timeout 0", 2, "argument --compile-timeout: 0 is not a positive, finite number"),
    (f"tune.py {S} --run-timeout inf", 2, "argument --run-timeout: inf is not a positive, finite number"),
    (f"tune.py {S} --runs-dir afile", 2, "afile exists and is not a folder"),
    (f"tune.py {S} --out afile", 2, "afile exists and is not a folder"),
    ("tune.py --suite missing.txt", 2, "suite file missing.txt not found"),
    ("tune.py --suite adir", 2, "cannot read suite file adir: Is a directory"),
    ("tune.py --suite binary.txt", 2, "cannot read suite file binary.txt: 'utf-8' codec can't decode"),
    ("tune.py --suite quote.txt", 2, "quote.txt:1: No closing quotation"),
    ("tune.py --suite badline.txt", 2, "badline.txt:1: malformed shape '2x2'"),
    ("tune.py --suite bigk.txt", 2, "bigk.txt:1: argument --kernel-size/-k: 100 is out of range"),
    ("tune.py --suite empty.txt", 2, "suite file empty.txt lists no problems"),
    ("tune.py --suite ok.txt -k 5", 2, "--kernel-size does nothing with --suite"),
    (f"tune.py --suite ok.txt {S}", 2, "give either --shape BxCxL or --suite FILE"),
    ("tune.py", 2, "give either --shape BxCxL or --suite FILE"),
    ("tune.py --shape --dry-run", 2, "argument --shape: expected one argument"),
    (f"tune.py {S} --frobnicate", 2, "unrecognized arguments: --frobnicate"),
    ("python -m search.compare --shape 4x8x1000 dw1d_f32_k7_t128_v4_o2_l1", 2, "is not a variant of"),
    (f"python -m search.compare {K3} --vary colour", 2, "unknown axis 'colour'"),
    (f"python -m search.compare {K3} --rounds 0", 2, "0 is out of range: give an integer of at least 1"),
    (f"python -m search.compare {K3} --jobs -1", 2, "-1 is out of range: give an integer of at least 1"),
    ("python -m search.compare --shape -1x2x3 dw1d_f32_k3_t128_v4_o2_l1", 2, "malformed shape '-1x2x3'"),
    ("python -m search.generic --kernel-sizes 17", 2, "K=17 has no generic kernel"),
    ("python -m search.generic --kernel-sizes 3,x", 2, "K=x has no generic kernel"),
    ("python -m search.generic --out afile", 2, "afile exists and is not a folder"),
    ("python -m search.generic --dtypes fp64", 2, "dtype=fp64 has no generic kernel"),
    ("python -m search.generic --jobs 0", 2, "0 is out of range: give an integer of at least 1"),
    ("python -m search.profile --shape 4x8x1000 dw1d_f32_k7_t128_v4_o2_l1", 2, "is not a variant of"),
    (f"python -m search.profile {K3} --launches 0", 2, "0 is out of range: give an integer of at least 1"),
    ("python -m dwgen.bench --suite missing.txt", 2, "suite file missing.txt not found"),
    ("python -m dwgen.bench --suite badline.txt", 2, "badline.txt:1: malformed shape '2x2'"),
    ("python -m dwgen.bench --only fastest", 2, "unknown contender(s) ['fastest']"),
    ("python -m dwgen.bench --out afile", 2, "afile exists and is not a folder"),
]
# Rows that need a machine without a GPU; on a GPU host they would start real work.
NO_GPU_CASES = [
    (f"tune.py {S}", 1, "no CUDA GPU found: tuning needs one"),
    (f"python -m search.compare {K3}", 1, "no CUDA GPU found: tuning needs one"),
    ("python -m dwgen.bench", 1, "no CUDA GPU found; the benchmark runs on the GPU host"),
]


def split(command: str) -> tuple[str, list[str]]:
    entry = next(e for e in sorted(ENTRY_POINTS, key=len, reverse=True) if command.startswith(e))
    return entry, shlex.split(command[len(entry):])


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("not a folder\n")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00--shape")
    (tmp_path / "quote.txt").write_text('--shape "2x2x64\n')
    (tmp_path / "badline.txt").write_text("--shape 2x2\n")
    (tmp_path / "bigk.txt").write_text("--shape 2x2x64 -k 100\n")
    (tmp_path / "empty.txt").write_text("# nothing here\n\n")
    (tmp_path / "ok.txt").write_text("--shape 2x2x64\n")
    (tmp_path / "notdb.db").write_text("this is not an SQLite database\n" * 10)
    return tmp_path


def call(command: str, capsys) -> tuple[int, str]:
    entry, args = split(command)
    main = importlib.import_module(ENTRY_POINTS[entry]).main
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's errors exit from inside main
        rc = e.code
    return rc, capsys.readouterr().err


@pytest.fixture
def fake_gpu(monkeypatch):
    """A GPU as far as tune.py's wiring can tell: the storage is opened, and nothing may be built."""
    from search import workflow

    def no_build(variants):
        raise AssertionError("a bad input reached the build")

    monkeypatch.setattr(workflow, "gpu_arch", lambda: "sm_90")
    monkeypatch.setattr(workflow, "gpu_builder", lambda runs_dir, jobs, timeout_s=None: no_build)


@pytest.mark.parametrize("command, rc, msg", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_and_nonzero(command, rc, msg, files, fake_gpu, capsys):
    got, err = call(command, capsys)
    prog = split(command)[0]
    assert (got, err.count("\n")) == (rc, 1), err
    assert err.startswith(f"{prog}: ") and msg in err, err


@pytest.mark.skipif(has_gpu(), reason="checks the no-GPU message")
@pytest.mark.parametrize("command, rc, msg", NO_GPU_CASES, ids=[c[0] for c in NO_GPU_CASES])
def test_without_a_gpu_one_line_and_nonzero(command, rc, msg, files, capsys):
    got, err = call(command, capsys)
    assert (got, err.count("\n")) == (rc, 1), err
    assert msg in err, err


@pytest.mark.parametrize("command", ["tune.py --shape -1x2x3", f"tune.py {S} --storage notaurl://x",
                                     f"python -m search.profile {K3} --launches -2",
                                     "python -m search.generic --kernel-sizes 17",
                                     "python -m dwgen.bench --only fastest"])
def test_a_real_process_exits_2_without_a_traceback(command):
    entry, args = split(command)
    argv = [str(ROOT / "tune.py")] if entry == "tune.py" else ["-m", ENTRY_POINTS[entry]]
    r = subprocess.run([sys.executable, *argv, *args], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2 and len(r.stderr.splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr


def readme_rows() -> dict[str, str]:
    section = README.split("## Bad input", 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]
    return {line.split("`")[1]: line for line in section.splitlines() if line.startswith("| `")}


def test_readme_table_is_the_tested_one():
    rows = readme_rows()
    cases = CASES + NO_GPU_CASES
    assert sorted(rows) == sorted(c[0] for c in cases)
    for command, rc, msg in cases:
        assert f"| {rc} |" in rows[command] and msg in rows[command], rows[command]


@pytest.mark.parametrize("k, dilation, expect", [(3, 1, 1), (7, 1, 3), (5, 3, 6), (1, 8, 0)])
def test_padding_same_centres_odd_kernels(k, dilation, expect, tmp_path):
    from search.cli import parse_args

    a = parse_args(["--shape", "2x2x64", "-k", str(k), "--dilation", str(dilation), "--padding", "same"])
    p = problem_from_args(a)
    assert p.padding == expect and p.out_length == 64
    suite = tmp_path / "s.txt"
    suite.write_text(f"--shape 2x2x64 -k {k} --dilation {dilation} --padding same\n")
    assert read_suite(suite) == [p]


def test_a_value_starting_with_a_dash_reaches_its_check():
    from dwgen import cli

    ap = cli.OneLineParser(prog="t")
    ap.add_argument("--shape")
    ap.add_argument("--flag", action="store_true")
    assert ap.parse_args(["--shape", "-1x2x3"]).shape == "-1x2x3"
    assert ap.parse_args(["--shape", "-1x2x3", "--flag"]).flag
    with pytest.raises(SystemExit):  # a real flag is never taken for the value
        ap.parse_args(["--shape", "--flag"])


@pytest.mark.parametrize("url", ["memory", "sqlite:///runs/dwgen.db", "sqlite:////abs/x.db",
                                 "postgresql+psycopg2://u:p@host:5432/db", "mysql://u@host/db"])
def test_good_storage_urls_pass(url):
    from dwgen import cli

    assert cli.storage(url) == url


def test_a_good_sqlite_storage_opens(tmp_path):
    from search import study as st

    s = st.open_storage(f"sqlite:///{tmp_path / 'x.db'}")
    assert s.get_all_studies() == [] and (tmp_path / "x.db").exists()
