"""python -m search.generic: choose, by measurement, the fast generic kernel of each K for untuned problems.

Most users never tune their shape; the frozen module then runs one generic kernel per K (stride 1,
dilation 1, any length, padding and bias). For each K this checks and times a few candidate designs on
training shapes (chosen apart from benchmarks/untuned.txt, which stays a held-out test), and keeps the
design with the best geometric mean of x copy. The choices go to dwgen/generic.json; the next freeze
(python tune.py) builds them into generated/.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

from dwgen import cli
from dwgen.freeze import atomic_write
from dwgen.problem import Problem
from dwgen.space import GENERIC_FILE, GENERIC_KERNEL_SIZES, Config, Variant, generic_problem, violations

# Designs that measured well on some suite shape (docs/perf-notes.md); each is valid for every K <= 9.
CANDIDATES: tuple[Config, ...] = (
    Config(threads=128, vec=4, outs=2, halo="shfl"),
    Config(threads=128, vec=4, outs=2, halo="l1"),
    Config(threads=64, vec=4, outs=2, halo="l1"),
    Config(threads=128, vec=4, outs=4, halo="l1"),
    Config(threads=128, vec=4, outs=2, walk="row", halo="l1"),
    Config(threads=256, vec=4, outs=1, walk="row", halo="async"),
    Config(threads=128, vec=4, outs=2, walk="persistent", halo="async"),
)


def training_problems(k: int) -> list[Problem]:
    """Two large shapes per K, odd and even lengths, none of them in the benchmark's untuned suite."""
    return [Problem(8, 1024, 4000, k, 1, (k - 1) // 2), Problem(2, 2048, 12289, k, 1, k // 2, bias=True)]


def choose(k: int, build, log=print, rounds: int = 40) -> dict:
    """Measure every candidate for K on each training shape; return the winner's record."""
    from dwgen.worker import GpuWorker
    from search.loop import check_each

    variants = [Variant(generic_problem(k), c) for c in CANDIDATES if not violations(generic_problem(k), c)]
    builds = build(variants)
    scores: dict[str, list[float]] = {v.name: [] for v in variants}
    shapes = []
    for p in training_problems(k):
        worker = GpuWorker(p)
        try:
            passed = []
            for r, cand in check_each(worker, variants, builds):
                if cand is not None:
                    passed.append(cand)
                else:
                    scores.pop(r.name, None)
                    log(f"  {p.key}: {r.summary()}")
            times = worker.retime([c for c in passed if c.variant.name in scores], rounds)
        finally:
            worker.close()
        shapes.append(p.key)
        for name in list(scores):
            scores[name].append(times[name] / times["copy_"])
    if not scores:
        raise RuntimeError(f"no generic candidate passed its check for K={k}")
    geo = {n: math.exp(sum(map(math.log, xs)) / len(xs)) for n, xs in scores.items()}
    for n in sorted(geo, key=geo.get):
        log(f"  K={k} {n:40s} " + " ".join(f"{x:.3f}" for x in scores[n]) + f"  geomean {geo[n]:.3f}x copy")
    best = min(geo, key=geo.get)
    v = next(v for v in variants if v.name == best)
    return {"kernel": best, "config": v.config.to_dict(), "x_copy": dict(zip(shapes, scores[best], strict=True)),
            "geomean_x_copy": geo[best]}


def parse_kernel_sizes(text: str) -> list[int]:
    """--kernel-sizes: comma-separated K values that have a generic kernel; ValueError says which is wrong."""
    ks = []
    for x in (x.strip() for x in text.split(",")):
        if not x:
            continue
        if not x.isdigit() or int(x) not in GENERIC_KERNEL_SIZES:
            raise ValueError(f"K={x} has no generic kernel; choose from {', '.join(map(str, GENERIC_KERNEL_SIZES))}")
        ks.append(int(x))
    if not ks:
        raise ValueError("--kernel-sizes names no K")
    return ks


def read_choices(path: Path) -> dict:
    """The choices already in --out (empty when it does not exist yet); checked before an hour of measuring."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("fp32", {}), dict):
        raise ValueError(f"{path} is not a file of generic kernel choices (a JSON object with an 'fp32' object)")
    return data


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python -m search.generic", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-sizes", default=",".join(map(str, GENERIC_KERNEL_SIZES)),
                    help="comma-separated K values to (re)choose; the others keep their choice")
    ap.add_argument("--out", type=Path, default=GENERIC_FILE)
    ap.add_argument("--jobs", type=cli.int_range(1), default=None)
    a = ap.parse_args(argv)
    try:
        ks = parse_kernel_sizes(a.kernel_sizes)
        data = read_choices(a.out)
    except ValueError as e:
        print(f"python -m search.generic: {e}", file=sys.stderr)
        return 2
    from search import workflow

    try:
        build = workflow.gpu_builder(Path("runs"), a.jobs)
    except workflow.UserError as e:
        print(f"python -m search.generic: {e}", file=sys.stderr)
        return 1
    from dwgen.worker import machine_info

    chosen = data.setdefault("fp32", {})
    t0 = time.perf_counter()
    for k in ks:
        print(f"K={k}: {len(CANDIDATES)} candidates on {', '.join(p.key for p in training_problems(k))}", flush=True)
        chosen[str(k)] = choose(k, build)
        # Written after every K: an interrupted run keeps what it measured.
        data["machine"] = machine_info()
        data["note"] = "written by python -m search.generic; the fast generic config of each K, by measurement"
        atomic_write(a.out, json.dumps(data, indent=2, sort_keys=True) + "\n")
    print(f"\n{'K':>2s} {'kernel':40s} {'geomean x copy':>15s}")
    for k in ks:
        print(f"{k:2d} {chosen[str(k)]['kernel']:40s} {chosen[str(k)]['geomean_x_copy']:15.3f}")
    print(f"wrote {a.out} in {time.perf_counter() - t0:.0f} s; run tune.py to freeze the new choices")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
