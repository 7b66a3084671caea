"""The committed frozen module: fresh against its templates, complete, light, and it builds."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from dwgen import freeze
from tests.conftest import ROOT

GEN = ROOT / "generated"
m = freeze.read_manifest(GEN)
pytestmark = pytest.mark.skipif(not m, reason="no generated/manifest.json committed yet")


def test_no_entry_is_stale():
    assert freeze.stale_entries(GEN) == [], "templates or flags changed under a frozen entry: re-tune it"


def test_entries_record_where_their_numbers_came_from():
    assert m["entries"]
    kernels = {k["name"]: k for k in m["kernels"]}
    for e in m["entries"]:
        assert set(e["problem"]) >= {"batch", "channels", "length", "kernel_size", "stride", "padding",
                                     "dilation", "dtype", "bias"}
        assert {"gpu", "capability", "driver", "torch", "cuda", "date"} <= set(e["machine"])
        meas = e["measured"]
        assert meas["kernel_ms"] > 0 and meas["copy_ms"] > 0 and meas["torch_ms"] > 0
        k = kernels[e["kernel"]]
        assert k["digest"] == e["digest"]
        first = (GEN / k["file"]).read_text().splitlines()[0]
        assert k["name"] in first and k["digest"] in first


def test_every_file_is_named_by_the_manifest():
    """A kernel file or launcher no manifest entry names is dead weight the module never builds, and a sign
    that a re-freeze's results were copied over an older folder (it happened once: old renderings came back)."""
    scalar = [k for which in ("scalar", "scalar_bwd") for k in m["generic"][which].values()]
    named = {k["file"] for k in m["kernels"] + scalar} | {m["launcher"]}
    files = {p.relative_to(GEN).as_posix() for p in GEN.rglob("*") if p.is_file() and p.suffix in (".cu", ".cpp")}
    assert files - named == set(), "files in generated/ the manifest does not name: remove them or re-freeze"


def test_each_fast_generic_kernel_is_of_its_key():
    """Every kernel of the fast generic tables (the narrow ones too) is of the direction, dtype, layout and K its
    key names, at stride and dilation 1: the frozen module takes the tables as written (it checks each kernel's
    family against its table, not its signature against the key), so a freeze that filed one under another key
    would run it on calls it was never built for."""
    kernels = {k["name"]: k for k in m["kernels"]}
    tables = {"fast": "fwd", "fast_narrow": "fwd", "fast_bwd": "bwd", "fast_bwd_narrow": "bwd"}
    wrong = []
    for table, direction in tables.items():
        for key, names in m["generic"].get(table, {}).items():
            dtype, layout, k = re.fullmatch(r"(fp32|fp16|bf16)_(bcl|blc)_k(\d+)", key).groups()
            for name in [names] if isinstance(names, str) else names:
                sig, where = kernels[name]["signature"], kernels[name]["direction"]
                if (where, sig["dtype"], sig["layout"], sig["kernel_size"], sig["stride"], sig["dilation"]) != (
                        direction, dtype, layout, int(k), 1, 1):
                    wrong.append(f"{table}[{key}]: {name}")
    assert not wrong, wrong


def test_target_shape_is_frozen():
    assert "32x512x8192_k3_s1_p1_d1_fp32_bcl_nobias" in {e["key"] for e in m["entries"]}


def test_imports_need_only_torch():
    code = ("import sys, generated; "
            "bad = [n for n in ('dwgen', 'search', 'optuna', 'jinja2') if n in sys.modules]; "
            "assert not bad, bad; assert callable(generated.depthwise_conv1d)")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_bad_input_is_refused_in_one_line():
    import torch

    import generated

    x = torch.randn(2, 4, 16)
    with pytest.raises(ValueError, match="CUDA device") as e:
        generated.depthwise_conv1d(x, torch.randn(4, 1, 3))
    assert "\n" not in str(e.value)


@pytest.mark.slow
@pytest.mark.nvcc
def test_builds_with_load_inline(tmp_path):
    """Compile the frozen module as a user's first call would (no GPU needed for the build), then check the
    registered ops: one-line errors from C++ for CPU tensors, and the fake implementations' shapes and
    memory orders (tests/op_registration_check.py)."""
    # a script run by its path does not have the repository on sys.path
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, DWGEN_BUILD_DIR=str(tmp_path), PYTHONPATH=path)
    out = subprocess.run([sys.executable, str(ROOT / "tests" / "op_registration_check.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "registered" in out.stdout
    # torch compiles C++ without optimisation unless asked, and the launcher's host code is a small call's cost
    ninja = (tmp_path / "build.ninja").read_text()
    cflags = next(line for line in ninja.splitlines() if line.startswith("cflags ="))
    assert " -O3" in cflags, cflags
    # the kernels were compiled a few to a unit, none as its own
    assert "dwgen_kernels_" in ninja and not re.search(r"kernels/[^ ]*\.cu\b", ninja)


