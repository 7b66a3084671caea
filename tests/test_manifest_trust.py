"""The frozen module checks its manifest: schema, field types, file digests, GPU architecture; what fails is
refused with a warning and its problems run the generic kernel, never blindly."""
from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest

from dwgen import freeze, frozen_dispatch
from dwgen.gate import load_frozen
from tests.conftest import ROOT

_names = itertools.count()


@pytest.fixture
def here(tmp_path):
    """A copy of the committed generated/ to tamper with."""
    shutil.copytree(ROOT / "generated", tmp_path / "g")
    return tmp_path / "g"


def manifest(here) -> dict:
    return json.loads((here / "manifest.json").read_text())


def rewrite(here, edit) -> dict:
    m = manifest(here)
    edit(m)
    (here / "manifest.json").write_text(json.dumps(m))
    return m


def trusted(here, capability: str | None = "9.0") -> frozen_dispatch.Tables:
    m = manifest(here)
    frozen_dispatch.check_manifest(m)
    return frozen_dispatch._trusted(m, here, capability)


def load(here):
    return load_frozen(here, f"dwgen_frozen_trust_{next(_names)}")


def forward_entries(m: dict) -> list[dict]:
    return [e for e in m["entries"] if e.get("direction", "fwd") == "fwd"]


def tuned_entry(m: dict) -> dict:
    """A tuned forward entry whose kernel no generic slot uses: refusing it changes only that entry's dispatch."""
    fast = set(m["generic"]["fast"].values())
    return next(e for e in forward_entries(m) if e["kernel"] not in fast)


def key(e: dict) -> tuple:
    return frozen_dispatch._entry_key(e["problem"])


def test_schema_is_the_freezes():
    assert frozen_dispatch.SCHEMA == freeze.SCHEMA


def test_the_committed_module_is_trusted_whole(here):
    m = manifest(here)
    t = trusted(here)
    assert len(t.kernels) == len(m["kernels"]) and len(t.tuned) == len(forward_entries(m)) > 0
    assert len(t.tuned) + len(t.tuned_bwd) == len(m["entries"])
    assert t.fast == m["generic"]["fast"] and t.dropped == [] and t.warnings == []
    assert freeze.stale_entries(here) == []


def test_a_tampered_kernel_is_never_built_or_called(here):
    e = tuned_entry(manifest(here))
    k = next(k for k in manifest(here)["kernels"] if k["name"] == e["kernel"])
    src = here / k["file"]
    src.write_text(src.read_text().replace("{", "{ /* edited */", 1))
    t = trusted(here)
    assert e["kernel"] not in t.kernels and t.dropped == [e["kernel"]] and key(e) not in t.tuned
    assert len(t.warnings) == 1 and k["file"] in t.warnings[0] and "generic kernel" in t.warnings[0]
    assert f"sha256 {k['file']}" in freeze.stale_entries(here)
    mod = load(here)
    with pytest.warns(UserWarning, match=re.escape(k["file"])):
        t = mod.tables()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once: the second look warns no more
        assert mod.tables() is t
    sources = mod._sources(t)
    assert str(src) not in sources and sources[-1].endswith(".cpp")
    assert sources[0].endswith(manifest(here)["launcher"])  # the longest job starts first
    stub = open(sources[-1]).read()
    # the launcher still names the refused kernel: a stand-in lets it link, and nothing dispatches to it
    assert f"int dwgen_launch_{e['kernel']}(" in stub and stub.count("dwgen_launch_") == 1


def test_a_missing_kernel_file_is_refused(here):
    e = tuned_entry(manifest(here))
    k = next(k for k in manifest(here)["kernels"] if k["name"] == e["kernel"])
    (here / k["file"]).unlink()
    t = trusted(here)
    assert t.dropped == [e["kernel"]] and "missing" in t.warnings[0]


@pytest.mark.parametrize("field, value", [
    ("align_bytes", "16"), ("align_bytes", True), ("align_bytes", 4096), ("channel_multiple", 0),
    ("channel_multiple", 1.0), ("peels_misalignment", 1), ("sizes_at_run_time", None), ("name", "x; system(1)"),
    ("file", "../../../etc/passwd"), ("file", "kernels/evil\n.cu"), ("sha256", None),
    ("config", None), ("config", []), ("signature", None), ("signature", "fp32_bcl_k3"),
])
def test_a_kernel_record_of_the_wrong_type_is_refused(here, field, value):
    name = tuned_entry(manifest(here))["kernel"]
    rewrite(here, lambda m: next(k for k in m["kernels"] if k["name"] == name).__setitem__(field, value))
    t = trusted(here)
    assert name not in t.kernels and name in t.dropped and len(t.warnings) == 1


def test_kernel_records_out_of_the_launchers_order_are_refused(here):
    names = [k["name"] for k in manifest(here)["kernels"][:2]]
    rewrite(here, lambda m: m["kernels"].__setitem__(slice(0, 2), m["kernels"][1::-1]))
    t = trusted(here)
    assert sorted(t.dropped) == sorted(names) and all("index" in w for w in t.warnings)


@pytest.mark.parametrize("path, value", [
    (("problem", "batch"), "32"), (("problem", "batch"), 0), (("problem", "bias"), 0),
    (("problem", "dtype"), "fp64"), (("problem", "layout"), "x; system(1)"), (("machine", "capability"), 9.0),
    (("machine",), None),
])
def test_a_tuned_entry_of_the_wrong_type_is_refused(here, path, value):
    e = tuned_entry(manifest(here))

    def edit(m):
        target = next(x for x in m["entries"] if x["key"] == e["key"])
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
    rewrite(here, edit)
    t = trusted(here)
    assert key(e) not in t.tuned and len(t.tuned) == len(forward_entries(manifest(here))) - 1
    assert e["kernel"] in t.kernels  # the kernel is fine: only this entry's dispatch is refused
    assert len(t.warnings) == 1 and "tuned entry" in t.warnings[0]


def test_entries_tuned_on_another_architecture_fall_back_to_generic(here):
    e = tuned_entry(manifest(here))
    rewrite(here, lambda m: next(x for x in m["entries"] if x["key"] == e["key"])["machine"].__setitem__(
        "capability", "8.0"))
    on_hopper = trusted(here, "9.0")
    assert key(e) not in on_hopper.tuned and e["kernel"] in on_hopper.kernels  # compiled, correct, not chosen
    assert len(on_hopper.warnings) == 1 and "architecture 8.0" in on_hopper.warnings[0]
    assert key(e) in trusted(here, "8.0").tuned and trusted(here, "8.0").warnings != []  # the others are 9.0
    assert key(e) in trusted(here, None).tuned  # no GPU to compare with: nothing dispatches anyway


@pytest.mark.parametrize("edit, why", [
    (lambda m: m.__setitem__("schema", 2), "schema 2"),
    (lambda m: m.__setitem__("schema", "3"), "schema '3'"),
    (lambda m: m.__setitem__("nvcc_flags", ["-O3", "-o /tmp/x; rm -rf ~"]), "nvcc_flags"),
    (lambda m: m.__setitem__("nvcc_flags", "-O3"), "nvcc_flags"),
    (lambda m: m.__setitem__("launcher", "../launch-0123456789ab.cpp"), "launcher"),
    (lambda m: m.pop("launcher_sha256"), "launcher"),
    (lambda m: m["generic"]["scalar"].pop("bf16"), "scalar"),
    (lambda m: m["generic"]["scalar"]["fp32"].__setitem__("file", "/etc/passwd"), "scalar"),
    (lambda m: m.__setitem__("kernels", {}), "kernels"),
])
def test_a_malformed_manifest_imports_and_the_first_call_says_why(here, edit, why):
    rewrite(here, edit)
    mod = load(here)
    assert mod.MANIFEST == {} and callable(mod.depthwise_conv1d)
    for call in (mod.tables, mod.build):
        with pytest.raises(RuntimeError, match=re.escape(why) + ".*run `python tune.py`") as err:
            call()
        assert "\n" not in str(err.value)


def test_bad_json_imports_and_the_first_call_says_why(here):
    (here / "manifest.json").write_text('{"schema": 3, ')
    with pytest.raises(RuntimeError, match=r"unreadable .*run `python tune.py`"):
        load(here).build()


@pytest.mark.parametrize("which", ["scalar", "launcher"])
def test_a_tampered_scalar_kernel_or_launcher_stops_the_build(here, which):
    m = manifest(here)
    rel = m["generic"]["scalar"]["fp32"]["file"] if which == "scalar" else m["launcher"]
    (here / rel).write_text((here / rel).read_text() + "// edited\n")
    mod = load(here)
    with pytest.raises(RuntimeError, match=re.escape(rel) + r".*re-run the freeze"):
        mod.build()
    assert f"sha256 {rel}" in freeze.stale_entries(here)


def test_the_extension_name_changes_with_any_source(here):
    mod = load(here)
    sources = mod._sources(mod.tables())
    name = mod.extension_name(sources)
    assert name == mod.extension_name(list(sources)) and re.fullmatch(r"dwgen_generated_[0-9a-f]{16}", name)
    for path in (sources[0], sources[len(sources) // 2], sources[-1]):  # a kernel, a scalar kernel, the launcher
        original = open(path).read()
        with open(path, "w") as f:
            f.write(original + " ")
        assert mod.extension_name(sources) != name, path
        with open(path, "w") as f:
            f.write(original)
    assert mod.extension_name(sources) == name


def test_nothing_is_loaded_with_pickle_or_eval():
    pattern = re.compile(r"\b(eval|exec)\(|\bpickle\b|\bmarshal\b|torch\.load\(|yaml\.load\(|\bshelve\b")
    files = [p for d in ("dwgen", "search", "generated") for p in (ROOT / d).rglob("*.py")] + [ROOT / "tune.py"]
    assert len(files) > 20
    hits = [f"{p.relative_to(ROOT)}:{n}" for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
            if pattern.search(line)]
    assert hits == []


def add_bwd_entry(here, kernel: str | None = None, **fields) -> dict:
    """A backward entry for the tuned forward's problem, naming the generic backward kernel of its signature
    (one of the committed kernels, so the files stay as recorded) unless told another; the committed
    backward entries are taken out first, so that it is the only one."""
    def edit(m):
        m["entries"] = forward_entries(m)
        e = next(x for x in m["entries"] if x["key"] == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias")
        m["entries"].append({**e, "direction": "bwd", "kernel": kernel or m["generic"]["fast_bwd"]["fp32_bcl_k3"],
                             **fields})
    return rewrite(here, edit)


def test_backward_entries_fill_the_tuned_bwd_table(here):
    m = add_bwd_entry(here)
    e = m["entries"][-1]
    t = trusted(here)
    assert t.tuned_bwd == {key(e): e["kernel"]} and t.warnings == []
    assert key(e) in t.tuned and t.tuned[key(e)] != e["kernel"]  # the forward's entry of the same problem stays
    tuned_rows, fast_rows, lent_rows = frozen_dispatch._table_rows(t)
    assert all(len(r) == 17 and r[0] in (0, 1) for r in tuned_rows)
    assert sum(r[0] == 0 for r in tuned_rows) == len(t.tuned) and sum(r[0] == 1 for r in tuned_rows) == 1
    index, k = t.kernels[e["kernel"]]
    # direction 1, B, C, L, K, S, pad_left 1, pad_right 1 (an entry without padding_right is symmetric), D,
    # dtype fp32 (0), no bias, layout bcl (0), activation none (0), then the kernel's choice
    assert [r for r in tuned_rows if r[0] == 1] == [[1, 32, 512, 8192, 3, 1, 1, 1, 1, 0, 0, 0, 0, index,
                                                     k["align_bytes"], k["channel_multiple"], 0]]
    assert all(len(r) == 10 for r in fast_rows) and all(len(r) == 11 for r in lent_rows)


@pytest.mark.parametrize("which, fields, why", [
    ("fwd kernel", {}, "its kernel is not a backward kernel"),
    ("bwd kernel", {"direction": "fwd"}, "its kernel is not a forward kernel"),
    ("bwd kernel", {"direction": "sideways"}, "its direction is not fwd or bwd"),
    ("bwd kernel", {"direction": None}, "its direction is not fwd or bwd"),
])
def test_an_entry_whose_direction_does_not_fit_is_refused(here, which, fields, why):
    m = manifest(here)
    kernel = tuned_entry(m)["kernel"] if which == "fwd kernel" else m["generic"]["fast_bwd"]["fp32_bcl_k3"]
    m = add_bwd_entry(here, kernel, **fields)
    t = trusted(here)
    assert t.tuned_bwd == {} and len(t.tuned) == len(m["entries"]) - 1  # the others are all used
    assert len(t.warnings) == 1 and "tuned entry" in t.warnings[0] and why in t.warnings[0]


def test_backward_entries_tuned_on_another_architecture_fall_back(here):
    m = add_bwd_entry(here, machine={**manifest(here)["entries"][0]["machine"], "capability": "8.0"})
    assert trusted(here, "9.0").tuned_bwd == {} and "architecture 8.0" in trusted(here, "9.0").warnings[0]
    assert trusted(here, "8.0").tuned_bwd == {key(m["entries"][-1]): m["entries"][-1]["kernel"]}


def test_tensor_cores_off_leaves_out_only_the_tensor_core_entries(here):
    """DWGEN_TENSOR_CORES=0: the problems tuned to a tensor-core kernel (a forward, or a split backward) run the
    generic kernels instead, in that direction only."""
    m = manifest(here)
    frozen_dispatch.check_manifest(m)
    family = {k["name"]: k["config"].get("family") for k in m["kernels"]}
    tc = {d: {key(e) for e in m["entries"] if e.get("direction", "fwd") == d
              and family[e["kernel"]] in frozen_dispatch.TC_FAMILIES} for d in ("fwd", "bwd")}
    if not tc["fwd"] | tc["bwd"]:
        pytest.skip("generated/ has no tuned tensor-core entry")
    on = frozen_dispatch._trusted(m, here, "9.0")
    off = frozen_dispatch._trusted(m, here, "9.0", tensor_cores=False)
    assert tc["fwd"] <= set(on.tuned) and tc["bwd"] <= set(on.tuned_bwd)
    assert set(off.tuned) == set(on.tuned) - tc["fwd"]
    assert set(off.tuned_bwd) == set(on.tuned_bwd) - tc["bwd"]


def test_tensor_cores_off_leaves_out_the_tensor_core_fast_generic_kernels(here):
    """DWGEN_TENSOR_CORES=0 covers untuned problems too: a (dtype, layout, K) whose fast generic kernel is of a
    tensor-core family runs the generic kernel instead (the C++ tables are built from these); the others keep
    theirs."""
    m = manifest(here)
    frozen_dispatch.check_manifest(m)
    family = {k["name"]: k["config"].get("family") for k in m["kernels"]}
    on = frozen_dispatch._trusted(m, here, "9.0")
    off = frozen_dispatch._trusted(m, here, "9.0", tensor_cores=False)
    for table in ("fast", "fast_bwd"):
        tc = {key for key, name in getattr(on, table).items() if family[name] in frozen_dispatch.TC_FAMILIES}
        assert getattr(off, table) == {key: name for key, name in getattr(on, table).items() if key not in tc}
    if not {key for key, name in on.fast.items() if family[name] in frozen_dispatch.TC_FAMILIES}:
        pytest.skip("generated/ has no tensor-core fast generic kernel")
    assert "fp16_bcl_k15" in on.fast and "fp16_bcl_k15" not in off.fast


def test_tensor_cores_off_leaves_out_split_backward_entries_too(here):
    """The split backward computes grad_x with the tensor-core forward: DWGEN_TENSOR_CORES=0 leaves its entries
    out as well (here a backward entry whose kernel record is marked as of that family)."""
    def edit(m):
        m["entries"] = forward_entries(m)
        e = next(x for x in m["entries"] if x["key"] == "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias")
        name = m["generic"]["fast_bwd"]["fp32_bcl_k3"]
        m["entries"].append({**e, "direction": "bwd", "kernel": name})
        k = next(k for k in m["kernels"] if k["name"] == name)
        k["config"] = {**k["config"], "family": "dw1d_bwdtc"}

    m = rewrite(here, edit)
    e = m["entries"][-1]
    on = frozen_dispatch._trusted(m, here, "9.0")
    off = frozen_dispatch._trusted(m, here, "9.0", tensor_cores=False)
    assert on.tuned_bwd == {key(e): e["kernel"]}
    assert off.tuned_bwd == {}
    # the kernel marked as split backward here is also fp32 K3's fast generic backward: off, that key runs the
    # generic kernel
    assert off.fast_bwd == {k: n for k, n in on.fast_bwd.items() if k != "fp32_bcl_k3"}


def test_kernels_are_compiled_a_few_to_a_unit(here, tmp_path):
    mod = load(here)
    sources = mod._sources(mod.tables())
    kernels = [s for s in sources if s.endswith(".cu")]
    units = mod._translation_units(sources, tmp_path / "build", jobs=2)
    assert units[0] == sources[0]  # the launcher, the longest job, still first
    assert [u for u in units if not u.endswith(".cu")] == [s for s in sources if not s.endswith(".cu")]
    cu = [u for u in units if u.endswith(".cu")]
    assert 1 < len(cu) <= mod.UNITS_PER_CORE * 2 < len(kernels)
    members = {u: re.findall(r'^#include "(.+)"', open(u).read(), re.M) for u in cu}
    assert sorted(m for ms in members.values() for m in ms) == sorted(kernels)  # each kernel in exactly one unit
    sizes = [sum(os.path.getsize(m) for m in ms) for ms in members.values()]
    assert max(sizes) - min(sizes) <= max(os.path.getsize(k) for k in kernels)  # balanced by size
    stamps = [os.stat(u).st_mtime_ns for u in cu]
    assert mod._translation_units(sources, tmp_path / "build", jobs=2) == units
    assert [os.stat(u).st_mtime_ns for u in cu] == stamps  # unchanged units are not rewritten: ninja has nothing to do
    # a kernel whose text changes (its name and size kept: a size change may rebalance the units) puts its unit
    # under a new name; the others stay
    changed = kernels[len(kernels) // 2]
    text = Path(changed).read_bytes()
    Path(changed).write_bytes(b"//!" + text[3:])  # its first line is a comment
    again = mod._translation_units(sources, tmp_path / "build", jobs=2)
    moved = set(again) - set(units)
    assert len(moved) == 1 and changed in open(moved.pop()).read()
    many = mod._translation_units(sources, tmp_path / "many", jobs=len(kernels))
    assert len([u for u in many if u.endswith(".cu")]) == len(kernels)


def test_a_fast_table_naming_a_kernel_of_the_wrong_scope_is_refused_with_a_warning(here):
    """A narrow table holds only kernels of narrow families (the dispatcher asks their scope), the tables for
    every call only the others: a kernel in the wrong one is not used there, and says so."""
    def edit(m):
        m["generic"]["fast_bwd_narrow"] = {"fp16_bcl_k15": [m["generic"]["fast_bwd"]["fp16_bcl_k15"]]}
        name = m["generic"]["fast_bwd"]["fp16_bcl_k3"]
        next(k for k in m["kernels"] if k["name"] == name)["config"]["family"] = "dw1d_bwdlane"

    m = rewrite(here, edit)
    t = trusted(here)
    assert t.fast_bwd_narrow == {} and "fp16_bcl_k3" not in t.fast_bwd
    assert len(t.fast_bwd) == len(m["generic"]["fast_bwd"]) - 1
    lane_in_fast = m["generic"]["fast_bwd"]["fp16_bcl_k3"]
    fused_in_narrow = m["generic"]["fast_bwd_narrow"]["fp16_bcl_k15"][0]
    assert any(lane_in_fast in w and "serves some calls only" in w for w in t.warnings)
    assert any(fused_in_narrow in w and "serves every call" in w for w in t.warnings)


@pytest.mark.parametrize("field,value", [("kernel_size", 4), ("dtype", "fp16"), ("layout", "blc"), ("stride", 2)])
def test_a_fast_table_naming_a_kernel_of_another_signature_is_refused_with_a_warning(here, field, value):
    """A fast generic kernel runs every call of its key's dtype, layout and K at stride and dilation 1; one built
    for another signature (a freeze that filed it under the wrong key, an edited manifest) is not used, and
    says so: the key's calls run the generic kernel instead of a kernel built for other calls."""
    def edit(m):
        name = m["generic"]["fast"]["bf16_bcl_k3"]
        signature = next(k for k in m["kernels"] if k["name"] == name)["signature"]
        assert signature[field] != value
        signature[field] = value

    m = rewrite(here, edit)
    t = trusted(here)
    name = m["generic"]["fast"]["bf16_bcl_k3"]
    assert "bf16_bcl_k3" not in t.fast and len(t.fast) == len(m["generic"]["fast"]) - 1
    assert any(name in w and "another signature than its table's key 'bf16_bcl_k3'" in w for w in t.warnings)
