"""scripts/sass.py: static SASS of named variants (its parsing here; a whole run where cuobjdump exists)."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "sass.py"


def _module():
    spec = importlib.util.spec_from_file_location("sass_script", SCRIPT)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_kernel_names_lose_their_mangling_but_keep_the_activation():
    m = _module()
    assert m.short_name("_Z33dw1d_bwd_bf16_k3_t128_o16_rawp_b4ILi1EEvPK13__nv_bfloat16S2_") == \
        "dw1d_bwd_bf16_k3_t128_o16_rawp_b4<1>"
    assert m.short_name("dw1d_bwd_bf16_k3_t128_o16_rawp_b4_sum") == "dw1d_bwd_bf16_k3_t128_o16_rawp_b4_sum"


def test_a_name_that_is_no_variant_of_the_problem_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, str(SCRIPT), "--shape", "4x64x1000", "--direction", "bwd",
                          "dw1d_f32_k3_t128_v4_o2_l1"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("python scripts/sass.py: dw1d_f32_k3_t128_v4_o2_l1 is not a variant of")


@pytest.mark.nvcc
@pytest.mark.skipif(shutil.which("cuobjdump") is None, reason="needs cuobjdump on PATH")
def test_counts_a_backward_variant():
    out = subprocess.run([sys.executable, str(SCRIPT), "--shape", "4x64x1000", "-k", "3", "--direction", "bwd",
                          "dw1d_bwd_f32_k3_t128_o4"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[2:]}
    assert {"dw1d_bwd_f32_k3_t128_o4<0>", "dw1d_bwd_f32_k3_t128_o4<1>", "dw1d_bwd_f32_k3_t128_o4_sum"} <= set(rows)
    assert all(int(r[1]) > 0 and int(r[4]) > 0 for r in rows.values())  # registers and instructions
