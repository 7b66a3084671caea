"""Dry run: render and nvcc-compile a problem's whole space and report each variant's resources."""
from __future__ import annotations

import time
from pathlib import Path

from dwgen import build, render
from dwgen.problem import Problem
from dwgen.space import enumerate_space


def dry_run(problem: Problem, arch: str, cache_dir: Path, jobs: int | None = None, limit: int | None = None,
            log=print) -> int:
    """Compile every valid variant for `arch`; returns 0 when all built, 1 otherwise."""
    variants = enumerate_space(problem)[:limit]
    log(f"{problem.key}: {len(variants)} valid variants, compiling for {arch} with nvcc {build.nvcc_version()}")
    t0 = time.perf_counter()
    jobs_ = [(v.name, render.render_variant(v), build.build_key(v.digest, arch)) for v in variants]
    results = build.compile_many(jobs_, cache_dir, arch=arch, workers=jobs)
    wall = time.perf_counter() - t0
    log(f"{'variant':48s} {'status':>13s} {'regs':>5s} {'spill':>6s} {'smem':>6s} {'nvcc s':>7s}")
    for b in results:
        log(f"{b.name:48s} {b.status:>13s} {b.registers:5d} {b.spill_bytes:6d} {b.smem_bytes:6d} {b.seconds:7.2f}")
    failed = [b for b in results if not b.ok]
    spilled = [b for b in results if b.ok and b.spill_bytes > 0]
    log(f"built {len(results) - len(failed)}/{len(results)} in {wall:.1f} s wall "
        f"({sum(b.seconds for b in results):.1f} s of nvcc); {len(spilled)} spill registers")
    for b in failed:
        log(f"FAILED {b.name}: {b.log.strip().splitlines()[-1] if b.log.strip() else b.status} ({b.log_path})")
    return 1 if failed else 0
