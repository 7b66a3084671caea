"""What generated/ holds, for people and for scripts: a row per tuned problem, as a table or JSON, and its CUDA."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from dwgen.freeze import DEFAULT_DIR, Winner, read_manifest
from dwgen.problem import Problem, ProblemError
from dwgen.recording import suite_line

# (row field, table heading); the JSON rows carry these fields and a few more.
COLUMNS = (("problem", "problem"), ("dtype", "dtype"), ("layout", "layout"), ("direction", "direction"),
           ("kernel", "kernel"), ("ms", "ms"), ("x_copy", "x copy"), ("speedup_vs_torch", "vs PyTorch"),
           ("gpu", "GPU"), ("date", "date"))


class ShowError(RuntimeError):
    """A request generated/ cannot answer; printed as one line."""


def entry_row(entry: dict, kernels: dict[str, dict] | None = None) -> dict:
    """One manifest entry as a flat row. Manifests written before layout and direction were fields
    hold only (B, C, L) forward kernels, hence those defaults."""
    p, m, machine = entry["problem"], entry.get("measured") or {}, entry.get("machine") or {}
    record = (kernels or {}).get(entry["kernel"], {})
    return {
        "problem": entry["key"],
        "dtype": entry.get("dtype", p.get("dtype", "fp32")),
        "layout": entry.get("layout", p.get("layout", "bcl")),
        "direction": row_direction(entry),
        "kernel": entry["kernel"],
        "ms": m.get("kernel_ms"),
        "x_copy": m.get("x_copy"),
        "speedup_vs_torch": m.get("speedup_vs_torch"),
        "copy_ms": m.get("copy_ms"),
        "torch_ms": m.get("torch_ms"),
        "gpu": machine.get("gpu", ""),
        "date": machine.get("date", ""),
        "digest": entry.get("digest", ""),
        "file": record.get("file", ""),
        "x_copy_elsewhere": _elsewhere(entry.get("stand_in")),
    }


def row_direction(entry: dict) -> str:
    """The direction a row shows and the filters ask: the entry's, else (manifests older than the field) its
    problem record's, else fwd."""
    problem = entry.get("problem")
    return entry.get("direction", problem.get("direction", "fwd") if isinstance(problem, dict) else "fwd")


def range_text(values, digits: int = 2) -> str:
    """Least to most of some figures, as "1.05-1.12" (a stand-in's x copy at its other sizes)."""
    values = list(values)
    return f"{min(values):.{digits}f}-{max(values):.{digits}f}"


def _elsewhere(stand_in) -> dict | None:
    """A stand-in's winner (tune.py --stand-in): its x copy at each other size it was weighed at; None for any
    other entry (or a record that is not of that form: show reads what it can)."""
    sizes = stand_in.get("sizes") if isinstance(stand_in, dict) else None
    xs = {size: t["x_copy"] for size, t in sizes.items()
          if isinstance(t, dict) and _number(t.get("x_copy")) is not None} if isinstance(sizes, dict) else {}
    return xs or None


def winner_row(w: Winner, frozen: bool) -> dict:
    """A tuning run's winner as a row of the same form, so that scripts read one format (tune.py --json)."""
    v, r = w.variant, w.result
    measured = {"kernel_ms": r.kernel_ms, "copy_ms": r.copy_ms, "torch_ms": r.torch_ms, "x_copy": r.x_copy,
                "speedup_vs_torch": r.speedup}
    row = entry_row({"key": v.problem.key, "kernel": v.name, "digest": v.digest, "problem": v.problem.to_dict(),
                     "direction": v.direction, "measured": measured, "machine": w.machine, "stand_in": w.stand_in})
    del row["file"]  # named by the freeze, not known here
    return {**row, "frozen": frozen}


def _cell(field: str, value) -> str:
    if value is None:
        return "n/a"
    if field == "ms":
        return f"{value:.4f}"
    if field in ("x_copy", "speedup_vs_torch"):
        return f"{value:.2f}x"
    if field == "x_copy_elsewhere":
        return range_text(value.values()) + "x"
    return str(value)


# the column a table gains when a row is a stand-in's winner (its x copy at the other sizes, least to most)
ELSEWHERE = ("x_copy_elsewhere", "other sizes")
NUMERIC = {"ms", "x_copy", "speedup_vs_torch", ELSEWHERE[0]}


def aligned(columns: tuple[tuple[str, str], ...], rows: list[list[str]]) -> str:
    """Headings and rows of cell text as aligned columns, numbers (NUMERIC fields) to the right."""
    cells = [[heading for _, heading in columns]] + rows
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    return "\n".join(
        "  ".join(c.rjust(w) if f in NUMERIC else c.ljust(w) for (f, _), c, w in zip(columns, row, widths, strict=True))
        .rstrip() for row in cells)


def table(rs: list[dict]) -> str:
    """Rows of tuned entries as aligned columns, with the stand-ins' column where a row has it."""
    columns = COLUMNS + ((ELSEWHERE,) if any(r.get(ELSEWHERE[0]) for r in rs) else ())
    return aligned(columns, [[_cell(f, r.get(f)) if f != ELSEWHERE[0] or r.get(f) else "-" for f, _ in columns]
                             for r in rs])


def generic_note(manifest: dict) -> str:
    """What runs for the problems nobody tuned (the manifest's generic section: fast kernels keyed
    dtype_layout_kK, a scalar kernel per dtype)."""
    g = manifest.get("generic", {})
    ks = sorted({int(key.rsplit("_k", 1)[1]) for key in g.get("fast", {})})
    parts = []
    if len(ks) > 1 and ks == list(range(ks[0], ks[-1] + 1)):
        parts.append(f"a fast generic kernel of each dtype and layout for K {ks[0]}-{ks[-1]} at stride and dilation 1")
    elif ks:
        parts.append(f"fast generic kernels for K {', '.join(map(str, ks))}")
    scalar = sorted(s["name"] for s in g.get("scalar", {}).values())
    if scalar:
        parts.append(f"the generic kernels {', '.join(scalar)} for the rest (past them, a kernel tuned for the "
                     "same K, stride, dilation, dtype and layout where one takes any size)")
    return "untuned problems run " + " and ".join(parts) if parts else ""


def _label(entry: dict) -> str:
    """An entry's key, with _bwd after a backward entry's (as tune.py --direction bwd names its tune)."""
    direction = entry.get("direction", "fwd")
    return entry["key"] if direction == "fwd" else f"{entry['key']}_{direction}"


def find(manifest: dict, query: str) -> list[dict]:
    """The entries a user means: one problem's (its forward and its backward entry, when both are tuned), found
    by its key, the start of exactly one key (e.g. 32x512x8192) or its kernel's name; KEY_bwd, the backward's."""
    entries = manifest.get("entries", [])
    exact = [e for e in entries if query in (e["key"], _label(e), e["kernel"])]
    matches = exact or [e for e in entries if e["key"].startswith(query)]
    keys = list(dict.fromkeys(e["key"] for e in matches))
    if len(keys) == 1:
        return matches
    if not matches:
        raise ShowError(f"generated/ holds no tuned problem {query!r}; `tune.py show` lists them")
    raise ShowError(f"{query!r} matches {len(keys)} problems ({', '.join(keys)}); give more of the key")


def source(out_dir: Path, row: dict) -> str:
    """The frozen CUDA text of a row's kernel."""
    path = Path(out_dir) / row["file"] if row["file"] else None
    if path is None or not path.is_file():
        raise ShowError(f"the source of {row['kernel']} is missing from {out_dir}; re-run the freeze (tune.py)")
    return path.read_text()


@dataclass(frozen=True)
class Only:
    """Which entries `tune.py show` keeps: measured on a GPU whose name lacks `not_on` (an entry that names no GPU
    counts as measured elsewhere), of one direction, stand-ins' winners (tune.py --stand-in) or the others; None
    keeps every entry on that count."""

    not_on: str | None = None
    direction: str | None = None
    stand_ins: bool | None = None

    def admits(self, gpu: str, direction: str | None) -> bool:
        """Whether something measured on `gpu` for `direction` passes the GPU and direction filters."""
        return ((self.not_on is None or self.not_on.lower() not in str(gpu).lower())
                and (self.direction is None or direction == self.direction))

    def keeps(self, e: dict) -> bool:
        return (self.admits((e.get("machine") or {}).get("gpu", ""), row_direction(e))
                and (self.stand_ins is None or is_stand_in(e) == self.stand_ins))


def is_stand_in(e: dict) -> bool:
    """Whether a tune under --stand-in froze this entry (it records the other sizes it was weighed at)."""
    return isinstance(e.get("stand_in"), dict)


def _out_flag(out_dir: Path) -> str:
    """--out for a printed command that must write where show read: left out for the default generated/, so the
    command runs as it stands in another checkout (the GPU host's)."""
    return "" if Path(out_dir).resolve() == DEFAULT_DIR.resolve() else f" --out {out_dir}"


def suite_text(entries: list[dict], out_dir: Path) -> str:
    """Entries as a suite file that re-tunes them (tune.py --suite FILE, with the flags its first line names): one
    problem a line, its kernel and where it was measured after it. A tune runs one direction, and --stand-in holds
    for all its problems, so the entries must agree on both."""
    if not entries:
        return f"# no tuned problem of {out_dir} matches"
    directions = sorted({row_direction(e) for e in entries})
    if len(directions) > 1:
        raise ShowError(f"these entries hold {' and '.join(directions)} kernels and a tune runs one direction: "
                        "add --direction fwd or --direction bwd")
    stand = sum(map(is_stand_in, entries))
    if 0 < stand < len(entries):
        raise ShowError(f"{stand} of these {len(entries)} entries are stand-ins' winners (re-tuned with --stand-in) "
                        "and the others are not: add --stand-ins or --no-stand-ins")
    flags = (_out_flag(out_dir) + ("" if directions == ["fwd"] else f" --direction {directions[0]}")
             + (" --stand-in" if stand else ""))
    lines = [f"# {len(entries)} problem(s) of {out_dir}; re-tune them with: python tune.py --suite FILE{flags}"]
    for e in entries:
        try:
            line = suite_line(Problem(**e["problem"]))
        except (KeyError, TypeError, ValueError, ProblemError) as err:  # a hand-edited or very old record
            raise ShowError(f"{e.get('key')}: its problem record cannot be written as tune.py flags "
                            f"({type(err).__name__}: {err})") from None
        machine = e.get("machine") or {}
        lines.append(f"{line}  # {e.get('kernel')}, {machine.get('gpu') or 'no GPU named'} {machine.get('date', '')}"
                     .rstrip())
    return "\n".join(lines)


@functools.cache
def _generic_keys() -> dict[str, tuple[str, str, int, str]]:
    """Every key a generic choice can be kept under (space.generic_choice_key), to its dtype, layout, K and
    direction: what search.generic can measure again."""
    from dwgen.dtypes import DTYPES
    from dwgen.problem import LAYOUTS
    from dwgen.space import DIRECTIONS, GENERIC_KERNEL_SIZES, generic_choice_key, generic_problem

    return {generic_choice_key(generic_problem(k, d, lay), direction): (d, lay, k, direction)
            for d in DTYPES for lay in LAYOUTS for k in GENERIC_KERNEL_SIZES for direction in DIRECTIONS}


GENERIC_COLUMNS = (("key", "key"), ("direction", "direction"), ("kernel", "kernel"), ("x_copy", "x copy"),
                   ("narrow", "beside it (scope: kernel x copy)"), ("gpu", "GPU"), ("date", "date"))


def generic_rows(manifest: dict, only: Only = Only()) -> list[dict]:
    """The manifest's measured generic choices (python -m search.generic), one row a dtype, layout, K and
    direction: the kernel every call may run, its geometric-mean x copy over its shapes, the narrower kernels
    chosen beside it for the calls their scopes take, where and when it was measured. `only` filters by GPU and
    direction; a key that is not of that form is shown with its parts unknown."""
    if only.stand_ins is not None:
        raise ShowError("--stand-ins and --no-stand-ins pick tuned entries: leave them out with --generic")
    generic = manifest.get("generic")
    chosen = generic.get("chosen") if isinstance(generic, dict) else None
    rs = []
    for key, record in sorted(chosen.items() if isinstance(chosen, dict) else []):
        record = record if isinstance(record, dict) else {}
        dtype, layout, k, direction = _generic_keys().get(key, (None, None, None, None))
        machine = record.get("machine") if isinstance(record.get("machine"), dict) else {}
        narrow = record.get("narrow") if isinstance(record.get("narrow"), list) else []
        row = {"key": key, "dtype": dtype, "layout": layout, "k": k, "direction": direction,
               "kernel": record.get("kernel"), "x_copy": _number(record.get("geomean_x_copy")),
               "narrow": [{"scope": n.get("scope"), "kernel": n.get("kernel"),
                           "x_copy": _number(n.get("geomean_x_copy"))} for n in narrow if isinstance(n, dict)],
               "gpu": machine.get("gpu", ""), "date": machine.get("date", "")}
        if only.admits(row["gpu"], row["direction"]):
            rs.append(row)
    return rs


def _number(value) -> float | None:
    """A measured figure as show prints it, None where a hand-edited record holds something else."""
    return value if type(value) in (int, float) else None


def _narrow_text(narrow: list[dict]) -> str:
    return "; ".join(f"{n['scope']}: {n['kernel']} {_cell('x_copy', n['x_copy'])}" for n in narrow) or "-"


def generic_table(rs: list[dict]) -> str:
    return aligned(GENERIC_COLUMNS, [[_narrow_text(r["narrow"]) if f == "narrow" else _cell(f, r[f])
                                      for f, _ in GENERIC_COLUMNS] for r in rs])


def generic_commands(rs: list[dict], out_dir: Path) -> str:
    """The python -m search.generic calls that measure these choices again (on the GPU they should serve): one a
    direction, layout and set of kernel sizes, with the dtypes that share them (each call freezes through the gate
    once a dtype and layout, so fewer calls gate no less)."""
    if not rs:
        return f"# no generic choice of {out_dir} matches"
    ks: dict[tuple[str, str, str], set[int]] = {}
    for r in rs:
        if r["k"] is None:
            raise ShowError(f"generic choice {r['key']!r} is not one search.generic keeps (dtype_layout_kK, _bwd "
                            "after a backward's, K 1-16): re-run python -m search.generic for its dtype, layout and K")
        ks.setdefault((r["direction"], r["layout"], r["dtype"]), set()).add(r["k"])
    groups: dict[tuple[str, str, tuple[int, ...]], list[str]] = {}
    for (direction, layout, dtype), sizes in sorted(ks.items()):
        groups.setdefault((direction, layout, tuple(sorted(sizes))), []).append(dtype)
    lines = [f"# {len(rs)} generic choice(s) of {out_dir}, measured again by:"]
    for (direction, layout, sizes), dtypes in groups.items():
        lines.append(f"python -m search.generic --direction {direction} --layouts {layout} --dtypes {','.join(dtypes)} "
                     f"--kernel-sizes {','.join(map(str, sizes))}{_out_flag(out_dir)}")
    return "\n".join(lines)


def show(out_dir: Path, query: str | None = None, *, with_source: bool = False, as_json: bool = False,
         only: Only = Only(), as_suite: bool = False, generic: bool = False) -> str:
    """What `tune.py show` prints: the table (or JSON) of generated/, one problem's row, or its source; the entries
    `only` keeps, or those as a suite file that re-tunes them."""
    manifest = read_manifest(out_dir)
    if not manifest:
        raise ShowError(f"no manifest.json in {out_dir}: nothing is frozen there (tune.py freezes winners)")
    if generic and (query is not None or with_source):
        raise ShowError("--generic lists the generic choices: leave out the problem and --source")
    if with_source and query is None:
        raise ShowError("--source needs a problem: `tune.py show PROBLEM --source`")
    if as_suite and (with_source or as_json):
        raise ShowError("--suite prints problem flags: leave out --source and --json")
    if generic:
        rs = generic_rows(manifest, only)
        if as_suite:
            return generic_commands(rs, out_dir)
        if as_json:
            return json.dumps(rs, indent=2)
        return generic_table(rs) if rs else f"no generic choice of {out_dir} matches"
    entries = [e for e in (find(manifest, query) if query is not None else manifest.get("entries", []))
               if only.keeps(e)]
    if as_suite:
        return suite_text(entries, out_dir)
    kernels = {k["name"]: k for k in manifest.get("kernels", [])}
    rs = [entry_row(e, kernels) for e in entries]
    if not rs and only != Only() and not as_json:
        return f"no tuned problem of {out_dir} matches those filters"
    if with_source:
        for r in rs:
            r["source"] = source(out_dir, r)
    if as_json:
        return json.dumps(rs, indent=2)
    if with_source:  # a problem's forward kernel, then its backward one (each source names itself first)
        return "\n\n".join(r["source"].rstrip("\n") for r in rs)
    if not rs:
        return f"{out_dir} holds no tuned problem yet; {generic_note(manifest)}"
    return table(rs) + ("" if query else f"\n{generic_note(manifest)}")
