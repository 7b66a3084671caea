"""A tune's report: runs/<problem>/report.md with PNG plots of its study (history, parameters, winner)."""
from __future__ import annotations

import difflib
import json
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.trial import TrialState

from dwgen.result import Result
from search import study as st

ROOT = Path(__file__).resolve().parent.parent
BENCH_RESULTS = ROOT / "benchmarks" / "results.json"
TOP_PARAMS = 4  # scatter plots of time against this many parameters, the most important first
# Rows of `python -m dwgen.bench` that the winner's bar chart borrows (the tune does not time them).
BENCH_CONTENDERS = {"torch.compile": "torch.compile", "cuda (naive)": "naive CUDA kernel"}


class ReportError(RuntimeError):
    """A report that cannot be made: no such study, nothing measured; printed as one line."""


@dataclass(frozen=True)
class Measured:
    """One trial that built, passed the check and was timed (skips, failures and duplicates left out)."""

    number: int
    params: dict
    result: Result


def measured_trials(study: optuna.Study) -> list[Measured]:
    """The study's real measurements: a skipped trial's 1e6 ms and a duplicate's repeated value are not."""
    out = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if t.user_attrs.get(st.SKIP_ATTR) or t.user_attrs.get("duplicate"):
            continue
        r = st.trial_result(t)
        if r is not None and r.ok:
            out.append(Measured(t.number, dict(t.params), r))
    return out


def _measured_study(study: optuna.Study, measured: list[Measured]) -> optuna.Study:
    """An in-memory copy holding only the measured trials, for Optuna's own plots and importances."""
    numbers = {m.number for m in measured}
    copy = optuna.create_study(direction="minimize")
    copy.add_trials([t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                     if t.number in numbers])
    return copy


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: a tune on a host without a display must not open a window
    import matplotlib.pyplot as plt

    return plt


def _style():
    """Optuna's plots switch pyplot to its ggplot style for good; inside this, every plot has that style
    (ours too, so the report looks of one piece) and the caller's style comes back afterwards."""
    return _pyplot().style.context("ggplot")


def _log_ms(ax) -> None:
    """A log time axis labelled in plain milliseconds (1, 2, 5 rather than 10^0, 2x10^0)."""
    from matplotlib.ticker import FuncFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)


def _baselines(measured: list[Measured]) -> tuple[float | None, float | None]:
    """Median copy_ and PyTorch times over the measured trials (each trial measured them beside itself)."""
    def median(xs: list[float]) -> float | None:
        xs = sorted(xs)
        return (xs[len(xs) // 2] + xs[(len(xs) - 1) // 2]) / 2 if xs else None
    return (median([m.result.copy_ms for m in measured if m.result.copy_ms]),
            median([m.result.torch_ms for m in measured if m.result.torch_ms]))


def _lines(ax, copy_ms: float | None, torch_ms: float | None) -> None:
    if copy_ms:
        ax.axhline(copy_ms, color="tab:green", linestyle="--", linewidth=1, label=f"copy_ {copy_ms:.4f} ms")
    if torch_ms:
        ax.axhline(torch_ms, color="tab:purple", linestyle="--", linewidth=1, label=f"PyTorch {torch_ms:.4f} ms")


def plot_history(study: optuna.Study, measured: list[Measured], path: Path, title: str) -> None:
    """Time per measured trial and the best so far (Optuna's plot), with copy_ and PyTorch as lines."""
    import warnings

    plt = _pyplot()
    with _style(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = optuna.visualization.matplotlib.plot_optimization_history(_measured_study(study, measured))
        copy_ms, torch_ms = _baselines(measured)
        _lines(ax, copy_ms, torch_ms)
        # PyTorch is often several times copy_: a log axis keeps the kernels' spread readable beside it
        _log_ms(ax)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("measured trial (skipped, failed and duplicate trials left out)")
        ax.set_ylabel("kernel time (ms)")
        ax.legend(fontsize=8, loc="upper right")
        _save(plt, ax.figure, path)


def importances(study: optuna.Study, measured: list[Measured]) -> tuple[dict[str, float], str]:
    """(parameter importances, why none) from Optuna's evaluator; empty with a reason when it cannot say."""
    if len(measured) < 2:
        return {}, f"parameter importances need at least 2 measured trials; this study has {len(measured)}"
    if len({m.result.kernel_ms for m in measured}) < 2:
        return {}, "every measured trial took the same time: no parameter explains any difference"
    try:
        return dict(optuna.importance.get_param_importances(_measured_study(study, measured))), ""
    except (ValueError, RuntimeError, ZeroDivisionError) as e:  # e.g. no parameter took two values
        return {}, f"Optuna could not compute parameter importances ({str(e).splitlines()[0][:160]})"


def plot_importances(study: optuna.Study, measured: list[Measured], path: Path, title: str) -> None:
    import warnings

    plt = _pyplot()
    with _style(), warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        ax = optuna.visualization.matplotlib.plot_param_importances(_measured_study(study, measured))
        ax.set_title("", loc="left")  # Optuna's own title sits there and would overprint ours
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("importance for the kernel time (fANOVA)")
        ax.set_ylabel("parameter")
        if ax.get_legend() is not None:
            ax.get_legend().remove()  # one series, named "Objective Value": says nothing
        _save(plt, ax.figure, path)


def plot_params(measured: list[Measured], names: list[str], path: Path, title: str) -> None:
    """Kernel time against each named parameter: one panel each, a point per measured trial."""
    plt = _pyplot()
    with _style():
        fig, axes = plt.subplots(1, len(names), figsize=(3.6 * len(names), 3.6), sharey=True, squeeze=False)
        copy_ms, torch_ms = _baselines(measured)
        best = min(measured, key=lambda m: m.result.kernel_ms)
        for ax, name in zip(axes[0], names, strict=True):
            points = [(m.params[name], m.result.kernel_ms) for m in measured if name in m.params]
            values = sorted({v for v, _ in points}, key=lambda v: (type(v).__name__, v))
            where = {v: i for i, v in enumerate(values)}
            # a small spread along x keeps trials of the same value from hiding one another
            xs = [where[v] + ((i * 0.6180339) % 1 - 0.5) * 0.3 for i, (v, _) in enumerate(points)]
            ax.scatter(xs, [t for _, t in points], s=14, alpha=0.6, color="tab:blue")
            ax.scatter([where[best.params[name]]], [best.result.kernel_ms], s=60, marker="*", color="black",
                       zorder=3, label="best")
            _lines(ax, copy_ms, torch_ms)
            ax.set_xticks(range(len(values)), [str(v) for v in values], rotation=45 if len(values) > 5 else 0)
            ax.set_xlabel(name)
            _log_ms(ax)
        axes[0][0].set_ylabel("kernel time (ms)")
        axes[0][-1].legend(fontsize=7, loc="upper right")
        fig.suptitle(title, fontsize=10)
        _save(plt, fig, path)


def bench_row(key: str, results_path: Path = BENCH_RESULTS) -> dict[str, dict]:
    """The problem's rows in `python -m dwgen.bench`'s results, by contender; empty when it has none."""
    try:
        results = json.loads(results_path.read_text())
    except (OSError, ValueError):
        return {}
    return {r["implementation"]: r for rows in results.get("suites", {}).values() for r in rows
            if r.get("problem") == key}


def winner_bars(winner: Result, copy_ms: float | None, torch_ms: float | None,
                bench: dict[str, dict]) -> list[tuple[str, float, str]]:
    """(label, ms, where the number comes from) for the winner's bar chart; never a number nobody measured."""
    bars = [(f"dwgen\n{winner.name}", winner.kernel_ms, "tune")]
    if copy_ms:
        bars.append(("copy_", copy_ms, "tune"))
    if torch_ms:
        bars.append(("PyTorch", torch_ms, "tune"))
    for impl, label in BENCH_CONTENDERS.items():
        r = bench.get(impl)
        if r and r.get("ms") is not None and r.get("correct"):
            bars.append((label, r["ms"], "bench"))
    return bars


def plot_bars(bars: list[tuple[str, float, str]], path: Path, title: str) -> None:
    plt = _pyplot()
    with _style():
        fig, ax = plt.subplots(figsize=(1.6 * len(bars) + 2, 4))
        colours = {"tune": "tab:blue", "bench": "tab:gray"}
        labels = [b[0] for b in bars]
        ms = [b[1] for b in bars]
        copy_ms = next((t for label, t, _ in bars if label == "copy_"), None)
        ax.bar(range(len(bars)), ms, color=[colours[b[2]] for b in bars])
        ax.set_xticks(range(len(bars)), labels, fontsize=8)
        for i, t in enumerate(ms):
            text = f"{t:.4f} ms" + (f"\n{t / copy_ms:.2f}x copy_" if copy_ms else "")
            ax.annotate(text, (i, t), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
        ax.set_ylabel("time (ms)")
        ax.set_ylim(0, max(ms) * 1.2)
        if any(b[2] == "bench" for b in bars):
            from matplotlib.patches import Patch

            ax.legend(handles=[Patch(color=c, label=f"measured by {'this tune' if k == 'tune' else 'dwgen.bench'}")
                               for k, c in colours.items()], fontsize=7, loc="upper left")
        ax.set_title(title, fontsize=10)
        _save(plt, fig, path)


def _save(plt, fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(study: optuna.Study, key: str, out_dir: Path, winner: Result | None = None,
                 bench_results: Path = BENCH_RESULTS) -> Path:
    """Write out_dir/report.md and its PNGs; returns the report's path.

    `winner` is the tune's re-timed winner; without it (tune.py report) the best measured trial stands in."""
    measured = measured_trials(study)
    if not measured:
        raise ReportError(f"study {study.study_name} holds no correct, timed trial: nothing to plot")
    out_dir.mkdir(parents=True, exist_ok=True)
    best = min(measured, key=lambda m: m.result.kernel_ms)
    chosen = winner if winner is not None and winner.ok else best.result
    copy_ms, torch_ms = _baselines(measured)
    baselines = "the medians of the times measured beside each trial"
    if winner is not None and winner.ok and winner.copy_ms and winner.torch_ms:
        # the re-timing measured them interleaved with the winner: the fairest comparison there is
        copy_ms, torch_ms = winner.copy_ms, winner.torch_ms
        baselines = "re-timed interleaved with the winner"
    trials = study.get_trials(deepcopy=False)
    skipped = sum(1 for t in trials if t.user_attrs.get(st.SKIP_ATTR))
    failed = sum(1 for t in trials if t.state == TrialState.FAIL and not t.user_attrs.get(st.SKIP_ATTR)
                 and not t.user_attrs.get("duplicate"))
    repeats = sum(1 for t in trials if t.user_attrs.get("duplicate"))
    lines = [f"# {key}", "",
             f"Study `{study.study_name}`: {len(trials)} trials, {len(measured)} built, correct and timed, "
             f"{skipped} skipped (invalid combinations or repeats within a batch), {repeats} repeats of a variant "
             f"measured before, {failed} failed (compile errors, wrong results, crashes); only the measured "
             "trials are plotted.", ""]
    how = "re-timed against the other finalists" if winner is not None else "the best trial of the search"
    line = f"Winner ({how}): `{chosen.name}`, {chosen.kernel_ms:.4f} ms"
    if copy_ms:
        line += f", {chosen.kernel_ms / copy_ms:.3f}x copy_ ({copy_ms:.4f} ms)"
    if torch_ms:
        line += f", {torch_ms / chosen.kernel_ms:.2f}x faster than PyTorch ({torch_ms:.4f} ms)"
    lines += [line + f". copy_ and PyTorch here and in the bar chart: {baselines}.", ""]

    lines += ["## Search history", "", "![search history](history.png)", ""]
    plot_history(study, measured, out_dir / "history.png", f"{key}: time per trial and best so far")

    imp, why_not = importances(study, measured)
    if imp:
        lines += ["## Parameter importances", "", "![parameter importances](importances.png)", "",
                  "By Optuna's fANOVA evaluator over the measured trials: " + ", ".join(
                      f"{n} {v:.2f}" for n, v in imp.items()) + ".", ""]
        plot_importances(study, measured, out_dir / "importances.png", f"{key}: parameter importances")
        names = [n for n in imp][:TOP_PARAMS]
    else:
        lines += ["## Parameter importances", "", f"Not plotted: {why_not}.", ""]
        names = sorted({n for m in measured for n in m.params})[:TOP_PARAMS]
    if names:
        order = "most important first" if imp else "in name order, for want of importances"
        lines += ["## Time against the parameters", "", "![time against the parameters](params.png)", "",
                  f"Kernel time of each measured trial against {', '.join(names)} ({order}); the star is "
                  "the search's best.", ""]
        plot_params(measured, names, out_dir / "params.png", f"{key}: time against the parameters")

    bench = bench_row(key, bench_results)
    bars = winner_bars(chosen, copy_ms, torch_ms, bench)
    lines += ["## The winner against the alternatives", "", "![winner against the alternatives](winner.png)", ""]
    borrowed = [label for label, _, src in bars if src == "bench"]
    missing = [label for impl, label in BENCH_CONTENDERS.items() if label not in borrowed]
    if borrowed:
        machine = json.loads(bench_results.read_text()).get("machine", {})
        verb = "comes" if len(borrowed) == 1 else "come"
        lines.append(f"The {' and '.join(borrowed)} (grey) {verb} from `python -m dwgen.bench` "
                     f"({machine.get('gpu', '?')}, {machine.get('date', '?')}), a separate run: their bars "
                     "compare across processes.")
    if missing:
        lines.append(f"{' and '.join(missing)}: not measured by the tune, and `benchmarks/results.json` has no "
                     "timed row for this problem; `python -m dwgen.bench` (without `--only`) measures "
                     f"{'it' if len(missing) == 1 else 'them'}.")
    lines.append("")
    plot_bars(bars, out_dir / "winner.png", f"{key}: winner against the alternatives")

    path = out_dir / "report.md"
    path.write_text("\n".join(lines))
    return path


def find_study(storage: str | optuna.storages.BaseStorage, key: str) -> str:
    """The name of the stored study of problem `key` (this space's study first, else the latest one)."""
    names = optuna.get_all_study_names(storage)
    prefix = "dwgen-"
    matches = [n for n in names if n.startswith(prefix) and n.split("-", 2)[-1] == key]
    if not matches:
        keys = sorted({n.split("-", 2)[-1] for n in names if n.startswith(prefix)})
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
        hint = f"; close: {', '.join(close)}" if close else (f"; it holds {', '.join(keys[:5])}"
                                                             f"{' ...' if len(keys) > 5 else ''}" if keys else
                                                             "; it holds no dwgen study")
        raise ReportError(f"no study of {key} in the storage{hint}")
    current = f"{prefix}{st.SPACE_TAG}-{key}"
    return current if current in matches else matches[-1]


def report_from_storage(storage: str | optuna.storages.BaseStorage, key: str, runs_dir: Path,
                        bench_results: Path = BENCH_RESULTS) -> Path:
    """Rebuild runs_dir/<key>/report.md from the stored study (tune.py report)."""
    study = optuna.load_study(study_name=find_study(storage, key), storage=storage)
    return write_report(study, key, runs_dir / key, bench_results=bench_results)

