"""Writing generated/: the winners' sources verbatim, the launcher, the dispatch and layer code, the manifest.

Every file is written to a temporary name and renamed into place, kernel files under content-addressed
names that never overwrite another's; manifest.json is renamed last and is the commit point, so a crash
at any moment leaves a module that imports and builds, the old one or the new one.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dwgen import render
from dwgen.dtypes import DTYPES
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import (
    DIRECTIONS,
    NVCC_FLAGS,
    Variant,
    direction_key,
    generic_key,
    generic_variants,
    make_config,
    narrow_variants,
    signature,
)

SCHEMA = 4  # 4: backward kernels beside the forward ones, the op registered in C++ (3: dtypes and layouts)
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "generated"
DISPATCH_SOURCE = Path(__file__).resolve().parent / "frozen_dispatch.py"
LAYERS_SOURCE = Path(__file__).resolve().parent / "frozen_layers.py"  # generated/layers.py: DepthwiseConv1d
LAUNCH_TEMPLATE = "frozen_launch.cpp.j2"


class FreezeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Winner:
    """What freezing one problem needs: the variant, its measured result and where it was measured."""

    variant: Variant
    result: Result
    machine: dict
    # tune.py --stand-in: the winner's times at the other sizes it was weighed at (search.standin.evidence),
    # recorded so that what generated/ lends to untuned sizes shows what it was chosen on
    stand_in: dict | None = None


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:  # the digests are of these UTF-8 bytes
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are checked-in sources
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sha256_text(text: str) -> str:
    """The digest the frozen module checks each file against before it compiles or calls it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_manifest(out_dir: Path = DEFAULT_DIR) -> dict:
    path = Path(out_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _kernel_record(v: Variant) -> dict:
    """What the frozen dispatch needs to know of a kernel: where it is and what its inputs must satisfy."""
    return {
        "name": v.name,
        "digest": v.digest,
        "file": f"kernels/{v.name}-{v.digest[:12]}.cu",
        "signature": signature(v.problem),
        "direction": v.family.direction,
        "config": v.config_dict,
        "align_bytes": v.align_bytes,
        "channel_multiple": v.channel_multiple,
        "peels_misalignment": v.family.peels_misalignment,
        "sizes_at_run_time": v.family.sizes_at_run_time,
    }


def _entry(w: Winner) -> dict:
    v, r = w.variant, w.result
    if not r.ok:
        raise FreezeError(f"{v.name} did not pass its check ({r.status}); only correct variants are frozen")
    if r.direction != v.direction:
        raise FreezeError(f"{v.name} is a {v.direction} kernel but its result was measured as {r.direction}")
    return {
        "problem": v.problem.to_dict(),
        "key": v.problem.key,
        # fwd: the forward's kernel; bwd: the backward's (grad_x, grad_weight, grad_bias), beside the forward's
        # entry of the same key. Manifests written before entries had a direction hold forward ones only.
        "direction": v.direction,
        "kernel": v.name,
        "digest": v.digest,
        "config": v.config_dict,
        "measured": {
            "kernel_ms": r.kernel_ms,
            "copy_ms": r.copy_ms,
            "torch_ms": r.torch_ms,
            "x_copy": r.x_copy,
            "speedup_vs_torch": r.speedup,
            "max_rel_error": r.max_rel_error,
            "reps": r.reps,
        },
        "machine": dict(w.machine),
        **({"stand_in": w.stand_in} if w.stand_in else {}),
    }


def entry_direction(e: dict) -> str:
    """fwd or bwd: which kernel of its problem an entry holds (fwd where the entry does not say)."""
    return e.get("direction", "fwd")


def entry_variant(e: dict) -> Variant:
    p, direction = Problem(**e["problem"]), entry_direction(e)
    return Variant(p, make_config(p, e["config"], direction), direction)


def _builds_as_frozen(e: dict) -> bool | None:
    """Whether the current templates and flags build an entry's kernel as it was frozen; None where its config
    is of an older space of its family (an axis gone or renamed), which no longer makes a variant at all."""
    try:
        return entry_variant(e).digest == e["digest"]
    except (TypeError, ValueError):
        return None


def _retired(e: dict) -> dict:
    """What a stale entry leaves in the manifest: its design, for a later re-tune to ask first (its numbers
    described code the templates no longer build, so they go with it). Nothing dispatches a retired design."""
    return {f: e[f] for f in ("key", "problem", "kernel", "config")} | {"direction": entry_direction(e)}


def _entry_slot(e: dict) -> tuple[str, int]:
    """Where an entry sorts and what it replaces: its problem's key, then the forward before the backward."""
    return e["key"], DIRECTIONS.index(entry_direction(e))


def _entry_label(e: dict) -> str:
    return direction_key(entry_variant(e).problem, entry_direction(e))


def _generic_choices(old: dict, new: dict | None) -> dict:
    """The measured generic designs: the previous manifest's, updated by new measurements (search.generic)."""
    chosen = dict(old.get("generic", {}).get("chosen", {}))
    chosen.update(new or {})
    return chosen


# The manifest's tables of fast generic kernels: each direction's (generic_key -> name), and the narrower ones
# chosen beside them (generic_key -> names, narrowest scope first; frozen_dispatch._FAST_TABLES)
FAST_TABLES = (("fast", "fwd", False), ("fast_bwd", "bwd", False), ("fast_narrow", "fwd", True),
               ("fast_bwd_narrow", "bwd", True))


def _fast_generic(chosen: dict) -> dict[str, list[list[Variant]]]:
    """The fast generic kernels of each table from the manifest's measured choices (the rest of the keys
    take the nearest measured K's design, or the family's first), a list for each key."""
    designs = {k: c["config"] for k, c in chosen.items()}
    narrow = {k: [n["config"] for n in c["narrow"]] for k, c in chosen.items() if c.get("narrow")}
    return {table: narrow_variants(designs, narrow, direction) if is_narrow
            else [[v] for v in generic_variants(designs, direction)] for table, direction, is_narrow in FAST_TABLES}


def _fast_table(lists: list[list[Variant]], is_narrow: bool) -> dict:
    """A manifest table: generic_key -> the kernel's name, or for a narrow table the names in order."""
    return {generic_key(vs[0].problem): [v.name for v in vs] if is_narrow else vs[0].name for vs in lists}


def freeze(winners: list[Winner], out_dir: Path = DEFAULT_DIR, log=print, generic: dict | None = None) -> dict:
    """Merge winners into generated/ (a winner replaces the entry of the same problem and direction) and return
    the manifest.

    Entries carried over from the previous manifest are dropped when the current templates or flags
    would build a different kernel for them: their numbers no longer describe the code. `generic` maps
    generic_choice_key -> {"config": ..., measurements} for fast generic kernels chosen by measurement (a
    backward one's key ends in _bwd).
    """
    out_dir = Path(out_dir)
    entries: dict[tuple[str, int], dict] = {}
    old = read_manifest(out_dir)
    if old and old.get("schema") != SCHEMA:
        log(f"dropping {len(old.get('entries', []))} entries of manifest schema {old.get('schema')}; re-tune them")
        old = {}
    chosen = _generic_choices(old, generic)
    retired = {_entry_slot(r): r for r in old.get("retired", [])}
    for e in old.get("entries", []):
        builds = _builds_as_frozen(e)
        if builds:
            entries[_entry_slot(e)] = {**e, "direction": entry_direction(e)}
        elif builds is False:
            log(f"dropping stale entry {_entry_label(e)} ({e['kernel']}): the templates changed under it; re-tune it "
                "(a re-tune asks its design first)")
            retired[_entry_slot(e)] = _retired(e)
        else:
            log(f"dropping entry {e['key']} ({e['kernel']}): its design is of an older space of its family; re-tune it")
    for w in winners:
        e = _entry(w)
        entries[_entry_slot(e)] = e
    variants = {v.name: v for v in map(entry_variant, entries.values())}
    fast = _fast_generic(chosen)
    for v in (v for lists in fast.values() for vs in lists for v in vs):
        variants.setdefault(v.name, v)
    kernels = [_kernel_record(variants[n]) for n in sorted(variants)]
    sources = {k["file"]: render.render_variant(variants[k["name"]]) for k in kernels}
    for k in kernels:
        k["sha256"] = sha256_text(sources[k["file"]])
    scalar, scalar_bwd = {}, {}
    for dtype, (rec, text) in _any_sources().items():
        scalar[dtype] = rec
        sources[rec["file"]] = text
    for dtype, (rec, text) in _any_sources("bwd").items():
        scalar_bwd[dtype] = rec
        sources[rec["file"]] = text
    launch_file, launcher = _launcher(kernels, scalar, scalar_bwd)
    sources[launch_file] = launcher

    manifest = {
        "schema": SCHEMA,
        "note": "written by dwgen's freeze step (python tune.py); do not edit",
        "nvcc_flags": list(NVCC_FLAGS),
        "kernels": kernels,
        "entries": [entries[k] for k in sorted(entries)],
        "generic": {
            **{table: _fast_table(fast[table], is_narrow) for table, _, is_narrow in FAST_TABLES},
            "chosen": chosen,
            "scalar": scalar,
            "scalar_bwd": scalar_bwd,
        },
        "launcher": launch_file,
        "launcher_sha256": sha256_text(launcher),
        "retired": [retired[k] for k in sorted(retired) if k not in entries],
    }
    for rel, text in sources.items():
        path = out_dir / rel
        if not path.exists() or path.read_text() != text:
            atomic_write(path, text)
    atomic_write(out_dir / "layers.py", LAYERS_SOURCE.read_text())  # before __init__.py, which imports it
    atomic_write(out_dir / "__init__.py", DISPATCH_SOURCE.read_text())
    atomic_write(out_dir / ".gitattributes", "* linguist-generated=true\n")
    atomic_write(out_dir / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _collect_garbage(out_dir, manifest)
    return manifest


def _any_sources(direction: str = "fwd") -> dict[str, tuple[dict, str]]:
    """Each dtype's scalar kernel of a direction: its manifest record and its source, rendered once."""
    out = {}
    for dtype in DTYPES:
        if direction == "fwd":
            name, digest, text = render.any_name(dtype), render.any_digest(dtype), render.render_any(dtype)
        else:
            name, digest, text = render.bwd_any_name(dtype), render.bwd_any_digest(dtype), render.render_bwd_any(dtype)
        out[dtype] = ({"name": name, "digest": digest, "file": f"kernels/{name}-{digest[:12]}.cu",
                       "sha256": sha256_text(text)}, text)
    return out


def _launcher(kernels: list[dict], scalar: dict, scalar_bwd: dict) -> tuple[str, str]:
    """File name and source of the dispatcher for these kernel records (index = position)."""
    ctx = {
        "template": LAUNCH_TEMPLATE,
        "kernels": [{"index": i, "name": k["name"], "direction": k["direction"]} for i, k in enumerate(kernels)],
        "any_names": {dtype: rec["name"] for dtype, rec in scalar.items()},
        "bwd_any_names": {dtype: rec["name"] for dtype, rec in scalar_bwd.items()},
    }
    digest = hashlib.sha256(json.dumps(ctx, sort_keys=True).encode()).hexdigest()
    return f"launch-{digest[:12]}.cpp", render.render_launcher(ctx, digest)


def source_files(manifest: dict) -> list[str]:
    """Every source the frozen module compiles (the kernels a few to a translation unit at build time, in parallel)."""
    return ([k["file"] for k in manifest["kernels"]] + [r["file"] for r in manifest["generic"]["scalar"].values()]
            + [r["file"] for r in manifest["generic"]["scalar_bwd"].values()] + [manifest["launcher"]])


def _collect_garbage(out_dir: Path, manifest: dict) -> None:
    """Remove sources the committed manifest no longer names (only after it is in place)."""
    keep = set(source_files(manifest))
    for path in list((out_dir / "kernels").glob("*.cu")) + list(out_dir.glob("launch-*.c*")):
        if str(path.relative_to(out_dir)) not in keep:
            path.unlink()


def stale_entries(out_dir: Path = DEFAULT_DIR) -> list[str]:
    """What no longer matches the current templates, flags and dispatch code: entry keys (with _bwd after a
    backward entry's), kernel names,
    'generic', 'launcher', 'dispatch', 'layers', and 'sha256 <file>' for a file whose recorded digest it misses
    (the frozen module would refuse that file)."""
    m = read_manifest(out_dir)
    if not m:
        return []
    if m.get("schema") != SCHEMA:
        return [f"schema {m.get('schema')}"]
    builds = [(e, _builds_as_frozen(e)) for e in m["entries"]]
    stale = [e["key"] if b is None else _entry_label(e) for e, b in builds if not b]
    # Re-render each kernel for the problem it was frozen for (restrictions depend on sizes).
    fast_variants = _fast_generic(m["generic"]["chosen"])
    variants = {v.name: v for v in [*(entry_variant(e) for e, b in builds if b is not None),
                                     *(v for lists in fast_variants.values() for vs in lists for v in vs)]}
    for k in m["kernels"]:
        v = variants.get(k["name"])
        if v is None or v.digest != k["digest"] or (out_dir / k["file"]).read_text() != render.render_variant(v):
            stale.append(k["name"])
    current, current_bwd = _any_sources(), _any_sources("bwd")
    scalar = {dtype: rec for dtype, (rec, _) in current.items()}
    scalar_bwd = {dtype: rec for dtype, (rec, _) in current_bwd.items()}
    if (m["generic"]["scalar"] != scalar or m["generic"].get("scalar_bwd") != scalar_bwd or any(
            m["generic"].get(table, {}) != _fast_table(fast_variants[table], is_narrow)
            for table, _, is_narrow in FAST_TABLES) or any(
                (out_dir / rec["file"]).read_text() != text
                for rec, text in [*current.values(), *current_bwd.values()])):
        stale.append("generic")
    launch_file, launcher = _launcher(m["kernels"], scalar, scalar_bwd)
    if m["launcher"] != launch_file or (out_dir / launch_file).read_text() != launcher:
        stale.append("launcher")
    if (out_dir / "__init__.py").read_text() != DISPATCH_SOURCE.read_text():
        stale.append("dispatch")
    if not (out_dir / "layers.py").exists() or (out_dir / "layers.py").read_text() != LAYERS_SOURCE.read_text():
        stale.append("layers")
    recorded = [(k["file"], k.get("sha256")) for k in m["kernels"]]
    recorded += [(r["file"], r.get("sha256")) for r in m["generic"]["scalar"].values()]
    recorded += [(r["file"], r.get("sha256")) for r in m["generic"].get("scalar_bwd", {}).values()]
    recorded.append((m["launcher"], m.get("launcher_sha256")))
    for rel, digest in recorded:
        path = out_dir / rel
        if not path.exists() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            stale.append(f"sha256 {rel}")
    return stale
