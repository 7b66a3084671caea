"""scripts/render-generic.py and scripts/generic-harness.cu: a rendering of the working tree's templates, and the
harness that times renderings side by side, still compile together (the harness runs on a GPU only)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dwgen.build import nvcc_path
from dwgen.space import NVCC_FLAGS

ROOT = Path(__file__).resolve().parent.parent


def test_usage_without_a_folder_is_one_line_and_exit_2():
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "render-generic.py")], capture_output=True,
                         text=True, cwd=ROOT)
    assert out.returncode == 2 and out.stderr.startswith("usage: python scripts/render-generic.py OUT_DIR")


@pytest.mark.nvcc
def test_the_harness_builds_against_a_fresh_rendering(tmp_path):
    rendering = tmp_path / "r"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "render-generic.py"), str(rendering)], check=True, cwd=ROOT)
    assert sorted(p.name for p in rendering.iterdir()) == [f"src_{d}_{t}.cu" for d in ("bwd", "fwd")
                                                           for t in ("bf16", "f16", "f32")]
    out = subprocess.run([nvcc_path(), *NVCC_FLAGS, "-arch=sm_90", "-I", str(rendering), "-o", str(tmp_path / "h"),
                          str(ROOT / "scripts" / "generic-harness.cu")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "h").exists()
