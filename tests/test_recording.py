"""dwgen.record: the problems a model runs, written as a suite that tune.py reads back (CPU tensors)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import dwgen
from dwgen.problem import Problem
from dwgen.recording import problem_of
from dwgen.suite import read_suite


class Block(nn.Module):
    """A Mamba-like block: a depthwise conv over a (B, L, C) tensor, then a ConvNeXt-like one, then a plain one."""

    def __init__(self, c: int = 16):
        super().__init__()
        self.short = nn.Conv1d(c, c, 4, padding=3, groups=c)
        self.wide = nn.Conv1d(c, c, 7, padding="same", groups=c, bias=False)
        self.mix = nn.Conv1d(c, c, 1)  # not depthwise: never recorded

    def forward(self, h):  # h: (B, L, C)
        x = self.short(h.transpose(1, 2))[..., : h.shape[1]]
        return self.mix(self.wide(x.contiguous()))


def test_a_model_records_its_depthwise_layers_and_the_suite_reads_back(tmp_path):
    model, h = Block(), torch.randn(2, 64, 16)
    expected = model(h)
    with dwgen.record(tmp_path / "m.suite", conv1d=True) as rec:
        got = model(h)
        model(h)
    assert torch.equal(got, expected), "recording changed a result"
    short = Problem(2, 16, 64, kernel_size=4, padding=3, bias=True, layout="blc")
    wide = Problem(2, 16, 64, kernel_size=7, padding=3, bias=False, layout="bcl")
    assert dict(rec.calls) == {short: 2, wide: 2}
    assert read_suite(tmp_path / "m.suite") == [short, wide]
    assert "# 2 call(s)" in (tmp_path / "m.suite").read_text()


def test_the_hook_is_gone_after_the_context(tmp_path):
    before = F.conv1d
    try:
        with dwgen.record(tmp_path / "s", conv1d=True):
            assert F.conv1d is not before
            raise KeyError("the model failed")
    except KeyError:
        pass
    assert F.conv1d is before


def test_without_conv1d_only_dwgen_calls_are_recorded(tmp_path):
    with dwgen.record(tmp_path / "s", conv1d=False) as rec:
        Block()(torch.randn(1, 8, 16))
    assert not rec.calls


def test_calls_through_a_bound_depthwise_conv1d_are_recorded(tmp_path):
    from generated import depthwise_conv1d, kernel_for  # bound before the context, as a model module does

    x, w = torch.randn(2, 8, 32, dtype=torch.bfloat16), torch.randn(8, 1, 3, dtype=torch.bfloat16)
    with dwgen.record(tmp_path / "s") as rec:
        with pytest.raises(ValueError, match="CUDA"):  # a CPU run of the model still says what it would call
            depthwise_conv1d(x, w, None, 1, 1, 1)
        with pytest.raises(ValueError):
            kernel_for(x, w, None, 1, 1, 1)  # asks, does not run: not recorded
    assert dict(rec.calls) == {Problem(2, 8, 32, kernel_size=3, padding=1, dtype="bf16"): 1}


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
def test_what_dwgen_cannot_tune_is_a_note_not_a_line(tmp_path):
    x = torch.randn(2, 8, 32)
    with dwgen.record(tmp_path / "s", conv1d=True) as rec:
        F.conv1d(x.double(), torch.randn(8, 1, 3).double(), groups=8)
        F.conv1d(x, torch.randn(8, 1, 4), padding="same", groups=8)
        F.conv1d(x[..., ::2], torch.randn(8, 1, 3), groups=8)
        F.conv1d(x, torch.randn(8, 1, 3), stride=5, groups=8)
        F.conv1d(x, torch.randn(4, 2, 3), groups=4)  # grouped, not depthwise: no note either
    assert not rec.calls and len(rec.skipped) == 4
    text = (tmp_path / "s").read_text()
    assert "dtype torch.float64" in text and "odd total padding" in text and "stride 5" in text
    assert all(line.startswith("#") for line in text.splitlines())


def test_problem_of_reads_layout_and_tuple_arguments():
    x = torch.randn(2, 32, 8).transpose(1, 2)  # (B, L, C) viewed as (B, C, L)
    p = problem_of(x, torch.randn(8, 1, 5), torch.zeros(8), (1,), (2,), (1,), groups=8)
    assert p == Problem(2, 8, 32, kernel_size=5, padding=2, bias=True, layout="blc")


def test_causal_silu_calls_are_recorded_as_tunable_problems(tmp_path):
    """Mamba's conv as the frozen module runs it: causal padding and SiLU become the problem's own fields,
    and the suite line tunes exactly that problem."""
    from generated import depthwise_conv1d

    h = torch.randn(2, 32, 8, dtype=torch.bfloat16)  # (B, L, C)
    w = torch.randn(8, 1, 4, dtype=torch.bfloat16)
    with dwgen.record(tmp_path / "s") as rec:
        for activation in ("silu", None):
            with pytest.raises(ValueError, match="CUDA"):
                depthwise_conv1d(h.transpose(1, 2), w, None, 1, "causal", 1, activation)
    causal = Problem(2, 8, 32, kernel_size=4, padding=3, padding_right=0, dtype="bf16", layout="blc")
    silu = Problem(2, 8, 32, kernel_size=4, padding=3, padding_right=0, dtype="bf16", layout="blc",
                   activation="silu")
    assert dict(rec.calls) == {silu: 1, causal: 1}
    text = (tmp_path / "s").read_text()
    assert "--padding causal" in text and "--activation silu" in text
    assert read_suite(tmp_path / "s") == [silu, causal]


def test_problem_of_reads_causal_padding_and_refuses_other_activations():
    x = torch.randn(1, 4, 20)
    p = problem_of(x, torch.randn(4, 1, 3), None, 1, "causal", 2, activation="silu")
    assert p == Problem(1, 4, 20, kernel_size=3, padding=4, padding_right=0, dilation=2, activation="silu")
    assert problem_of(x, torch.randn(4, 1, 3), None, 1, 1, 1, activation="gelu") == \
        "activation 'gelu': dwgen fuses none or 'silu'"
