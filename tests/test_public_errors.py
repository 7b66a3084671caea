"""generated.depthwise_conv1d refuses every bad call in one line, and the README's table is these cases."""
from __future__ import annotations

import pytest

from tests.conftest import ROOT

README = (ROOT / "README.md").read_text()


def _t(*shape, dtype=None, grad=False):
    import torch

    t = torch.randn(*shape, dtype=dtype or torch.float32)
    return t.requires_grad_(True) if grad else t


# (the call as the README shows it, its arguments, the exception, the start of the one line it says)
CASES = [
    ("depthwise_conv1d(torch.randn(2, 4), w)", lambda: (_t(2, 4), _t(4, 1, 3)), {}, ValueError,
     "dwgen: x must be a (batch, channels, length) tensor"),
    ("depthwise_conv1d(x.double(), w.double())", lambda: (_t(2, 4, 16).double(), _t(4, 1, 3).double()), {},
     TypeError, "dwgen: x must be float32, float16 or bfloat16, got torch.float64"),
    ("depthwise_conv1d(x, torch.randn(4, 2, 3))", lambda: (_t(2, 4, 16), _t(4, 2, 3)), {}, ValueError,
     "dwgen: weight must have shape (4, 1, K) for depthwise conv, got (4, 2, 3)"),
    ("depthwise_conv1d(x, torch.randn(4, 1, 0))", lambda: (_t(2, 4, 16), _t(4, 1, 0)), {}, ValueError,
     "dwgen: weight has K = 0 taps; a convolution needs at least one"),
    ("depthwise_conv1d(x, w, torch.randn(3))", lambda: (_t(2, 4, 16), _t(4, 1, 3), _t(3)), {}, ValueError,
     "dwgen: bias must have shape (4,) or be None"),
    ("depthwise_conv1d(x, w.half())", lambda: (_t(2, 4, 16), _t(4, 1, 3).half()), {}, ValueError,
     "dwgen: weight and bias must be torch.float32 on cpu, like x"),
    ("depthwise_conv1d(x, w, stride=0)", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"stride": 0}, ValueError,
     "dwgen: stride must be an int >= 1, got 0"),
    ("depthwise_conv1d(x, w, stride=2**31)", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"stride": 2**31}, ValueError,
     "dwgen: stride must be at most 2**31 - 1, got 2147483648"),
    ("depthwise_conv1d(x, w, padding=2**32 + 5, stride=2**20)", lambda: (_t(2, 4, 16), _t(4, 1, 3)),
     {"padding": 2**32 + 5, "stride": 2**20}, ValueError,
     "dwgen: padding must be at most 2**31 - 1 a side, got 4294967301 and 4294967301"),
    ("depthwise_conv1d(x, w, padding=-1)", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"padding": -1}, ValueError,
     "dwgen: padding must be an int >= 0, 'same', 'valid' or 'causal', got -1"),
    ("depthwise_conv1d(x, w, padding='full')", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"padding": "full"},
     ValueError, "dwgen: padding must be an int >= 0, 'same', 'valid' or 'causal', got 'full'"),
    ("depthwise_conv1d(x, w, stride=2, padding='same')", lambda: (_t(2, 4, 16), _t(4, 1, 3)),
     {"stride": 2, "padding": "same"}, ValueError,
     "dwgen: padding='same' needs stride 1 (as in PyTorch); give the padding as an int"),
    ("depthwise_conv1d(x, w, activation='relu')", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"activation": "relu"},
     ValueError, "dwgen: activation must be None or 'silu', got 'relu'"),
    ("depthwise_conv1d(x, w, dilation=True)", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {"dilation": True},
     ValueError, "dwgen: dilation must be an int >= 1, got True"),
    ("depthwise_conv1d(torch.randn(2, 4, 2), torch.randn(4, 1, 5))", lambda: (_t(2, 4, 2), _t(4, 1, 5)), {},
     ValueError, "dwgen: no output for length 2, kernel 5, padding 0, dilation 1; raise padding or the length"),
    ("depthwise_conv1d(x, w) with x on the CPU", lambda: (_t(2, 4, 16), _t(4, 1, 3)), {}, ValueError,
     "dwgen: x must be on a CUDA device; move it with x.cuda()"),
]


@pytest.mark.parametrize("call, args, kwargs, exc, line", CASES, ids=[c[0] for c in CASES])
def test_bad_call_raises_one_line(call, args, kwargs, exc, line):
    import generated

    with pytest.raises(exc) as e:
        generated.depthwise_conv1d(*args(), **kwargs)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_readme_lists_these_calls():
    section = README.split("### The public function", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) == len(CASES)
    for (call, _, _, exc, line), row in zip(CASES, rows, strict=True):
        assert f"`{call}`" in row and exc.__name__ in row and line in row, row
