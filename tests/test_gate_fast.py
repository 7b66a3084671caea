"""The gate's walk over the fast generic kernels with padding past their halo (the dispatcher sends any padding at
stride and dilation 1 to them), on the committed module's tables, the op calls stood in for (no GPU here)."""
from __future__ import annotations

import pytest

from dwgen import freeze, gate
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
