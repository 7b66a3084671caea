"""The build cache's decisions without nvcc: what a killed build leaves is cleared, never taken as built."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dwgen import build
from dwgen.problem import Problem
from dwgen.space import enumerate_space

SOURCE = 'extern "C" __global__ void tiny(float* y) { y[0] = 1.0f; }\n'


@pytest.fixture
def fake_nvcc(monkeypatch):
    """nvcc stand-in: writes a library to the -o path and a ptxas report; records each compile."""
    calls = []

    def run(cmd, timeout_s):
        out = cmd[cmd.index("-o") + 1]
        calls.append(out)
        with open(out, "wb") as f:
            f.write(b"\x7fELF fake")
        return subprocess.CompletedProcess(cmd, 0, "ptxas info    : Used 32 registers\n", "")

    monkeypatch.setattr(build, "nvcc_path", lambda: "/fake/bin/nvcc")
    monkeypatch.setattr(build, "_run_killable", run)
    return calls


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_finished_build_is_reused(tmp_path, fake_nvcc):
    first = build.compile_library("tiny", SOURCE, "k", tmp_path)
    again = build.compile_library("tiny", SOURCE, "k", tmp_path)
    assert first.ok and not first.cached and again.ok and again.cached and len(fake_nvcc) == 1
    assert again.registers == 32


def test_a_library_of_another_source_under_the_key_is_rebuilt(tmp_path, fake_nvcc):
    # what probe-ab's old keys could leave in runs/build: an edited source's library under its variant's key
    build.compile_library("tiny", SOURCE.replace("1.0f", "2.0f"), "k", tmp_path)
    b = build.compile_library("tiny", SOURCE, "k", tmp_path)
    assert b.ok and not b.cached and len(fake_nvcc) == 2
    assert (tmp_path / "k" / "tiny.cu").read_text() == SOURCE


@pytest.mark.parametrize("left", [
    {"tiny.so": b"\x7fELF"},                                      # a library without its log
    {"tiny.log": "ptxas", "tiny.cu": SOURCE[:20]},                # killed between the log and the rename
    {"tiny.cu": SOURCE[:20]},                                     # killed during nvcc: a half-written source
])
def test_what_a_kill_leaves_is_rebuilt(tmp_path, fake_nvcc, left):
    out = tmp_path / "k"
    out.mkdir()
    for name, content in left.items():
        (out / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    b = build.compile_library("tiny", SOURCE, "k", tmp_path)
    assert b.ok and not b.cached and len(fake_nvcc) == 1
    assert (out / "tiny.cu").read_text() == SOURCE and (out / "tiny.so").read_bytes() == b"\x7fELF fake"


def test_stale_temps_are_cleared_and_a_live_builds_kept(tmp_path, fake_nvcc):
    out = tmp_path / "k"
    out.mkdir()
    live = os.getppid()  # runs for as long as this test does
    old = time.time() - 3 * 120
    files = {
        f".tmp-{dead_pid()}-a1b2.so": None,   # its build was killed: cleared at once
        f".tmp-{dead_pid()}-c3d4.cu": None,
        f".tmp-{live}-e5f6.so": None,         # a concurrent build, compiling now: kept
        f".tmp-{live}-g7h8.so": old,          # alive by pid, older than any compile: a recycled pid, cleared
        "tmpold123.so": old,                  # mkstemp's old names: cleared once older than any compile
        "tmpnew456.so": None,                 # ...and kept while a compile could still be writing it
    }
    for name, mtime in files.items():
        (out / name).write_bytes(b"half")
        if mtime:
            os.utime(out / name, (mtime, mtime))
    b = build.compile_library("tiny", SOURCE, "k", tmp_path, timeout_s=120)
    assert b.ok and not b.cached
    assert sorted(p.name for p in out.iterdir()) == sorted([f".tmp-{live}-e5f6.so", "tmpnew456.so", "tiny.cu",
                                                            "tiny.log", "tiny.so"])


def test_a_cached_build_is_not_confused_by_leftovers(tmp_path, fake_nvcc):
    build.compile_library("tiny", SOURCE, "k", tmp_path)
    (tmp_path / "k" / f".tmp-{dead_pid()}-x.so").write_bytes(b"half")
    assert build.compile_library("tiny", SOURCE, "k", tmp_path).cached and len(fake_nvcc) == 1


def test_a_failed_compile_leaves_no_temp(tmp_path, monkeypatch):
    monkeypatch.setattr(build, "nvcc_path", lambda: "/fake/bin/nvcc")
    monkeypatch.setattr(build, "_run_killable",
                        lambda cmd, timeout_s: subprocess.CompletedProcess(cmd, 2, "", "error: undeclared"))
    b = build.compile_library("tiny", SOURCE, "k", tmp_path)
    assert b.status == "compile_error"
    assert sorted(p.name for p in (tmp_path / "k").iterdir()) == ["tiny.cu", "tiny.error.log"]


def test_two_variants_never_share_a_build_directory(monkeypatch):
    monkeypatch.setattr(build, "nvcc_version", lambda: "cuda_12.4.r12.4/compiler.0")
    variants = [v for p in (Problem(8, 64, 2048), Problem(8, 64, 2048, dtype="bf16"),
                            Problem(8, 64, 2048, 4, 1, 3, dtype="fp16", layout="blc"))
                for v in enumerate_space(p)]
    keys = {build.build_key(v.digest, "sm_90") for v in variants}
    assert len(keys) == len({v.digest for v in variants}) == len(variants)
    assert all(build.build_key(v.digest, "sm_90").startswith(v.digest[:24]) for v in variants[:5])
    v = variants[0]  # the same variant for another GPU or compiler builds apart too
    assert len({build.build_key(v.digest, "sm_90"), build.build_key(v.digest, "sm_80")}) == 2
    monkeypatch.setattr(build, "nvcc_version", lambda: "cuda_12.6.r12.6/compiler.0")
    assert build.build_key(v.digest, "sm_90") not in keys


def test_one_key_with_two_sources_is_refused_before_any_compile(tmp_path, fake_nvcc):
    with pytest.raises(ValueError, match="share the build key k1 with different sources"):
        build.compile_many([("a", "// one", "k1"), ("b", "// two", "k1")], tmp_path)
    assert not list(tmp_path.iterdir())  # nothing compiled
    builds = build.compile_many([("a", "// one", "k1"), ("a", "// one", "k1")], tmp_path)  # a repeat is fine
    assert [b.status for b in builds] == ["ok", "ok"]


def test_a_build_key_takes_only_a_whole_digest():
    digest = "ab" * 32
    assert build.build_key(digest, "sm_90").startswith(digest[:24])
    for bad in (digest + "0123456789ab", digest[:40], "not-a-digest"):  # probe-ab's old key was the first
        with pytest.raises(ValueError, match="sha256 hex digest"):
            build.build_key(bad, "sm_90")
