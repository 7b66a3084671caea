"""The registered op and its backward (docs/design-op.md): opcheck, gradients against float64 autograd,
torch.compile, CUDA graphs, a second GPU, bitwise-reproducible gradients, and a short training run of a
Mamba-style block against the same block on nn.Conv1d."""
from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from dwgen.dtypes import torch_dtype
from dwgen.gate import misaligned

pytestmark = pytest.mark.gpu

# Largest |dwgen - float64| over the largest |float64| of the same tensor, in fp32: the outputs add K
# products, grad_weight and grad_bias add B*Lout of them in fp32 (per-tile partials, then their sum), so
# they miss by a few fp32 roundings of the largest partial sums, 1e-6 or less; 1e-4 leaves room and still
# fails any wrong tap, padding, stride or missing term, each of which moves some output by 1e-2 or more.
FP32_TOL = 1e-4
ACTIVATIONS = {None: 0, "silu": 1}


@pytest.fixture(scope="module")
def generated():
    """The frozen module, built: loading its extension registers dwgen::depthwise_conv1d and its backward."""
    import generated as g

    g.build()
    return g


def fwd_op():
    return torch.ops.dwgen.depthwise_conv1d.default


def bwd_op():
    return torch.ops.dwgen.depthwise_conv1d_backward.default


@dataclass(frozen=True)
class Call:
    """One call: sizes, K, stride, padding (an int, "same", "causal", or (left, right) for the raw op),
    dilation, dtype, x's memory order, bias, activation."""

    batch: int
    channels: int
    length: int
    k: int
    stride: int = 1
    padding: int | str | tuple[int, int] = 0
    dilation: int = 1
    dtype: str = "fp32"
    layout: str = "bcl"
    bias: bool = True
    activation: str | None = None

    @property
    def pads(self) -> tuple[int, int]:
        """(left, right) padding as the contract spells "same" and "causal"."""
        span = self.dilation * (self.k - 1)
        if self.padding == "causal":
            return span, 0
        if self.padding == "same":
            return span // 2, span - span // 2
        if isinstance(self.padding, tuple):
            return self.padding
        return self.padding, self.padding

    @property
    def out_length(self) -> int:
        left, right = self.pads
        return (self.length + left + right - self.dilation * (self.k - 1) - 1) // self.stride + 1

    @property
    def act(self) -> int:
        return ACTIVATIONS[self.activation]

    def __str__(self) -> str:
        p = "x".join(map(str, self.padding)) if isinstance(self.padding, tuple) else self.padding
        tail = ("_bias" if self.bias else "") + (f"_{self.activation}" if self.activation else "")
        return (f"{self.batch}x{self.channels}x{self.length}_k{self.k}_s{self.stride}_p{p}_d{self.dilation}"
                f"_{self.dtype}_{self.layout}{tail}")


def tensor(shape_bcl: tuple[int, int, int], layout: str, dtype, gen: torch.Generator, device="cuda"):
    """randn of shape (B, C, L) in `layout`'s memory order: blc is (B, L, C) memory viewed via transpose."""
    b, c, n = shape_bcl
    if layout == "blc":
        return torch.randn(b, n, c, generator=gen, device=device).to(dtype).transpose(1, 2)
    return torch.randn(b, c, n, generator=gen, device=device).to(dtype)


def inputs(c: Call, seed: int = 0, requires_grad: bool = True, device="cuda"):
    """Fresh x, weight, bias (None without bias) and a grad_out in the output's memory order; never zeros."""
    gen = torch.Generator(device=device).manual_seed(seed)
    dt = torch_dtype(c.dtype)
    x = tensor((c.batch, c.channels, c.length), c.layout, dt, gen, device)
    w = torch.randn(c.channels, 1, c.k, generator=gen, device=device).to(dt)
    b = torch.randn(c.channels, generator=gen, device=device).to(dt) if c.bias else None
    gy = tensor((c.batch, c.channels, c.out_length), c.layout, dt, gen, device)
    if requires_grad:
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_()
    return x, w, b, gy


def run(generated, c: Call, x, w, b):
    """The public function, or the registered op for a padding the public function has no name for."""
    if isinstance(c.padding, tuple):
        return fwd_op()(x, w, b, c.stride, *c.pads, c.dilation, c.act)
    return generated.depthwise_conv1d(x, w, b, stride=c.stride, padding=c.padding, dilation=c.dilation,
                                      activation=c.activation)


def torch_forward(c: Call, x, w, b):
    """PyTorch's own: pad (asymmetric as asked), conv1d, SiLU where asked."""
    z = F.conv1d(F.pad(x, c.pads), w, b, stride=c.stride, dilation=c.dilation, groups=c.channels)
    return F.silu(z) if c.activation == "silu" else z


def reference(c: Call, x, w, b, gy):
    """float64 autograd of F.conv1d: (y, grad_x, grad_weight, grad_bias); grad_bias is that of a zero bias
    when there is none (the backward op writes it all the same)."""
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    bd = (b.detach().double() if b is not None else torch.zeros(c.channels, dtype=torch.float64,
                                                                device=x.device)).requires_grad_()
    y = torch_forward(c, xd, wd, bd)
    return (y.detach(), *torch.autograd.grad(y, (xd, wd, bd), gy.double()))


def rel_err(out, ref) -> float:
    """Largest |out - ref| over the largest |ref|; NaN (an unwritten element) reads as inf."""
    ref = ref.detach().double()
    err = (out.detach().double() - ref).abs().max()
    scale = ref.abs().max().clamp_min(1e-30)
    return float(torch.nan_to_num(err / scale, nan=float("inf")))


def norm_rel_err(out, ref) -> float:
    """||out - ref|| / ||ref||: the error of a whole tensor, as in the forward's 16-bit test."""
    ref = ref.detach().double()
    return float(torch.linalg.vector_norm(out.detach().double() - ref) / torch.linalg.vector_norm(ref))


def bitwise_equal(a, b) -> bool:
    """Same bits (torch.equal says -0 == 0 and NaN != NaN; this says neither)."""
    ints = {4: torch.int32, 2: torch.int16}[a.element_size()]
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.contiguous().view(ints), b.contiguous().view(ints)))


def grads(y, x, w, b, gy):
    """(grad_x, grad_weight, grad_bias or None) as autograd hands them over, without accumulating into .grad
    (which would restride them to x's strides whatever the backward returned)."""
    leaves = [t for t in (x, w, b) if t is not None]
    out = torch.autograd.grad(y, leaves, gy)
    return (*out, None) if b is None else out


def has_xs_order(y, x) -> bool:
    """y is (B, C, L) contiguous when x is (one position or one channel makes x both: then (B, C, L) too),
    else (B, L, C) memory viewed as (B, C, L) when x is that."""
    if x.is_contiguous():
        return y.is_contiguous()
    return y.transpose(1, 2).is_contiguous() if x.transpose(1, 2).is_contiguous() else y.is_contiguous()


def same_memory_order(a, b) -> bool:
    """a has b's strides wherever a dimension has more than one element (a size-1 dimension's stride is free)."""
    return a.shape == b.shape and all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape, strict=True)
                                      if n > 1)


# ---- registration and opcheck ----------------------------------------------------------------------------

def test_ops_have_the_contracts_schemas(generated):
    assert str(fwd_op()._schema) == (
        "dwgen::depthwise_conv1d(Tensor x, Tensor weight, Tensor? bias, int stride, int pad_left, int pad_right, "
        "int dilation, int activation) -> Tensor")
    assert str(bwd_op()._schema) == (
        "dwgen::depthwise_conv1d_backward(Tensor grad_out, Tensor x, Tensor weight, Tensor? bias, int stride, "
        "int pad_left, int pad_right, int dilation, int activation) -> (Tensor, Tensor, Tensor)")


OPCHECK_CASES = [
    Call(2, 16, 37, 3, padding=1),
    Call(2, 16, 37, 4, padding="causal", layout="blc", bias=False, activation="silu"),
    Call(3, 24, 41, 5, stride=2, dilation=2, padding=(3, 1), activation="silu"),
    Call(2, 32, 64, 4, padding="causal", dtype="bf16", layout="blc", activation="silu"),
    Call(2, 16, 33, 3, stride=2, padding=(0, 2), dtype="bf16", bias=False),
    Call(1, 8, 29, 7, dilation=3, padding="same", dtype="bf16", layout="blc"),
    Call(2, 16, 30, 2, padding=(1, 0), dtype="fp16", activation="silu"),
]


@pytest.mark.parametrize("c", OPCHECK_CASES, ids=str)
def test_opcheck_forward(generated, c):
    """Schema, autograd registration, fake (Meta) kernel and AOT dispatch with dynamic shapes, backward included."""
    x, w, b, _ = inputs(c)
    torch.library.opcheck(fwd_op(), (x, w, b, c.stride, *c.pads, c.dilation, c.act))


@pytest.mark.parametrize("c", OPCHECK_CASES, ids=str)
def test_opcheck_backward(generated, c):
    """The backward op has no autograd of its own (no double backward): every other check, on inputs that
    do not require grad."""
    x, w, b, gy = inputs(c, requires_grad=False)
    torch.library.opcheck(bwd_op(), (gy, x, w, b, c.stride, *c.pads, c.dilation, c.act),
                          test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))


# ---- gradients against float64 ---------------------------------------------------------------------------

def gradient_cases(n: int, seed: int = 10) -> list[Call]:
    """fp32 cases across K 1-9 and 31, stride 1-3, dilation 1-3, both memory orders, every kind of padding,
    bias or not, SiLU or not, odd lengths (some shorter than the dilated kernel), one channel, one row."""
    rng = random.Random(seed)
    out: list[Call] = []
    while len(out) < n:
        k = rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 9, 31])
        stride, dilation = rng.randint(1, 3), rng.randint(1, 3)
        kind = rng.choice(["int", "causal", "same", "asym"])
        if kind == "same" and stride != 1:
            kind = "causal"
        span = dilation * (k - 1)
        padding = {"int": rng.randint(0, span), "causal": "causal", "same": "same",
                   "asym": (rng.randint(0, span), rng.randint(0, span))}[kind]
        length = rng.choice([1, 3, 7, 63, 257, 1001, 2049, rng.randrange(1, 4000, 2)])
        c = Call(rng.randint(1, 3), rng.choice([1, 3, 8, 24, 64, 96]), length, k, stride, padding, dilation,
                 layout=rng.choice(["bcl", "blc"]), bias=rng.random() < 0.6, activation=rng.choice([None, "silu"]))
        if c.out_length >= 1:
            out.append(c)
    return out


GRADIENT_CASES = [
    Call(2, 64, 1000, 3, padding=1),
    Call(2, 64, 999, 4, padding="causal", layout="blc", activation="silu"),
    Call(1, 1, 1, 4, padding="causal", bias=False),
    Call(3, 8, 5, 9, padding=(8, 0), layout="blc", activation="silu"),  # length < K
    Call(2, 24, 777, 31, stride=3, dilation=3, padding=(45, 2), activation="silu"),
    *gradient_cases(48),
]


@pytest.mark.parametrize("c", GRADIENT_CASES, ids=str)
def test_fp32_gradients_match_float64(generated, c):
    x, w, b, gy = inputs(c, seed=1)
    y = run(generated, c, x, w, b)
    gx, gw, gb = grads(y, x, w, b, gy)
    ref = reference(c, x, w, b, gy)
    for name, got, want in (("y", y, ref[0]), ("grad_x", gx, ref[1]), ("grad_weight", gw, ref[2]),
                            ("grad_bias", gb, ref[3])):
        if got is None:
            continue
        assert got.shape == want.shape and got.dtype == x.dtype, (name, got.shape, got.dtype)
        assert rel_err(got, want) <= FP32_TOL, (name, rel_err(got, want))
    # results and gradients keep x's memory order: no hidden transpose on either side
    assert same_memory_order(gx, x), (gx.stride(), x.stride())
    assert has_xs_order(y, x), (y.stride(), x.stride())


@pytest.mark.parametrize("c", [Call(2, 64, 1000, 4, padding="causal", activation="silu", layout=layout, bias=bias)
                                  for layout in ("bcl", "blc") for bias in (True, False)], ids=str)
def test_backward_op_returns_all_three_in_xs_order(generated, c):
    """The raw backward op: grad_x in x's memory order, grad_weight (C, 1, K), grad_bias (C,) even without a
    bias, all in x's dtype and right against float64."""
    x, w, b, gy = inputs(c, seed=2, requires_grad=False)
    gx, gw, gb = bwd_op()(gy, x, w, b, c.stride, *c.pads, c.dilation, c.act)
    _, rx, rw, rb = reference(c, x, w, b, gy)
    assert gx.stride() == x.stride() and gw.shape == (c.channels, 1, c.k) and gb.shape == (c.channels,)
    assert gx.dtype == gw.dtype == gb.dtype == x.dtype
    for name, got, want in (("grad_x", gx, rx), ("grad_weight", gw, rw), ("grad_bias", gb, rb)):
        assert rel_err(got, want) <= FP32_TOL, (name, rel_err(got, want))


@pytest.mark.parametrize("gy_order", ["other", "expanded"])
@pytest.mark.parametrize("layout", ["bcl", "blc"])
def test_grad_out_in_any_memory_order(generated, layout, gy_order):
    """grad_out need not be in y's memory order: the other order, or an expanded one (what y.sum() sends)."""
    c = Call(2, 32, 500, 4, padding="causal", layout=layout, activation="silu")
    x, w, b, gy = inputs(c, seed=3)
    if gy_order == "other":
        gy = gy.contiguous() if layout == "blc" else gy.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        gy = torch.full((1, 1, 1), 0.5, device="cuda").expand(gy.shape)
    y = run(generated, c, x, w, b)
    got = grads(y, x, w, b, gy)
    ref = reference(c, x, w, b, gy)
    for name, g, want in zip(("grad_x", "grad_weight", "grad_bias"), got, ref[1:], strict=True):
        assert rel_err(g, want) <= FP32_TOL, (name, rel_err(g, want))


@pytest.mark.parametrize("layout", ["bcl", "blc"])
def test_misaligned_and_strided_inputs(generated, layout):
    """x one element past a 16-byte boundary, and x read through a stride of 2: right values; grad_x of the
    misaligned x keeps its strides. (The contract does not say which order a strided x's grad_x has.)"""
    c = Call(2, 24, 301, 5, padding=2, layout=layout, activation="silu")
    base, w0, b0, gy = inputs(c, seed=4, requires_grad=False)
    wide = tensor((c.batch, c.channels, 2 * c.length), layout, base.dtype,
                  torch.Generator(device="cuda").manual_seed(5))
    for kind, x in (("misaligned", misaligned(base)), ("strided", wide[..., ::2])):
        x.requires_grad_()
        w, b = w0.detach().requires_grad_(), b0.detach().requires_grad_()
        y = run(generated, c, x, w, b)
        gx, gw, gb = grads(y, x, w, b, gy)
        ref = reference(c, x, w, b, gy)
        for name, got, want in (("y", y, ref[0]), ("grad_x", gx, ref[1]), ("grad_weight", gw, ref[2]),
                                ("grad_bias", gb, ref[3])):
            assert rel_err(got, want) <= FP32_TOL, (kind, name, rel_err(got, want))
        if kind == "misaligned":
            assert gx.stride() == x.stride()


def test_public_function_and_registered_op_agree(generated):
    """"causal" and "same" are only names for (left, right) padding: the same bits through either door."""
    for c in (Call(2, 32, 300, 4, padding="causal", layout="blc", activation="silu"),
              Call(2, 32, 300, 6, dilation=2, padding="same")):
        x, w, b, _ = inputs(c, seed=6, requires_grad=False)
        raw = fwd_op()(x, w, b, c.stride, *c.pads, c.dilation, c.act)
        assert bitwise_equal(run(generated, c, x, w, b), raw)


BF16_CASES = [
    Call(8, 512, 4096, 3, padding=1, dtype="bf16"),
    Call(4, 1024, 2048, 4, padding="causal", dtype="bf16", layout="blc", activation="silu"),
    Call(4, 1024, 2048, 4, padding="causal", dtype="bf16", activation="silu", bias=False),
    Call(4, 256, 3001, 7, stride=2, dilation=2, padding=(9, 3), dtype="bf16", activation="silu"),
    Call(2, 256, 4097, 31, padding=15, dtype="bf16", layout="blc"),
    Call(4, 512, 2048, 4, padding="causal", dtype="fp16", layout="blc", activation="silu"),
]


@pytest.mark.parametrize("c", BF16_CASES, ids=str)
def test_16_bit_gradient_error_at_most_twice_pytorchs(generated, c):
    """On the same 16-bit inputs, each of dwgen's y, grad_x, grad_weight, grad_bias is no further from
    float64 (||error|| / ||float64||) than twice PyTorch's own result in that dtype (F.pad, conv1d, SiLU,
    autograd), as FlashAttention's tests hold its 16-bit kernels to."""
    x, w, b, gy = inputs(c, seed=7)
    y = run(generated, c, x, w, b)
    ours = (y, *grads(y, x, w, b, gy))
    yt = torch_forward(c, x, w, b)
    theirs = (yt, *grads(yt, x, w, b, gy))
    ref = reference(c, x, w, b, gy)
    for name, o, t, want in zip(("y", "grad_x", "grad_weight", "grad_bias"), ours, theirs, ref, strict=True):
        if o is None:
            continue
        e_ours, e_theirs = norm_rel_err(o, want), norm_rel_err(t, want)
        assert e_ours <= 2 * e_theirs, (name, e_ours, e_theirs)


# The suite's problems whose backwards are frozen from the lane and walk families (which want grad_out 16-byte
# aligned in x's memory order): the two Mamba problems (causal) and bf16 K7 (centred padding): grad_out as the
# forward's output is laid out, one element past a 16-byte boundary, and in the other memory order. Each must
# come back right (the latter two hand over to another kernel), never refused or approximated.
SHUFFLE_CALLS = [Call(8, 4096, 2048, 4, padding="causal", dtype="bf16", activation="silu", bias=False),
                 Call(8, 4096, 2048, 4, padding="causal", dtype="bf16", layout="blc", activation="silu", bias=False),
                 Call(16, 1024, 4096, 7, padding=3, dtype="bf16", bias=False)]


@pytest.mark.parametrize("gy_kind", ["as_y", "misaligned", "other_order"])
@pytest.mark.parametrize("c", SHUFFLE_CALLS, ids=str)
def test_tuned_shuffle_backwards_take_any_grad_out(generated, c, gy_kind):
    x, w, b, gy = inputs(c, seed=12)
    frozen = generated.kernel_for(x, w, b, c.stride, c.padding, c.dilation, direction="bwd", activation=c.activation)
    assert frozen.startswith(("dw1d_bwdlane_", "dw1d_bwdwalk_")), frozen  # the kernels this test is about
    if gy_kind == "misaligned":
        gy = misaligned(gy)
    elif gy_kind == "other_order":
        gy = gy.contiguous() if c.layout == "blc" else gy.transpose(1, 2).contiguous().transpose(1, 2)
    y = run(generated, c, x, w, b)
    ours = grads(y, x, w, b, gy)
    yt = torch_forward(c, x, w, b)
    theirs = grads(yt, x, w, b, gy)
    ref = reference(c, x, w, b, gy)[1:3]
    for name, o, t, want in zip(("grad_x", "grad_weight"), ours[:2], theirs[:2], ref, strict=True):
        e_ours, e_theirs = norm_rel_err(o, want), norm_rel_err(t, want)
        assert e_ours <= 2 * e_theirs, (gy_kind, name, e_ours, e_theirs)


# ---- torch.compile ---------------------------------------------------------------------------------------

def close(a, b, dtype) -> bool:
    """Equal up to one rounding of the dtype at the tensor's scale (a different reduction order may round
    a sum the other way; anything wired wrong misses by far more)."""
    return rel_err(a, b) <= (1e-5 if dtype == torch.float32 else 2.0**-7)


@pytest.mark.parametrize("c", [Call(2, 64, 1000, 3, padding=1),
                                  Call(2, 64, 1000, 4, padding="causal", layout="blc", activation="silu"),
                                  Call(2, 128, 777, 4, padding="causal", dtype="bf16", layout="blc",
                                       activation="silu", bias=False),
                                  Call(2, 64, 1001, 5, stride=2, dilation=2, padding=4, dtype="bf16")], ids=str)
def test_compile_fullgraph_forward_and_backward_equal_eager(generated, c):
    """torch.compile(fullgraph=True) of a function calling generated.depthwise_conv1d: no graph break
    (fullgraph raises on one), and the compiled forward and backward give eager's results."""
    torch._dynamo.reset()

    def f(x, w, b):
        return run(generated, c, x, w, b)

    compiled = torch.compile(f, fullgraph=True)
    x, w, b, gy = inputs(c, seed=8)
    y_eager, y_comp = f(x, w, b), compiled(x, w, b)
    assert y_comp.shape == y_eager.shape and close(y_comp, y_eager, x.dtype)
    assert y_comp.stride() == y_eager.stride()
    for name, ge, gc in zip(("grad_x", "grad_weight", "grad_bias"), grads(y_eager, x, w, b, gy),
                            grads(y_comp, x, w, b, gy), strict=True):
        if ge is not None:
            assert close(gc, ge, x.dtype), (name, rel_err(gc, ge))


def test_compile_fullgraph_of_a_mamba_style_mixer(generated):
    """The op between a Linear and the transposes around it, compiled whole, forward and backward."""
    torch._dynamo.reset()
    gen = torch.Generator(device="cuda").manual_seed(9)
    lin_w = torch.randn(256, 64, generator=gen, device="cuda", requires_grad=True)
    w = torch.randn(256, 1, 4, generator=gen, device="cuda", requires_grad=True)
    b = torch.randn(256, generator=gen, device="cuda", requires_grad=True)
    h = torch.randn(2, 700, 64, generator=gen, device="cuda")

    def mixer(h, lin_w, w, b):
        u = F.linear(h, lin_w).transpose(1, 2)  # (B, C, L) view of (B, L, C) memory
        return generated.depthwise_conv1d(u, w, b, padding="causal", activation="silu").transpose(1, 2).square().mean()

    eager = mixer(h, lin_w, w, b)
    comp = torch.compile(mixer, fullgraph=True)(h, lin_w, w, b)
    assert rel_err(comp, eager) <= 1e-5
    for ge, gc in zip(torch.autograd.grad(eager, (lin_w, w, b)), torch.autograd.grad(comp, (lin_w, w, b)), strict=True):
        assert rel_err(gc, ge) <= 1e-4


# ---- CUDA graphs -----------------------------------------------------------------------------------------

def capture(fn):
    """fn captured in a CUDA graph after a warm-up on a side stream (as torch's graph docs ask); returns the
    graph and what the captured call returned (its static outputs)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


GRAPH_CASES = [Call(4, 256, 3000, 3, padding=1), Call(4, 512, 2048, 4, padding="causal", dtype="bf16", layout="blc",
                                                        activation="silu")]


@pytest.mark.parametrize("c", GRAPH_CASES, ids=str)
def test_cuda_graph_replay_of_forward_equals_eager(generated, c):
    x, w, b, _ = inputs(c, seed=10, requires_grad=False)
    graph, y_static = capture(lambda: run(generated, c, x, w, b))
    x2, w2, b2, _ = inputs(c, seed=11, requires_grad=False)  # new values in the captured tensors
    for t, new in ((x, x2), (w, w2), (b, b2)):
        if t is not None:
            t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    assert bitwise_equal(y_static, run(generated, c, x, w, b))


@pytest.mark.parametrize("c", GRAPH_CASES, ids=str)
def test_cuda_graph_replay_of_forward_and_backward_equals_eager(generated, c):
    x, w, b, gy = inputs(c, seed=12)

    def step():
        y = run(generated, c, x, w, b)
        return (y, *grads(y, x, w, b, gy))

    graph, static = capture(step)
    x2, w2, b2, gy2 = inputs(c, seed=13, requires_grad=False)
    with torch.no_grad():
        for t, new in ((x, x2), (w, w2), (b, b2), (gy, gy2)):
            if t is not None:
                t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("y", "grad_x", "grad_weight", "grad_bias"), static, step(), strict=True):
        if want is not None:
            assert bitwise_equal(got, want), name


# ---- the split backward's second stream -----------------------------------------------------------------
# The split backward (fp16 K31, as Conformer) runs its weight gradient on a second stream of the device,
# forked from the caller's stream and joined back to it. A stream forked into a graph capture stays in it
# until the capture ends, so a call from another thread meanwhile must not use it.

SPLIT = Call(32, 512, 1024, 31, padding=15, dtype="fp16", bias=False)


def split_inputs(generated, seed):
    x, w, b, gy = inputs(SPLIT, seed=seed, requires_grad=False)
    frozen = generated.kernel_for(x, w, b, SPLIT.stride, SPLIT.padding, SPLIT.dilation, direction="bwd")
    assert frozen.startswith("dw1d_bwdtc_"), frozen  # the kernel these tests are about
    return x, w, b, gy


def split_backward(x, w, b, gy):
    return bwd_op()(gy, x, w, b, SPLIT.stride, *SPLIT.pads, SPLIT.dilation, SPLIT.act)


def test_split_backward_replayed_from_a_graph_equals_eager(generated):
    x, w, b, gy = split_inputs(generated, seed=20)
    graph, static = capture(lambda: split_backward(x, w, b, gy))
    x2, w2, _, gy2 = split_inputs(generated, seed=21)
    for t, new in ((x, x2), (w, w2), (gy, gy2)):
        t.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("grad_x", "grad_weight", "grad_bias"), static, split_backward(x, w, b, gy),
                               strict=True):
        assert bitwise_equal(got, want), name


def test_split_backward_called_while_another_thread_captures_it(generated):
    """Thread A captures the split backward (thread-local capture mode, so that thread B may work meanwhile);
    while A's capture is open, B calls it eagerly on its own stream. B's gradients are those of an eager call
    made before, A's capture ends without error and its replay gives eager's gradients."""
    import threading

    xa, wa, ba, gya = split_inputs(generated, seed=22)
    xb, wb, bb, gyb = split_inputs(generated, seed=23)
    want_a, want_b = split_backward(xa, wa, ba, gya), split_backward(xb, wb, bb, gyb)
    torch.cuda.synchronize()
    captured, b_done = threading.Event(), threading.Event()
    result: dict = {}

    def thread_a():
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                split_backward(xa, wa, ba, gya)  # warm-up, as torch's graph docs ask
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                result["a"] = split_backward(xa, wa, ba, gya)
                captured.set()
                b_done.wait(timeout=120)
            result["graph"] = graph
        except Exception as e:  # reported by the main thread
            result["a_error"] = repr(e)
        finally:
            captured.set()

    def thread_b():
        try:
            captured.wait(timeout=120)
            stream = torch.cuda.Stream()
            with torch.cuda.stream(stream):
                result["b"] = split_backward(xb, wb, bb, gyb)
            stream.synchronize()
        except Exception as e:
            result["b_error"] = repr(e)
        finally:
            b_done.set()

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert "a_error" not in result and "b_error" not in result, result
    for name, got, want in zip(("grad_x", "grad_weight", "grad_bias"), result["b"], want_b, strict=True):
        assert bitwise_equal(got, want), ("thread B", name)
    result["graph"].replay()
    torch.cuda.synchronize()
    for name, got, want in zip(("grad_x", "grad_weight", "grad_bias"), result["a"], want_a, strict=True):
        assert bitwise_equal(got, want), ("thread A's replay", name)


# ---- a second GPU ----------------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
@pytest.mark.parametrize("layout", ["bcl", "blc"])
def test_tensors_on_the_second_gpu(generated, layout):
    """Tensors on cuda:1 while cuda:0 is current (and the other way round): results and gradients on the
    tensors' device, right against float64, and the current device left as it was."""
    c = Call(2, 64, 1000, 4, padding="causal", layout=layout, activation="silu")
    for current, where in ((0, 1), (1, 0)):
        with torch.cuda.device(current):
            x, w, b, gy = inputs(c, seed=14, device=f"cuda:{where}")
            y = run(generated, c, x, w, b)
            got = grads(y, x, w, b, gy)
            assert torch.cuda.current_device() == current
            ref = reference(c, x, w, b, gy)
            for name, g, want in zip(("y", "grad_x", "grad_weight", "grad_bias"), (y, *got), ref, strict=True):
                assert g.device == torch.device("cuda", where), name
                assert rel_err(g, want) <= FP32_TOL, (name, rel_err(g, want))


# ---- deterministic gradients -----------------------------------------------------------------------------

@pytest.mark.parametrize("c", [Call(32, 512, 8192, 3, padding=1),
                                  Call(8, 4096, 2048, 4, padding="causal", dtype="bf16", layout="blc",
                                       activation="silu")], ids=str)
def test_gradients_are_bitwise_reproducible(generated, c):
    """grad_weight and grad_bias sum per-tile partials in a fixed order (no float atomics): two backward
    runs on a shape of many tiles give the same bits, through autograd and through the op itself."""
    x, w, b, gy = inputs(c, seed=15)
    first = grads(run(generated, c, x, w, b), x, w, b, gy)
    second = grads(run(generated, c, x, w, b), x, w, b, gy)
    for name, g1, g2 in zip(("grad_x", "grad_weight", "grad_bias"), first, second, strict=True):
        assert bitwise_equal(g1, g2), name
    with torch.no_grad():
        raw = [bwd_op()(gy, x, w, b, c.stride, *c.pads, c.dilation, c.act) for _ in range(2)]
    for name, g1, g2 in zip(("grad_x", "grad_weight", "grad_bias"), *raw, strict=True):
        assert bitwise_equal(g1, g2), name
    assert bitwise_equal(raw[0][1].view_as(w), first[1])


# ---- training ---------------------------------------------------------------------------------------------

class MambaStyleBlock(nn.Module):
    """Linear(d, C), a causal depthwise conv K4 on the (B, L, C) result viewed as (B, C, L), SiLU, Linear(C, d)."""

    def __init__(self, d: int, channels: int, conv: nn.Module):
        super().__init__()
        self.inp = nn.Linear(d, channels)
        self.conv = conv
        self.out = nn.Linear(channels, d)

    def forward(self, h):
        u = self.inp(h).transpose(1, 2)
        if isinstance(self.conv, nn.Conv1d):  # as Mamba calls it: pad K-1 both sides, keep the first L, SiLU
            v = F.silu(self.conv(u)[..., :h.shape[1]])
        else:
            v = self.conv(u)
        return self.out(v.transpose(1, 2))


def train(model: nn.Module, optimizer: str, data, dtype) -> list[float]:
    opt = (torch.optim.SGD(model.parameters(), lr=0.5) if optimizer == "sgd"
           else torch.optim.Adam(model.parameters(), lr=3e-3))
    losses = []
    for h, target in data:
        loss = F.mse_loss(model(h.to(dtype)).float(), target)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# Per-step |loss(dwgen) - loss(nn.Conv1d)| / loss(nn.Conv1d). Both blocks share every layer but the conv, so
# the losses differ only by how the conv rounds. In fp32 that is summation order (1e-7 of an output): this
# test on the CPU, with an exactly rounded conv (float64 inside) standing in for dwgen, moved the losses by
# 1.6e-7 at most; 1e-5 leaves room. In bf16 PyTorch rounds the conv's output to bf16 before SiLU and SiLU's
# gradient before the conv's backward, where dwgen keeps both in fp32: the same stand-in moved the losses
# by 2.7e-4 (SGD) and 5.5e-4 (Adam). 3e-3 leaves room, and still fails a zero grad_bias (1e-2), a backward
# without SiLU (2e-2), grad_weight's last tap left at zero (9e-3 with Adam) or a grad_x shifted by one
# position (4e-1 with Adam), as the stand-in with those bugs showed.
TRAIN_TOL = {"fp32": 1e-5, "bf16": 3e-3}


def training_losses(generated, dtype: str, optimizer: str) -> tuple[list[float], list[float]]:
    """Losses of 20 steps of the same block, same init, same data: on nn.Conv1d, and on
    generated.DepthwiseConv1d(padding="causal", activation="silu") with the nn.Conv1d one's state dict."""
    dt = torch_dtype(dtype)
    d, channels, batch, length = 64, 128, 4, 256
    torch.manual_seed(0)
    ref = MambaStyleBlock(d, channels, nn.Conv1d(channels, channels, 4, padding=3, groups=channels))
    teacher = MambaStyleBlock(d, channels, nn.Conv1d(channels, channels, 4, padding=3, groups=channels)).cuda()
    ours = MambaStyleBlock(d, channels, generated.DepthwiseConv1d(channels, 4, padding="causal", activation="silu"))
    assert ours.state_dict().keys() == ref.state_dict().keys()
    ours.load_state_dict(ref.state_dict())
    gen = torch.Generator(device="cuda").manual_seed(16)
    data = []
    with torch.no_grad():
        for _ in range(20):
            h = torch.randn(batch, length, d, generator=gen, device="cuda")
            data.append((h, teacher(h)))
    return train(ref.cuda().to(dt), optimizer, data, dt), train(ours.cuda().to(dt), optimizer, data, dt)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_training_matches_nn_conv1d_step_for_step(generated, monkeypatch, dtype, optimizer):
    """20 SGD or Adam steps of a Mamba-style block on dwgen's layer give nn.Conv1d's losses, step for step."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)  # on by default for convs: keep fp32 fp32
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    ref_losses, our_losses = training_losses(generated, dtype, optimizer)
    assert ref_losses[-1] < 0.7 * ref_losses[0], ref_losses  # it trains: equal losses of a stuck model say nothing
    worst = max(abs(a - r) / r for a, r in zip(our_losses, ref_losses, strict=True))
    assert worst <= TRAIN_TOL[dtype], (worst, our_losses, ref_losses)


def test_double_backward_is_refused_in_one_line(generated):
    """The backward op has no autograd of its own: create_graph=True through it says so, never returns a
    second-order gradient that is silently zero."""
    x = torch.randn(2, 8, 64, device="cuda", requires_grad=True)
    w = torch.randn(8, 1, 3, device="cuda", requires_grad=True)
    y = generated.depthwise_conv1d(x, w, padding=1)
    with pytest.raises(RuntimeError, match="dwgen: depthwise_conv1d has no double backward") as e:
        torch.autograd.grad(y.square().sum(), x, create_graph=True)
    assert "\n" not in str(e.value).strip()


# Bad CUDA input straight into C++ (the direct binding and the registered op), each call in a process of its
# own: on the H200 host every message that carried a number once ended the process with SIGSEGV instead of
# raising (the C++ checks now spell their text without iostreams).
BAD_CUDA_CALLS = {
    "weight shape, op": ("op(x, w.new_zeros(8, 2, 4), None, 1, 1, 1, 1, 0)",
                         "dwgen: weight must have shape (8, 1, K) for depthwise conv, got (8, 2, 4)"),
    "weight shape, binding": ("ext.forward(x, w.new_zeros(8, 2, 4), None, 1, 1, 1, 1, 0)",
                              "dwgen: weight must have shape (8, 1, K) for depthwise conv, got (8, 2, 4)"),
    "bias shape": ("op(x, w, w.new_zeros(3), 1, 1, 1, 1, 0)", "dwgen: bias must have shape (8,) or be None"),
    "stride 0": ("op(x, w, None, 0, 1, 1, 1, 0)", "dwgen: stride must be an int >= 1, got 0"),
    "dtype": ("op(x.double(), w.double(), None, 1, 1, 1, 1, 0)",
              "dwgen: x must be float32, float16 or bfloat16, got Double"),
    "no output": ("op(x[..., :2], w, None, 1, 0, 0, 1, 0)",
                  "dwgen: no output for length 2, kernel 4, padding 0+0, dilation 1; raise padding or the length"),
    "grad_out shape": ("torch.ops.dwgen.depthwise_conv1d_backward(x, x, w, None, 1, 0, 0, 1, 0)",
                       "dwgen: grad_out must be Float (2, 8, 97) on cuda:0, got Float (2, 8, 100)"),
}


@pytest.mark.parametrize("name", sorted(BAD_CUDA_CALLS))
def test_bad_cuda_input_raises_one_line_from_cpp(generated, name):
    import subprocess
    import sys

    from tests.conftest import ROOT

    call, message = BAD_CUDA_CALLS[name]
    script = ("import torch, generated\next = generated.build()\nop = torch.ops.dwgen.depthwise_conv1d\n"
              "x, w = torch.randn(2, 8, 100, device='cuda'), torch.randn(8, 1, 4, device='cuda')\n"
              f"try:\n    {call}\nexcept (ValueError, TypeError, RuntimeError) as e:\n    print(str(e))\n")
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"exit {out.returncode}: {out.stderr[-2000:]}"
    assert out.stdout.strip() == message
