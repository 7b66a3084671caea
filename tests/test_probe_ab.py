"""scripts/probe-ab.py's edits, on the CPU: what each changes in a rendered source, and that the templates still
hold the text the edits look for (a template change would otherwise make the probe skip them quietly)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
_spec = importlib.util.spec_from_file_location("probe_ab", ROOT / "scripts" / "probe-ab.py")
probe_ab = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe_ab)

from dwgen import render  # noqa: E402
from dwgen.problem import Problem  # noqa: E402
from dwgen.space import variant_from_name  # noqa: E402

MAMBA = Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16", False, "bcl", padding_right=0, activation="silu")


def rendered(name: str, p: Problem, direction: str = "bwd") -> str:
    return render.render_variant(variant_from_name(name, p, direction))


def test_same_changes_no_code_and_combined_edits_apply_in_turn():
    src = "constexpr bool STREAM = false;\nasm(\"cp.async.ca.shared.global [%0], [%1], 8;\");\n"
    same = probe_ab.edited(src, "same")
    assert same.startswith(src) and same[len(src):].strip().startswith("//")
    both = probe_ab.edited(src, "stream+ring256")
    assert "STREAM = true;" in both and "cp.async.ca.shared.global.L2::256B [" in both
    assert probe_ab.edited(src, "l2pf") is None  # no load_vec here: skipped, not half-applied


def test_unknown_edit_is_refused_in_one_line():
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="unknown edit 'bogus'"):
        probe_ab.edit_name("stream+bogus")


@pytest.mark.parametrize("name, problem, edits", [
    ("dw1d_bwdlane_bf16_k4_t128_o8_n2_h2", MAMBA, ("stream", "l2pf", "l2pf_nol1", "pdl")),
    ("dw1d_bwdwalk_bf16_k4_t256_c64_v4_s256_u4_a3", Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16", False, "blc",
                                                             padding_right=0, activation="silu"),
     ("stream", "ring256", "pdl")),
    ("dw1d_bwd_f32_k4_t256_o8_raw_b4_across", Problem(8, 4096, 2048, 4, 1, 3, 1), ("stream", "async256", "pdl")),
])
def test_edits_find_their_text_in_the_templates(name, problem, edits):
    src = rendered(name, problem)
    for e in edits:
        out = probe_ab.edited(src, e)
        assert out is not None and out != src, e


def test_blocks_edits_ask_ptxas_for_blocks_an_sm_on_one_argument_launch_bounds():
    src = rendered("dw1d_f16_k9_cl_t128_v4_o4_w16_c32", Problem(8, 1024, 4000, 9, 1, 4, 1, "fp16", False, "blc"), "fwd")
    assert "__launch_bounds__(128)" in src
    out = probe_ab.edited(src, "blocks5")
    assert "__launch_bounds__(128, 5)" in out and "__launch_bounds__(128)" not in out


def test_minblocks_edits_move_the_second_argument_of_two_argument_launch_bounds():
    src = rendered("dw1d_f32_k31_t64_v4_o2_r2_n2_row_async", Problem(32, 512, 1024, 31, 1, 15, 1), "fwd")
    assert "__launch_bounds__(64, 32)" in src
    out = probe_ab.edited(src, "minblocks16")
    assert "__launch_bounds__(64, 16)" in out and "__launch_bounds__(64, 32)" not in out
    assert probe_ab.edited("__launch_bounds__(128)", "minblocks24") is None  # one argument: left to blocksN


def test_pdl_launches_the_sums_through_the_helper_once_and_waits_in_them():
    src = probe_ab.edited(rendered("dw1d_bwdlane_bf16_k4_t128_o8_n2_h2", MAMBA), "pdl")
    assert "_sum<<<" not in src and src.count("dwgen_pdl_launch(dw1d_bwdlane_bf16_k4_t128_o8_n2_h2_sum, ") == 1
    assert src.count("#include <cuda_runtime.h>") == 1 and src.count("cudaGridDependencySynchronize();") == 1


def test_channel_forward_edits_find_their_text_and_replace_the_register_prefetch():
    src = rendered("dw1d_f16_k9_cl_t128_v4_o4_w16_c32", Problem(8, 1024, 4000, 9, 1, 4, 1, "fp16", False, "blc"),
                   "fwd")
    for e in ("unroll0", "unroll2", "unroll3", "unroll4", "ring2", "ring4"):
        out = probe_ab.edited(src, e)
        assert out is not None and out != src, e
    unrolled = probe_ab.edited(src, "unroll3")
    assert "#pragma unroll 3\n    for (int s = 0; s < STEPS; ++s) {" in unrolled
    assert src.count("if (more) {") == 2 and unrolled.count("if (more) {") == 1  # the load stays conditional
    ring = probe_ab.edited(src, "ring4")
    assert "vec_t next[NEW];" not in ring and "constexpr int R = 4;" in ring
    assert ring.count("cp.async.wait_group") == 1 and ring.count("// The launch contract") == 1


def test_from_dir_takes_another_rendering_of_the_variant_not_an_edit(tmp_path):
    # B as the same variant rendered from another checkout of the templates (before and after a template change).
    (tmp_path / "dw1d_x.cu").write_text("// the earlier rendering\n")
    assert probe_ab.edited("// now\n", f"from:{tmp_path}", "dw1d_x") == "// the earlier rendering\n"
    assert probe_ab.edited("// now\n", f"from:{tmp_path}", "dw1d_y") is None  # not rendered there: skipped
    with pytest.raises(ValueError, match="needs the variant's name"):  # never a quiet skip of every side
        probe_ab.edited("// now\n", f"from:{tmp_path}")
    assert probe_ab.edit_name(f"from:{tmp_path}") == f"from:{tmp_path}"
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="no such folder"):
        probe_ab.edit_name(f"from:{tmp_path / 'missing'}")


def test_each_side_builds_from_its_own_source_in_its_own_folder():
    # Until the thirty-fourth session every side of a variant shared one build folder (the key kept only the
    # variant's digest), so A and its edits ran one library.
    p = Problem(8, 1024, 4000, 9, 1, 4, dtype="fp16", layout="blc")
    v = variant_from_name("dw1d_f16_k9_cl_t128_v4_o4_w16_c32", p, "fwd")
    base = render.render_variant(v)
    sides = [(v, "A", base)] + [(v, e, probe_ab.edited(base, e)) for e in ("same", "blocks5", "blocks6")]
    keys = [key for _, _, key in probe_ab.build_jobs(sides, "sm_90")]
    assert len(set(keys)) == len(keys), keys
    assert probe_ab.build_jobs(sides[:1], "sm_90") == probe_ab.build_jobs(sides, "sm_90")[:1]  # A's key is stable


def test_render_variants_renders_with_the_other_checkouts_templates(tmp_path):
    import shutil
    import subprocess

    other = tmp_path / "other"  # a checkout whose channel template carries a marker
    shutil.copytree(ROOT / "dwgen", other / "dwgen", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "templates", other / "templates")
    cl = other / "templates" / "dw1d_cl.cu.j2"
    cl.write_text(cl.read_text() + "\n// the other checkout\n")
    ab = tmp_path / "ab.txt"
    ab.write_text("# a comment\n--shape 8x1024x4000 -k 9 --padding 4 --dtype fp16 --layout blc --rounds 5 "
                  "--edit from:x dw1d_f16_k9_cl_t128_v4_o4_w16_c32 dw1d_f16_k9_cl_t128_v64_o4_w16_c32\n")
    script = str(ROOT / "scripts" / "render-variants.py")
    proc = subprocess.run([sys.executable, script, "--root", str(other), str(ab), str(tmp_path / "r")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr  # the v64 design is past the axes: reported, left out
    assert "v64" in proc.stdout and "not rendered" in proc.stdout
    out = (tmp_path / "r" / "dw1d_f16_k9_cl_t128_v4_o4_w16_c32.cu").read_text()
    assert out.endswith("// the other checkout\n")
    p = Problem(8, 1024, 4000, 9, 1, 4, 1, "fp16", False, "blc")
    assert out != rendered("dw1d_f16_k9_cl_t128_v4_o4_w16_c32", p, "fwd")  # not this checkout's rendering

    ab.write_text("--shape 8x1024 -k 9 --dtype fp16 dw1d_f16_k9_cl_t128_v4_o4_w16_c32\n")
    proc = subprocess.run([sys.executable, script, str(ab), str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"render-variants: {ab}:1: ") and len(proc.stderr.strip().splitlines()) == 1


def test_warm_samples_time_n_calls_and_report_one():
    from dwgen.bench import Timing

    calls = []
    probe_ab.repeated(lambda: calls.append(1), 20)()
    assert len(calls) == 20
    one = probe_ab.per_call(Timing(2.0, 1.0, 3, (2.0, 4.0, 1.0)), 20)
    assert (one.median_ms, one.min_ms, one.reps, one.samples) == (0.1, 0.05, 3, (0.1, 0.2, 0.05))


def test_gridswap_swaps_the_walks_grid_and_leaves_the_sums_alone():
    mamba_blc = Problem(8, 4096, 2048, 4, 1, 3, 1, "bf16", False, "blc", padding_right=0, activation="silu")
    src = rendered("dw1d_bwdwalk_bf16_k4_t256_c64_v4_s256_u4_a3", mamba_blc)
    out = probe_ab.edited(src, "gridswap")
    assert out is not None
    walk, sums = out.split("_sum(", 1)[0], out.split("_sum(", 1)[1]
    assert walk.count("blockIdx.y) * CT") == 2 and "blockIdx.x) / parts" in walk and "blockIdx.x) * C + c0" in walk
    assert "blockIdx.x) * CT" not in walk and "blockIdx.y) / parts" not in walk
    assert "blockIdx.x) * COLS" in sums  # the weight sums' own grid is untouched
    assert "kernel<<<dim3(static_cast<unsigned>(g), static_cast<unsigned>((C + CT * CV - 1) / (CT * CV)))" in out


@pytest.mark.parametrize("text", ["0", "-3", "two"])
def test_warm_refuses_anything_but_a_count_of_calls(text):
    import argparse

    with pytest.raises(argparse.ArgumentTypeError, match="1 or more"):
        probe_ab.warm_calls(text)
    assert probe_ab.warm_calls("20") == 20
