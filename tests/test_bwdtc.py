"""The split backward for long 16-bit filters (dwgen/families/bwdtc.py): which problems it serves, its names,
its render (the tensor-core forward inside it, launched for grad_x), and its weight-gradient kernel run on the
CPU (tests/cuda_on_cpu.h) against float64. grad_x runs on tensor cores, so only the GPU tests check it."""
from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from dwgen import render
from dwgen.check import compare, grad_output, make_inputs
from dwgen.families import bwdtc, tc
from dwgen.problem import Problem
from dwgen.space import Variant, enumerate_space, families_of, variant_from_name, violations
from tests.cuda_on_cpu import HERE, MAIN_OPEN, PRELUDE, WARP_MMA_ON_CPU, raw, run_both_schedules
from tests.test_bwd_on_cpu import reference

CONFORMER = Problem(32, 512, 1024, 31, 1, 15, 1, "fp16")


def split_variants(p: Problem) -> list[Variant]:
    return [v for v in enumerate_space(p, "bwd") if v.family.name == "dw1d_bwdtc"]


@pytest.mark.parametrize("p,serves", [
    (CONFORMER, True),
    (replace(CONFORMER, dtype="bf16"), True),
    (replace(CONFORMER, padding=30, padding_right=0), True),  # causal
    (replace(CONFORMER, dtype="fp32"), False),  # no fp32 tensor-core forward
    (replace(CONFORMER, layout="blc"), False),
    (replace(CONFORMER, activation="silu", padding=30, padding_right=0), False),
    (replace(CONFORMER, kernel_size=7, padding=3), False),  # short filters: the fused and lane families'
    (replace(CONFORMER, kernel_size=9, padding=4, padding_right=4), False),  # the lane backward's, as generic kernels
    (replace(CONFORMER, kernel_size=10, padding=5, padding_right=4), True),  # from MIN_TAPS: a measurement decides
    (replace(CONFORMER, kernel_size=15, padding=7, padding_right=7, dtype="bf16"), True),
    (replace(CONFORMER, padding=31, padding_right=31), False),  # grad_x's padding would be negative
    (replace(CONFORMER, stride=2), False),
])
def test_serves_long_16bit_filters_over_bcl_only(p, serves):
    assert (("dw1d_bwdtc" in [f.name for f in families_of(p, "bwd")]) is serves)
    assert bool(split_variants(p)) is serves


def test_names_round_trip_and_the_grad_x_design_is_a_forward_of_the_mirrored_problem():
    vs = split_variants(CONFORMER)
    assert len(vs) > 50
    for v in vs:
        assert variant_from_name(v.name, CONFORMER, "bwd") == v
        q = bwdtc.mirrored(CONFORMER)
        assert (q.length, q.out_length, q.padding, q.padding_right) == (1024, 1024, 15, 15)
        assert not [r.__name__ for r in tc.RESTRICTIONS if not r(q, v.config.gx)]
    causal = bwdtc.mirrored(replace(CONFORMER, padding=30, padding_right=0))
    assert (causal.padding, causal.padding_right, causal.out_length) == (0, 30, 1024)
    with pytest.raises(ValueError):
        variant_from_name(vs[0].name + "_x", CONFORMER, "bwd")


def test_edge_problems_keep_within_what_the_launch_serves():
    """Edges break the tuning's length rules on purpose, never the launch's own (paddings within the halo)."""
    for p in (CONFORMER, replace(CONFORMER, padding=30, padding_right=0)):
        for v in split_variants(p)[:40]:
            assert v.tiling.tile_length <= 1024 and v.tiling.smem_bytes <= bwdtc.STATIC_SMEM_BYTES
            edges = v.edge_problems()
            assert len(edges) >= 6
            for q in edges:
                assert bwdtc.padding_within_halo(q, v.config) and bwdtc.applies(q), (v.name, q.key)


def test_the_render_launches_the_tensor_core_forward_on_grad_out_with_the_taps_reversed():
    v = split_variants(CONFORMER)[0]
    src = render.render_variant(v)
    assert f"extern \"C\" int dwgen_launch_{v.name}_gx(const void* x, const void* w" in src
    assert f"extern \"C\" int dwgen_launch_{v.name}(const void* gy, const void* x" in src
    assert f"dwgen_launch_{v.name}_gx(gy, wr, nullptr, gx, B, C, Lout, L, H - P, 0, stream)" in src
    assert f"extern \"C\" long long dwgen_workspace_{v.name}(" in src
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in src
    assert "wr[i] = w[i - k + K - 1 - k]" in src


def test_the_weight_gradient_runs_beside_grad_x_on_a_second_stream_joined_back():
    """The weight gradient neither reads the taps nor waits for grad_x: it is launched on the side stream
    between a fork and a join recorded on the caller's, and grad_x's taps come from their own small kernel."""
    v = split_variants(CONFORMER)[0]
    src = render.render_variant(v)
    launch = src[src.index(f"extern \"C\" int dwgen_launch_{v.name}("):]
    order = ["side_serves(side->stream, s)", "cudaEventRecord(side->fork, s)",
             "cudaStreamWaitEvent(side->stream, side->fork, 0)",
             "launch_wgrad(gy, x, gw, gb, work, B, C, L, Lout, P, ws)", "launch_reverse(w, work, B, C, Lout, s)",
             "_gx(gy, wr, nullptr, gx", "cudaEventRecord(side->join, ws)", "cudaStreamWaitEvent(s, side->join, 0)"]
    at = [launch.index(a) for a in order]
    assert at == sorted(at)
    assert "cudaThreadExchangeStreamCaptureMode" in src  # a first call under graph capture may create the stream
    # a side stream another capture holds (it stays in a capture until that ends) is left alone
    assert "return ss == cudaStreamCaptureStatusActive && cs == cudaStreamCaptureStatusActive && sid == cid;" in src
    assert "cudaStreamSynchronize(ws)" in src  # a failed join waits before the caller frees what the side reads
    assert not re.search(r"_wgrad\(\s*const [^)]*\bw\b", src)  # the weight-gradient kernel takes no taps


def test_each_weight_gradient_design_renders_its_own_kernel():
    """fma designs get the CUDA-core kernel, mma designs the tensor-core one (a bool rendered
    as a "false" string once gave every design the mma kernel)."""
    for v in [v for v in split_variants(CONFORMER) if v.config.span == 4 and v.config.nt == 2][:12]:
        src = render.render_variant(v)
        mma = v.config.wgrad == "mma"
        assert ("mma16816(ones, a, ONES, ONES)" in src) is mma, v.name
        assert ("__shared__ float sm[SMEM_FLOATS]" in src) is not mma, v.name


def test_a_hostile_value_in_the_grad_x_context_is_refused():
    v = split_variants(CONFORMER)[0]
    ctx = bwdtc.render_context(CONFORMER, v.config)
    ctx["gx"]["mma_type"] = "f16; system(1)"
    with pytest.raises(render.RenderError):
        render.render_family(bwdtc.TEMPLATE, ctx, "fp16", v.name, v.digest, "bwd")


# The weight-gradient kernel alone on the CPU: the partial rendered by itself, its launch_wgrad called.
WGRAD_MAIN = MAIN_OPEN + r"""
    void* x = slurp(in, B * C * L * e);
    void* gy = slurp(in, B * C * Lout * e);
    void* w = slurp(in, C * K * e);
    std::fclose(in);
    void* gw = std::aligned_alloc(64, static_cast<size_t>((C * K * e + 63) / 64 * 64));
    void* gb = std::aligned_alloc(64, static_cast<size_t>((C * e + 63) / 64 * 64 + 64));
    using namespace CAT(NAME, _ns);
    const long long ws = workspace_floats(B, C, Lout);
    float* work = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((ws * 4 + 63) / 64 * 64 + 64)));
    const int rv = launch_reverse(w, work, B, C, Lout, nullptr);
    if (rv != 0) return 10 + rv;
    const int rc = launch_wgrad(gy, x, gw, gb, work, B, C, L, Lout, P, nullptr);
    if (rc != 0) return 10 + rc;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(gw, 1, static_cast<size_t>(C * K * e), out);
    std::fwrite(gb, 1, static_cast<size_t>(C * e), out);
    std::fwrite(work + taps_offset(B, C, Lout), 1, static_cast<size_t>(C * K * e), out);
    std::fclose(out);
    return 0;
}
"""


# Both weight-gradient kernels with the sums and launches they share, as the variant's source includes them.
WGRAD_ON_CPU = ('{% if wgrad_mma %}{% include "_bwd_wgrad_mma.cu.j2" %}{% else %}{% include "_bwd_wgrad.cu.j2" %}'
                '{% endif %}{% include "_bwd_wgrad_sum.cu.j2" %}')


def wgrad_binary(v: Variant, tmp, monkeypatch):
    """The weight-gradient kernel of v (fma or mma, the latter's PTX primitives emulated), with its sums and
    launches, its launches made emulator calls, built with g++."""
    import jinja2

    loader = jinja2.ChoiceLoader([jinja2.DictLoader({"_warp_mma.cu.j2": WARP_MMA_ON_CPU, "wgrad_on_cpu": WGRAD_ON_CPU}),
                                  render._ENV.loader])
    monkeypatch.setattr(render, "_ENV", render._ENV.overlay(loader=loader))
    src = render.render_family("wgrad_on_cpu", bwdtc.render_context(v.problem, v.config), v.problem.dtype, v.name,
                               v.digest, "bwd")
    src = re.sub(r"(\w+)<<<", r"emu::launch(\1, ", src).replace(">>>(", ", ")
    storage = "__half" if v.problem.dtype == "fp16" else "__nv_bfloat16"
    main = WGRAD_MAIN.replace("{{ storage }}", storage)
    text = '#include "cuda_on_cpu.h"\n#include <cstring>\n' + src + PRELUDE + main
    path, exe = tmp / f"{v.name}.cpp", tmp / v.name
    path.write_text(text)
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-pthread", "-w", f"-I{HERE}",
                           f"-DNAME={v.name}", "-o", str(exe), str(path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


# Problems (long filters on short rows so that the CPU stays quick) and designs: one tile a row, rows of
# several tiles and a short last tile, a walk that crosses rows and ends short, dilation, bf16, causal.
CASES = [
    (Problem(3, 2, 520, 31, 1, 15, 1, "fp16", bias=True), bwdtc.Config(threads=64, run=8, span=1, warps=2, nt=1,
                                                                        tile=512)),
    (Problem(2, 3, 700, 17, 1, 8, 1, "fp16"), bwdtc.Config(threads=64, run=8, span=4, warps=2, nt=1, tile=512)),
    (Problem(3, 2, 1100, 16, 1, 15, 1, "bf16", padding_right=0, bias=True),
     bwdtc.Config(threads=64, run=16, span=2, warps=2, nt=1, tile=512)),
    (Problem(2, 2, 900, 16, 1, 10, 2, "bf16"), bwdtc.Config(threads=64, run=8, span=2, warps=2, nt=1, tile=512)),
]


# the tensor-core kernel: Conformer's K31 on a row of one tile and the walk on into the next rows, rows that
# are not whole vectors (each row's x and grad_out start elsewhere in a vector: the product's diagonals move),
# dilation, bf16 with a causal padding
CASES += [
    (Problem(3, 2, 520, 31, 1, 15, 1, "fp16", bias=True),
     bwdtc.Config(threads=64, run=8, span=4, wgrad="mma", warps=2, nt=1, tile=512)),
    (Problem(3, 2, 1027, 31, 1, 15, 1, "fp16"), bwdtc.Config(threads=64, run=8, span=2, wgrad="mma", warps=2, nt=1,
                                                             tile=512)),
    (Problem(2, 3, 900, 16, 1, 10, 2, "bf16"), bwdtc.Config(threads=64, run=8, span=1, wgrad="mma", warps=2, nt=1,
                                                            tile=512)),
    (Problem(3, 2, 1100, 16, 1, 15, 1, "bf16", padding_right=0, bias=True),
     bwdtc.Config(threads=64, run=16, span=2, wgrad="mma", warps=2, nt=1, tile=512)),
]
# the fast generic backward's reach from MIN_TAPS (two and three 16-wide chunks of the product): K10 with
# even-filter padding and on rows that are not whole vectors, K15 in bf16 with bias, causal K12
CASES += [
    (Problem(2, 3, 700, 10, 1, 5, 1, "fp16", padding_right=4),
     bwdtc.Config(threads=64, run=8, span=2, wgrad="mma", warps=2, nt=1, tile=512)),
    (Problem(3, 2, 1027, 10, 1, 4, 1, "fp16"), bwdtc.Config(threads=64, run=8, span=4, wgrad="mma", warps=2, nt=1,
                                                             tile=512)),
    (Problem(2, 2, 2100, 15, 1, 7, 1, "bf16", bias=True),
     bwdtc.Config(threads=64, run=16, span=1, wgrad="mma", warps=2, nt=2, tile=1024)),
    (Problem(2, 3, 1300, 12, 1, 11, 1, "fp16", padding_right=0),
     bwdtc.Config(threads=128, run=8, span=1, wgrad="mma", warps=2, nt=1, tile=512)),
]


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("p,c", CASES, ids=[Variant(p, c, "bwd").name for p, c in CASES])
def test_weight_gradient_matches_float64_on_cpu(tmp_path, monkeypatch, p, c):
    import torch

    v = Variant(p, c, "bwd")
    assert not violations(p, c, "bwd"), violations(p, c, "bwd")
    exe = wgrad_binary(v, tmp_path, monkeypatch)
    for q in [p] + [q for q in v.edge_problems() if q.length <= 2000][:6]:
        x, w, b = make_inputs(q, 1, "cpu")
        gy = grad_output(q, 1, "cpu")
        inp, out = tmp_path / f"{q.key}.in", tmp_path / f"{q.key}.out"
        inp.write_bytes(raw(x) + raw(gy) + raw(w))
        args = [exe, inp, out, q.batch, q.channels, q.length, q.out_length, q.padding, 0, 0, q.kernel_size]
        proc = run_both_schedules(args, out)
        assert proc.returncode == 0, f"{q.key}: exit {proc.returncode} {proc.stderr[-2000:]}"
        data = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.uint8)
        n_w = w.numel() * w.element_size()
        gw = data[:n_w].view(x.dtype).view(w.shape)
        gb = data[n_w:n_w + 2 * q.channels].view(x.dtype)
        wr = data[n_w + 2 * q.channels:].view(x.dtype).view(w.shape)
        (_, ref_w, ref_b), (_, scale_w, scale_b) = reference(q, x, w, b, gy, 0)
        for what, got, ref, scale in (("grad_weight", gw, ref_w, scale_w), ("grad_bias", gb, ref_b, scale_b)):
            outcome = compare(q, got, ref, scale)
            assert outcome.ok, f"{v.name} on {q.key}: {what}: {outcome.message}"
        assert torch.equal(wr, w.flip(-1)), f"{v.name} on {q.key}: the reversed taps"


def test_the_checks_run_the_split_backward_without_silu_and_the_fused_one_with_both():
    """The split launch refuses a SiLU, so the worker's checks must not ask one of it (they did: every split
    variant of the first GPU tune failed its check with cudaErrorInvalidValue); the fused family still gets both."""
    from tests.backward_checks import asked

    for family, served in (("dw1d_bwdtc", {"none"}), ("dw1d_bwd", {"none", "silu"})):
        v = next(v for v in enumerate_space(CONFORMER, "bwd") if v.family.name == family)
        seen = [q.activation for q in asked(v, CONFORMER)]
        assert len(seen) > 3 and set(seen) == served, (family, seen)
