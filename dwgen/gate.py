"""The gate of what ships: every kernel of a frozen module, run through that module, against float64.

python -m dwgen.gate DIR imports the frozen module in DIR (building it), then for every kernel it holds,
tuned and generic, launches it through the module's own launcher on its problem and on the family's edge
problems (odd lengths, tiny shapes, other padding and bias, a misaligned x where the family peels it), with
the output NaN-poisoned inside NaN guard bands, and checks each against the float64 reference (a backward
kernel's grad_x, grad_weight and grad_bias against float64 autograd, with and without SiLU). A tuned kernel is
checked on each problem it was tuned for (its left and right padding and its activation, and the other
activation too: one launch function takes both; a backward one from tune.py --direction bwd on its own
problem), any other on a problem of its signature. It also checks that each tuned problem dispatches to its
kernel in its direction and computes right through the module's op, each fast generic kernel the same on a
padding past its halo (and each one chosen beside a key's for some calls on a call its scope takes, and with
SiLU), and the generic kernels of every dtype, both ways, symmetric and causal.
Exit 0 only when every check passed; the tuner commits a manifest only then.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from dwgen import check
from dwgen.problem import ACTIVATIONS, Problem, other_activation
from dwgen.space import FAMILIES, Variant, direction_key, make_config

# each family's scope as a fast generic kernel, by name (the kernel records name a family that is not primary)
GENERIC_SCOPES_OF = {f.name: f.generic_scope for fs in FAMILIES.values() for f in fs}
# the scopes whose kernels take causal calls (the lane and walk backwards): their base problems are causal
CAUSAL_SCOPES = ("causal_or_centred", "left_halo")

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
    """A problem of a kernel's signature (its sizes are run-time, so any will do as a base for edges): centred,
    or causal for a lane kernel or a walk backward serving as a fast generic one (their scopes: space.scope_admits)."""
    s = k["signature"]
    p = Problem(4, 64, 1000, s["kernel_size"], s["stride"], (s["kernel_size"] - 1) // 2 * s["dilation"],
                s["dilation"], s["dtype"], layout=s["layout"])
    if GENERIC_SCOPES_OF.get(k["config"].get("family")) in CAUSAL_SCOPES:
        p = replace(p, padding=p.halo, padding_right=0)
    return p


def _gate_forward(ext, index: int, k: dict, base: Problem, cache) -> str | None:
    variant = Variant(base, make_config(base, k["config"]))

    def run(q, x, w, b, y):  # the left padding is P; the right one is in y's length
        ext.launch(index, x, w.contiguous(), b, y, q.padding, q.activation_arg)

    for q in [base, *variant.edge_problems()]:
        outcome = check.check(q, run, seeds=SEEDS, cache=cache)
        if outcome.ok and k["peels_misalignment"]:
            outcome = check.check(q, lambda q_, x, w, b, y: run(q_, misaligned(x), w, b, y), seeds=(2,), cache=cache)
        if not outcome.ok:
            return outcome.message
    outcome = check.check(replace(base, activation=other_activation(base)), run, seeds=(3,), cache=cache)
    return None if outcome.ok else outcome.message


def _gate_backward(ext, index: int, k: dict, base: Problem) -> str | None:
    variant = Variant(base, make_config(base, k["config"], "bwd"), "bwd")

    def run(q, x, w, b, gy, gx, gw, gb):
        ext.launch_backward(index, gy, x, w.contiguous(), b, gx, gw, gb, q.padding, q.activation_arg)

    served = variant.family.activations(base)  # the split backward takes no SiLU, nor a centred lane
    for q in [base, *variant.edge_problems()]:
        # the base problem with both activations; each edge problem with one of them, by its length
        for activation in (served if q == base else (served[q.length % len(served)],)):
            outcome = check.check_backward(replace(q, activation=activation), run, seeds=SEEDS)
            if not outcome.ok:
                return outcome.message
    return None


# Problems only the generic kernels take (stride, dilation or K past the fast ones, a strided x), the last two
# with causal padding: (B, C, L, K, stride, left padding, dilation, bias, layout, right padding).
GENERIC_PROBLEMS = ((2, 5, 301, 33, 3, 7, 2, True, "bcl", 7), (1, 3, 40, 64, 4, 40, 1, False, "bcl", 40),
                    (2, 6, 77, 5, 1, 2, 8, False, "blc", 2), (2, 16, 130, 4, 2, 3, 1, True, "blc", 3),
                    (2, 5, 300, 33, 3, 64, 2, True, "bcl", 0), (2, 16, 130, 4, 2, 3, 1, False, "blc", 0))


def _call_kwargs(q: Problem) -> dict:
    """q's keyword arguments for the op: its padding as an int, 'causal', or 'same' (the halo split H // 2 on the
    left and the rest on the right: a centred call of an even filter at stride 1)."""
    if q.symmetric or q.causal:
        return q.call_kwargs
    if q.stride != 1 or q.paddings != (q.halo // 2, q.halo - q.halo // 2):
        raise ValueError(f"{q.key}: the op takes no padding argument for these paddings")
    return {**replace(q, padding_right=q.padding).call_kwargs, "padding": "same"}


def _chosen(mod, q: Problem, direction: str) -> str:
    """The kernel the module's dispatcher picks for q in a direction."""
    x, w, b = check.make_inputs(q, 0)
    return mod.kernel_for(x, w, b, **_call_kwargs(q), direction=direction)


def _through_the_op(mod, q: Problem, direction: str, seed: int, cache) -> str | None:
    """q through the module's op (the forward, or the backward op as autograd calls it) against float64: the
    failure as one line, or None."""
    import torch

    if direction == "fwd":
        with torch.no_grad():
            outcome = check.check(q, lambda q_, x, w, b, y: y.copy_(mod.depthwise_conv1d(x, w, b, **_call_kwargs(q_))),
                                  seeds=(seed,), cache=cache)
        return None if outcome.ok else f"depthwise_conv1d on {q.key}: {outcome.message}"
    outcome = check.check_backward(q, check.through_backward_op(torch.ops.dwgen.depthwise_conv1d_backward.default),
                                   seeds=(seed,))
    return None if outcome.ok else f"depthwise_conv1d_backward on {q.key}: {outcome.message}"


def _lent_calls(mod, entries, keys, cache) -> list[str]:
    """Each kernel the dispatcher lends to untuned problems of its signature, called through the op on three of
    them (other sizes, odd lengths; the tuned padding as far as the halo, causal, the halo on both sides): it must
    be the kernel chosen and compute right."""
    failures = []
    t = mod.tables()
    for name, p, direction in entries:
        signature = mod._signature({f: getattr(p, f) for f in mod._SIGNATURE_FIELDS})
        if (t.lent if direction == "fwd" else t.lent_bwd).get(signature) != name:
            continue  # another entry of the signature lends its kernel, or none does
        multiple = t.kernels[name][1]["channel_multiple"]
        halo = (p.kernel_size - 1) * p.dilation
        for q in (replace(p, batch=2, channels=5 * multiple, length=777 + halo, padding=min(p.padding, halo),
                          padding_right=min(p.padding_right, halo)),
                  replace(p, batch=3, channels=3 * multiple, length=1001 + halo, padding=halo, padding_right=0),
                  replace(p, batch=1, channels=2 * multiple, length=555 + halo, padding=halo, padding_right=halo)):
            if direction_key(q, direction) in keys:
                continue
            got = _chosen(mod, q, direction)
            if got != name:
                failures.append(f"{direction_key(q, direction)} (untuned) dispatches to {got}, not {name} of its "
                                "signature")
            why = _through_the_op(mod, q, direction, 6, cache)
            if why is not None:
                failures.append(f"{why} (untuned, lent {name})")
    return failures


def _fast_past_the_halo(mod, cache) -> list[str]:
    """Each fast generic kernel through the op on a problem whose padding passes its halo on both sides (output
    longer than the input: the dispatcher sends any padding at stride and dilation 1 to it, while its family's
    edge problems stop at the halo): it must be the kernel chosen and compute right."""
    failures = []
    t = mod.tables()
    for direction, table in (("fwd", mod.MANIFEST["generic"]["fast"]), ("bwd", mod.MANIFEST["generic"]["fast_bwd"])):
        for key, name in table.items():
            dtype, layout, k = mod._FAST_KEY.fullmatch(key).groups()
            multiple = t.kernels[name][1]["channel_multiple"]
            # symmetric: the op takes an int or 'causal', so both sides pass the halo by the same 3
            q = Problem(2, 3 * multiple, 301, int(k), 1, int(k) + 2, 1, dtype, bias=True, layout=layout,
                        padding_right=int(k) + 2)
            got = _chosen(mod, q, direction)
            why = (f"{direction_key(q, direction)} dispatches to {got}, not the fast {name}" if got != name
                   else _through_the_op(mod, q, direction, 7, cache))
            if why is not None:
                failures.append(f"{why} (padding past the halo)")
    return failures


def _fast_narrow_calls(mod, cache) -> list[str]:
    """Each fast generic kernel chosen beside a key's for some calls, through the op on a call its scope takes and
    on a causal and a centred one, plain and with SiLU: each call goes where the dispatcher's rule sends it (the
    first narrow kernel whose scope admits it, else the key's kernel for every call) and must compute right."""
    failures = []
    t = mod.tables()
    for direction, narrow, whole in (("fwd", "fast_narrow", "fast"), ("bwd", "fast_bwd_narrow", "fast_bwd")):
        for key, names in getattr(t, narrow).items():
            dtype, layout, k = mod._FAST_KEY.fullmatch(key).groups()
            k, h = int(k), int(k) - 1
            # channels every kernel of the key takes (a (B, L, C) walk and fused design need not share a vector)
            multiple = math.lcm(*(t.kernels[n][1]["channel_multiple"] for n in [*names, getattr(t, whole).get(key)]
                                  if n is not None))
            for name in names:
                # a call of its scope: causal for the lane and walk ones; the halo on both sides for the
                # within-halo one (neither causal nor centred: a lane kernel before it in the list does not take
                # it); then causal on a row that is not whole vectors (which a lane kernel does not take either)
                # and centred
                causal = mod._scope(t, name) in CAUSAL_SCOPES
                q = Problem(2, 3 * multiple, 304, k, 1, h, 1, dtype, bias=True, layout=layout,
                            padding_right=0 if causal else h)
                calls = [q, replace(q, length=301, padding_right=0),
                         replace(q, padding=h // 2, padding_right=h - h // 2)]
                for call in (c for q_ in calls for c in (q_, replace(q_, activation="silu"))):
                    left, right = call.paddings
                    want = next((n for n in names if mod._admits(mod._scope(t, n), k, left, right, call.activation,
                                                                 call.batch, call.length, call.elem_bytes)),
                                getattr(t, whole).get(key))
                    got = _chosen(mod, call, direction)
                    why = (f"{direction_key(call, direction)} dispatches to {got}, not the fast {want}" if got != want
                           else _through_the_op(mod, call, direction, 8, cache))
                    if why is not None:
                        failures.append(f"{why} (a narrow fast kernel's scope)")
                if direction == "bwd":  # paddings only the op's own pad_left and pad_right give: (0, H) and (H, 1)
                    # and for a walk, grad_out rows longer than x: the halo on both sides, and 300 on the right (a
                    # thread's whole walk past x's row)
                    walk = [(h, h), (h, 300)] if mod._scope(t, name) == "left_halo" else []
                    for call in [replace(q, length=301, padding=0, padding_right=h),
                                 replace(q, length=301, padding=h, padding_right=min(1, h)),
                                 *(replace(q, length=301, padding=a, padding_right=b) for a, b in walk)]:
                        why = _through_the_op(mod, call, direction, 9, cache)
                        if why is not None:
                            failures.append(f"{why} (a narrow fast kernel's scope, uneven padding)")
    return failures


def gate(mod, log=print) -> list[str]:
    """Every failure, as one line each; empty when the module may ship."""
    import torch

    ext = mod.build()
    failures: list[str] = []
    cache = check.ReferenceCache()
    entries = [(e["kernel"], Problem(**e["problem"]), e.get("direction", "fwd")) for e in mod.MANIFEST["entries"]]
    tuned: dict[str, list[Problem]] = {}  # kernel -> the problems it was tuned for (a name carries its direction)
    for name, p, _ in entries:
        tuned.setdefault(name, []).append(p)
    kernels = mod.MANIFEST["kernels"]
    for index, k in enumerate(kernels):
        why = None
        for base in tuned.get(k["name"]) or [signature_problem(k)]:
            if k["direction"] == "bwd":
                why = _gate_backward(ext, index, k, base)
            else:
                why = _gate_forward(ext, index, k, base, cache)
            if why is not None:
                failures.append(f"{k['name']}: {why}")
                break
        log(f"[{index + 1:3d}/{len(kernels)}] {k['name']}: {'ok' if why is None else 'FAILED'}")
    op, op_bwd = torch.ops.dwgen.depthwise_conv1d.default, torch.ops.dwgen.depthwise_conv1d_backward.default
    keys = {direction_key(p, direction) for _, p, direction in entries}
    # each tuned problem, and the same with the other bias where nothing was tuned for it (the dispatcher runs
    # the kernel tuned for this one there)
    calls = [(name, q, direction) for name, p, direction in entries
             for q in (p, replace(p, bias=not p.bias)) if q == p or direction_key(q, direction) not in keys]
    for name, p, direction in calls:
        got = _chosen(mod, p, direction)
        if got != name:
            failures.append(f"{direction_key(p, direction)} dispatches to {got}, not its tuned {name}")
        # a backward on the problem its kernel was tuned for, with either activation (the other one dispatches
        # elsewhere, but must be right too)
        for q in (p,) if direction == "fwd" else (p, replace(p, activation=other_activation(p))):
            why = _through_the_op(mod, q, direction, 3, cache)
            if why is not None:
                failures.append(why)
    failures += _lent_calls(mod, entries, keys, cache)
    failures += _fast_past_the_halo(mod, cache)
    failures += _fast_narrow_calls(mod, cache)
    for dtype in mod.MANIFEST["generic"]["scalar"]:
        for b_, c_, n_, k_, s_, p_, d_, bias, layout, pr in GENERIC_PROBLEMS:
            for activation in ACTIVATIONS:
                p = Problem(b_, c_, n_, k_, s_, p_, d_, dtype, bias=bias, layout=layout, padding_right=pr,
                            activation=activation)
                outcome = check.check(p, lambda q, x, w, b, y: y.copy_(op(x, w, b, *q.op_args)), seeds=(4,),
                                      cache=cache)
                if outcome.ok:
                    outcome = check.check_backward(p, check.through_backward_op(op_bwd), seeds=(5,))
                if not outcome.ok:
                    failures.append(f"generic {dtype}: {outcome.message}")
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
