"""Compiling: nvcc to one shared library per variant, in parallel, with a content-keyed cache.

Each library holds a variant's kernel and the host function that launches it (the launch contract); the
search loads it with ctypes. The search never builds a torch extension; the frozen module in generated/
compiles the same sources into its own, since it may import nothing but torch.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path

from dwgen.space import NVCC_FLAGS

DEFAULT_ARCH = "sm_90"
CUDA_HOME_GUESS = "/usr/local/cuda"
# How long one variant may compile before its nvcc (with the host compiler, cicc and ptxas it started) is
# killed and the variant recorded as a timeout; the slowest variants of the space take a few seconds.
COMPILE_TIMEOUT_S = 120.0


class ToolchainError(RuntimeError):
    """nvcc is missing or unusable: nothing can be built."""


@dataclass(frozen=True)
class Build:
    """What compiling one source produced: a shared library, or a status with the log that explains it."""

    name: str
    status: str  # "ok" | "compile_error" | "timeout"
    library: str = ""
    log: str = ""
    log_path: str = ""
    seconds: float = 0.0
    registers: int = -1
    spill_bytes: int = -1
    smem_bytes: int = -1
    stack_bytes: int = -1
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def for_activation(self, activation: str) -> Build:
        """The figures of the kernels a problem with this activation runs (its ACT instance and any kernel
        without one, such as the backward's weight sum), not the worst of every instance compiled."""
        if not self.ok:
            return self
        return replace(self, **parse_ptxas(self.log, 1 if activation == "silu" else 0))


def cuda_home() -> str:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if not home and Path(CUDA_HOME_GUESS, "bin", "nvcc").exists():
        home = CUDA_HOME_GUESS
    if not home:
        found = shutil.which("nvcc")
        home = str(Path(found).resolve().parent.parent) if found else ""
    return home


def nvcc_path() -> str:
    home = cuda_home()
    nvcc = Path(home, "bin", "nvcc") if home else None
    if not nvcc or not nvcc.exists():
        raise ToolchainError("nvcc not found: install the CUDA toolkit and set CUDA_HOME (e.g. /usr/local/cuda)")
    return str(nvcc)


@functools.cache
def nvcc_version() -> str:
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"Build (\S+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


def build_key(digest: str, arch: str) -> str:
    """Build-cache key: the variant's content digest plus the target and the compiler that built it. Only a
    whole sha256 digest is taken: the key keeps its first 24 characters, so anything appended to one (as
    probe-ab once did to tell an edited source from its original) would be cut off and two sources would
    share one library."""
    if not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ValueError(f"build_key takes a sha256 hex digest of the source, not {digest!r}")
    return f"{digest[:24]}-{arch}-{re.sub(r'[^A-Za-z0-9.]+', '.', nvcc_version())}"


_PTXAS_USED = re.compile(r"Used (\d+) registers")
_PTXAS_SMEM = re.compile(r"(\d+) bytes smem")
_PTXAS_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


_PTXAS_ENTRY = re.compile(r"Compiling entry function '([^']*)'")
_KERNEL_INSTANCE = re.compile(r"_Z\d+(\w+?)ILi(-?\d+)E")  # name<int>(...), mangled: the template's int is ACT


def kernel_instance(function: str) -> tuple[str, int | None]:
    """A kernel's name and its ACT template argument from its (mangled) function name; None for a kernel that
    is no template instance (the backward's weight sum, the extern "C" ones)."""
    m = _KERNEL_INSTANCE.match(function)
    return (m.group(1), int(m.group(2))) if m else (function, None)


def parse_ptxas(log: str, act: int | None = None) -> dict:
    """Registers, shared memory, stack and spill bytes from `-Xptxas -v` output, of the variant's worst
    kernel: a variant holds several (the ACT=0 and ACT=1 instances, the backward's weight sum), and the one
    ptxas lists first is not always the one that runs. With `act`, only the kernels a problem of that
    activation runs count (the other ACT instance is left out)."""
    found = list(_PTXAS_ENTRY.finditer(log))
    cuts = [m.start() for m in found] or [0]
    entries = [log[a:b] for a, b in zip(cuts, [*cuts[1:], len(log)], strict=True)]
    if act is not None and found:
        entries = [e for e, m in zip(entries, found, strict=True) if kernel_instance(m.group(1))[1] in (None, act)]
    text = "".join(entries)
    regs = [int(m.group(1)) for m in _PTXAS_USED.finditer(text)]
    smem = [int(m.group(1)) for m in _PTXAS_SMEM.finditer(text)]
    spills = [(int(m.group(1)), int(m.group(2)) + int(m.group(3))) for m in _PTXAS_SPILL.finditer(text)]
    return {
        "registers": max(regs, default=-1),
        "smem_bytes": max(smem, default=0),
        "stack_bytes": max((s for s, _ in spills), default=-1),
        "spill_bytes": max((b for _, b in spills), default=-1),
    }


_TEMP_PREFIX = ".tmp-"  # + the compiling process's pid + "-": a temp whose pid is gone was left by a kill
_LEGACY_TEMP = re.compile(r"^tmp\w+\.so$")  # mkstemp's names, from before temps carried a pid


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def clear_stale_temps(out_dir: Path, timeout_s: float) -> list[str]:
    """Remove half-written libraries that a killed build left in out_dir; returns their names.

    A temp is stale when its process is gone, or when it is older than any compile may run (which also
    covers another host's temps in a shared folder and a recycled pid); a live build's temp is kept."""
    removed = []
    now = time.time()
    for path in Path(out_dir).iterdir():
        name = path.name
        if name.startswith(_TEMP_PREFIX):
            pid = name[len(_TEMP_PREFIX):].split("-", 1)[0]
            gone = pid.isdigit() and not _pid_alive(int(pid))
        elif _LEGACY_TEMP.match(name):
            gone = False
        else:
            continue
        try:
            if gone or now - path.stat().st_mtime > 2 * timeout_s:
                path.unlink()
                removed.append(name)
        except FileNotFoundError:  # another process cleared it first
            pass
    return removed


def _write_source(src: Path, source: str) -> None:
    """Write the source by rename: a concurrent build of the same key may be compiling the file now, and
    truncating it under that nvcc would turn a valid variant into a compile error."""
    if src.exists() and src.read_text() == source:
        return
    fd, tmp = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", suffix=".cu", dir=src.parent)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, src)


def _run_killable(cmd: list[str], timeout_s: float) -> subprocess.CompletedProcess | None:
    """Run cmd in a process group of its own; None when it ran past timeout_s, after killing the whole group.

    Killing nvcc alone is not enough: the host compiler, cicc or ptxas it started would run on, holding
    the output pipes open, and waiting for those pipes to close would hang the build as long as they do."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return None
    except BaseException:  # Ctrl-C: leave no compiler behind
        _kill_group(proc)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone, with all it started
        pass


def compile_library(name: str, source: str, key: str, cache_dir: Path, arch: str = DEFAULT_ARCH,
                    timeout_s: float = COMPILE_TIMEOUT_S) -> Build:
    """Compile one source to a shared library under cache_dir/key/, reusing a previous build of the same key.

    The CUDA runtime is linked as a shared library: loaded into a torch process, the variant then uses
    torch's own runtime, its current device and its streams. A build counts as done only when both its
    library and its log are there (the library is renamed into place after the log is written); what a
    killed build left (temps, a source without a library) is cleared or rewritten, never trusted; nor is a
    library built from another source under this key (the source beside it differs): it is rebuilt."""
    out_dir = Path(cache_dir) / key
    library = out_dir / f"{name}.so"
    log_path = out_dir / f"{name}.log"
    built_from = out_dir / f"{name}.cu"
    if library.exists() and log_path.exists() and built_from.exists() and built_from.read_text() == source:
        log = log_path.read_text()
        return Build(name, "ok", str(library), log, str(log_path), 0.0, cached=True, **parse_ptxas(log))
    out_dir.mkdir(parents=True, exist_ok=True)
    clear_stale_temps(out_dir, timeout_s)
    src = out_dir / f"{name}.cu"
    _write_source(src, source)
    # Compile into a temporary name and rename: a killed build never leaves a half-written library.
    fd, tmp = tempfile.mkstemp(prefix=f"{_TEMP_PREFIX}{os.getpid()}-", suffix=".so", dir=out_dir)
    os.close(fd)
    cmd = [nvcc_path(), "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", f"-arch={arch}", *NVCC_FLAGS,
           "-Xptxas", "-v", "-o", tmp, str(src)]
    t0 = time.perf_counter()
    proc = _run_killable(cmd, timeout_s)
    if proc is None:
        os.unlink(tmp)
        return Build(name, "timeout", log=f"compile timeout: nvcc ran past {timeout_s:g} s and was killed",
                     log_path=str(src), seconds=timeout_s)
    seconds = time.perf_counter() - t0
    log = " ".join(cmd) + "\n" + proc.stdout + proc.stderr
    if proc.returncode != 0:
        os.unlink(tmp)
        err = out_dir / f"{name}.error.log"
        err.write_text(log)
        return Build(name, "compile_error", log=log, log_path=str(err), seconds=seconds)
    log_path.write_text(log)
    os.replace(tmp, library)
    return Build(name, "ok", str(library), log, str(log_path), seconds, **parse_ptxas(log))


def compile_many(jobs: Iterable[tuple[str, str, str]], cache_dir: Path, arch: str = DEFAULT_ARCH,
                 workers: int | None = None, on_done: Callable[[Build], None] | None = None,
                 timeout_s: float = COMPILE_TIMEOUT_S) -> list[Build]:
    """Compile (name, source, key) jobs in parallel; nvcc is a subprocess, so threads suffice.

    Returns the builds in the order of `jobs`; `on_done` sees each build as it finishes (in this thread),
    so that a long compile can show progress. A job that compiles longer than `timeout_s` is killed and
    returned as a timeout. Two jobs with one key must have one source: they would build into one folder and
    library, so that every caller loads whichever source compiled last."""
    jobs = list(jobs)
    sources: dict[str, str] = {}
    for name, source, key in jobs:
        if sources.setdefault(key, source) != source:
            raise ValueError(f"{name}: two jobs share the build key {key} with different sources; "
                             "derive the key from the source (build_key of its digest)")
    workers = workers or max(1, os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [pool.submit(compile_library, n, s, k, cache_dir, arch, timeout_s) for n, s, k in jobs]
        try:
            if on_done is not None:
                for f in as_completed(futures):
                    on_done(f.result())
            return [f.result() for f in futures]
        except BaseException:
            # Ctrl-C (or a failing callback) should not wait for thousands of queued nvcc runs.
            pool.shutdown(wait=True, cancel_futures=True)
            raise
