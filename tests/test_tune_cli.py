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
    assert len(problems) == 13 and problems[0].key == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"
    assert problems[5].stride == 2
    # Mamba's conv, causal with SiLU, in both memory orders
    assert [p.key for p in problems[-2:]] == ["8x4096x2048_k4_s1_p3_d1_bf16_bcl_nobias_pr0_silu",
                                              "8x4096x2048_k4_s1_p3_d1_bf16_blc_nobias_pr0_silu"]
    assert all(p.causal and p.activation == "silu" and p.out_length == 2048 for p in problems[-2:])
    bad = tmp_path / "bad.txt"
    bad.write_text("--shape 2x2x64\n--shape 2x2 # broken\n")
    with pytest.raises(Exception, match=r"bad.txt:2: malformed shape"):
        read_suite(bad)


@pytest.mark.nvcc
@pytest.mark.slow
def test_dry_run_compiles_a_small_space(tmp_path):
    # K31 on a short row leaves the forward's smallest space (80 variants, about two minutes on two cores: slow);
    # the whole of it compiles without a GPU
    out = run("--shape", "1x1x128", "--kernel-size", "31", "--dry-run", "--runs-dir", str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert "built" in out.stdout and "FAILED" not in out.stdout


def test_backward_of_a_strided_problem_is_refused_in_one_line(tmp_path):
    out = run("--shape", "4x64x1000", "--stride", "2", "--direction", "bwd", "--dry-run", "--runs-dir", str(tmp_path))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["tune.py: the fused backward is stride 1 only; other strides use the generic "
                                       "backward"]
    assert not (tmp_path / "build").exists()


@pytest.mark.nvcc
def test_dry_run_compiles_the_backward_space(tmp_path):
    import json

    from dwgen.problem import Problem
    from dwgen.space import enumerate_space

    # padding 2 (Lout = L + 2: neither causal nor centred), so that the fused family is the whole space
    out = run("--shape", "4x64x1000", "--padding", "2", "--direction", "bwd", "--dry-run", "--json", "--runs-dir",
              str(tmp_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    rows = json.loads(out.stdout)
    # the fused backward's whole space for this problem: tiles of at most 1000 positions, one channel a block,
    # staged as floats or as stored, a block walking 1, 2, 4 or 8 tiles where a channel's rows hold them; the
    # raw stage's 128-thread designs again with a ceiling of 56 registers (none of them spills at this size)
    assert [r["variant"] for r in rows] == [v.name for v in enumerate_space(Problem(4, 64, 1000, 3, 1, 2), "bwd")]
    assert [r["variant"] for r in rows][:3] == [
        "dw1d_bwd_f32_k3_t128_o2", "dw1d_bwd_f32_k3_t128_o2_b2", "dw1d_bwd_f32_k3_t128_o2_b4"]
    assert all(r["status"] == "ok" and r["spill_bytes"] == 0 for r in rows)
    assert "4x64x1000_k3_s1_p2_d1_fp32_bcl_nobias_bwd: 32 valid variants" in out.stderr


def test_a_suite_skips_its_strided_problems_backward_with_a_note(tmp_path, capsys):
    """They keep the generic backward; the rest of the suite is tuned."""
    from dwgen.problem import Problem
    from search.cli import tunable

    strided, plain = Problem(4, 2048, 8192, 3, 2, 1), Problem(4, 64, 1000)
    assert tunable([strided, plain], "bwd", tmp_path / "suite.txt") == [plain]
    assert capsys.readouterr().err.splitlines() == [
        "tune.py: skipping 4x2048x8192_k3_s2_p1_d1_fp32_bcl_nobias: the fused backward is stride 1 only; other "
        "strides use the generic backward"]
    assert tunable([strided, plain], "fwd", tmp_path / "suite.txt") == [strided, plain]  # the forward has both


def test_a_suite_of_strided_problems_only_has_no_backward_to_tune(tmp_path):
    suite = tmp_path / "suite.txt"
    suite.write_text("--shape 4x2048x8192 --kernel-size 3 --padding 1 --stride 2\n"
                     "--shape 4x64x1000 --stride 3\n")
    out = run("--suite", str(suite), "--direction", "bwd", "--dry-run", "--runs-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"tune.py: the fused backward is stride 1 only; other strides use the generic backward: no problem of "
        f"{suite} has a fused backward to tune"]


@pytest.mark.parametrize("args, paddings, activation", [
    ([], (1, 1), "none"),
    (["--padding", "2"], (2, 2), "none"),
    (["--padding", "same"], (1, 1), "none"),
    (["--padding", "causal"], (2, 0), "none"),
    (["--padding", "causal", "--dilation", "3", "--activation", "silu"], (6, 0), "silu"),
    (["--padding", "causal", "-k", "1"], (0, 0), "none"),
    (["--activation", "none"], (1, 1), "none"),
])
def test_padding_and_activation_flags_make_the_problem(args, paddings, activation):
    from dwgen.suite import problem_from_args
    from search.cli import parse_args

    p = problem_from_args(parse_args(["--shape", "2x4x64", *args]))
    assert (p.paddings, p.activation) == (paddings, activation)


def test_a_causal_silu_problem_reads_the_same_from_the_command_line_a_suite_and_a_recording(tmp_path):
    from dwgen.problem import Problem
    from dwgen.recording import suite_line
    from dwgen.suite import problem_from_args
    from search.cli import parse_args

    line = "--shape 8x4096x2048 --kernel-size 4 --padding causal --activation silu --dtype bf16 --layout blc"
    p = problem_from_args(parse_args(line.split()))
    assert p == Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc", padding_right=0, activation="silu")
    suite = tmp_path / "s.txt"
    suite.write_text(f"{line}\n{suite_line(p)}\n")
    assert read_suite(suite) == [p, p]


def test_activation_beside_a_suite_is_refused(tmp_path):
    suite = tmp_path / "s.txt"
    suite.write_text("--shape 2x4x64\n")
    out = run("--suite", str(suite), "--activation", "silu", "--runs-dir", str(tmp_path))
    assert out.returncode == 2 and out.stderr.splitlines() == [
        "tune.py: --activation does nothing with --suite: write it on the suite file's lines"]


def test_seeds_from_names_the_folder_whose_winners_are_asked_first(tmp_path, monkeypatch):
    from search import cli as search_cli
    from search import workflow

    seen = {}

    def fake_tune(problems, **kw):
        seen.update(kw)
        return 0

    monkeypatch.setattr(workflow, "tune", fake_tune)
    old = tmp_path / "before-the-change"
    old.mkdir()
    assert search_cli.main(["--shape", "2x4x64", "--seeds-from", str(old), "--runs-dir", str(tmp_path)]) == 0
    assert seen["seeds_from"] == old
    assert search_cli.main(["--shape", "2x4x64", "--runs-dir", str(tmp_path)]) == 0
    assert seen["seeds_from"] is None  # generated/ itself
    (tmp_path / "a-file").write_text("")
    assert run("--shape", "2x4x64", "--seeds-from", str(tmp_path / "a-file")).returncode == 2
