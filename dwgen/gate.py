"""The gate of what ships: every kernel of a frozen module, run through that module, against float64.

python -m dwgen.gate DIR imports the frozen module in DIR (building it), then for every kernel it holds,
tuned and generic, launches it through the module's own launcher on its problem and on the family's edge
problems (odd lengths, tiny shapes, other padding and bias, a misaligned x where the family peels it), with
the output NaN-poisoned inside NaN guard bands, and checks each against the float64 reference. It also
checks that each tuned problem dispatches to its kernel, and the generic kernels of every dtype. Exit 0
only when every check passed; the tuner commits a manifest only then.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

from dwgen import check
from dwgen.problem import Problem
from dwgen.space import Variant, make_config

SEEDS = (0, 1)


def load_frozen(path: Path, name: str = "dwgen_frozen_under_gate"):
    spec = importlib.util.spec_from_file_location(name, path / "__init__.py", submodule_search_locations=[str(path)])
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def misaligned(x):
    """The same values as x in the same layout, starting one element past a 16-byte boundary."""
    import torch

    flat = torch.empty(x.numel() + 16, device=x.device, dtype=x.dtype)
    if x.is_contiguous():
        view = flat[1:1 + x.numel()].view(x.shape)
    else:  # (B, L, C) memory
        view = flat[1:1 + x.numel()].view(x.shape[0], x.shape[2], x.shape[1]).transpose(1, 2)
    view.copy_(x)
    return view


def signature_problem(k: dict) -> Problem:
    """A problem of a kernel's signature (its sizes are run-time, so any will do as a base for edges)."""
    s = k["signature"]
    return Problem(4, 64, 1000, s["kernel_size"], s["stride"], (s["kernel_size"] - 1) // 2 * s["dilation"],
                   s["dilation"], s["dtype"], layout=s["layout"])


def gate(mod, log=print) -> list[str]:
    """Every failure, as one line each; empty when the module may ship."""
    import torch

    ext = mod.build()
    failures: list[str] = []
    cache = check.ReferenceCache()
    tuned = {e["kernel"]: Problem(**e["problem"]) for e in mod.MANIFEST["entries"]}
    for index, k in enumerate(mod.MANIFEST["kernels"]):
        base = tuned.get(k["name"], signature_problem(k))
        variant = Variant(base, make_config(base, k["config"]))
        problems = [base] + variant.edge_problems()

        def run(q, x, w, b, y, index=index):
            ext.launch(index, x, w.contiguous(), b, y, q.padding)

        status = "ok"
        for q in problems:
            outcome = check.check(q, run, seeds=SEEDS, cache=cache)
            if outcome.ok and k["peels_misalignment"]:
                outcome = check.check(q, lambda q_, x, w, b, y: run(q_, misaligned(x), w, b, y), seeds=(2,),
                                      cache=cache)
            if not outcome.ok:
                failures.append(f"{k['name']}: {outcome.message}")
                status = "FAILED"
                break
        log(f"[{index + 1:3d}/{len(mod.MANIFEST['kernels'])}] {k['name']}: {status} ({len(problems)} problems)")
    for name, p in tuned.items():
        x, w, b = check.make_inputs(p, 0)
        got = mod.kernel_for(x, w, b, p.stride, p.padding, p.dilation)
        if got != name:
            failures.append(f"{p.key} dispatches to {got}, not its tuned {name}")
        with torch.no_grad():
            outcome = check.check(p, lambda q, x, w, b, y: y.copy_(
                mod.depthwise_conv1d(x, w, b, q.stride, q.padding, q.dilation)), seeds=(3,), cache=cache)
        if not outcome.ok:
            failures.append(f"depthwise_conv1d on {p.key}: {outcome.message}")
    for dtype, rec in mod.MANIFEST["generic"]["scalar"].items():
        for p in (Problem(2, 5, 301, 33, 3, 7, 2, dtype, bias=True), Problem(1, 3, 40, 64, 4, 40, 1, dtype),
                  Problem(2, 6, 77, 5, 1, 2, 8, dtype, layout="blc")):
            outcome = check.check(p, lambda q, x, w, b, y: ext.launch_any(x, w, b, y, q.kernel_size, q.stride,
                                                                         q.padding, q.dilation), cache=cache)
            if not outcome.ok:
                failures.append(f"{rec['name']}: {outcome.message}")
    return failures


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m dwgen.gate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", type=Path, nargs="?", default=Path(__file__).resolve().parent.parent / "generated")
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("python -m dwgen.gate: no CUDA GPU found; the gate runs kernels", file=sys.stderr)
        return 1
    if not (a.dir / "manifest.json").exists():
        print(f"python -m dwgen.gate: no manifest.json in {a.dir}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    failures = gate(load_frozen(a.dir))
    for f in failures:
        print(f"FAILED {f}")
    print(f"gate: {'passed' if not failures else f'{len(failures)} failure(s)'} in {time.perf_counter() - t0:.0f} s")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
