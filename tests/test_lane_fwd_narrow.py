"""The forward's narrow table holding lane kernels (fp32 K3, bf16 K4 and K7, two sharing a tuned entry's name),
frozen over a copy of the committed module: launcher rows, kernel_for against space.scope_admits and x's alignment,
never over (B, L, C), and the gate's walk."""
import copy
import shutil
from dataclasses import replace

import pytest
import torch

from dwgen import freeze, gate
from dwgen.dtypes import torch_dtype
from dwgen.families import lane
from dwgen.problem import Problem
from dwgen.space import Variant, generic_problem, scope_admits, scope_stand_in
from tests.conftest import ROOT

DESIGNS = {"bf16_bcl_k4": lane.Config(threads=128, vecs=2, spread=True, walk="row"),
           "bf16_bcl_k7": lane.Config(threads=64, vecs=4, spread=True, walk="row"),
           "fp32_bcl_k3": lane.Config(threads=128, vecs=1, walk="row")}


def lane_name(key):
    dtype, _, k = key.split("_")
    return Variant(scope_stand_in(generic_problem(int(k[1:]), dtype), "causal_or_centred"), DESIGNS[key]).name


@pytest.fixture(scope="module")
def frozen(tmp_path_factory):
    out = tmp_path_factory.mktemp("lane_fwd") / "generated"
    shutil.copytree(ROOT / "generated", out)
    chosen = copy.deepcopy(freeze.read_manifest(out)["generic"]["chosen"])
    for key in DESIGNS:
        config = {**DESIGNS[key].to_dict(), "family": "dw1d_lane"}
        chosen[key]["narrow"] = [{"scope": "causal_or_centred", "config": config, "kernel": lane_name(key)}]
    m = freeze.freeze([], out, log=lambda s: None, generic=chosen)
    mod = gate.load_frozen(out, "dwgen_frozen_lane_fwd")
    return m, mod, mod._trusted(m, out, "9.0"), out


@pytest.fixture
def mod(frozen, monkeypatch):
    _, mod, t, _ = frozen
    monkeypatch.setattr(mod, "_validate", lambda x, w, b, s, padding, d, a: (
        *(lr := mod._paddings(padding, w.shape[2], s, d)), mod._output_length(x, w.shape[2], *lr, s, d, padding)))
    monkeypatch.setattr(mod, "tables", lambda device=None: t)
    return mod


def make_x(p, offset=0):
    n = p.batch * p.channels * p.length
    flat = torch.zeros(n + 16, dtype=torch_dtype(p.dtype))[offset:offset + n]
    return (flat.view(p.batch, p.length, p.channels).transpose(1, 2) if p.layout == "blc"
            else flat.view(p.batch, p.channels, p.length))


def choice(mod, p, offset=0):
    w = torch.zeros(p.channels, 1, p.kernel_size, dtype=torch_dtype(p.dtype))
    kw = gate._call_kwargs(p)
    return mod.kernel_for(make_x(p, offset), w, None, 1, kw["padding"], 1, activation=kw.get("activation"))


def test_frozen_as_forward_narrow_kernels_of_their_keys(frozen):
    m, mod, t, out = frozen
    names = {key: lane_name(key) for key in DESIGNS}
    assert {names["bf16_bcl_k7"], names["fp32_bcl_k3"]} <= {e["kernel"] for e in m["entries"]}
    assert m["generic"]["fast_narrow"] == t.fast_narrow and {key: t.fast_narrow[key] for key in names} == {
        key: [n] for key, n in names.items()}
    assert not t.warnings and freeze.stale_entries(out) == []
    mine = {t.kernels[n][0] for n in names.values()}
    rows = [r for r in mod._table_rows(t)[1] if r[0] == 0 and r[4] > 0 and r[6] in mine]
    assert sorted(r[6] for r in rows) == sorted(mine)
    scope = mod._SCOPES.index("causal_or_centred")
    assert all(r[2] == 0 and r[4:6] == [1, scope] and r[7:] == [16, 1, 0] for r in rows)
    launcher = (out / m["launcher"]).read_text()
    table, declared = mod._launcher_table(launcher)
    for n in names.values():
        assert table[t.kernels[n][0]] == n and f"ENTRY_FWD({n})" in launcher
        assert declared[n] == ", ".join(["const void*"] * 3 + ["void*"] + ["long long"] * 6 + ["void*"])


def test_kernel_for_runs_a_lane_kernel_exactly_where_its_scope_admits_the_call(mod):
    t = mod.tables()
    ran = set()
    for key, name in ((key, lane_name(key)) for key in DESIGNS):
        dtype, k = key.split("_")[0], int(key.split("_k")[1])
        h = k - 1
        for length in (1000, 1004, 1002, 8, 4):
            for pads in {(h, 0), (h // 2, h - h // 2), (h, h), (0, 0)}:
                for act, batch in (("none", 2), ("silu", 2), ("none", 65535), ("none", 65536)):
                    try:
                        p = Problem(batch, 1 if batch > 2 else 3, length, k, 1, pads[0], 1, dtype,
                                    padding_right=pads[1], activation=act)
                        got = choice(mod, p)
                    except Exception:
                        continue  # no output, or paddings no padding argument spells
                    if got in t.tuned.values() and got != name:
                        continue  # a tuned problem of the committed module
                    assert got == (name if scope_admits("causal_or_centred", p) else t.fast[key]), p.key
                    assert choice(mod, p, offset=1) != name  # off a 16-byte boundary
                    assert choice(mod, p, offset=16 // p.elem_bytes) == got
                    ran.add(got == name)
    assert ran == {True, False}
    fp32 = Problem(2, 3, 1004, 3, 1, 2, 1, "fp32", padding_right=0)  # whole fp32 vectors, not 16-bit ones
    assert choice(mod, fp32) == lane_name("fp32_bcl_k3")
    assert choice(mod, replace(fp32, length=1002)) != lane_name("fp32_bcl_k3")
    assert choice(mod, Problem(2, 3, 1004, 4, 1, 3, 1, "bf16", padding_right=0)) == t.fast["bf16_bcl_k4"]


def test_a_blc_x_never_runs_a_lane_kernel(mod):
    t = mod.tables()
    for key in DESIGNS:
        dtype, k = key.split("_")[0], int(key.split("_k")[1])
        p = Problem(2, 16, 1000, k, 1, k - 1, 1, dtype, layout="blc", padding_right=0, activation="silu")
        assert mod._layout(make_x(p)) == "blc" and choice(mod, p) == t.fast[f"{dtype}_blc_k{k}"]


def test_the_gate_walks_each_forward_lane_kernel_through_its_scope(mod, monkeypatch):
    t = mod.tables()
    monkeypatch.setattr(gate.check, "make_inputs", lambda q, seed: (
        make_x(q), torch.zeros(q.channels, 1, q.kernel_size, dtype=torch_dtype(q.dtype)), None))
    called = []
    monkeypatch.setattr(gate, "_through_the_op", lambda mod, q, d, seed, cache: called.append((q, d)))
    assert gate._fast_narrow_calls(mod, None) == []
    for key in DESIGNS:
        dtype, k = key.split("_")[0], int(key.split("_k")[1])
        h = k - 1
        runs = {(q.paddings, q.length, q.activation): choice(mod, q) for q, d in called
                if d == "fwd" and q.dtype == dtype and q.kernel_size == k and q.layout == "bcl"}
        assert runs[((h, 0), 304, "none")] == runs[((h, 0), 304, "silu")] == runs[((h // 2, h - h // 2), 304, "none")] \
            == lane_name(key)
        assert runs[((h // 2, h - h // 2), 304, "silu")] == runs[((h, 0), 301, "none")] == t.fast[key]
        base = gate.signature_problem(t.kernels[lane_name(key)][1])
        assert base.causal and base.length % (16 // base.elem_bytes) == 0
