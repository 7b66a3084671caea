"""python -m dwgen.bench: dwgen's frozen kernels side by side with what users would run instead.

For each problem of the suites, in one process on the GPU: copy_ of the bytes the op must move, PyTorch
eager, torch.compile, a simple Triton kernel, a naive CUDA kernel and generated.depthwise_conv1d; each
checked against the float64 reference, then all timed interleaved. Problems whose data fit in L2 are
timed as CUDA-graph replays of one call, so that their few microseconds of GPU time are not hidden
behind the host's; the host time of a plain call is measured apart and reported beside it.
Suite lines may ask for causal padding and a fused SiLU as tune.py's do (--padding causal, --activation
silu), and for the backward (--backward, dwgen/bench/cases.py): those lines are timed by
dwgen/bench/training.py, in rows with a direction (fwd, bwd, fwd+bwd).
Writes results.json, results.md and results.png (the bar chart of dwgen/bench/plot.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dwgen import bench, check, cli
from dwgen.bench import training
from dwgen.bench.cases import read_cases
from dwgen.bench.contenders import CONTENDERS, TRAINING
from dwgen.bench.labels import problem_fields, problem_label
from dwgen.problem import Problem, ProblemError

ROOT = Path(__file__).resolve().parents[2]


def measure(p: Problem, names: list[str]) -> list[dict]:
    import torch

    x, w, b = check.make_inputs(p, 0)
    ref, scale = check.reference(p, x, w, b)
    graphs = bench.latency_bound(p)
    copy = bench.copy_operands(p)
    copy_host_us = bench.host_us_per_call(copy)
    fns: dict = {}
    fns["copy_"], copy_timing = bench.timed_form(copy, graphs)
    rows: dict[str, dict] = {}
    for name in names:
        row = {"implementation": name, "correct": False, "ms": None, "error": ""}
        try:
            fn = CONTENDERS[name](p, x, w, b)
            out = fn()
            torch.cuda.synchronize()
            outcome = check.compare(p, out, ref, scale)
            row["correct"] = outcome.ok
            row["error"] = outcome.message
            row["max_rel_error"] = outcome.max_rel_error
            row["host_us"] = bench.host_us_per_call(fn)
            fns[name], row["timing"] = bench.timed_form(fn, graphs)
        except Exception as e:  # a contender that cannot run this problem is reported, not fatal
            row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        if name == "dwgen":
            import generated

            row["kernel"] = generated.kernel_for(x, w, b, **p.call_kwargs)
        rows[name] = row
    times, rounds = bench.time_rounds(fns, flush=bench.needs_flush(p))
    copy_ms = times["copy_"].median_ms
    torch_ms = times["pytorch"].median_ms if "pytorch" in times else None
    out = [{"implementation": "copy_", "ms": copy_ms, "x_copy": 1.0, "correct": True, "rounds": rounds,
            "host_us": copy_host_us, "timing": copy_timing}]
    for name, row in rows.items():
        if name in times:
            ms = times[name].median_ms
            lo, _, hi = bench.ratio_spread(times[name], times["copy_"])
            row.update(ms=ms, x_copy=ms / copy_ms, x_copy_p10=lo, x_copy_p90=hi,
                       speedup_vs_torch=torch_ms / ms if torch_ms else None, rounds=rounds)
        out.append(row)
    base = {"problem": p.key, **problem_fields(p), "direction": "fwd"}
    del x, ref, scale
    return [{**base, **r} for r in out]


def cell(r: dict) -> str:
    if r.get("ms") is None:
        return "n/a"
    flag = ""
    if not r["correct"]:
        err = r.get("max_rel_error")
        flag = f" ‡ {err:.1e}" if isinstance(err, float) else " ‡"
    if r.get("timing", "").startswith("plain ("):
        flag += " †"
    spread = f", {r['x_copy_p10']:.2f}-{r['x_copy_p90']:.2f}" if r.get("x_copy_p10") else ""
    return f"{r['ms']:.4f} ({r['x_copy']:.2f}x{spread}){flag}"


def markdown(results: dict) -> str:
    m = results["machine"]
    # results from before host times were medians over rounds say nothing of rounds
    host_rounds = f", the median of {results['host_rounds']} rounds" if results.get("host_rounds") else ""
    lines = [f"Measured on {m['gpu']} (driver {m['driver']}, torch {m['torch']}, CUDA {m['cuda']}), {m['date']}, "
             "by `python -m dwgen.bench`. Each cell: median ms (x copy_ of the same bytes, then the 10th-90th "
             "percentile of that ratio over the rounds, timed interleaved in the same process). Problems "
             "whose data fit in L2, and training steps whose host work outlasts their GPU work (both marked "
             "graph), are timed as CUDA-graph replays, so their cells are GPU time; † marks a call that "
             "could not be captured; ‡ a result outside the dtype's tolerance against "
             "float64, with its largest relative error (PyTorch's 16-bit SiLU rows land there: it rounds the "
             "convolution to 16 bits before SiLU, twice in all). Then PyTorch eager's "
             "time over dwgen's, and the host time of one plain call (µs of CPU to issue it"
             f"{host_rounds}; it is hidden when "
             "the GPU is busy, and it is what a short problem costs outside a graph).", ""]
    if any(r.get("direction", "fwd") != "fwd" for rows in results["suites"].values() for r in rows):
        lines[0] += (" Rows with a direction time a training step's parts on inputs that require grad: fwd, "
                     "fwd+bwd (the forward, then the gradients of x, weight and bias) and bwd (fwd+bwd less fwd, "
                     "round by round; its host µs likewise), each as a multiple of copy_ of the forward's bytes.")
    for suite, rows in results["suites"].items():
        # The simple Triton and naive CUDA kernels have no backward and no SiLU: a suite whose every row
        # needs one of those has no column for them.
        beyond = all(r.get("backward") or r.get("activation") == "silu" for r in rows)
        names = ["copy_"] + [n for n in CONTENDERS if not beyond or n in TRAINING]
        header = " | ".join(["problem", *names, "dwgen kernel", "dwgen vs PyTorch", "host µs: PyTorch / dwgen"])
        lines += [f"**{suite}**", "", f"| {header} |",
                  "|---" * (len(names) + 4) + "|"]
        by_problem: dict[str, dict] = {}
        for r in rows:
            by_problem.setdefault(r["problem"], {})[r["implementation"]] = r
        for impls in by_problem.values():
            first = next(iter(impls.values()))
            dw = impls.get("dwgen", {})
            sp = dw.get("speedup_vs_torch")
            host = " / ".join(f"{impls[n]['host_us']:.1f}" if impls.get(n, {}).get("host_us") else "n/a"
                              for n in ("pytorch", "dwgen"))
            lines.append(f"| {problem_label(first)} | " + " | ".join(cell(impls[n]) if n in impls else "n/a"
                                                                     for n in names)
                         + f" | `{dw.get('kernel', '')}` | {f'{sp:.2f}x' if sp else 'n/a'} | {host} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python -m dwgen.bench", description=__doc__)
    ap.add_argument("--suite", type=Path, action="append",
                    help="suite file(s); default: benchmarks/suite.txt, untuned.txt and training.txt")
    ap.add_argument("--only", default=None, help="comma-separated contenders (default: all)")
    ap.add_argument("--out", type=cli.directory, default=ROOT / "benchmarks", help="where results.json/.md go")
    ap.add_argument("--json", action="store_true", help="print the results as JSON instead of the table")
    a = ap.parse_args(argv)
    # Everything the user wrote is checked before the GPU is asked for, so that a typo is not reported late.
    names = [n for n in a.only.split(",") if n] if a.only is not None else list(CONTENDERS)
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown or not names:
        print(f"python -m dwgen.bench: unknown contender(s) {unknown or [a.only]}; choose from "
              f"{', '.join(CONTENDERS)}", file=sys.stderr)
        return 2
    try:
        suites = {path: read_cases(path) for path in a.suite or [ROOT / "benchmarks" / f"{stem}.txt" for stem in
                                                                  ("suite", "untuned", "training")]}
    except ProblemError as e:
        print(f"python -m dwgen.bench: {e}", file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("python -m dwgen.bench: no CUDA GPU found; the benchmark runs on the GPU host", file=sys.stderr)
        return 1
    from dwgen.worker import machine_info

    results = {"machine": machine_info(), "host_rounds": bench.HOST_ROUNDS, "suites": {}}
    for path, problems in suites.items():
        rows = []
        for case in problems:
            print(f"{case.key} ...", flush=True, file=sys.stderr if a.json else sys.stdout)
            rows += measure(case.problem, names) if case.plain else training.measure(case, names)
        results["suites"][path.stem] = rows
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    md = markdown(results)
    (a.out / "results.md").write_text(md + "\n")
    try:
        from dwgen.bench.plot import plot

        plot(results, a.out / "results.png")
    except Exception as e:  # no matplotlib, a plot that fails: the measured table stands without its chart
        print(f"python -m dwgen.bench: results.png not written: {type(e).__name__}: {e}", file=sys.stderr)
    print(json.dumps(results, indent=2) if a.json else md)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
