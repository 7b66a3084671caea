"""The benchmark's bar chart: every problem, each contender's time as a multiple of copy_, from results.json.

    python -m dwgen.bench.plot [results.json] [--out results.png]

needs no GPU: it reads what `python -m dwgen.bench` wrote (which draws the same chart beside its table).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from dwgen import cli

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results.json"
# One colour per contender, the same in every chart; dwgen is the one to find at a glance.
COLOURS = {"pytorch": "tab:red", "torch.compile": "tab:orange", "triton (simple)": "tab:purple",
           "cuda (naive)": "tab:brown", "dwgen": "tab:blue"}


def rows_by_problem(results: dict) -> list[tuple[str, str, dict[str, dict]]]:
    """(suite, problem key, {contender: row}) in the order the results list them."""
    out: dict[tuple[str, str], dict[str, dict]] = {}
    for suite, rows in results["suites"].items():
        for r in rows:
            out.setdefault((suite, r["problem"]), {})[r["implementation"]] = r
    return [(suite, key, impls) for (suite, key), impls in out.items()]


def plot(results: dict, path: Path) -> Path:
    """Write the chart of every problem in `results` to path (PNG); returns path."""
    import matplotlib

    matplotlib.use("Agg")  # a file only, on hosts without a display too
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from dwgen.bench.labels import problem_label

    problems = rows_by_problem(results)
    names = list(dict.fromkeys(r["implementation"] for _, _, impls in problems for r in impls.values()
                               if r["implementation"] != "copy_"))
    height = 0.8 / len(names)
    fig, ax = plt.subplots(figsize=(11, 0.18 * len(names) * len(problems) + 1.5))
    ticks, labels, wrong_seen = [], [], False
    for i, (suite, _key, impls) in enumerate(problems):
        ticks.append(i)
        first = next(iter(impls.values()))
        labels.append(f"{problem_label(first)} [{suite}]")
        for j, name in enumerate(names):
            r = impls.get(name)
            y = i - 0.4 + (j + 0.5) * height
            if not r or r.get("ms") is None:
                ax.text(1.0, y, " n/a", va="center", fontsize=6, color=COLOURS.get(name, "gray"))
                continue
            wrong = not r.get("correct", False)
            wrong_seen |= wrong
            ax.barh(y, r["x_copy"], height=height, color=COLOURS.get(name, "gray"),
                    hatch="///" if wrong else None, edgecolor="white" if wrong else None, linewidth=0)
            if name == "dwgen":
                ax.text(r["x_copy"], y, f" {r['x_copy']:.2f}x", va="center", fontsize=6)
    ax.axvline(1.0, color="black", linewidth=1, label="copy_")
    ax.set_xscale("log")
    # from below 1x, so that a kernel faster than copy_ (a shorter bar) is seen as one
    top = max(r["x_copy"] for _, _, impls in problems for r in impls.values() if r.get("ms") is not None)
    ax.set_xlim(0.8, top * 1.3)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    ax.xaxis.set_major_locator(FixedLocator([0.5, 1, 2, 5, 10, 20]))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_ylim(len(problems) - 0.5, -0.5)  # first problem on top, as in the table
    ax.set_xlabel("time as a multiple of copy_ of the same bytes (log; lower is better, 1x is copy speed)")
    ax.grid(axis="x", alpha=0.3)
    handles = [Patch(color=COLOURS.get(n, "gray"), label=n) for n in names]
    if wrong_seen:
        handles.append(Patch(facecolor="gray", hatch="///", edgecolor="white",
                             label="missed the float64 check"))
    # under the axes, where no bar can be hidden behind it
    ax.legend(handles=handles, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.035), ncol=len(handles),
              frameon=False)
    m = results.get("machine", {})
    absent = [n for n in COLOURS if n not in names]
    ax.set_title(f"python -m dwgen.bench on {m.get('gpu', '?')}, {m.get('date', '?')}: median time over copy_"
                 + (f"\n(not in this run: {', '.join(absent)})" if absent else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python -m dwgen.bench.plot", description="Draw the benchmark's bar chart from "
                           "its results.json (no GPU needed).")
    ap.add_argument("results", nargs="?", type=Path, default=RESULTS, help="default: benchmarks/results.json")
    ap.add_argument("--out", type=Path, default=None, help="the PNG to write (default: results.png beside it)")
    a = ap.parse_args(argv)
    try:
        results = json.loads(a.results.read_text())
        results["suites"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not the results of python -m dwgen.bench"
        print(f"python -m dwgen.bench.plot: cannot read {a.results}: {why}", file=sys.stderr)
        return 2
    print(plot(results, a.out or a.results.with_suffix(".png")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
