"""generated/layers.py: DepthwiseConv1d has nn.Conv1d's parameters and init; from_conv1d and swap_conv1d say why."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import dwgen
import generated
from generated.layers import DepthwiseConv1d, SwapReport, swap_conv1d

# generated/__init__.py is frozen_dispatch.py, which gains these lines with the functional op's rewrite
# (issue 10, item 1); until then the tests that need it are expected to fail, and once it lands they must pass.


def conv(c=8, k=3, **kw) -> nn.Conv1d:
    return nn.Conv1d(c, c, k, groups=c, **kw)


@pytest.mark.parametrize("kwargs, says", [
    ({"channels": 0}, "channels must be an int >= 1, got 0"),
    ({"channels": 8.0}, "channels must be an int >= 1, got 8.0"),
    ({"kernel_size": 0}, "kernel_size must be an int >= 1, got 0"),
    ({"kernel_size": (3,)}, "kernel_size must be an int >= 1, got (3,)"),
    ({"stride": 0}, "stride must be an int >= 1, got 0"),
    ({"dilation": True}, "dilation must be an int >= 1, got True"),
    ({"padding": -1}, "padding must be an int >= 0, 'same' or 'causal', got -1"),
    ({"padding": "valid"}, "padding must be an int >= 0, 'same' or 'causal', got 'valid'"),
    ({"padding": "same", "stride": 2}, "padding='same' needs stride 1 (as in nn.Conv1d), got stride 2"),
    ({"activation": "relu"}, "activation must be None or 'silu', got 'relu'"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, says):
    args = {"channels": 8, "kernel_size": 3, **kwargs}
    with pytest.raises(ValueError) as e:
        DepthwiseConv1d(**args)
    assert str(e.value) == f"DepthwiseConv1d: {says}"


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_parameters_and_state_dict_are_nn_conv1d_s(bias, dtype):
    ours, theirs = DepthwiseConv1d(12, 5, bias=bias, dtype=dtype), conv(12, 5, bias=bias, dtype=dtype)
    assert [(n, p.shape, p.dtype) for n, p in ours.named_parameters()] == \
           [(n, p.shape, p.dtype) for n, p in theirs.named_parameters()]
    assert {k: (v.shape, v.dtype) for k, v in ours.state_dict().items()} == \
           {k: (v.shape, v.dtype) for k, v in theirs.state_dict().items()}
    assert list(ours.state_dict()) == (["weight", "bias"] if bias else ["weight"])


def test_state_dict_loads_both_ways():
    ours, theirs = DepthwiseConv1d(8, 4, padding="causal"), conv(8, 4)
    ours.load_state_dict(theirs.state_dict())
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    again = DepthwiseConv1d(8, 4)
    theirs.load_state_dict(again.state_dict())
    assert torch.equal(again.weight, theirs.weight) and torch.equal(again.bias, theirs.bias)
    with pytest.raises(RuntimeError, match="size mismatch"):
        DepthwiseConv1d(8, 3).load_state_dict(theirs.state_dict())


def test_seeded_init_is_nn_conv1d_s():
    torch.manual_seed(7)
    theirs = conv(16, 7, padding=3)
    torch.manual_seed(7)
    ours = DepthwiseConv1d(16, 7, padding=3)
    assert torch.equal(ours.weight, theirs.weight) and torch.equal(ours.bias, theirs.bias)
    assert not torch.equal(ours.weight, DepthwiseConv1d(16, 7).weight)  # it is drawn, not a constant
    # and both leave the random stream at the same place
    torch.manual_seed(7)
    conv(16, 7)
    after_theirs = torch.rand(3)
    torch.manual_seed(7)
    DepthwiseConv1d(16, 7)
    assert torch.equal(torch.rand(3), after_theirs)


def test_device_and_dtype_are_honoured():
    m = DepthwiseConv1d(4, 3, dtype=torch.float16, device="meta")
    assert m.weight.dtype == m.bias.dtype == torch.float16 and m.weight.device.type == "meta"


@pytest.mark.parametrize("kwargs, text", [
    ({}, "DepthwiseConv1d(8, kernel_size=3, stride=1)"),
    ({"padding": 1, "dilation": 2, "bias": False},
     "DepthwiseConv1d(8, kernel_size=3, stride=1, padding=1, dilation=2, bias=False)"),
    ({"padding": "causal", "activation": "silu"},
     "DepthwiseConv1d(8, kernel_size=3, stride=1, padding=causal, activation=silu)"),
    ({"padding": "same"}, "DepthwiseConv1d(8, kernel_size=3, stride=1, padding=same)"),
    ({"stride": 2}, "DepthwiseConv1d(8, kernel_size=3, stride=2)"),
])
def test_repr_reads_like_nn_conv1d_s(kwargs, text):
    assert repr(DepthwiseConv1d(8, 3, **kwargs)) == text


@pytest.mark.parametrize("kwargs, want", [
    ({"padding": 2, "dilation": 2, "stride": 2}, (2, 2, 2)),
    ({"padding": (1,)}, (1, 1, 1)),
    ({"padding": "same"}, ("same", 1, 1)),
    ({"padding": "valid"}, (0, 1, 1)),
])
def test_from_conv1d_shares_the_parameters(kwargs, want):
    c = conv(6, 5, **kwargs)
    state = torch.get_rng_state()
    m = DepthwiseConv1d.from_conv1d(c)
    assert torch.equal(state, torch.get_rng_state())  # nothing drawn for parameters that are then replaced
    assert (m.padding, m.stride, m.dilation) == want and (m.channels, m.kernel_size) == (6, 5)
    assert m.weight is c.weight and m.bias is c.bias
    assert m.activation is None and DepthwiseConv1d.from_conv1d(c, activation="silu").activation == "silu"


def test_from_conv1d_keeps_no_bias_dtype_and_training_mode():
    c = conv(4, 3, bias=False, dtype=torch.bfloat16).eval()
    m = DepthwiseConv1d.from_conv1d(c)
    assert m.bias is None and m.weight.dtype == torch.bfloat16 and not m.training
    assert list(m.state_dict()) == ["weight"]


class Conv1dWithItsOwnForward(nn.Conv1d):
    def forward(self, x):
        return super().forward(x) * 2


def with_hook(m: nn.Module) -> nn.Module:
    m.register_forward_hook(lambda mod, args, out: out * 2)
    return m


@pytest.mark.parametrize("module, why", [
    (nn.Conv1d(8, 16, 3, groups=8), "not depthwise: in_channels=8, out_channels=16, groups=8; "
                                    "DepthwiseConv1d needs groups == in_channels == out_channels"),
    (nn.Conv1d(8, 8, 3), "not depthwise: in_channels=8, out_channels=8, groups=1; "
                         "DepthwiseConv1d needs groups == in_channels == out_channels"),
    (conv(8, 3, padding=1, padding_mode="reflect"), "padding_mode='reflect'; DepthwiseConv1d pads with zeros only"),
    (conv(8, 3, dtype=torch.float64), "its weight is torch.float64; dwgen's kernels are float32, float16 and bfloat16"),
    (Conv1dWithItsOwnForward(8, 8, 3, groups=8),
     "Conv1dWithItsOwnForward subclasses nn.Conv1d and may compute something else; only nn.Conv1d is replaced"),
    (nn.utils.parametrizations.weight_norm(conv(8, 3)),
     "ParametrizedConv1d subclasses nn.Conv1d and may compute something else; only nn.Conv1d is replaced"),
    (with_hook(conv(8, 3)), "it has forward hooks (weight_norm, spectral_norm, ...), which a replacement would drop"),
    (nn.Linear(3, 3), "expected an nn.Conv1d, got Linear"),
])
def test_from_conv1d_refuses_what_it_cannot_stand_in_for(module, why):
    with pytest.raises(ValueError) as e:
        DepthwiseConv1d.from_conv1d(module)
    assert str(e.value) == f"DepthwiseConv1d.from_conv1d: {why}"


class Block(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.mix = conv(c, 4, padding=3)  # Mamba's short conv
        self.proj = nn.Conv1d(c, 2 * c, 1)
        self.smooth = conv(c, 3, padding=1, padding_mode="reflect")
        self.act = nn.SiLU()


def test_swap_conv1d_replaces_the_eligible_and_says_why_it_left_the_others():
    model = nn.Sequential(Block(8), nn.ModuleList([conv(8, 5, padding="same")]), nn.Linear(8, 8))
    optimizer_params = list(model.parameters())
    keys = {k: v.shape for k, v in model.state_dict().items()}
    report = swap_conv1d(model)
    assert isinstance(report, SwapReport)
    assert report.replaced == ["0.mix", "1.0"]
    assert report.skipped == [
        ("0.proj", "not depthwise: in_channels=8, out_channels=16, groups=1; "
                   "DepthwiseConv1d needs groups == in_channels == out_channels"),
        ("0.smooth", "padding_mode='reflect'; DepthwiseConv1d pads with zeros only"),
    ]
    assert isinstance(model[0].mix, DepthwiseConv1d) and model[0].mix.padding == 3
    assert isinstance(model[1][0], DepthwiseConv1d) and model[1][0].padding == "same"
    assert type(model[0].proj) is nn.Conv1d and type(model[0].smooth) is nn.Conv1d
    # the parameters are the same objects, under the same names: state dicts and optimizers carry over
    assert list(model.parameters()) == optimizer_params
    assert all(a is b for a, b in zip(model.parameters(), optimizer_params, strict=True))
    assert {k: v.shape for k, v in model.state_dict().items()} == keys
    assert str(report).splitlines() == [
        "swap_conv1d: replaced 2 nn.Conv1d with DepthwiseConv1d, left 2",
        "  replaced 0.mix",
        "  replaced 1.0",
        "  left     0.proj: not depthwise: in_channels=8, out_channels=16, groups=1; "
        "DepthwiseConv1d needs groups == in_channels == out_channels",
        "  left     0.smooth: padding_mode='reflect'; DepthwiseConv1d pads with zeros only",
    ]
    assert swap_conv1d(model).replaced == []  # a second swap finds nothing left to do


def test_swap_conv1d_keeps_a_shared_conv_shared():
    shared = conv(4, 3)
    model = nn.ModuleDict({"a": nn.Sequential(shared), "b": nn.Sequential(shared)})
    report = swap_conv1d(model)
    assert report.replaced == ["a.0", "b.0"] and report.skipped == []
    assert model["a"][0] is model["b"][0] and isinstance(model["a"][0], DepthwiseConv1d)
    assert model["a"][0].weight is shared.weight


def test_swap_conv1d_cannot_replace_the_model_itself():
    c = conv(4, 3)
    report = swap_conv1d(c)
    assert report.replaced == []
    assert report.skipped == [("", "the model itself is the conv: use DepthwiseConv1d.from_conv1d(model)")]
    assert "(the model itself)" in str(report)


def test_dwgen_exports_the_layer_lazily():
    assert dwgen.DepthwiseConv1d is generated.layers.DepthwiseConv1d
    assert dwgen.swap_conv1d is generated.layers.swap_conv1d
    assert dwgen.depthwise_conv1d is generated.depthwise_conv1d
    assert {"DepthwiseConv1d", "swap_conv1d"} <= set(dir(dwgen))
    with pytest.raises(AttributeError):
        dwgen.NoSuchThing  # noqa: B018


def test_generated_exports_the_layer():
    assert generated.DepthwiseConv1d is DepthwiseConv1d is dwgen.DepthwiseConv1d
    assert generated.swap_conv1d is swap_conv1d


def test_import_dwgen_does_not_import_generated():
    import subprocess
    import sys

    from tests.conftest import ROOT

    code = "import sys, dwgen; assert 'generated' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout == "ok\n", out.stderr[-2000:]


@pytest.mark.parametrize("kwargs", [{}, {"padding": "causal", "activation": "silu"}])
def test_forward_on_the_cpu_is_refused_in_one_line(kwargs):
    m = DepthwiseConv1d(4, 3, **kwargs)
    with pytest.raises((ValueError, RuntimeError)) as e:
        m(torch.randn(2, 4, 16))
    assert str(e.value).startswith("dwgen: ") and "\n" not in str(e.value)
