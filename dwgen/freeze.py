"""Writing generated/: the winners' sources verbatim, the launcher, the dispatch code and the manifest.

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
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import NVCC_FLAGS, Config, Variant

SCHEMA = 1
DEFAULT_DIR = Path(__file__).resolve().parent.parent / "generated"
DISPATCH_SOURCE = Path(__file__).resolve().parent / "frozen_dispatch.py"
LAUNCH_TEMPLATE = "frozen_launch.cu.j2"
ANY_MAX_BLOCKS = 1 << 20


class FreezeError(RuntimeError):
    pass


@dataclass(frozen=True)
class Winner:
    """What freezing one problem needs: the variant, its measured result and where it was measured."""

    variant: Variant
    result: Result
    machine: dict


def atomic_write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; these are checked-in sources
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read_manifest(out_dir: Path = DEFAULT_DIR) -> dict:
    path = Path(out_dir) / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _entry(w: Winner) -> dict:
    v, r = w.variant, w.result
    if not r.ok:
        raise FreezeError(f"{v.name} did not pass its check ({r.status}); only correct variants are frozen")
    return {
        "problem": v.problem.to_dict(),
        "key": v.problem.key,
        "variant": {
            "name": v.name,
            "digest": v.digest,
            "config": v.config.to_dict(),
            "threads": v.config.threads,
            "tile_outputs": v.tile_outputs,
            "walk": v.config.walk,
            "align_bytes": v.align_bytes,
        },
        "file": f"kernels/{v.name}-{v.digest[:12]}.cu",
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
    }


def freeze(winners: list[Winner], out_dir: Path = DEFAULT_DIR) -> dict:
    """Merge winners into generated/ (a winner replaces the entry of the same problem) and return the manifest."""
    out_dir = Path(out_dir)
    old = read_manifest(out_dir)
    entries = {e["key"]: e for e in old.get("entries", [])}
    sources: dict[str, str] = {}
    for w in winners:
        e = _entry(w)
        entries[e["key"]] = e
        sources[e["file"]] = render.render_variant(w.variant)
    ordered = [entries[k] for k in sorted(entries)]
    for e in ordered:  # entries carried over from the old manifest must still have their sources
        if e["file"] not in sources and not (out_dir / e["file"]).exists():
            raise FreezeError(f"{out_dir / e['file']} is missing; re-tune {e['key']} or restore the file")

    any_file = f"kernels/{render.ANY_NAME}-{render.any_digest()[:12]}.cu"
    sources[any_file] = render.render_any()
    launch_ctx = {
        "template": LAUNCH_TEMPLATE,
        "entries": [
            {"index": i, "name": e["variant"]["name"], "threads": e["variant"]["threads"],
             "tile_outputs": e["variant"]["tile_outputs"], "walk": e["variant"]["walk"]}
            for i, e in enumerate(ordered)
        ],
        "any_name": render.ANY_NAME,
        "any_threads": render.ANY_THREADS,
        "any_max_blocks": ANY_MAX_BLOCKS,
    }
    launch_digest = hashlib.sha256(json.dumps(launch_ctx, sort_keys=True).encode()).hexdigest()
    launcher = render.render_launcher(launch_ctx, launch_digest)
    launch_file = f"launch-{launch_digest[:12]}.cu"
    sources[launch_file] = launcher

    manifest = {
        "schema": SCHEMA,
        "note": "written by dwgen's freeze step (python tune.py); do not edit",
        "nvcc_flags": list(NVCC_FLAGS),
        "generic": {"name": render.ANY_NAME, "digest": render.any_digest(), "file": any_file,
                    "threads": render.ANY_THREADS},
        "launcher": launch_file,
        "entries": ordered,
    }
    for rel, text in sources.items():
        path = out_dir / rel
        if not path.exists() or path.read_text() != text:
            atomic_write(path, text)
    atomic_write(out_dir / "__init__.py", DISPATCH_SOURCE.read_text())
    atomic_write(out_dir / ".gitattributes", "* linguist-generated=true\n")
    atomic_write(out_dir / "manifest.json", json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _collect_garbage(out_dir, manifest)
    return manifest


def _collect_garbage(out_dir: Path, manifest: dict) -> None:
    """Remove sources the committed manifest no longer names (only after it is in place)."""
    keep = {e["file"] for e in manifest["entries"]} | {manifest["generic"]["file"], manifest["launcher"]}
    for path in list((out_dir / "kernels").glob("*.cu")) + list(out_dir.glob("launch-*.cu")):
        if str(path.relative_to(out_dir)) not in keep:
            path.unlink()


def stale_entries(out_dir: Path = DEFAULT_DIR) -> list[str]:
    """Entries whose source no longer matches what the current templates and flags would render."""
    m = read_manifest(out_dir)
    stale = []
    for e in m.get("entries", []):
        p = Problem(**e["problem"])
        v = Variant(p, Config(**e["variant"]["config"]))
        if v.digest != e["variant"]["digest"] or (out_dir / e["file"]).read_text() != render.render_variant(v):
            stale.append(e["key"])
    if m and m["generic"]["digest"] != render.any_digest():
        stale.append("generic")
    return stale
