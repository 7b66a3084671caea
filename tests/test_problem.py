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


MAMBA = Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc", padding_right=0, activation="silu")


def test_symmetric_problems_without_activation_keep_their_keys():
    """Studies, manifests and results are found by key: the new fields change no old problem's."""
    assert Problem(32, 512, 8192, 3, 1, 1, 1, padding_right=1, activation="none").key == \
        "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"
    assert Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", layout="blc").key == "8x4096x2048_k4_s1_p3_d1_bf16_blc_nobias"


def test_right_padding_and_silu_add_to_the_key():
    assert MAMBA.key == "8x4096x2048_k4_s1_p3_d1_bf16_blc_nobias_pr0_silu"
    assert Problem(2, 4, 64, 4, 1, 3, padding_right=0).key == "2x4x64_k4_s1_p3_d1_fp32_bcl_nobias_pr0"
    assert Problem(2, 4, 64, 3, 1, 1, activation="silu").key == "2x4x64_k3_s1_p1_d1_fp32_bcl_nobias_silu"
    keys = {Problem(2, 4, 64, 4, 1, p, padding_right=r, activation=a).key
            for p, r in ((3, 3), (3, 0), (0, 3), (2, 1), (1, 2)) for a in ("none", "silu")}
    assert len(keys) == 10


def test_right_padding_is_normalised_so_equal_problems_are_equal():
    a, b = Problem(2, 4, 64, 3, 1, 1), Problem(2, 4, 64, 3, 1, 1, padding_right=1)
    assert a == b and hash(a) == hash(b) and a.padding_right == 1 and a.symmetric and len({a, b}) == 1
    assert a != Problem(2, 4, 64, 3, 1, 1, padding_right=0) and a != Problem(2, 4, 64, 3, 1, 1, activation="silu")
    # a problem read back from its dict (a manifest entry, a worker's argument) is the same problem
    assert Problem(**MAMBA.to_dict()) == MAMBA
    # a manifest entry written before the fields existed reads as symmetric, without activation
    old = {k: v for k, v in a.to_dict().items() if k not in ("padding_right", "activation")}
    assert Problem(**old) == a


@pytest.mark.parametrize("L,K,S,PL,PR,D", [(10, 4, 1, 3, 0, 1), (2048, 4, 1, 3, 0, 1), (1000, 5, 2, 8, 0, 2),
                                           (9, 2, 1, 0, 1, 1), (31, 7, 3, 1, 5, 2), (1, 4, 1, 3, 0, 1)])
def test_asymmetric_out_length_matches_torch_on_padded_input(L, K, S, PL, PR, D):
    x, w = torch.randn(1, 2, L), torch.randn(2, 1, K)
    expect = F.conv1d(F.pad(x, (PL, PR)), w, stride=S, dilation=D, groups=2).shape[-1]
    p = Problem(1, 2, L, K, S, PL, D, padding_right=PR)
    assert p.out_length == conv_out_length(L, K, S, PL, D, PR) == expect
    assert p.paddings == (PL, PR) and p.op_args == (S, PL, PR, D, 0)


def test_causal_problems_speak_the_public_functions_padding():
    assert MAMBA.causal and not MAMBA.symmetric and MAMBA.out_length == 2048
    assert MAMBA.padding_arg == "causal" and MAMBA.activation_arg == 1
    assert MAMBA.call_kwargs == {"stride": 1, "padding": "causal", "dilation": 1, "activation": "silu"}
    assert MAMBA.op_args == (1, 3, 0, 1, 1)
    plain = Problem(2, 4, 64, 3, 1, 1)
    assert plain.call_kwargs == {"stride": 1, "padding": 1, "dilation": 1, "activation": None}
    assert not Problem(2, 4, 64, 3, 1, 2).causal and Problem(2, 4, 64, 3, 2, 4, 2, padding_right=0).causal
    with pytest.raises(ProblemError, match="neither symmetric nor causal"):
        _ = Problem(2, 4, 64, 4, 1, 2, padding_right=1).padding_arg


@pytest.mark.parametrize("kw, msg", [
    ({"padding_right": -1}, "padding_right must be a non-negative integer"),
    ({"padding_right": "0"}, "padding_right must be a non-negative integer"),
    ({"padding_right": 1.0}, "padding_right must be a non-negative integer"),
    ({"activation": "relu"}, "unknown activation 'relu': choose one of none, silu"),
    ({"activation": None}, "unknown activation None"),
    ({"kernel_size": 5, "padding": 0, "padding_right": 0, "length": 3}, r"no output: length 3 with padding 0 "),
    ({"kernel_size": 5, "padding": 1, "padding_right": 0, "length": 3}, r"with padding 1\+0 is shorter"),
])
def test_new_fields_are_checked_in_one_line(kw, msg):
    with pytest.raises(ProblemError, match=msg) as e:
        Problem(**{"batch": 2, "channels": 3, "length": 16, **kw})
    assert "\n" not in str(e.value)


def test_edge_problems_keep_the_problems_right_padding_and_activation():
    """The search and the gate check a variant on edge problems: a causal SiLU problem's are causal-shaped
    (right padding 0, left as the family asks) with SiLU, a symmetric one's symmetric."""
    from dwgen import space

    for p in (MAMBA, Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", padding_right=0, activation="silu")):
        for direction in ("fwd", "bwd"):
            v = space.enumerate_space(p, direction)[0]
            edges = v.edge_problems()
            assert edges and all(q.padding_right == 0 and q.activation == "silu" for q in edges), v.name
            assert any(q.padding != p.padding for q in edges)  # other left paddings too
    v = space.enumerate_space(Problem(4, 64, 1000, 4, 1, 3), "fwd")[0]
    assert all(q.symmetric and q.activation == "none" for q in v.edge_problems())
