from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dwgen.problem import Problem, ProblemError, conv_out_length, parse_shape


def test_parse_shape():
    assert parse_shape("32x512x8192") == (32, 512, 8192)
    assert parse_shape(" 1X2x3 ") == (1, 2, 3)


@pytest.mark.parametrize("bad", ["32x512", "axbxc", "32x512x8192x2", "", "-1x2x3", "1.5x2x3"])
def test_malformed_shape_refused(bad):
    with pytest.raises(ProblemError, match="malformed shape"):
        parse_shape(bad)


@pytest.mark.parametrize("L,K,S,P,D", [(10, 3, 1, 1, 1), (10, 4, 2, 3, 1), (7, 3, 3, 0, 2), (5, 5, 1, 0, 1),
                                        (1, 3, 1, 1, 1), (2, 7, 2, 3, 1), (31, 31, 1, 15, 1), (9, 2, 4, 0, 3)])
def test_out_length_matches_torch(L, K, S, P, D):
    x = torch.randn(1, 2, L)
    w = torch.randn(2, 1, K)
    expect = F.conv1d(x, w, stride=S, padding=P, dilation=D, groups=2).shape[-1]
    assert conv_out_length(L, K, S, P, D) == expect
    assert Problem(1, 2, L, K, S, P, D).out_length == expect


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"batch": 0}, "batch must be a positive integer"),
        ({"channels": -3}, "channels must be a positive integer"),
        ({"length": 0}, "length must be a positive integer"),
        ({"kernel_size": 0}, "kernel_size must be"),
        ({"stride": 0}, "stride must be"),
        ({"dilation": 0}, "dilation must be"),
        ({"padding": -1}, "padding must be a non-negative"),
        ({"length": 2, "kernel_size": 5, "padding": 0}, "no output"),
        ({"layout": "nhwc"}, "unknown layout"),
        ({"dtype": "int8"}, "unknown dtype"),
        ({"batch": 2.0}, "batch must be a positive integer"),
        ({"bias": 1}, "bias must be True or False"),
    ],
)
def test_nonsense_refused_in_one_line(kw, msg):
    args = {"batch": 2, "channels": 3, "length": 16, **kw}
    with pytest.raises(ProblemError, match=msg) as e:
        Problem(**args)
    assert "\n" not in str(e.value)


def test_key_is_canonical_and_distinct():
    a = Problem(32, 512, 8192, 3, 1, 1, 1)
    assert a.key == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"
    assert a.key == Problem.from_shape("32x512x8192").key
    variants = {a, Problem(32, 512, 8192, 3, 2, 1, 1), Problem(32, 512, 8192, 3, 1, 1, 1, bias=True),
                Problem(32, 512, 8192, 3, 1, 2, 1), Problem(32, 512, 8192, 3, 1, 1, 2),
                Problem(32, 512, 8192, 3, 1, 1, 1, "bf16"), Problem(32, 512, 8192, 3, 1, 1, 1, layout="blc")}
    assert len({p.key for p in variants}) == len(variants) == 7


def test_min_bytes_counts_input_and_output():
    p = Problem(2, 3, 100, 3, 2, 1)
    assert p.min_bytes == 2 * 3 * (100 + p.out_length) * 4
