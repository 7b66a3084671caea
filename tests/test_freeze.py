from __future__ import annotations

import importlib
import json
import sys

import pytest

from dwgen import freeze, render
from dwgen.families.bcl import Config
from dwgen.gate import load_frozen
from dwgen.problem import Problem
from dwgen.result import Result
from dwgen.space import Variant

MACHINE = {"gpu": "NVIDIA H200", "capability": "9.0", "driver": "580", "torch": "2.11", "cuda": "13.0",
           "date": "2026-11-30", "sm_count": 132}


def winner(p: Problem, c: Config, ms: float = 0.27) -> freeze.Winner:
    v = Variant(p, c)
    r = Result(v.name, v.digest, "ok", kernel_ms=ms, copy_ms=0.26, torch_ms=1.27, reps=50, max_rel_error=1e-7)
    return freeze.Winner(v, r, MACHINE)


def test_freeze_writes_verbatim_sources_and_manifest(tmp_path):
    w = winner(Problem(32, 512, 8192), Config(threads=256, vec=4, outs=1, halo="l1", stream=True))
    m = freeze.freeze([w], tmp_path, log=lambda s: None)
    (e,) = json.loads((tmp_path / "manifest.json").read_text())["entries"]
    # Expected values written out by hand, each number distinct, so that a field copied from the wrong
    # place or a ratio taken the wrong way round shows.
    assert e["problem"] == {"batch": 32, "channels": 512, "length": 8192, "kernel_size": 3, "stride": 1,
                            "padding": 1, "dilation": 1, "dtype": "fp32", "bias": False,
                            "layout": "bcl", "padding_right": 1, "activation": "none"}
    assert e["key"] == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias"
    assert e["kernel"] == "dw1d_f32_k3_t256_v4_o1_l1_cs" and e["digest"] == w.variant.digest
    assert e["config"]["threads"] == 256 and e["config"]["halo"] == "l1" and e["config"]["stream"] is True
    assert e["measured"] == {"kernel_ms": 0.27, "copy_ms": 0.26, "torch_ms": 1.27,
                             "x_copy": pytest.approx(1.0384615), "speedup_vs_torch": pytest.approx(4.7037037),
                             "max_rel_error": 1e-7, "reps": 50}
    assert e["machine"] == MACHINE and "stand_in" not in e  # tuned without --stand-in
    kernels = {k["name"]: k for k in m["kernels"]}
    assert (tmp_path / kernels[w.variant.name]["file"]).read_text() == render.render_variant(w.variant)
    for dtype, rec in m["generic"]["scalar"].items():
        assert (tmp_path / rec["file"]).read_text() == render.render_any(dtype)
    # one fast generic kernel per dtype, layout and K <= 16
    assert sorted(m["generic"]["fast"]) == sorted(f"{d}_{lay}_k{k}" for d in ("fp32", "fp16", "bf16")
                                                  for lay in ("bcl", "blc") for k in range(1, 17))
    assert all(name in kernels for name in m["generic"]["fast"].values())
    assert json.loads((tmp_path / "manifest.json").read_text()) == m
    assert (tmp_path / "__init__.py").read_text() == freeze.DISPATCH_SOURCE.read_text()
    assert (tmp_path / "layers.py").read_text() == freeze.LAYERS_SOURCE.read_text()
    assert freeze.stale_entries(tmp_path) == []
    mod = load_frozen(tmp_path, "frozen_a")
    assert mod.MANIFEST == m and callable(mod.depthwise_conv1d)
    layers = importlib.import_module("frozen_a.layers")  # the layer calls its own package's op
    assert layers._functional() is mod.depthwise_conv1d


def test_a_stand_ins_winner_records_what_it_was_weighed_on(tmp_path):
    """tune.py --stand-in's evidence (its score and times at the other sizes) goes into the entry as given, and
    the frozen module's checks take the entry as any other."""
    from dwgen import frozen_dispatch

    w = winner(Problem(4, 1536, 5000, kernel_size=3, stride=3), Config(threads=128, vec=4, outs=2, halo="l1"))
    evidence = {"score": 1.014, "sizes": {"8x1536x3968": {"kernel_ms": 0.0484, "copy_ms": 0.0453, "x_copy": 1.068}}}
    m = freeze.freeze([freeze.Winner(w.variant, w.result, MACHINE, stand_in=evidence)], tmp_path, log=lambda s: None)
    (e,) = m["entries"]
    assert e["stand_in"] == evidence
    written = json.loads((tmp_path / "manifest.json").read_text())
    frozen_dispatch.check_manifest(written)
    t = frozen_dispatch._trusted(written, tmp_path, "9.0")  # dispatched and lent like any entry
    assert list(t.tuned.values()) == [w.variant.name] and list(t.lent.values()) == [w.variant.name]


def test_freeze_merges_and_sorts_by_problem(tmp_path):
    a = winner(Problem(32, 512, 8192), Config())
    b = winner(Problem(16, 1024, 4096, 7, 1, 3), Config(vec=4, outs=2, halo="smem"))
    freeze.freeze([a], tmp_path)
    m = freeze.freeze([b], tmp_path)
    assert [e["key"] for e in m["entries"]] == sorted([a.variant.problem.key, b.variant.problem.key])
    a2 = winner(Problem(32, 512, 8192), Config(threads=512), ms=0.25)
    m = freeze.freeze([a2], tmp_path)
    assert len(m["entries"]) == 2
    assert {e["kernel"] for e in m["entries"]} == {a2.variant.name, b.variant.name}
    assert not (tmp_path / f"kernels/{a.variant.name}-{a.variant.digest[:12]}.cu").exists()  # collected
    assert [k["name"] for k in m["kernels"]] == sorted(k["name"] for k in m["kernels"])


def test_crash_mid_freeze_leaves_previous_module_intact(tmp_path, monkeypatch):
    freeze.freeze([winner(Problem(32, 512, 8192), Config())], tmp_path)
    before = {p.relative_to(tmp_path): p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    real = freeze.atomic_write

    def dying(path, text):
        if path.name == "manifest.json":
            raise OSError("disk full")
        real(path, text)

    monkeypatch.setattr(freeze, "atomic_write", dying)
    with pytest.raises(OSError):
        freeze.freeze([winner(Problem(16, 1024, 4096, 7, 1, 3), Config(halo="smem"))], tmp_path)
    for rel, data in before.items():
        assert (tmp_path / rel).read_bytes() == data, rel
    m = json.loads((tmp_path / "manifest.json").read_text())
    for f in freeze.source_files(m):
        assert (tmp_path / f).exists()
    assert not list(tmp_path.rglob(".*.tmp*")) and not [p for p in tmp_path.rglob(".manifest.json.*")]


def test_only_correct_results_are_frozen(tmp_path):
    w = winner(Problem(32, 512, 8192), Config())
    bad = freeze.Winner(w.variant, w.result.with_(status="wrong"), MACHINE)
    with pytest.raises(freeze.FreezeError, match="did not pass"):
        freeze.freeze([bad], tmp_path)
    assert not (tmp_path / "manifest.json").exists()


def test_stale_entry_detected_when_template_changes(tmp_path, monkeypatch):
    freeze.freeze([winner(Problem(32, 512, 8192), Config())], tmp_path)
    from dwgen import space

    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + "// edited\n")
    assert "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias" in freeze.stale_entries(tmp_path)
    # and a later freeze drops the entry whose numbers no longer describe its code
    dropped = []
    m = freeze.freeze([winner(Problem(1, 768, 512), Config(threads=128))], tmp_path, log=dropped.append)
    assert [e["key"] for e in m["entries"]] == [Problem(1, 768, 512).key]
    assert dropped and "re-tune" in dropped[0]


def test_a_dropped_entry_leaves_its_design_for_the_next_re_tune_and_no_numbers(tmp_path, monkeypatch):
    from dwgen import space
    from search import workflow

    p, c = Problem(32, 512, 8192), Config(threads=64, outs=4)
    freeze.freeze([winner(p, c)], tmp_path)
    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + "// edited\n")
    m = freeze.freeze([winner(Problem(1, 768, 512), Config(threads=128))], tmp_path, log=lambda s: None)
    (gone,) = m["retired"]
    assert gone["key"] == p.key and gone["direction"] == "fwd" and not {"digest", "measured", "machine"} & set(gone)
    assert workflow.frozen_variant(p, tmp_path) is None  # nothing dispatches it
    assert workflow.previous_config(p, tmp_path) == c  # but a re-tune of p asks it first
    assert c in workflow.sibling_configs(Problem(16, 512, 8192), tmp_path)  # and nearby problems' tunes after theirs
    # a later freeze keeps it until p has a winner again
    assert freeze.freeze([], tmp_path, log=lambda s: None)["retired"] == [gone]
    m = freeze.freeze([winner(p, Config(threads=256))], tmp_path, log=lambda s: None)
    assert m["retired"] == [] and [e["key"] for e in m["entries"]] == sorted([p.key, Problem(1, 768, 512).key])


def test_edited_launcher_dispatch_or_layers_is_stale(tmp_path):
    m = freeze.freeze([winner(Problem(32, 512, 8192), Config())], tmp_path)
    assert freeze.stale_entries(tmp_path) == []
    launcher = tmp_path / m["launcher"]
    launcher.write_text(launcher.read_text() + "// hand edit\n")
    init = tmp_path / "__init__.py"
    init.write_text(init.read_text() + "# hand edit\n")
    layers = tmp_path / "layers.py"
    layers.write_text(layers.read_text() + "# hand edit\n")
    assert {"launcher", "dispatch", "layers"} <= set(freeze.stale_entries(tmp_path))
    layers.unlink()
    assert "layers" in freeze.stale_entries(tmp_path)


@pytest.mark.slow
@pytest.mark.nvcc
def test_frozen_launcher_builds_for_every_walk(tmp_path):
    """The launcher's persistent, row and tile branches compile (generated/ may hold none of them), and so does
    its tuned backward table, whose rows the C++ side takes, checking each row's direction (no GPU needed)."""
    import os
    import subprocess

    from dwgen.families import bwd

    ws = [winner(Problem(32, 512, 1024, 31, 1, 15), Config(threads=64, vec=4, outs=2, walk="persistent", halo="async")),
          winner(Problem(4, 64, 1000), Config(threads=128, vec=4, outs=1, walk="row", halo="smem")),
          winner(Problem(4, 64, 4096), Config(threads=128, vec=2, outs=2, halo="shfl")),
          winner(Problem(4, 64, 4096, 4, 1, 3, padding_right=0, activation="silu"), Config(threads=128, vec=4)),
          bwd_winner(Problem(4, 64, 4096), bwd.Config(threads=128, outs=4))]
    freeze.freeze(ws, tmp_path / "frozen_walks", log=lambda s: None)
    env = dict(os.environ, DWGEN_BUILD_DIR=str(tmp_path / "build"))
    (tmp_path / "build").mkdir()
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import frozen_walks as f; ext = f.build(); "
            "tuned, fast, lent = f._table_rows(f._trusted(f.MANIFEST, f._HERE, None)); "
            "assert sorted(r[0] for r in tuned) == [0, 0, 0, 0, 1], tuned; "
            "assert [r[:7] for r in lent] == [[0, 31, 1, 1, 0, 0, 0]], lent; ext.install(0, tuned, fast, lent); "
            "bad = [[1 - r[0], *r[1:]] for r in tuned]; act2 = [[*r[:12], 2, *r[13:]] for r in tuned]\n"
            "for rows in ([bad[0]], [bad[-1]], [[r[0], *r[2:]] for r in tuned], act2):\n"
            "    try: ext.install(0, rows, fast, lent)\n"
            "    except RuntimeError as e: assert any(w in str(e) for w in ('direction', 'fields', 'activation')), e\n"
            "    else: raise SystemExit(f'install took {rows}')\n"
            "for rows in ([[1, *lent[0][1:]]], [[*lent[0][:6], 2, *lent[0][7:]]], [lent[0][1:]]):\n"
            "    try: ext.install(0, tuned, fast, rows)\n"
            "    except RuntimeError as e: assert any(w in str(e) for w in ('direction', 'lent')), e\n"
            "    else: raise SystemExit(f'install took lent {rows}')\n"
            # a narrow row of each scope frozen_dispatch numbers (the last, left_halo, is 3) and none past them
            "assert fast, 'no fast rows'\n"
            "for s in (1, 2, 3): ext.install(0, tuned, fast + [[*fast[0][:4], 1, s, *fast[0][6:]]], lent)\n"
            "try: ext.install(0, tuned, fast + [[*fast[0][:4], 1, 4, *fast[0][6:]]], lent)\n"
            "except RuntimeError as e: assert 'fast table row' in str(e), e\n"
            "else: raise SystemExit('install took a scope past the last')\n"
            "print('built')")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "built" in out.stdout


def bwd_winner(p: Problem, c, ms: float = 0.45) -> freeze.Winner:
    v = Variant(p, c, "bwd")
    r = Result(v.name, v.digest, "ok", kernel_ms=ms, copy_ms=0.26, torch_ms=1.74, reps=40, max_rel_error=2e-7,
               direction="bwd")
    return freeze.Winner(v, r, MACHINE)


def test_freeze_writes_a_backward_entry_beside_the_forwards(tmp_path):
    from dwgen.families import bwd

    p = Problem(32, 512, 8192)
    fwd = winner(p, Config(threads=256, vec=4, outs=1, halo="l1", stream=True))
    back = bwd_winner(p, bwd.Config(threads=128, outs=4))
    freeze.freeze([fwd], tmp_path, log=lambda s: None)
    m = freeze.freeze([back], tmp_path, log=lambda s: None)
    assert [(e["key"], e["direction"], e["kernel"]) for e in m["entries"]] == [
        ("32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias", "fwd", "dw1d_f32_k3_t256_v4_o1_l1_cs"),
        ("32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias", "bwd", "dw1d_bwd_f32_k3_t128_o4")]
    e = m["entries"][1]
    assert e["digest"] == back.variant.digest
    assert e["config"] == {"threads": 128, "outs": 4, "tc": 1, "stage": "f32", "tiles": 1, "walk": "row", "regs": 0}
    assert e["measured"] == {"kernel_ms": 0.45, "copy_ms": 0.26, "torch_ms": 1.74,
                             "x_copy": pytest.approx(1.7307692), "speedup_vs_torch": pytest.approx(3.8666667),
                             "max_rel_error": 2e-7, "reps": 40}
    kernels = {k["name"]: k for k in m["kernels"]}
    k = kernels["dw1d_bwd_f32_k3_t128_o4"]
    assert k["direction"] == "bwd" and k["digest"] == back.variant.digest
    assert (tmp_path / k["file"]).read_text() == render.render_variant(back.variant)
    assert freeze.entry_variant(e) == back.variant and freeze.stale_entries(tmp_path) == []
    # a later backward winner replaces the backward entry only
    again = bwd_winner(p, bwd.Config(threads=256, outs=8), ms=0.44)
    m = freeze.freeze([again], tmp_path, log=lambda s: None)
    assert [e["kernel"] for e in m["entries"]] == ["dw1d_f32_k3_t256_v4_o1_l1_cs", "dw1d_bwd_f32_k3_t256_o8"]
    assert "dw1d_bwd_f32_k3_t128_o4" not in {k["name"] for k in m["kernels"]}  # collected
    mod = load_frozen(tmp_path, "frozen_bwd_entry")
    t = mod._trusted(mod.MANIFEST, tmp_path, "9.0")
    key = (32, 512, 8192, 3, 1, 1, 1, 1, "fp32", False, "bcl", "none")  # ..., pad_left, pad_right, D, ..., activation
    assert t.tuned == {key: "dw1d_f32_k3_t256_v4_o1_l1_cs"} and t.tuned_bwd == {key: "dw1d_bwd_f32_k3_t256_o8"}


def test_a_backward_entry_goes_stale_with_its_template(tmp_path, monkeypatch):
    from dwgen import space
    from dwgen.families import bwd

    p = Problem(4, 64, 1000)
    freeze.freeze([winner(p, Config(threads=64, vec=4, outs=1)), bwd_winner(p, bwd.Config(threads=128, outs=2))],
                  tmp_path, log=lambda s: None)
    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + ("// edited\n" if n == "dw1d_bwd.cu.j2" else ""))
    stale = freeze.stale_entries(tmp_path)
    assert "4x64x1000_k3_s1_p1_d1_fp32_bcl_nobias_bwd" in stale and p.key not in stale
    dropped = []
    m = freeze.freeze([], tmp_path, log=dropped.append)
    assert [(e["key"], e["direction"]) for e in m["entries"]] == [(p.key, "fwd")]
    assert any("dropping stale entry 4x64x1000_k3_s1_p1_d1_fp32_bcl_nobias_bwd" in line for line in dropped)


def test_only_results_of_the_variants_direction_are_frozen(tmp_path):
    from dwgen.families import bwd

    w = bwd_winner(Problem(4, 64, 1000), bwd.Config(threads=128, outs=2))
    mislabelled = freeze.Winner(w.variant, w.result.with_(direction="fwd"), MACHINE)
    with pytest.raises(freeze.FreezeError, match="is a bwd kernel but its result was measured as fwd"):
        freeze.freeze([mislabelled], tmp_path)


def test_entries_written_without_a_direction_are_forward_ones(tmp_path):
    p = Problem(32, 512, 8192)
    m = freeze.freeze([winner(p, Config())], tmp_path, log=lambda s: None)
    for e in m["entries"]:
        del e["direction"]  # as manifests were written before entries had one
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    assert freeze.entry_direction(m["entries"][0]) == "fwd" and freeze.stale_entries(tmp_path) == []
    mod = load_frozen(tmp_path, "frozen_no_direction")
    t = mod._trusted(mod.MANIFEST, tmp_path, "9.0")
    assert list(t.tuned.values()) == [m["entries"][0]["kernel"]] and t.tuned_bwd == {} and t.warnings == []
    # the next freeze writes the field on the entries it carries over, their digests untouched
    again = freeze.freeze([], tmp_path, log=lambda s: None)
    assert [(e["direction"], e["digest"]) for e in again["entries"]] == [("fwd", m["entries"][0]["digest"])]


CAUSAL_SILU = Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16", padding_right=0, activation="silu")


def test_a_causal_silu_winner_is_frozen_under_its_own_key_and_dispatched_only_as_itself(tmp_path):
    """The manifest carries the right padding and the activation; the tuned tables key by them, so the same
    sizes tuned symmetric without activation are another entry, and each table row says which it is."""
    from dwgen import frozen_dispatch
    from dwgen.families import bwd

    plain = Problem(8, 4096, 2048, 4, 1, 3, dtype="bf16")
    ws = [winner(CAUSAL_SILU, Config(threads=128, vec=8, outs=2, halo="l1")),
          winner(plain, Config(threads=256, vec=8, outs=1, halo="l1")),
          bwd_winner(CAUSAL_SILU, bwd.Config(threads=256, outs=8))]
    m = freeze.freeze(ws, tmp_path, log=lambda s: None)
    assert freeze.stale_entries(tmp_path) == []
    by_key = {(e["key"], e["direction"]): e for e in m["entries"]}
    assert set(by_key) == {(CAUSAL_SILU.key, "fwd"), (CAUSAL_SILU.key, "bwd"), (plain.key, "fwd")}
    e = by_key[CAUSAL_SILU.key, "fwd"]
    assert (e["problem"]["padding"], e["problem"]["padding_right"], e["problem"]["activation"]) == (3, 0, "silu")
    assert freeze.entry_variant(e).problem == CAUSAL_SILU  # the manifest round-trips the problem
    frozen_dispatch.check_manifest(m)
    t = frozen_dispatch._trusted(m, tmp_path, "9.0")
    assert t.warnings == [] and len(t.tuned) == 2 and len(t.tuned_bwd) == 1
    tuned, _, _ = frozen_dispatch._table_rows(t)
    # direction, B, C, L, K, S, pad_left, pad_right, D, dtype (bf16 2), bias, layout, activation, then the choice
    heads = sorted(r[:13] for r in tuned)
    assert heads == [[0, 8, 4096, 2048, 4, 1, 3, 0, 1, 2, 0, 0, 1], [0, 8, 4096, 2048, 4, 1, 3, 3, 1, 2, 0, 0, 0],
                     [1, 8, 4096, 2048, 4, 1, 3, 0, 1, 2, 0, 0, 1]]
    kernel = {(r[7], r[12]): m["kernels"][r[13]]["name"] for r in tuned if r[0] == 0}  # by (pad_right, activation)
    assert kernel == {(0, 1): ws[0].variant.name, (3, 0): ws[1].variant.name}


def test_entries_without_padding_right_or_activation_read_as_symmetric_without(tmp_path):
    """Manifests written before the fields existed stay valid: their entries key as symmetric, no activation."""
    from dwgen import frozen_dispatch

    freeze.freeze([winner(Problem(32, 512, 8192), Config())], tmp_path, log=lambda s: None)
    path = tmp_path / "manifest.json"
    m = json.loads(path.read_text())
    for e in m["entries"]:
        del e["problem"]["padding_right"], e["problem"]["activation"]
    path.write_text(json.dumps(m))
    assert freeze.stale_entries(tmp_path) == []
    (e,) = m["entries"]
    assert freeze.entry_variant(e).problem == Problem(32, 512, 8192)
    t = frozen_dispatch._trusted(m, tmp_path, "9.0")
    assert t.warnings == [] and list(t.tuned) == [(32, 512, 8192, 3, 1, 1, 1, 1, "fp32", False, "bcl", "none")]
    assert frozen_dispatch._table_rows(t)[0][0][:13] == [0, 32, 512, 8192, 3, 1, 1, 1, 1, 0, 0, 0, 0]
    # and a later freeze carries the entry over as it is
    m2 = freeze.freeze([], tmp_path, log=lambda s: None)
    assert m2["entries"] == m["entries"]


@pytest.mark.parametrize("field, value", [("padding_right", -1), ("padding_right", "0"), ("padding_right", None),
                                          ("activation", "relu"), ("activation", None), ("activation", 1)])
def test_an_entry_with_a_bad_padding_right_or_activation_is_refused(tmp_path, field, value):
    from dwgen import frozen_dispatch

    m = freeze.freeze([winner(CAUSAL_SILU, Config(threads=128, vec=8, outs=2, halo="l1"))], tmp_path,
                      log=lambda s: None)
    m["entries"][0]["problem"][field] = value
    t = frozen_dispatch._trusted(m, tmp_path, "9.0")
    assert t.tuned == {} and len(t.warnings) == 1 and "tuned entry" in t.warnings[0]
    assert ("right padding" if field == "padding_right" else "activation") in t.warnings[0]


def test_the_launcher_keys_tuned_rows_by_both_paddings_and_the_activation():
    """The C++ tuned table (checked in its rendered text: no compiler needed) matches a call's pad_left,
    pad_right and activation, never a symmetric tuning for an asymmetric call or one without SiLU for SiLU;
    bias alone may differ (the call's own bias first, then the other: every kernel takes bias at run time)."""
    m = freeze.read_manifest(freeze.DEFAULT_DIR)  # the committed one, fresh (tests/test_generated.py)
    text = (freeze.DEFAULT_DIR / m["launcher"]).read_text()
    assert "int64_t v[12] = {B, C, L, K, S, pl, pr, D, dtype, bias ? 1 : 0, layout, act};" in text
    assert "r.size() == 17" in text and "choice_of(r, 13)" in text
    assert "r[5], r[6], r[7], r[8], static_cast<int>(r[9]), r[10] != 0,\n" in text
    assert "static_cast<int>(r[11]), r[12])] = c;" in text
    assert "for (const bool b : {bias, !bias}) {" in text
    assert "tuned.find(tuned_key(x.size(0), x.size(1), x.size(2), K, S, pl, pr, D, dt, b, layout, act))" in text
    for direction in (0, 1):
        assert f"tuned_choice(t.tuned[{direction}], x, K, S, pl, pr, D, dt, bias, layout, act)" in text
    assert "pl == pr" not in text
    assert text.count("Lout, act);") == 2  # both choose_fwd and choose_bwd are asked with the activation


def freeze_with_narrow_designs(out) -> tuple[dict, dict, Variant, Variant, Variant]:
    """The committed generic choices, less fp16's backward ones, with three narrow designs measured beside fused
    ones (the lane backward at fp16 K8, the split backward at fp16 K15, the walk backward at fp16 (B, L, C) K4),
    frozen into out: the manifest, the fused designs by key, the lane, split and walk designs, each built as the
    freeze builds it (on a stand-in of its scope)."""
    from dwgen.families import bwd, bwdlane, bwdtc, bwdwalk
    from dwgen.space import generic_problem, scope_stand_in

    def design(k, config, scope="any", layout="bcl"):
        return Variant(scope_stand_in(generic_problem(k, "fp16", layout), scope), config, "bwd")

    fused = {k: design(k, bwd.Config(threads=128, outs=8, stage="raw", tiles=4)) for k in (8, 15)}
    fused["blc4"] = design(4, bwd.Config(threads=128, outs=16, tc=64, stage="async", tiles=4), layout="blc")
    lane = design(8, bwdlane.Config(threads=128, outs=8, rows=2), "causal_or_centred")
    split = design(15, bwdtc.Config(threads=64, run=16, span=4, wgrad="mma", warps=2, nt=2, tile=1024))
    walk = design(4, bwdwalk.Config(threads=256, ct=64, vec=4, seg=256, unroll=4, stages=3), "left_halo", "blc")
    chosen = {f"fp16_{layout}_k{k}_bwd": {"config": fused[f].config_dict, "kernel": fused[f].name,
                                          "geomean_x_copy": 2.5,
                                          "narrow": [{"scope": s, "config": v.config_dict, "kernel": v.name}]}
              for layout, k, f, s, v in (("bcl", 8, 8, "causal_or_centred", lane),
                                         ("bcl", 15, 15, "within_halo", split),
                                         ("blc", 4, "blc4", "left_halo", walk))}
    # the committed module's fp16 backward measurements left out: these three alone decide fp16's backward tables
    committed = {key: c for key, c in freeze.read_manifest(freeze.DEFAULT_DIR)["generic"]["chosen"].items()
                 if not (key.startswith("fp16_") and key.endswith("_bwd"))}
    return freeze.freeze([], out, log=lambda s: None, generic=committed | chosen), fused, lane, split, walk


def test_narrow_designs_are_frozen_beside_the_fused_one_and_dispatched_by_their_scopes(tmp_path, monkeypatch):
    """search.generic's narrow designs (the lane backward for causal and centred calls at K8, the split backward
    within the halo at K15) go to the narrow table, for their K and the K that take their design from the same
    measurement; the fused design keeps the fast table; the dispatcher runs a narrow kernel only for calls its
    scope takes and an x it takes, else the fused one."""
    import torch

    m, fused, lane, split, walk = freeze_with_narrow_designs(tmp_path)
    before = freeze.read_manifest(freeze.DEFAULT_DIR)
    assert m["generic"]["fast_bwd"]["fp16_bcl_k8"] == fused[8].name
    narrow = m["generic"]["fast_bwd_narrow"]
    # K1-9 take K8's lane design (it fits up to a halo of 8 within its 8-position runs), K10-16 K15's split one
    # (each scope follows its own nearest measurement: K8 could not weigh the split backward)
    # (B, L, C): K1-4 K4's walk design (K5 and K6 take K4's measurement, but its 4-channel state does not fit them)
    # beside the narrow kernels of the committed module's own measurements (other dtypes' keys), as today's rule
    # takes them
    own = {key: names for key, names in freeze._fast_table(freeze._fast_generic(before["generic"]["chosen"])[
        "fast_bwd_narrow"], True).items() if not key.startswith("fp16_")}
    assert narrow == {**own, **{f"fp16_bcl_k{k}": [lane.name.replace("_k8_", f"_k{k}_")] for k in range(1, 10)},
                      **{f"fp16_bcl_k{k}": [split.name.replace("_k15_", f"_k{k}_")] for k in range(10, 17)},
                      **{f"fp16_blc_k{k}": [walk.name.replace("_k4_", f"_k{k}_")] for k in range(1, 5)}}
    # the forward's tables as the committed module holds them (this test's choices are the backward's)
    assert m["generic"]["fast_narrow"] == before["generic"]["fast_narrow"]
    assert m["generic"]["fast"] == before["generic"]["fast"]
    assert freeze.stale_entries(tmp_path) == []
    mod = load_frozen(tmp_path, "dwgen_frozen_narrow")
    t = mod._trusted(m, tmp_path, "9.0")
    assert t.fast_bwd_narrow == narrow and not t.warnings
    _, fast, _ = mod._table_rows(t)
    assert all(len(r) == 10 for r in fast)
    own_rows = [[1, mod._SCOPES.index(mod._scope(t, n))] for names in own.values() for n in names]
    assert sorted(r[4:6] for r in fast if r[0] == 1 and r[4] > 0) == sorted(  # the backward's: rank, scope number
        [[1, 1]] * 7 + [[1, 2]] * 9 + [[1, 3]] * 4 + own_rows)
    # a walk whose blocks cover under 1024 positions (its scope's grid rule counts on them) is refused, with a warning
    import copy

    short = copy.deepcopy(m)
    record = next(k for k in short["kernels"] if k["name"] == walk.name)
    record["config"] = {**record["config"], "seg": 128, "threads": 128}
    ts = mod._trusted(short, tmp_path, "9.0")
    assert "fp16_blc_k4" not in ts.fast_bwd_narrow and any(walk.name in w and "1024" in w for w in ts.warnings)
    # without tensor cores the split kernels are left out; the lane ones stay
    assert mod._trusted(m, tmp_path, "9.0", tensor_cores=False).fast_bwd_narrow == {
        key: names for key, names in narrow.items() if "_bwdtc_" not in names[0]}

    def on_any_device(x, weight, bias, stride, padding, dilation, activation):  # the rule, without a GPU
        left, right = mod._paddings(padding, weight.shape[2], stride, dilation)
        return left, right, mod._output_length(x, weight.shape[2], left, right, stride, dilation, padding)

    monkeypatch.setattr(mod, "_validate", on_any_device)
    monkeypatch.setattr(mod, "tables", lambda device=None: t)

    def choice(k, padding, activation=None, length=1000, offset=0):
        x = torch.zeros(2 * 8 * length + 8, dtype=torch.float16)[offset:offset + 2 * 8 * length].view(2, 8, length)
        w = torch.zeros(8, 1, k, dtype=torch.float16)
        return mod.kernel_for(x, w, None, 1, padding, 1, direction="bwd", activation=activation)

    assert choice(8, "causal") == choice(8, "causal", "silu") == choice(8, "same") == lane.name  # centred (3, 4)
    assert choice(8, "same", "silu") == choice(8, 3) == choice(8, "causal", length=1001) == fused[8].name
    assert choice(15, 7) == choice(15, 14) == choice(15, "causal") == choice(15, "causal", length=1001) == split.name
    assert choice(15, 7, "silu") == choice(15, 15) == fused[15].name  # SiLU; past the halo
    # an x off a 16-byte boundary (both stage 16-byte vectors): what runs it without narrow designs
    assert choice(8, "causal", offset=1) == choice(8, 8, offset=1) != lane.name
    assert choice(15, 7, offset=1) == choice(15, 15, offset=1) != split.name

    def choice_blc(padding, activation=None, length=1000, channels=8, offset=0):
        n = 2 * channels * length
        x = torch.zeros(n + 8, dtype=torch.float16)[offset:offset + n].view(2, length, channels).transpose(1, 2)
        w = torch.zeros(channels, 1, 4, dtype=torch.float16)
        return mod.kernel_for(x, w, None, 1, padding, 1, direction="bwd", activation=activation)

    # the walk: the halo on the left, any right padding, SiLU too; else the fused kernel; channels not whole
    # 4-channel vectors or an x off their 8-byte boundary go where they went without narrow designs
    assert choice_blc("causal") == choice_blc("causal", "silu") == choice_blc(3) == choice_blc(3, "silu") == walk.name
    assert choice_blc("causal", length=1001) == walk.name
    assert choice_blc("same") == choice_blc(1) == choice_blc(4) == fused["blc4"].name
    assert choice_blc("causal", channels=6) == choice_blc(4, channels=6) != walk.name
    assert choice_blc("causal", offset=1) == choice_blc(4, offset=1) != walk.name


def test_a_lane_forward_is_frozen_beside_the_forward_design_and_runs_causal_and_centred_calls(tmp_path, monkeypatch):
    """The lane forward measured beside bf16 K4's forward design for the calls of its scope goes to the forward's
    narrow table (K4 alone: every other K was measured and chose none); the dispatcher runs it for causal calls,
    plain or with SiLU, and centred plain ones on rows of whole vectors from a 16-byte boundary, else the design
    for every call; a lane design that walks tiles is refused, with a warning."""
    import copy

    import torch

    from dwgen.families import lane
    from dwgen.space import generic_problem, scope_stand_in

    v = Variant(scope_stand_in(generic_problem(4, "bf16"), "causal_or_centred"),
                lane.Config(threads=128, vecs=2, spread=True, walk="row"))
    committed = freeze.read_manifest(freeze.DEFAULT_DIR)["generic"]
    chosen = copy.deepcopy(committed["chosen"])
    chosen["bf16_bcl_k4"]["narrow"] = [{"scope": "causal_or_centred", "config": v.config_dict, "kernel": v.name}]
    m = freeze.freeze([], tmp_path, log=lambda s: None, generic=chosen)
    fused, narrow = m["generic"]["fast"]["bf16_bcl_k4"], m["generic"]["fast_narrow"]
    assert narrow["bf16_bcl_k4"] == [v.name] and fused != v.name
    # the other keys as the committed module holds them (the other bf16 K measured the lane forward themselves:
    # theirs, or none), or, for a bf16 K that took K4's measurement, K4's design
    for key in (committed["fast_narrow"].keys() | narrow.keys()) - {"bf16_bcl_k4"}:
        k4 = [v.name.replace("_k4_", f"_k{key.rsplit('_k', 1)[1]}_")] if key.startswith("bf16_bcl_") else None
        assert narrow.get(key) in (committed["fast_narrow"].get(key), k4), key
    assert freeze.stale_entries(tmp_path) == []
    mod = load_frozen(tmp_path, "dwgen_frozen_lane_fwd")
    t = mod._trusted(m, tmp_path, "9.0")
    assert t.fast_narrow == narrow and not t.warnings
    _, fast, _ = mod._table_rows(t)
    assert [r[4:6] for r in fast if r[0] == 0 and r[4] > 0] == [[1, mod._SCOPES.index("causal_or_centred")]] * sum(
        map(len, narrow.values()))

    def on_any_device(x, weight, bias, stride, padding, dilation, activation):  # the rule, without a GPU
        left, right = mod._paddings(padding, weight.shape[2], stride, dilation)
        return left, right, mod._output_length(x, weight.shape[2], left, right, stride, dilation, padding)

    monkeypatch.setattr(mod, "_validate", on_any_device)
    monkeypatch.setattr(mod, "tables", lambda device=None: t)

    def choice(padding, activation=None, length=1000, offset=0):
        x = torch.zeros(2 * 8 * length + 8, dtype=torch.bfloat16)[offset:offset + 2 * 8 * length].view(2, 8, length)
        w = torch.zeros(8, 1, 4, dtype=torch.bfloat16)
        return mod.kernel_for(x, w, None, 1, padding, 1, activation=activation)

    assert choice("causal") == choice("causal", "silu") == choice("same") == v.name  # centred: (1, 2)
    assert choice("same", "silu") == choice(3) == choice("causal", length=1001) == fused
    assert choice("causal", offset=1) != v.name  # an x off a 16-byte boundary
    tile = copy.deepcopy(m)
    record = next(k for k in tile["kernels"] if k["name"] == v.name)
    record["config"] = {**record["config"], "walk": "tile"}
    tt = mod._trusted(tile, tmp_path, "9.0")
    assert "bf16_bcl_k4" not in tt.fast_narrow and any(v.name in w and "tiles" in w for w in tt.warnings)


def test_only_kernels_whose_launch_peels_the_head_are_recorded_as_taking_a_misaligned_x(tmp_path):
    """The dispatcher sends a misaligned x to a tuned kernel only when its record says the launch peels the head:
    the window and tensor-core forwards do, the lane forward (16-byte aligned runs) and the (B, L, C) ones do not."""
    from dwgen.families import lane

    p = Problem(8, 64, 2048, 4, 1, 3, padding_right=0, dtype="bf16")
    winners = [winner(p, Config(threads=128, vec=8, outs=2, halo="l1")),
               winner(p, lane.Config(threads=128, vecs=1, walk="row"), ms=0.07)]
    m = freeze.freeze(winners, tmp_path, log=lambda s: None)
    kernels = {k["name"]: k for k in m["kernels"]}
    assert kernels["dw1d_bf16_k4_t128_v8_o2_l1"]["peels_misalignment"] is True
    assert kernels["dw1d_lane_bf16_k4_t128_o1_row"]["peels_misalignment"] is False
    assert kernels["dw1d_lane_bf16_k4_t128_o1_row"]["align_bytes"] == 16
    assert not any(k["peels_misalignment"] for k in kernels.values() if k["signature"]["layout"] == "blc")


def test_untuned_problems_past_the_fast_generic_kernels_borrow_a_tuned_kernel_of_their_signature(tmp_path, monkeypatch):
    """Untuned problems with K past 16, a stride or a dilation run a tuned kernel of their signature (K, stride,
    dilation, dtype, layout, activation) when its family takes sizes at run time: the one tuned on the largest
    problem; a K the fast generic kernels cover keeps those; paddings past the halo and other activations keep
    the scalar kernel, as does a record whose family does not take any size."""
    import torch

    big, small = Problem(32, 512, 1024, 31, 1, 15), Problem(8, 256, 2048, 31, 1, 15)
    strided, short = Problem(4, 2048, 8192, 3, 2, 1), Problem(8, 64, 2048, 4, 1, 3)
    ws = [winner(big, Config(threads=64, vec=4, outs=4, batches=2, walk="row", halo="async")),
          winner(small, Config(threads=128, vec=4, outs=1, run=2, halo="smem")),
          winner(strided, Config(threads=128, vec=4, outs=2, halo="l1")),
          winner(short, Config(threads=128, vec=4, outs=1, run=2, halo="l1"))]
    m = freeze.freeze(ws, tmp_path / "frozen_lend", log=lambda s: None)
    assert all(k["sizes_at_run_time"] is True for k in m["kernels"])
    mod = load_frozen(tmp_path / "frozen_lend", "dwgen_frozen_lend")
    t = mod._trusted(m, tmp_path / "frozen_lend", "9.0")
    assert t.lent == {(31, 1, 1, "fp32", "bcl", "none"): ws[0].variant.name,
                      (3, 2, 1, "fp32", "bcl", "none"): ws[2].variant.name} and t.lent_bwd == {}
    _, _, lent = mod._table_rows(t)
    assert sorted(r[:7] for r in lent) == [[0, 3, 2, 1, 0, 0, 0], [0, 31, 1, 1, 0, 0, 0]]

    def on_any_device(x, weight, bias, stride, padding, dilation, activation):  # the rule, without a GPU
        left, right = mod._paddings(padding, weight.shape[2], stride, dilation)
        return left, right, mod._output_length(x, weight.shape[2], left, right, stride, dilation, padding)

    monkeypatch.setattr(mod, "_validate", on_any_device)

    def choice(length, k, stride=1, padding=0, activation=None, channels=6):
        x, w = torch.zeros(2, channels, length), torch.zeros(channels, 1, k)
        return mod.kernel_for(x, w, None, stride, padding, 1, activation=activation)

    scalar = m["generic"]["scalar"]["fp32"]["name"]
    assert choice(777, 31, padding=15) == ws[0].variant.name  # other sizes, the tuned padding
    assert choice(777, 31, padding="causal") == ws[0].variant.name  # 30 on the left, none on the right
    assert choice(777, 31, padding=31) == scalar  # past the halo: no family's edges checked it
    assert choice(777, 31, padding=15, activation="silu") == scalar
    assert choice(3001, 3, stride=2, padding=1) == ws[2].variant.name
    assert choice(3001, 3, stride=3, padding=1) == scalar
    assert choice(3001, 4, padding=3) == m["generic"]["fast"]["fp32_bcl_k4"]  # the fast generic kernel, not a loan
    # a family that takes only some sizes never lends: the next largest of the signature does
    next(k for k in m["kernels"] if k["name"] == ws[0].variant.name)["sizes_at_run_time"] = False
    t = mod._trusted(m, tmp_path / "frozen_lend", "9.0")
    assert t.lent[31, 1, 1, "fp32", "bcl", "none"] == ws[1].variant.name


def test_the_launcher_and_the_python_dispatch_agree_on_the_fast_kernels_reach_and_the_lent_rule():
    """Both dispatchers say which K the fast generic kernels cover and when a lent kernel runs; the C++ one is
    checked in the committed launcher's text (no compiler needed)."""
    from dwgen import frozen_dispatch
    from dwgen.space import LEFT_HALO_SPAN

    m = freeze.read_manifest(freeze.DEFAULT_DIR)
    text = (freeze.DEFAULT_DIR / m["launcher"]).read_text()
    assert f"constexpr int MAX_K = {frozen_dispatch.FAST_MAX_K};" in text
    fast_ks = [k for k in range(1, 100) if frozen_dispatch._FAST_KEY.fullmatch(f"fp32_bcl_k{k}")]
    assert fast_ks == list(range(1, frozen_dispatch.FAST_MAX_K + 1))
    assert "if (S == 1 && D == 1 && K <= MAX_K) return t.fast[direction][dt][layout][K];" in text
    assert "if (std::max(pl, pr) > (K - 1) * D) return Choice{};" in text
    # the narrow kernels' scopes (kernel_for's _admits): within the halo without an activation; causal, or centred
    # without an activation, on rows of whole vectors
    assert "case 1: return act == 0 && std::max(pl, pr) <= h;" in text
    assert ("case 2: return x.size(2) % (16 / x.element_size()) == 0 && x.size(0) <= 65535 && "
            "x.size(2) <= (1 << 30) &&") in text
    assert "((pl == h && pr == 0) || (pl == h / 2 && pr == h - h / 2 && act == 0));" in text
    assert "case 3: return pl == h && Lout <= (1 << 30) && x.size(0) * ((Lout + 1023) / 1024) <= 65535;" in text
    assert frozen_dispatch._LEFT_HALO_SPAN == LEFT_HALO_SPAN == 1024
    assert frozen_dispatch._SCOPES == ("any", "within_halo", "causal_or_centred", "left_halo")
    assert f"constexpr int MAX_SCOPE = {len(frozen_dispatch._SCOPES) - 1};" in text and "r[5] <= MAX_SCOPE," in text
    assert frozen_dispatch._SIGNATURE_FIELDS == ("kernel_size", "stride", "dilation", "dtype", "layout", "activation")
    assert "int64_t v[6] = {K, S, D, dtype, layout, act};" in text


def test_the_python_dispatch_and_the_registry_agree_on_the_narrow_scopes():
    """frozen_dispatch (torch only) restates which families serve some calls only as fast generic kernels and
    which calls each scope takes; both must say what the registry and space.scope_admits say."""
    import random

    from dwgen import frozen_dispatch
    from dwgen.space import FAMILIES, GENERIC_SCOPES, scope_admits

    narrow = {f.name: f.generic_scope for fs in FAMILIES.values() for f in fs if f.generic_scope not in (None, "any")}
    assert frozen_dispatch._NARROW_SCOPES == narrow
    assert set(frozen_dispatch._SCOPES) == {"any", *GENERIC_SCOPES} and set(narrow.values()) <= set(GENERIC_SCOPES)
    rng = random.Random(0)
    for _ in range(3000):
        k = rng.randint(1, 16)
        h = k - 1
        left = rng.choice([0, h // 2, h, h + 1, rng.randint(0, 20)])
        right = rng.choice([0, h - left, h - h // 2, left, rng.randint(0, 20)])
        length = rng.choice([8, 16, 1000, 1001, 4096, 4099, 65536, 2**30, 2**30 + 8]) + h
        if length + left + right - h < 1 or right < 0:
            continue
        # under 2**31 elements; the walk's grid rule near its edge: 64 rows of 2^20 outputs, 65535 of 1024
        batch = rng.choice([1, 2, 64, 65535, 65536]) if length < 2**15 else rng.choice([1, 64]) if length < 2**20 else 1
        p = Problem(batch, 1, length, k, 1, left, 1, rng.choice(["fp32", "fp16", "bf16"]), padding_right=right,
                    activation=rng.choice(["none", "silu"]))
        for scope in frozen_dispatch._SCOPES:
            assert scope_admits(scope, p) == frozen_dispatch._admits(
                scope, k, left, right, None if p.activation == "none" else p.activation, p.batch, p.length,
                p.elem_bytes), (scope, p)


def test_a_measured_backward_generic_design_is_frozen_as_the_fast_backward_and_dispatched(tmp_path):
    """search.generic --direction bwd's choice (key <dtype>_<layout>_k<K>_bwd) becomes the fast generic backward
    of its K, and of the K nobody measured where it fits; the forward's fast kernels stay as they were; the
    manifest is consistent (nothing stale) and the dispatcher's tables trust it."""
    from dwgen.families import bwd
    from dwgen.space import generic_problem

    before = freeze.freeze([], tmp_path / "a", log=lambda s: None)
    design = Variant(generic_problem(4, "bf16"), bwd.Config(threads=128, outs=8, stage="raw", tiles=4), "bwd")
    chosen = {"bf16_bcl_k4_bwd": {"config": design.config_dict, "kernel": design.name, "geomean_x_copy": 1.6}}
    m = freeze.freeze([], tmp_path / "b", log=lambda s: None, generic=chosen)
    assert m["generic"]["fast_bwd"]["bf16_bcl_k4"] == design.name
    assert m["generic"]["fast_bwd"]["bf16_bcl_k3"] == "dw1d_bwd_bf16_k3_t128_o8_raw_b4"  # the nearest measured K
    assert m["generic"]["fast_bwd"]["fp32_bcl_k4"] == before["generic"]["fast_bwd"]["fp32_bcl_k4"]
    assert m["generic"]["fast"] == before["generic"]["fast"]
    assert m["generic"]["chosen"] == before["generic"]["chosen"] | chosen
    assert freeze.stale_entries(tmp_path / "b") == []
    from dwgen import frozen_dispatch

    frozen_dispatch.check_manifest(m)
    tables = frozen_dispatch._trusted(m, tmp_path / "b", "9.0")  # what the C++ dispatcher's rows are built from
    assert tables.fast_bwd["bf16_bcl_k4"] == design.name and not tables.warnings


def test_an_entry_of_an_older_space_is_dropped_not_a_crash(tmp_path):
    p = Problem(32, 512, 8192)
    freeze.freeze([winner(p, Config(threads=64, outs=4))], tmp_path)
    path = tmp_path / "manifest.json"
    m = json.loads(path.read_text())
    m["entries"][0]["config"]["gone_axis"] = 1  # an axis its family no longer has
    path.write_text(json.dumps(m))
    assert p.key in freeze.stale_entries(tmp_path)  # and its kernel file, which nothing builds now
    said = []
    m = freeze.freeze([winner(Problem(1, 768, 512), Config(threads=128))], tmp_path, log=said.append)
    assert [e["key"] for e in m["entries"]] == [Problem(1, 768, 512).key] and m["retired"] == []
    assert any("older space" in s for s in said)


def test_a_nearby_current_design_is_asked_before_a_retired_one(tmp_path, monkeypatch):
    from dwgen import space
    from search import workflow

    old, new = Config(threads=64, outs=2), Config(threads=256)
    freeze.freeze([winner(Problem(1, 768, 512), old)], tmp_path)  # its key sorts first
    real = space.template_text
    monkeypatch.setattr(space, "template_text", lambda n: real(n) + "// edited\n")
    m = freeze.freeze([winner(Problem(32, 512, 8192), new)], tmp_path, log=lambda s: None)
    assert [r["key"] for r in m["retired"]] == [Problem(1, 768, 512).key]
    assert workflow.sibling_configs(Problem(16, 512, 8192), tmp_path) == [new, old]
