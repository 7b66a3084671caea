"""The fused SiLU, forward and backward, on inputs holding +-inf, +-90, +-1e30, 0 and NaN: the frozen module
against float64 taken to SiLU's limits (templates/_common.cu.j2, dw_silu and dw_silu_grad). Non-finite
results are compared by class (NaN where the reference is NaN, the same infinity where it is infinite),
finite ones within the dtype's tolerance; the fast (B, C, L) and (B, L, C) kernels and the generic ones."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dwgen.dtypes import DTYPES, torch_dtype
from tests.gpu.test_op_gpu import Call, grads, run, tensor

pytestmark = pytest.mark.gpu

INF, NAN = float("inf"), float("nan")
SPECIALS = (INF, -INF, 90.0, -90.0, 1e30, -1e30, 0.0, NAN)


@pytest.fixture(scope="module")
def generated():
    import generated as g

    g.build()
    return g


def silu64(z):
    """float64 SiLU at its limits: torch gives silu(-inf) = -inf * 0 = NaN; the limit is 0."""
    y = z * torch.sigmoid(z)
    return torch.where(z == -INF, torch.zeros_like(z), y)


def slope64(z):
    """float64 d silu / dz at its limits: torch gives NaN at both infinities (inf * 0); the limits are 1 and 0."""
    s = torch.sigmoid(z)
    g = s * (1 + z * (1 - s))
    return torch.where(z == INF, torch.ones_like(z), torch.where(z == -INF, torch.zeros_like(z), g))


def taps(c: Call, x):
    """x zero-padded as the call pads it, and the view of tap k: xp[..., k*D + o*S] for each output o."""
    xp = F.pad(x, c.pads)
    span = c.stride * (c.out_length - 1) + 1
    return xp, [xp[..., k * c.dilation:k * c.dilation + span:c.stride] for k in range(c.k)]


def conv64(c: Call, x, w, b):
    """The conv tap by tap in float64 (only the real taps: no algorithm of torch's multiplies a padding zero
    or another channel's weight into an infinity)."""
    _, xs = taps(c, x)
    z = sum(w[:, 0, k][None, :, None] * xk for k, xk in enumerate(xs))
    return z + b[None, :, None] if b is not None else z


def reference(c: Call, x, w, b, gy):
    """float64 (y, grad_x, grad_weight, grad_bias) and their error scales, SiLU at its limits."""
    xd, wd, gyd = x.double(), w.double(), gy.double()
    bd = b.double() if b is not None else torch.zeros(c.channels, dtype=torch.float64, device=x.device)
    z = conv64(c, xd, wd, bd)
    g = gyd * slope64(z)
    za = conv64(c, xd.abs(), wd.abs(), bd.abs())
    # As dwgen.check.backward_reference: z recomputed in fp32 moves the slope by up to 0.5 of its error; at
    # an infinite z the slope is exactly its limit, so that term is left out there.
    gs = g.abs() + 0.5 * gyd.abs() * torch.where(torch.isfinite(za), za, torch.zeros_like(za))
    xp, xs = taps(c, xd)
    _, xas = taps(c, xd.abs())
    gw = torch.stack([(g * xk).sum(dim=(0, 2)) for xk in xs], dim=1)[:, None, :]
    sw = torch.stack([(gs * xk).sum(dim=(0, 2)) for xk in xas], dim=1)[:, None, :]
    # grad_x: each tap scatters w[k] * g back to the input it read (through the padded input, then cropped).
    gxp, sxp = torch.zeros_like(xp), torch.zeros_like(xp)
    span = c.stride * (c.out_length - 1) + 1
    for k in range(c.k):
        at = slice(k * c.dilation, k * c.dilation + span, c.stride)
        gxp[..., at] += wd[:, 0, k][None, :, None] * g
        sxp[..., at] += wd[:, 0, k].abs()[None, :, None] * gs
    left = c.pads[0]
    gx, sx = gxp[..., left:left + c.length], sxp[..., left:left + c.length]
    return ((silu64(z), za), (gx, sx), (gw, sw), (g.sum(dim=(0, 2)), gs.sum(dim=(0, 2))))


def mismatches(out, ref, scale, dtype: str) -> str:
    """'' when out matches ref: NaN for NaN, the same infinity for an infinity, else within tolerance."""
    d = DTYPES[dtype]
    out = out.detach().double()
    nan_ok = torch.isnan(out) == torch.isnan(ref)
    inf_ok = torch.where(torch.isinf(ref), out == ref, ~torch.isinf(out))
    finite = torch.isfinite(ref)
    close = ~finite | ((out - ref).abs() <= d.tolerance * scale + d.absolute_floor)  # inf scale: any finite
    bad = ~(nan_ok & inf_ok & close)
    if not bool(bad.any()):
        return ""
    idx = tuple(int(i) for i in bad.nonzero()[0])
    return f"{int(bad.sum())} wrong, first at {idx}: got {float(out[idx]):.6g}, want {float(ref[idx]):.6g}"


def with_specials(c: Call, x):
    """x (B, C, L) with the special values written in, away from the padding (so that no output that sees
    one also reads a padding zero, where a kernel may skip the tap that float64 multiplies): channel 4m alone,
    4m + 1 two side by side, 4m + 2 all eight spread out, 4m + 3 none."""
    margin = 2 * (c.k * c.dilation + max(c.pads)) + 8
    x = x.detach().clone()
    for ch in range(c.channels):
        kind, m = ch % 4, ch // 4
        for n in range(c.batch):
            at = margin + 13 * n + ch % 7
            if kind == 0:
                x[n, ch, at] = SPECIALS[m % 8]
            elif kind == 1:
                x[n, ch, at], x[n, ch, at + 1] = SPECIALS[m % 8], SPECIALS[(m + 3) % 8]
            elif kind == 2:
                for j, v in enumerate(SPECIALS):
                    x[n, ch, at + j * (2 * c.k * c.dilation + 1)] = v
    assert margin + 13 * c.batch + 7 + 8 * (2 * c.k * c.dilation + 1) < c.length - margin
    return x


CASES = [Call(2, 64, 600, k, stride=s, padding=p, dtype=dtype, layout=layout, bias=bias, activation="silu")
         for dtype in ("fp32", "bf16") for layout in ("bcl", "blc")
         for k, s, p, bias in ((1, 1, 0, False), (4, 1, "causal", True), (3, 2, 1, True))]


@pytest.mark.parametrize("c", CASES, ids=str)
def test_silu_at_the_edges_of_the_floats(generated, c):
    gen = torch.Generator(device="cuda").manual_seed(7)
    dt = torch_dtype(c.dtype)
    x = with_specials(c, tensor((c.batch, c.channels, c.length), "bcl", torch.float32, gen))
    x = (x.to(dt).transpose(1, 2).contiguous().transpose(1, 2) if c.layout == "blc" else x.to(dt)).requires_grad_()
    if c.k == 1:  # z = +-x exactly: SiLU and its slope meet each special value itself
        sign = torch.where(torch.arange(c.channels, device="cuda") % 8 < 4, 1.0, -1.0)
        w = sign[:, None, None].to(dt).requires_grad_()
    else:
        w = torch.randn(c.channels, 1, c.k, generator=gen, device="cuda").to(dt).requires_grad_()
    b = torch.randn(c.channels, generator=gen, device="cuda").to(dt).requires_grad_() if c.bias else None
    gy = tensor((c.batch, c.channels, c.out_length), c.layout, dt, gen)

    y = run(generated, c, x, w, b)
    got = (y, *grads(y, x, w, b, gy))
    torch.cuda.synchronize()
    refs = reference(c, x.detach(), w.detach(), b.detach() if b is not None else None, gy)
    kernels = {d: generated.kernel_for(x, w, b, c.stride, c.padding, c.dilation, direction=d) for d in ("fwd", "bwd")}
    for what, out, (ref, scale) in zip(("y", "grad_x", "grad_weight", "grad_bias"), got, refs, strict=True):
        if out is None:  # no bias: nothing to compare
            continue
        assert out.shape == ref.shape, (what, out.shape, ref.shape)
        message = mismatches(out, ref, scale, c.dtype)
        assert not message, f"{c} {kernels}: {what}: {message}"
    # the inputs hold every class: the comparison above saw NaN, both infinities and finite values
    assert bool(torch.isnan(refs[0][0]).any()) and bool((refs[0][0] == INF).any())
