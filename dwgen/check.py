"""Correctness: the float64 reference, per-dtype tolerances, inputs, and mismatch reports."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dwgen.dtypes import DTYPES, torch_dtype
from dwgen.problem import Problem

# Error of each output is measured against a bound that scales with the sum of |x|*|w| it adds up, so
# that cancellation near zero does not count as error; the bound per dtype is in the dtype table (fp32
# accumulating K <= 64 terms stays far below it; 16-bit outputs add one rounding to the storage type).
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class CheckOutcome:
    ok: bool
    message: str
    max_rel_error: float


def in_layout(t, layout: str):
    """A (B, C, L) tensor with the same values, laid out in memory as `layout` says (a view of it for blc)."""
    return t.transpose(1, 2).contiguous().transpose(1, 2) if layout == "blc" else t.contiguous()


def empty_output(p: Problem, fill: float | None = None, device: str = "cuda"):
    """The output tensor a call returns: (B, C, Lout) in the problem's layout, NaN-filled when asked."""
    import torch

    dt = torch_dtype(p.dtype)
    if p.layout == "blc":
        y = torch.empty(p.batch, p.out_length, p.channels, device=device, dtype=dt).transpose(1, 2)
    else:
        y = torch.empty(p.batch, p.channels, p.out_length, device=device, dtype=dt)
    if fill is not None:
        y.fill_(fill)
    return y


GUARD_ELEMENTS = 256  # NaN bands before and after each output under test; a multiple of any vector


def guarded_output(p: Problem, device: str = "cuda"):
    """A NaN-filled output inside NaN guard bands, and a function that says whether the bands are untouched."""
    import torch

    n, g = p.batch * p.channels * p.out_length, GUARD_ELEMENTS
    buf = torch.full((n + 2 * g,), float("nan"), device=device, dtype=torch_dtype(p.dtype))
    inner = buf[g:g + n]
    if p.layout == "blc":
        y = inner.view(p.batch, p.out_length, p.channels).transpose(1, 2)
    else:
        y = inner.view(p.batch, p.channels, p.out_length)
    return y, lambda: bool(torch.isnan(buf[:g]).all()) and bool(torch.isnan(buf[g + n:]).all())


def make_inputs(p: Problem, seed: int, device: str = "cuda"):
    """Fresh random x, weight and bias in the problem's dtype and layout (never zeros: they hide unwritten outputs)."""
    import torch

    g = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(p.dtype)
    x = torch.randn(p.batch, p.channels, p.length, generator=g, device=device).to(dt)
    w = torch.randn(p.channels, 1, p.kernel_size, generator=g, device=device).to(dt)
    b = torch.randn(p.channels, generator=g, device=device).to(dt) if p.bias else None
    return in_layout(x, p.layout), w, b


def torch_conv(p: Problem, x, w, b):
    """The convolution alone (no activation), padded as p says: F.conv1d's own padding when symmetric, else
    x zero-padded by F.pad on each side first (exact: the same products, the same sums)."""
    import torch.nn.functional as F

    if p.symmetric:
        return F.conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.channels)
    return F.conv1d(F.pad(x, p.paddings), w, b, stride=p.stride, dilation=p.dilation, groups=p.channels)


def activate(p: Problem, z):
    """p's activation applied to a convolution's result."""
    import torch.nn.functional as F

    return F.silu(z) if p.activation == "silu" else z


def reference(p: Problem, x, w, b):
    """float64 result (with p's activation) and the float64 error scale conv(|x|, |w|) + |b| for each output
    (SiLU, whose slope stays below 1.1, keeps that scale)."""
    xd, wd = x.double(), w.double()
    bd = b.double() if b is not None else None
    ref = torch_conv(p, xd, wd, bd)
    scale = torch_conv(p, xd.abs(), wd.abs(), bd.abs() if bd is not None else None)
    return activate(p, ref), scale


def compare(p: Problem, out, ref, scale) -> CheckOutcome:
    """Every output within tolerance of the float64 reference; NaN (an unwritten output) always fails."""
    import torch

    tol, floor = DTYPES[p.dtype].tolerance, DTYPES[p.dtype].absolute_floor
    if tuple(out.shape) != tuple(ref.shape):
        return CheckOutcome(False, f"{p.key}: shape {tuple(out.shape)} != {tuple(ref.shape)}", float("inf"))
    err = (out.double() - ref).abs()
    rel = err / scale.clamp_min(1e-30)
    bad = ~(err <= tol * scale + floor)  # NaN compares false, so it lands in bad
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


class _ProblemSeedCache:
    """Operands and float64 references per (problem, seed), made once per process and reused for every
    variant checked there (each seed's inputs still fresh random data, never zeros): a search checks every
    candidate of a problem on the same seeds, and float64 references of a large problem cost more than the
    kernel they check. The entry used longest ago goes first; the entries together keep within max_bytes (on
    a GPU, a quarter of its memory), and one larger than that is made and not kept. Subclasses say what an
    entry is (`_make`)."""

    MAX_ENTRIES = 32

    def __init__(self, device: str = "cuda", max_entries: int | None = None, max_bytes: int | None = None):
        self.device, self.max_bytes = device, max_bytes
        self.max_entries = self.MAX_ENTRIES if max_entries is None else max_entries
        self._entries: dict = {}
        self._sizes: dict = {}

    def _make(self, p: Problem, seed: int) -> tuple:
        raise NotImplementedError

    def _budget(self) -> float:
        if self.max_bytes is None:
            import torch

            self.max_bytes = (torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory // 4
                              if self.device == "cuda" else float("inf"))
        return self.max_bytes

    def get(self, p: Problem, seed: int):
        key = (p, seed)  # the problem holds its paddings and activation
        if key in self._entries:
            self._entries[key] = self._entries.pop(key)  # the most recently used last
            return self._entries[key]
        entry = self._make(p, seed)
        size = sum(t.numel() * t.element_size() for t in _tensors(entry))
        if size > self._budget():
            return entry
        while self._entries and (len(self._entries) >= self.max_entries
                                 or sum(self._sizes.values()) + size > self._budget()):
            oldest = next(iter(self._entries))
            del self._entries[oldest], self._sizes[oldest]
        self._entries[key], self._sizes[key] = entry, size
        return entry


def _tensors(items) -> list:
    """The tensors of a nest of tuples (None and numbers left out)."""
    out = []
    for t in items:
        if isinstance(t, tuple):
            out += _tensors(t)
        elif hasattr(t, "element_size"):
            out.append(t)
    return out


class ReferenceCache(_ProblemSeedCache):
    """The forward's: x, w, b, the float64 output and its error scale."""

    MAX_ENTRIES = 64  # a forward entry is about half a backward one

    def _make(self, p: Problem, seed: int) -> tuple:
        x, w, b = make_inputs(p, seed, self.device)
        return (x, w, b, *reference(p, x, w, b))


def _captured_on_a_side_stream(p: Problem, launch: Callable[[], object]):
    """`launch` captured into a CUDA graph on a side stream (nothing runs yet), and None; or, when the capture
    refused it (the legacy stream, a synchronisation: not sticky), None and the failed outcome."""
    import torch

    torch.cuda.synchronize()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    refused: Exception | None = None
    with torch.cuda.stream(side):
        graph.capture_begin()
        try:
            launch()
        except Exception as e:
            refused = e
        try:
            graph.capture_end()
        except RuntimeError as e:
            refused = refused or e
    torch.cuda.synchronize()
    if refused is None:
        return graph, None
    first = str(refused).strip().splitlines()[0] if str(refused).strip() else type(refused).__name__
    return None, CheckOutcome(False, f"{p.key}: its launch failed while captured on the stream it was given: {first}",
                              float("inf"))


def check_stream(p: Problem, run: Callable, cache: ReferenceCache | None = None) -> CheckOutcome:
    """The launch puts its work on the stream it is given and nowhere else.

    `check` waits for the whole device, so it passes a variant that computes on a stream of its own; in a
    program that reads y after its own stream only, that variant races. Here its launch is captured into a
    CUDA graph on a side stream: a capture runs nothing, so an output written by then was written by work
    put elsewhere. The graph is then replayed into the same, NaN-filled, output and compared."""
    import torch

    cache = cache or ReferenceCache()
    x, w, b, ref, scale = cache.get(p, 0)
    y, guards_intact = guarded_output(p, device=x.device)
    graph, refused = _captured_on_a_side_stream(p, lambda: run(p, x, w, b, y))
    if refused is not None:
        return refused
    if not (bool(torch.isnan(y).all()) and guards_intact()):
        return CheckOutcome(False, f"{p.key}: wrote its output outside the stream it was given (while its launch "
                                   "was captured on that stream)", float("inf"))
    graph.replay()
    torch.cuda.synchronize()
    if not guards_intact():
        return CheckOutcome(False, f"graph replay: {p.key}: wrote outside its output", float("inf"))
    outcome = compare(p, y, ref, scale)
    return outcome if outcome.ok else CheckOutcome(False, f"graph replay: {outcome.message}", outcome.max_rel_error)


def check(p: Problem, run: Callable, seeds=SEEDS, cache: ReferenceCache | None = None) -> CheckOutcome:
    """Run `run(problem, x, w, b, y)` on random inputs per seed, y pre-filled with NaN, and compare with the
    float64 reference of the problem (its paddings and its activation)."""
    import torch

    cache = cache or ReferenceCache()
    worst = 0.0
    for seed in seeds:
        x, w, b, ref, scale = cache.get(p, seed)
        y, guards_intact = guarded_output(p, device=x.device)
        run(p, x, w, b, y)
        torch.cuda.synchronize()
        if not guards_intact():
            return CheckOutcome(False, f"seed {seed}: {p.key}: wrote outside its output", float("inf"))
        outcome = compare(p, y, ref, scale)
        if not outcome.ok:
            return CheckOutcome(False, f"seed {seed}: {outcome.message}", outcome.max_rel_error)
        worst = max(worst, outcome.max_rel_error)
    return CheckOutcome(True, "", worst)


# The backward: grad_x, grad_weight and grad_bias of depthwise_conv1d (with p's activation) against
# float64 autograd of F.conv1d on the same inputs. Each gradient's error is bounded like the forward's,
# by the sum of the magnitudes it adds up (|w|*|g| for grad_x, |g|*|x| for grad_weight, |g| for grad_bias,
# g being grad_out through the activation), so long reductions over B and L are judged by their own size.
def backward_reference(p: Problem, x, w, b, gy):
    """float64 (grad_x, grad_weight, grad_bias) and their error scales."""
    import torch

    xd = x.double().requires_grad_()
    wd = w.double().requires_grad_()
    bd = b.double().requires_grad_() if b is not None else None
    with torch.enable_grad():
        silu = p.activation == "silu"
        z = torch_conv(p, xd, wd, bd)
        y = activate(p, z)
        grads = torch.autograd.grad(y, [t for t in (xd, wd, bd) if t is not None], gy.double(), retain_graph=True)
        g = torch.autograd.grad(y, z, gy.double())[0] if silu else gy.double()
        xa = xd.detach().abs().requires_grad_()
        wa = wd.detach().abs().requires_grad_()
        za = torch_conv(p, xa, wa, bd.detach().abs() if bd is not None else None)
        gs = g.abs()
        if silu:
            # The kernel recomputes z in fp32, and SiLU's slope moves with z (|silu''| <= 0.5): an error of
            # tol * |z|'s scale in z is an error of 0.5 * that in the slope, which g carries.
            gs = gs + 0.5 * gy.double().abs() * za.detach()
        sx, sw = torch.autograd.grad(za, [xa, wa], gs)
    sb = gs.abs().sum(dim=(0, 2))
    gb = grads[2] if b is not None else g.sum(dim=(0, 2))
    return (grads[0], grads[1], gb), (sx, sw, sb)


def grad_output(p: Problem, seed: int, device: str = "cuda"):
    """A random grad_out of the problem's output, in its layout, as the next layer would send it."""
    import torch

    gen = torch.Generator(device=device).manual_seed(1000 + seed)
    return in_layout(torch.randn(p.batch, p.channels, p.out_length, generator=gen, device=device)
                     .to(torch_dtype(p.dtype)), p.layout)


def nan_gradients(p: Problem, x, w) -> tuple:
    """NaN-filled grad_x (in x's layout), grad_weight and grad_bias for a backward to write."""
    import torch

    gx = in_layout(torch.full(x.shape, float("nan"), device=x.device, dtype=x.dtype), p.layout)
    gw = torch.full(w.shape, float("nan"), device=x.device, dtype=x.dtype)
    gb = torch.full((p.channels,), float("nan"), device=x.device, dtype=x.dtype)
    return gx, gw, gb


class BackwardReferenceCache(_ProblemSeedCache):
    """check_backward's: x, w, b, grad_out, and the float64 gradients with their error scales (a large
    problem's entry holds two float64 copies of x)."""

    def _make(self, p: Problem, seed: int) -> tuple:
        x, w, b = make_inputs(p, seed, self.device)
        gy = grad_output(p, seed, x.device)
        return (x, w, b, gy, *backward_reference(p, x, w, b, gy))


def _compare_gradients(p: Problem, got: tuple, refs: tuple, scales: tuple, what_first: str) -> CheckOutcome:
    worst = 0.0
    for what, g, ref, scale in zip(("grad_x", "grad_weight", "grad_bias"), got, refs, scales, strict=True):
        outcome = compare(p, g, ref, scale)
        if not outcome.ok:
            return CheckOutcome(False, f"{what_first}{what}: {outcome.message}", outcome.max_rel_error)
        worst = max(worst, outcome.max_rel_error)
    return CheckOutcome(True, "", worst)


def check_backward(p: Problem, run: Callable, seeds=(0, 1),
                   cache: BackwardReferenceCache | None = None) -> CheckOutcome:
    """Run `run(problem, x, w, b, gy, gx, gw, gb)` (outputs NaN-filled, gx in x's layout) and compare all three
    with float64 autograd of the problem (its paddings and its activation)."""
    import torch

    cache = cache or BackwardReferenceCache()
    worst = 0.0
    for seed in seeds:
        x, w, b, gy, refs, scales = cache.get(p, seed)
        gx, gw, gb = nan_gradients(p, x, w)
        run(p, x, w, b, gy, gx, gw, gb)
        torch.cuda.synchronize()
        outcome = _compare_gradients(p, (gx, gw, gb), refs, scales, f"seed {seed} act {p.activation_arg}: ")
        if not outcome.ok:
            return outcome
        worst = max(worst, outcome.max_rel_error)
    return CheckOutcome(True, "", worst)


def through_backward_op(op: Callable) -> Callable:
    """A `run` for check_backward that calls the registered backward op as autograd does (the problem's
    paddings and activation) and copies its gradients into the NaN-filled outputs."""
    def run(q: Problem, x, w, b, gy, gx, gw, gb) -> None:
        rx, rw, rb = op(gy, x, w, b, *q.op_args)
        gx.copy_(rx), gw.copy_(rw), gb.copy_(rb)
    return run


def check_backward_stream(p: Problem, run: Callable, cache: BackwardReferenceCache | None = None) -> CheckOutcome:
    """check_stream for the backward: its launch (both kernels, and any scratch it takes), captured into a
    CUDA graph on a side stream, writes nothing before the replay, and the replay's gradients are right."""
    import torch

    cache = cache or BackwardReferenceCache()
    x, w, b, gy, refs, scales = cache.get(p, 0)
    gx, gw, gb = nan_gradients(p, x, w)
    graph, refused = _captured_on_a_side_stream(p, lambda: run(p, x, w, b, gy, gx, gw, gb))
    if refused is not None:
        return refused
    if not all(bool(torch.isnan(g).all()) for g in (gx, gw, gb)):
        return CheckOutcome(False, f"{p.key}: wrote its gradients outside the stream it was given (while its "
                                   "launch was captured on that stream)", float("inf"))
    graph.replay()
    torch.cuda.synchronize()
    return _compare_gradients(p, (gx, gw, gb), refs, scales, "graph replay: ")
