"""Wiring of one tuning run: study, builds, GPU worker, search, decision, freeze, report."""
from __future__ import annotations

import time
from pathlib import Path

from dwgen import build as builder
from dwgen import freeze as frz
from dwgen import render
from dwgen.problem import Problem
from dwgen.space import Variant
from search import loop
from search import study as st


class UserError(RuntimeError):
    """Something the user can fix; printed as one line."""


def gpu_arch() -> str:
    import torch

    if not torch.cuda.is_available():
        raise UserError("no CUDA GPU found: tuning needs one (`--dry-run` compiles the space without a GPU)")
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def make_builder(cache_dir: Path, arch: str, jobs: int | None):
    def build(variants: list[Variant]):
        return builder.compile_many(
            [(v.name, render.render_variant(v), builder.build_key(v.digest, arch)) for v in variants],
            cache_dir, arch=arch, workers=jobs)
    return build


def tune(problem: Problem, *, trials: int, timeout_s: float | None, sampler: str, seed: int, storage: str | None,
         runs_dir: Path, out_dir: Path, freeze: bool, jobs: int | None, log=print) -> int:
    from dwgen.worker import GpuWorker

    t_start = time.perf_counter()
    arch = gpu_arch()
    try:
        builder.nvcc_version()
    except builder.ToolchainError as e:
        raise UserError(str(e)) from e
    storage = storage or st.default_storage(runs_dir)
    study = st.open_study(problem, storage, sampler, seed)
    log(f"tuning {problem.key} on {arch}: study {study.study_name} in {storage}")
    build = make_builder(runs_dir / "build", arch, jobs)
    worker = GpuWorker(problem)
    try:
        machine = worker.machine()
        base = worker.baselines()
        log(f"{machine['gpu']}: copy_ of the same bytes {base['copy_ms']:.4f} ms, "
            f"PyTorch eager {base['torch_ms']:.4f} ms ({base['copy_ms'] / base['torch_ms'] * 100:.0f}% of copy speed)")
        known, stats = loop.search(problem, study, build, worker, trials=trials, timeout_s=timeout_s, log=log)
        decided = loop.decide(known, build, worker)
    finally:
        worker.close()
    wall = time.perf_counter() - t_start
    log(f"variants: {stats.asked} asked, {stats.skipped} skipped by restrictions, {stats.duplicates} duplicates, "
        f"{stats.built} built ({stats.build_failed} failed), {stats.correct} correct and timed; "
        f"failures {stats.failures or 'none'}")
    log(f"compile wall {stats.compile_wall_s:.1f} s, check+time wall {stats.evaluate_wall_s:.1f} s, "
        f"worker restarts {worker.restarts}")
    if decided is None:
        log("no correct variant found; generated/ left as it was")
        return 1
    v, r, times = decided
    log("re-timed finalists, interleaved (ms): " + ", ".join(f"{k} {t:.4f}" for k, t in times.items()))
    log(f"winner {v.name}: {r.kernel_ms:.4f} ms, {r.x_copy:.3f}x copy ({r.copy_ms:.4f} ms), "
        f"{r.speedup:.2f}x faster than PyTorch ({r.torch_ms:.4f} ms)")
    if freeze:
        frz.freeze([frz.Winner(v, r, machine)], out_dir)
        log(f"froze {v.name} for {problem.key} into {out_dir}")
    log(f"search wall {wall:.1f} s")
    return 0
