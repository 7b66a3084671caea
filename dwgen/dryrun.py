"""Dry run: render and nvcc-compile a problem's whole space and report each variant's resources."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from dwgen import build, render
from dwgen.families import bcl, blc
from dwgen.problem import Problem
from dwgen.progress import Progress
from dwgen.space import all_configs, direction_key, enumerate_space, families_of, family_of, violations

# What a user can change when one restriction rules out every config; the others name themselves.
_HINTS = {
    "window_fits_registers": lambda p: (f"the dilated kernel spans (K-1)*dilation+1 = "
                                        f"{p.halo + 1} inputs and a thread holds at most "
                                        f"{bcl.MAX_WINDOW_FLOATS}: lower --kernel-size or --dilation"),
    "fits_registers": lambda p: (f"a (B, L, C) thread holds its K weights and a window of "
                                 f"{p.halo + 1}+ inputs per channel, more than "
                                 f"{blc.MAX_REGISTER_FLOATS} registers: lower --kernel-size or --dilation"),
    "channels_whole_vectors": lambda p: f"{p.channels} channels are not a multiple of any vector width but 1",
}


# The fused backward family is written for stride 1 (grad_x as a correlation with the taps reversed); the
# frozen module runs the generic backward for every other stride, so there is nothing to tune there.
BWD_STRIDE_ONE = "the fused backward is stride 1 only; other strides use the generic backward"


def no_variant_reason(problem: Problem, direction: str = "fwd") -> str | None:
    """Why the problem has no valid variant to build in a direction (the restrictions every config breaks);
    None when it has."""
    if direction == "bwd" and problem.stride != 1:
        return BWD_STRIDE_ONE
    if any(not violations(problem, c, direction) for f in families_of(problem, direction)[1:] for c in all_configs(f)):
        return None
    broken: set[str] | None = None  # why not, in the primary family's terms
    for c in all_configs(family_of(problem, direction)):
        bad = violations(problem, c, direction)
        if not bad:
            return None
        broken = set(bad) if broken is None else broken & set(bad)
    names = sorted(broken or ())
    why = "; ".join(_HINTS[n](problem) for n in names if n in _HINTS) or "each config breaks some restriction"
    what = problem.key if direction == "fwd" else f"the {direction} of {problem.key}"
    return f"no variant of {what} can be built ({', '.join(names) or 'mixed restrictions'}): {why}"


def dry_run(problem: Problem, arch: str, cache_dir: Path, jobs: int | None = None, limit: int | None = None,
            log=print, quiet: bool = False,
            report: Callable[[Problem, list[build.Build]], None] | None = None,
            timeout_s: float = build.COMPILE_TIMEOUT_S, direction: str = "fwd") -> int:
    """Compile every valid variant of a direction for `arch`; returns 0 when all built, 1 otherwise.

    `report`, when given, receives the builds (for --json)."""
    variants = enumerate_space(problem, direction)[:limit]
    if not variants:
        log(no_variant_reason(problem, direction) or f"{problem.key}: nothing to compile (limit {limit})")
        return 1
    log(f"{direction_key(problem, direction)}: {len(variants)} valid variants, compiling for {arch} with nvcc "
        f"{build.nvcc_version()}")
    t0 = time.perf_counter()
    jobs_ = [(v.name, render.render_variant(v), build.build_key(v.digest, arch)) for v in variants]
    failed_so_far = 0

    with Progress(len(jobs_), "compiling", quiet=quiet) as progress:
        def tick(b: build.Build) -> None:
            nonlocal failed_so_far
            failed_so_far += not b.ok
            progress.set_note(f"{failed_so_far} failed" if failed_so_far else "")
            progress.advance()

        results = build.compile_many(jobs_, cache_dir, arch=arch, workers=jobs, on_done=tick,
                                     timeout_s=timeout_s)
    results = [b.for_activation(problem.activation) for b in results]  # the kernels this problem runs
    wall = time.perf_counter() - t0
    log(f"{'variant':48s} {'status':>13s} {'regs':>5s} {'spill':>6s} {'smem':>6s} {'nvcc s':>7s}")
    for b in results:
        log(f"{b.name:48s} {b.status:>13s} {b.registers:5d} {b.spill_bytes:6d} {b.smem_bytes:6d} {b.seconds:7.2f}")
    log(summary(results, wall))
    failed = [b for b in results if not b.ok]
    for b in failed:
        log(f"FAILED {b.name}: {b.log.strip().splitlines()[-1] if b.log.strip() else b.status} ({b.log_path})")
    if report is not None:
        report(problem, results)
    return 1 if failed else 0


def summary(results: list[build.Build], wall_s: float) -> str:
    """One line: how many built, how long, and how many variants spill (a count of variants, and their bytes)."""
    ok = [b for b in results if b.ok]
    spilled = [b for b in ok if b.spill_bytes > 0]
    cached = sum(b.cached for b in results)
    spill = (f"{len(spilled)} variants spill registers ({sum(b.spill_bytes for b in spilled)} bytes of spill "
             "stores and loads in all)" if spilled else "no variant spills registers")
    return (f"built {len(ok)}/{len(results)} in {wall_s:.1f} s wall ({sum(b.seconds for b in results):.1f} s of "
            f"nvcc{f', {cached} from the build cache' if cached else ''}); {spill}")


def build_rows(problem: Problem, builds: list[build.Build]) -> list[dict]:
    """The dry run's table as JSON rows (tune.py --dry-run --json)."""
    return [{"problem": problem.key, "variant": b.name, "status": b.status, "registers": b.registers,
             "spill_bytes": b.spill_bytes, "smem_bytes": b.smem_bytes, "stack_bytes": b.stack_bytes,
             "nvcc_s": b.seconds, "cached": b.cached, "log": b.log_path} for b in builds]
