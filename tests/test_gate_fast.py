"""The gate's walks over the fast generic kernels: with padding past their halo (the dispatcher sends any padding at
stride and dilation 1 to them), on the committed module's tables, and the narrow ones in the calls of their scopes;
the op calls stood in for (no GPU here)."""
from __future__ import annotations

import pytest

from dwgen import freeze, gate
from dwgen.dtypes import torch_dtype
from tests.conftest import ROOT

pytestmark = pytest.mark.skipif(not freeze.read_manifest(ROOT / "generated"), reason="no generated/ committed")


def fast(mod, direction):
    return mod.MANIFEST["generic"]["fast" if direction == "fwd" else "fast_bwd"]


def test_every_fast_kernel_is_called_past_its_halo_in_its_direction(monkeypatch):
    import generated

    called = []
    monkeypatch.setattr(gate, "_chosen", lambda mod, q, d: fast(mod, d)[f"{q.dtype}_{q.layout}_k{q.kernel_size}"])
    monkeypatch.setattr(gate, "_through_the_op", lambda mod, q, d, seed, cache: called.append((q, d)))
    assert gate._fast_past_the_halo(generated, None) == []
    assert sorted((f"{q.dtype}_{q.layout}_k{q.kernel_size}", d) for q, d in called) == sorted(
        (key, d) for d in ("fwd", "bwd") for key in fast(generated, d))
    for q, _ in called:
        halo = (q.kernel_size - 1) * q.dilation
        assert q.stride == q.dilation == 1 and min(q.padding, q.padding_right) > halo and q.out_length > q.length
        assert q.call_kwargs["padding"] == q.padding  # a padding the op takes (an int: both sides alike)


def test_a_wrong_dispatch_or_result_is_one_line_each(monkeypatch):
    import generated

    monkeypatch.setattr(gate, "_chosen", lambda mod, q, d: "dw1d_any_f32" if q.kernel_size == 3 else
                        fast(mod, d)[f"{q.dtype}_{q.layout}_k{q.kernel_size}"])
    monkeypatch.setattr(gate, "_through_the_op", lambda mod, q, d, seed, cache: "wrong" if q.kernel_size == 5 else None)
    failures = gate._fast_past_the_halo(generated, None)
    assert len(failures) == 2 * 6 * 2  # K3 and K5, each dtype and layout, both directions
    assert all(f.endswith("(padding past the halo)") for f in failures)
    assert sum("dispatches to dw1d_any_f32, not the fast" in f for f in failures) == 12


def test_each_narrow_fast_kernel_is_called_in_its_scope_causal_and_centred_plain_and_with_silu(tmp_path, monkeypatch):
    """The gate's walk over the narrow fast generic kernels (frozen here beside the fused ones: the lane backward
    at fp16 K8, the split one at fp16 K15, the walk one at fp16 (B, L, C) K4), each call dispatched by the module's
    own rule on CPU tensors (a centred call of an even filter as padding='same') and the op call stood in for:
    nothing fails, and each narrow kernel gets the calls of its scope."""
    import torch

    from tests.test_freeze import freeze_with_narrow_designs

    _, fused, lane, split, walk = freeze_with_narrow_designs(tmp_path)
    mod = gate.load_frozen(tmp_path, "dwgen_frozen_gate_narrow")
    t = mod._trusted(mod.MANIFEST, tmp_path, "9.0")
    monkeypatch.setattr(mod, "tables", lambda device=None: t)

    def on_any_device(x, weight, bias, stride, padding, dilation, activation):  # the rule, without a GPU
        left, right = mod._paddings(padding, weight.shape[2], stride, dilation)
        return left, right, mod._output_length(x, weight.shape[2], left, right, stride, dilation, padding)

    monkeypatch.setattr(mod, "_validate", on_any_device)
    monkeypatch.setattr(gate.check, "make_inputs", lambda q, seed: (  # in q's dtype: the committed module's own
        # narrow kernels (bf16 among them) are in the manifest beside this test's fp16 ones
        torch.zeros(q.batch, q.length, q.channels, dtype=torch_dtype(q.dtype)).transpose(1, 2) if q.layout == "blc"
        else torch.zeros(q.batch, q.channels, q.length, dtype=torch_dtype(q.dtype)),
        torch.zeros(q.channels, 1, q.kernel_size, dtype=torch_dtype(q.dtype)), None))
    called = []
    monkeypatch.setattr(gate, "_through_the_op", lambda mod, q, d, seed, cache: called.append((q, d)))
    assert gate._fast_narrow_calls(mod, None) == []
    # the paddings only the op's pad_left and pad_right give, (0, H) and (H, 1): run through the op, not dispatched
    # (the backward's calls: the committed module's own forward narrow kernels, once it has some, get theirs too)
    uneven = [q for q, d in called if d == "bwd"
              and not (q.symmetric or q.causal or q.paddings == (q.halo // 2, q.halo - q.halo // 2))]
    # (this test's fp16 kernels: lanes K1-9, splits K10-16, walks (B, L, C) K1-4; K1 and K2 have no such padding)
    uneven_keys = [(k, "bcl") for k in range(3, 17)] + [(k, "blc") for k in (3, 4)]
    assert {(q.kernel_size, q.layout, q.paddings) for q in uneven if q.dtype == "fp16"} == {
        (k, c, pads) for k, c in uneven_keys for pads in ((0, k - 1), (k - 1, 1))} | {
        (k, "blc", (k - 1, 300)) for k in range(1, 5)}  # the walk's grad_out far past x
    runs = {(q.kernel_size, q.layout, q.paddings, q.length, q.activation): mod.kernel_for(
        *gate.check.make_inputs(q, 0)[:2], None, **gate._call_kwargs(q), direction="bwd")
        for q, d in called if d == "bwd" and q not in uneven and q.dtype == "fp16"}
    c = "bcl"
    assert runs[(8, c, (7, 0), 304, "none")] == runs[(8, c, (7, 0), 304, "silu")] == lane.name
    assert runs[(8, c, (3, 4), 304, "none")] == lane.name and runs[(8, c, (3, 4), 304, "silu")] == fused[8].name
    assert runs[(8, c, (7, 0), 301, "none")] == fused[8].name  # a row that is not whole vectors
    assert runs[(15, c, (14, 14), 304, "none")] == split.name and runs[(15, c, (14, 14), 304, "silu")] == fused[15].name
    assert runs[(15, c, (14, 0), 301, "none")] == runs[(15, c, (7, 7), 304, "none")] == split.name
    # the walk: causal on any row, plain and with SiLU; centred (1, 2) is the fused kernel's
    assert runs[(4, "blc", (3, 0), 304, "none")] == runs[(4, "blc", (3, 0), 304, "silu")] == walk.name
    assert runs[(4, "blc", (3, 0), 301, "silu")] == walk.name
    assert runs[(4, "blc", (1, 2), 304, "none")] == fused["blc4"].name
    assert runs[(4, "blc", (3, 3), 301, "none")] == walk.name  # the halo on both sides
    assert {d for _, d in called} == {"bwd"} | ({"fwd"} if t.fast_narrow else set())
    assert sum(d == "bwd" for _, d in called) >= 2 * 3 * 2
