"""The benchmark's rows with a direction: fwd, bwd and fwd+bwd of PyTorch eager, torch.compile and dwgen on
one case (causal padding and SiLU included), checked against float64 autograd, timed interleaved (GPU only).

fwd+bwd is a forward and `torch.autograd.grad` of x, weight and bias (a training step's work, without the
accumulation into .grad that a leaf x would add and a model's x, the output of a layer, does not have);
bwd is (fwd+bwd) - fwd, round by round, as BASELINES.md measures it: timing the backward alone would need a
retained graph, whose forward outputs stay alive across calls. Every ratio is to copy_ of the forward's
bytes (B*C*(L + Lout) elements read plus written), so a direction's x copy_ says how many forwards' worth of
memory traffic it costs; the backward's floor is about 1.5x, a step's about 2.5x (BASELINES.md).
"""
from __future__ import annotations

from dwgen import bench, check
from dwgen.bench.cases import Case
from dwgen.bench.contenders import TRAINING, case_forward
from dwgen.bench.labels import problem_fields

# Largest |error| over the largest |float64| of each of y, grad_x, grad_weight, grad_bias. fp32: a few
# roundings of the largest partial sums (1e-6 or less); 1e-4 fails any wrong tap or term. 16-bit: four units
# of the format's roundoff: the result's own rounding, and the roundings PyTorch makes on the way (the conv
# output before SiLU, SiLU's gradient before the conv's backward), each at most a unit of the largest value.
GRAD_TOLERANCE = {"fp32": 1e-4, "fp16": 2.0**-9, "bf16": 2.0**-6}
OUTPUTS = ("y", "grad_x", "grad_weight", "grad_bias")


def reference(case: Case, x, w, b, gy=None) -> tuple:
    """float64 autograd of the case's PyTorch formula: (y,) and, given grad_out, its gradients of x, weight and
    bias (bias only when there is one)."""
    import torch

    leaves = [t.detach().double().requires_grad_(gy is not None) for t in (x, w, b) if t is not None]
    with torch.enable_grad():
        y = case_forward(case, leaves[0], leaves[1], leaves[2] if b is not None else None)
    grads = torch.autograd.grad(y, leaves, gy.double()) if gy is not None else ()
    return (y.detach(), *grads)


def max_rel_error(got, want) -> float:
    """Largest |got - want| over the largest |want|; NaN reads as inf."""
    import torch

    err = (got.detach().double() - want).abs().max() / want.abs().max().clamp_min(1e-30)
    return float(torch.nan_to_num(err, nan=float("inf")))


def compare(case: Case, got: tuple, want: tuple) -> check.CheckOutcome:
    """Each output (y, then the gradients) within GRAD_TOLERANCE of float64; the first that is not, named."""
    tol, worst = GRAD_TOLERANCE[case.dtype], 0.0
    for name, g, r in zip(OUTPUTS, got, want, strict=False):
        if tuple(g.shape) != tuple(r.shape):
            return check.CheckOutcome(False, f"{case.key}: {name} has shape {tuple(g.shape)}, want {tuple(r.shape)}",
                                      float("inf"))
        err = max_rel_error(g, r)
        if not err <= tol:
            return check.CheckOutcome(False, f"{case.key}: {name} misses float64 by {err:.3g} of its largest "
                                      f"value (> {tol:g})", err)
        worst = max(worst, err)
    return check.CheckOutcome(True, "", worst)


def measure(case: Case, names: list[str], device: str = "cuda") -> list[dict]:
    """Rows of every direction of the case for the named contenders that have a backward, and copy_."""
    import torch

    x, w, b = check.make_inputs(case, 0, device)
    leaves = [t for t in (x, w, b) if t is not None]
    gy = None
    if case.backward:
        for t in leaves:
            t.requires_grad_()
        g = torch.Generator(device=device).manual_seed(1)
        gy = check.in_layout(torch.randn(case.batch, case.channels, case.out_length, generator=g, device=device)
                             .to(x.dtype), case.layout)  # in y's memory order, as the next layer sends it
    ref = reference(case, x, w, b, gy)
    graphs = case.graph or bench.latency_bound(case)
    copy = bench.copy_operands(case)
    fns: dict = {}
    fns["copy_"], copy_timing = bench.timed_form(copy, graphs)
    copy_row = {"implementation": "copy_", "correct": True, "host_us": bench.host_us_per_call(copy),
                "timing": copy_timing}
    contenders = [n for n in names if n in TRAINING]
    rows: dict[tuple[str, str], dict] = {}
    for name in contenders:
        common = {"implementation": name, "correct": False, "ms": None, "error": ""}
        host: dict[str, float] = {}
        timing: dict[str, str] = {}
        try:
            forward = TRAINING[name](case)
            calls = {"fwd": lambda forward=forward: forward(x, w, b)}
            if case.backward:
                calls["fwd+bwd"] = lambda forward=forward: torch.autograd.grad(forward(x, w, b), leaves, gy)
            y = forward(x, w, b)
            got = (y, *torch.autograd.grad(y, leaves, gy)) if case.backward else (y,)
            torch.cuda.synchronize()
            outcome = compare(case, got, ref)
            del y, got
            common.update(correct=outcome.ok, error=outcome.message, max_rel_error=outcome.max_rel_error)
            for d, fn in calls.items():
                host[d] = bench.host_us_per_call(fn)
                fns[f"{name}|{d}"], timing[d] = bench.timed_form(fn, graphs)
            if case.backward:
                host["bwd"], timing["bwd"] = host["fwd+bwd"] - host["fwd"], timing["fwd+bwd"]
        except Exception as e:  # a contender that cannot run this case is reported, not fatal
            common["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        for d in case.directions:
            rows[name, d] = {**common, **({"host_us": host[d], "timing": timing[d]} if d in host else {})}
        if name == "dwgen":  # each row names the kernels it ran: fwd+bwd both
            kernels = {d: _kernel(case, x, w, b, d) for d in ("fwd", "bwd") if d in case.directions}
            for d in case.directions:
                rows[name, d]["kernel"] = " + ".join(k for k in map(kernels.get, d.split("+")) if k)
    del ref
    times, rounds = bench.time_rounds(fns, flush=bench.needs_flush(case))
    for name in contenders:
        if f"{name}|fwd+bwd" in times:
            times[f"{name}|bwd"] = bench.difference(times[f"{name}|fwd+bwd"], times[f"{name}|fwd"])
    copy_t = times["copy_"]
    out = []
    for d in case.directions:
        base = {"problem": case.row_key(d), **problem_fields(case), "backward": case.backward, "direction": d}
        out.append({**base, **copy_row, "ms": copy_t.median_ms, "x_copy": 1.0, "rounds": rounds})
        torch_t = times.get(f"pytorch|{d}")
        for name in contenders:
            row, t = dict(rows[name, d]), times.get(f"{name}|{d}")
            if t is not None:
                lo, _, hi = bench.ratio_spread(t, copy_t)
                row.update(ms=t.median_ms, x_copy=t.median_ms / copy_t.median_ms, x_copy_p10=lo, x_copy_p90=hi,
                           speedup_vs_torch=torch_t.median_ms / t.median_ms if torch_t else None, rounds=rounds)
            out.append({**base, **row})
    return out


def _kernel(case: Case, x, w, b, direction: str = "fwd") -> str:
    """The kernel dwgen runs for the case in that direction, or "" when generated.kernel_for cannot say."""
    import torch

    import generated

    try:
        with torch.no_grad():
            return generated.kernel_for(x, w, b, **case.call_kwargs, direction=direction)
    except (TypeError, ValueError, RuntimeError):  # kernel_for's arguments are not part of the op's contract
        return ""
