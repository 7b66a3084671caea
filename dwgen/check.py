"""Correctness: the float64 reference, per-dtype tolerances, inputs, and mismatch reports."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from dwgen.problem import Problem, ProblemError

# Error of each output, measured against a bound that scales with the sum of |x|*|w| it adds up,
# so that cancellation near zero does not count as error. fp32 accumulating K <= 64 terms stays
# far below this.
TOLERANCE = {"fp32": 1e-5}
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class CheckOutcome:
    ok: bool
    message: str
    max_rel_error: float


def make_inputs(p: Problem, seed: int, device: str = "cuda"):
    """Fresh random x, weight and bias for a problem (never zeros: zeros hide unwritten outputs)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch.float32
    x = torch.randn(p.batch, p.channels, p.length, generator=g, device=device, dtype=dt)
    w = torch.randn(p.channels, 1, p.kernel_size, generator=g, device=device, dtype=dt)
    b = torch.randn(p.channels, generator=g, device=device, dtype=dt) if p.bias else None
    return x, w, b


def torch_conv(p: Problem, x, w, b):
    import torch.nn.functional as F

    return F.conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.channels)


def reference(p: Problem, x, w, b):
    """float64 result and the float64 error scale conv(|x|, |w|) + |b| for each output."""
    xd, wd = x.double(), w.double()
    bd = b.double() if b is not None else None
    ref = torch_conv(p, xd, wd, bd)
    scale = torch_conv(p, xd.abs(), wd.abs(), bd.abs() if bd is not None else None)
    return ref, scale


def compare(p: Problem, out, ref, scale) -> CheckOutcome:
    """Every output within tolerance of the float64 reference; NaN (an unwritten output) always fails."""
    import torch

    tol = TOLERANCE[p.dtype]
    if tuple(out.shape) != tuple(ref.shape):
        return CheckOutcome(False, f"{p.key}: shape {tuple(out.shape)} != {tuple(ref.shape)}", float("inf"))
    err = (out.double() - ref).abs()
    rel = err / scale.clamp_min(1e-30)
    bad = ~(rel <= tol)  # NaN compares false, so it lands in bad
    max_rel = float(torch.nan_to_num(rel, nan=float("inf")).max()) if rel.numel() else 0.0
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        return CheckOutcome(
            False,
            f"{p.key}: first mismatch at {idx}: got {float(out[idx]):.6g}, want {float(ref[idx]):.6g} "
            f"(max relative error {max_rel:.3g} > {tol:g})",
            max_rel,
        )
    return CheckOutcome(True, "", max_rel)


def edge_problems(p: Problem, tile: int, vec: int) -> list[Problem]:
    """Sizes that break assumptions: L not a multiple of the vector or tile, L < K, C = 1, B = 1."""
    sizes = [
        (1, 1, 1), (1, 1, p.kernel_size - 1), (1, 3, p.kernel_size), (2, 3, 7), (1, 2, 33),
        (2, 3, tile + vec), (3, 5, 3 * tile - vec), (1, 1, 2 * tile + 1), (2, 1, 4096 + 3), (1, 4, 1000),
        (p.batch if p.batch <= 4 else 1, 1, p.length), (1, p.channels, min(p.length, 4 * tile)),
    ]
    # Padding and bias are run-time arguments of a kernel: check other values than the tuned ones too.
    others = [(2, 3, tile + 5, 0, not p.bias), (1, 2, 3 * tile + 1, p.kernel_size - 1, p.bias),
              (1, 3, 999, (p.kernel_size - 1) // 2 * p.dilation, not p.bias)]
    out: list[Problem] = []
    candidates = [(b, c, n, p.padding, p.bias) for b, c, n in sizes] + others
    for b, c, n, pad, bias in candidates:
        if n < 1:
            continue
        try:
            q = replace(p, batch=b, channels=c, length=n, padding=pad, bias=bias)
        except ProblemError:
            continue  # no output at this length with this padding
        if q not in out and q != p:
            out.append(q)
    return out


class ReferenceCache:
    """Inputs and float64 references per (problem, seed), computed once per process and reused for
    every variant checked there; each seed's inputs are still fresh random data, never zeros."""

    def __init__(self, device: str = "cuda", max_entries: int = 64):
        self.device, self.max_entries = device, max_entries
        self._entries: dict = {}

    def get(self, p: Problem, seed: int):
        key = (p, seed)
        if key not in self._entries:
            if len(self._entries) >= self.max_entries:
                self._entries.pop(next(iter(self._entries)))
            x, w, b = make_inputs(p, seed, self.device)
            self._entries[key] = (x, w, b, *reference(p, x, w, b))
        return self._entries[key]


def check(p: Problem, run: Callable, seeds=SEEDS, cache: ReferenceCache | None = None) -> CheckOutcome:
    """Run `run(problem, x, w, b, y)` on random inputs per seed, y pre-filled with NaN, and compare."""
    import torch

    cache = cache or ReferenceCache()
    worst = 0.0
    for seed in seeds:
        x, w, b, ref, scale = cache.get(p, seed)
        y = torch.full((p.batch, p.channels, p.out_length), float("nan"), device=x.device, dtype=x.dtype)
        run(p, x, w, b, y)
        torch.cuda.synchronize()
        outcome = compare(p, y, ref, scale)
        if not outcome.ok:
            return CheckOutcome(False, f"seed {seed}: {outcome.message}", outcome.max_rel_error)
        worst = max(worst, outcome.max_rel_error)
    return CheckOutcome(True, "", worst)
