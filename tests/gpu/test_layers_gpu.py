"""DepthwiseConv1d on the GPU against nn.Conv1d in float64: forward, padding same/causal, SiLU, gradients, swap."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dwgen.dtypes import DTYPES
from generated.layers import DepthwiseConv1d, swap_conv1d

pytestmark = pytest.mark.gpu
DEVICE = "cuda"

# (batch, channels, length, kernel_size, stride, padding, dilation, bias)
SHAPES = [
    (2, 64, 1000, 3, 1, 1, 1, True),
    (4, 96, 777, 4, 1, "causal", 1, True),  # Mamba's short conv
    (1, 16, 64, 4, 1, "causal", 3, False),
    (2, 48, 513, 7, 1, "same", 2, False),
    (2, 40, 300, 4, 1, "same", 1, True),  # even K: PyTorch puts the extra tap on the right
    (3, 32, 1000, 5, 2, 2, 1, True),
]
ids = [f"{b}x{c}x{n}_k{k}_s{s}_p{p}_d{d}{'_bias' if bias else ''}" for b, c, n, k, s, p, d, bias in SHAPES]
DTYPE_NAMES = ["fp32", "bf16"]


def make(shape, dtype: str, activation, layout: str = "bcl", seed: int = 0):
    """The layer, its nn.Conv1d twin in float64 with the same parameters, and an input x."""
    b, c, n, k, s, p, d, bias = shape
    torch.manual_seed(seed)
    dt = getattr(torch, DTYPES[dtype].torch_name)
    ours = DepthwiseConv1d(c, k, s, p, d, bias=bias, activation=activation, device=DEVICE, dtype=dt)
    twin_padding = d * (k - 1) if p == "causal" else p
    twin = nn.Conv1d(c, c, k, s, twin_padding, d, groups=c, bias=bias, device=DEVICE, dtype=torch.float64)
    twin.load_state_dict({key: v.double() for key, v in ours.state_dict().items()})
    x = torch.randn(b, n, c, device=DEVICE).to(dt).transpose(1, 2) if layout == "blc" else \
        torch.randn(b, c, n, device=DEVICE).to(dt)
    return ours, twin, x


def twin_forward(twin, x, padding, activation):
    """nn.Conv1d, then the slice causal padding saves, then SiLU: what the layer must equal."""
    y = twin(x)
    if padding == "causal":
        y = y[..., :x.shape[-1]]
    return F.silu(y) if activation == "silu" else y


def scale_of(twin, x, padding, activation):
    """conv(|x|, |w|) + |b| in float64, the sum each output's error is relative to (SiLU's slope is below 1.1)."""
    abs_twin = copy.deepcopy(twin)
    with torch.no_grad():
        for p in abs_twin.parameters():
            p.abs_()
    y = twin_forward(abs_twin, x.double().abs(), padding, None)
    return y * 1.1 if activation == "silu" else y


def assert_close(got, want, scale, dtype: str, tol_scale: float = 1.0, what: str = ""):

    tol, floor = DTYPES[dtype].tolerance * tol_scale, DTYPES[dtype].absolute_floor
    assert tuple(got.shape) == tuple(want.shape), (what, tuple(got.shape), tuple(want.shape))
    err = (got.double() - want).abs()
    bad = ~(err <= tol * scale + floor)  # NaN lands in bad
    if bool(bad.any()):
        i = tuple(int(v) for v in bad.nonzero()[0])
        rel = float(torch.nan_to_num(err / scale.clamp_min(1e-30), nan=float("inf")).max())
        pytest.fail(f"{what}: first mismatch at {i}: got {float(got[i]):.6g}, want {float(want[i]):.6g} "
                    f"(max relative error {rel:.3g} > {tol:g})")


@pytest.mark.parametrize("layout", ["bcl", "blc"])
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_forward_equals_nn_conv1d(shape, dtype, activation, layout):

    ours, twin, x = make(shape, dtype, activation, layout)
    padding = shape[5]
    with torch.no_grad():
        y = ours(x)
        want = twin_forward(twin, x.double(), padding, activation)
        scale = scale_of(twin, x, padding, activation)
    # SiLU adds one rounding of its own result (|silu(z)| <= |z| <= scale)
    assert_close(y, want, scale, dtype, 2.0 if activation else 1.0, "forward")
    assert y.dtype == x.dtype
    if padding in ("same", "causal"):
        assert y.shape[-1] == x.shape[-1]
    # x's memory order, and a tensor of its own: no larger buffer behind it that a slice was cut from
    assert y.transpose(1, 2).is_contiguous() if layout == "blc" else y.is_contiguous()
    assert y.untyped_storage().nbytes() == y.numel() * y.element_size()


def grad_scales(twin, x, gy, padding, activation):
    """The float64 sums each gradient's error is relative to: the same backward on |x|, |w|, |gy|."""
    abs_twin = copy.deepcopy(twin)
    with torch.no_grad():
        for p in abs_twin.parameters():
            p.abs_()
    xa = x.double().abs().requires_grad_(True)
    y = twin_forward(abs_twin, xa, padding, None)
    y.backward(gy.abs() * (1.1 if activation == "silu" else 1.0))
    return xa.grad, abs_twin.weight.grad, abs_twin.bias.grad if abs_twin.bias is not None else None


@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_backward_equals_nn_conv1d(shape, dtype, activation):

    ours, twin, x = make(shape, dtype, activation, "bcl", seed=1)
    padding = shape[5]
    x = x.requires_grad_(True)
    y = ours(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    xd = x.detach().double().requires_grad_(True)
    twin_forward(twin, xd, padding, activation).backward(gy.double())
    sx, sw, sb = grad_scales(twin, x.detach(), gy.double(), padding, activation)
    # gradients add up B*L products in fp32 before their one rounding; allow the sum's error too
    tol_scale = 10.0 if dtype == "fp32" else 2.0
    assert_close(x.grad, xd.grad, sx, dtype, tol_scale, "grad_x")
    assert_close(ours.weight.grad, twin.weight.grad, sw, dtype, tol_scale, "grad_weight")
    if ours.bias is not None:
        assert_close(ours.bias.grad, twin.bias.grad, sb, dtype, tol_scale, "grad_bias")
    assert x.grad.dtype == x.dtype and ours.weight.grad.dtype == ours.weight.dtype


def test_bf16_error_at_most_twice_pytorchs():
    """The Mamba layer in bf16 (causal, SiLU, x stored (B, L, C)): output and gradients no further from
    float64 than twice what nn.Conv1d + slice + F.silu in bf16 gives on the same numbers."""

    shape = (4, 256, 2048, 4, 1, "causal", 1, True)
    ours, twin, x = make(shape, "bf16", "silu", "blc", seed=2)
    theirs = copy.deepcopy(twin).to(torch.bfloat16)
    norm = torch.linalg.vector_norm

    def run(module, inp):
        inp = inp.detach().requires_grad_(True)
        y = module(inp) if module is ours else F.silu(module(inp)[..., :inp.shape[-1]])
        y.backward(gy.to(y.dtype))
        return y.detach().double(), inp.grad.double(), module.weight.grad.double(), module.bias.grad.double()

    gy = torch.randn(x.shape, device=DEVICE, dtype=torch.float64)
    want = run(twin, x.double())
    for name, a, b, w in zip(("y", "grad_x", "grad_weight", "grad_bias"), run(ours, x), run(theirs, x), want,
                             strict=True):
        e_ours, e_theirs = float(norm(a - w) / norm(w)), float(norm(b - w) / norm(w))
        assert e_ours <= 2 * e_theirs, (name, e_ours, e_theirs)


class Block(nn.Module):
    """Mamba-ish: pointwise in, the short causal conv by padding and slice, SiLU, then a reflect-padded depthwise
    conv (swap_conv1d must leave it, and the pointwise one) and a dilated "same" one."""

    def __init__(self, c: int = 64):
        super().__init__()
        self.inp = nn.Conv1d(c, c, 1)
        self.conv1d = nn.Conv1d(c, c, 4, groups=c, padding=3)
        self.smooth = nn.Conv1d(c, c, 3, groups=c, padding=1, padding_mode="reflect")
        self.mix = nn.Conv1d(c, c, 5, groups=c, padding="same", dilation=2, bias=False)

    def forward(self, x):
        h = F.silu(self.conv1d(self.inp(x))[..., :x.shape[-1]])
        return self.mix(self.smooth(h)) + x


def test_swap_conv1d_keeps_outputs_and_gradients(monkeypatch):
    # cuDNN's TF32 off: the pointwise layers left to PyTorch would otherwise round their inputs to 10 bits, and a
    # last-bit difference upstream (any other summation order) moves their weight gradients by ~1e-5 relative
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    torch.manual_seed(3)
    model = nn.Sequential(Block(), Block()).to(DEVICE)
    before = copy.deepcopy(model)
    params = list(model.parameters())
    report = swap_conv1d(model)
    assert report.replaced == ["0.conv1d", "0.mix", "1.conv1d", "1.mix"]
    assert [name for name, _ in report.skipped] == ["0.inp", "0.smooth", "1.inp", "1.smooth"]
    x = torch.randn(2, 64, 500, device=DEVICE)
    y, want = model(x), before(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    want.backward(gy)
    torch.testing.assert_close(y, want, rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), before.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    # an optimizer made before the swap trains the swapped model: its parameters are the same objects
    assert all(a is b for a, b in zip(model.parameters(), params, strict=True))
    opt = torch.optim.SGD(params, lr=0.1)
    w0 = model[0].conv1d.weight.detach().clone()
    opt.step()
    assert not torch.equal(model[0].conv1d.weight, w0)

