"""The fused backward's own source, run on the CPU (tests/cuda_on_cpu.h: a block's threads as fibers)
through its launch function and checked against float64: the kernel's index and staging logic, for
machines without a GPU. It says nothing of speed or of the device's memory model."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from dwgen.check import backward_reference, compare, grad_output, make_inputs
from dwgen.families import bwdlane, bwdwalk
from dwgen.families.bwd import Config
from dwgen.problem import ACTIVATIONS, Problem
from dwgen.space import Variant, violations
from tests.cuda_on_cpu import MAIN_OPEN, build, raw, run_both_schedules, shipped_generic

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

MAIN = MAIN_OPEN + r"""
    void* x = slurp(in, B * C * L * e);
    void* gy = slurp(in, B * C * Lout * e);
    void* w = slurp(in, C * K * e);
    void* b = bias ? slurp(in, C * e) : nullptr;
    std::fclose(in);
    void* gx = std::aligned_alloc(64, static_cast<size_t>((B * C * L * e + 63) / 64 * 64));
    void* gw = std::aligned_alloc(64, static_cast<size_t>((C * K * e + 63) / 64 * 64));
    void* gb = std::aligned_alloc(64, static_cast<size_t>((C * e + 63) / 64 * 64 + 64));
    const long long ws = CAT(dwgen_workspace_, NAME)(B, C, L, Lout, P);
    float* work = static_cast<float*>(std::aligned_alloc(64, static_cast<size_t>((ws * 4 + 63) / 64 * 64 + 64)));
    const int rc = CAT(dwgen_launch_, NAME)(gy, x, w, b, gx, gw, gb, work, B, C, L, Lout, P, act, nullptr);
    if (rc != 0) return 10 + rc;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(gx, 1, static_cast<size_t>(B * C * L * e), out);
    std::fwrite(gw, 1, static_cast<size_t>(C * K * e), out);
    std::fwrite(gb, 1, static_cast<size_t>(C * e), out);
    std::fclose(out);
    return 0;
}
"""



def reference(p: Problem, x, w, b, gy, act: int):
    """float64 gradients and their error scales as dwgen.check.backward_reference gives them, in numpy
    (torch's float64 depthwise convolution takes about a second a call on this CPU)."""
    import numpy as np
    import torch

    xd, wd, gyd = x.double().numpy(), w.double().numpy()[:, 0, :], gy.double().numpy()
    bd = b.double().numpy() if b is not None else np.zeros(p.channels)
    n, k, d, pad, lout = p.length, p.kernel_size, p.dilation, p.padding, p.out_length
    width = pad + n + p.padding_right + k * d  # x padded on both sides, and room for every tap's slice
    xp = np.zeros((p.batch, p.channels, width))
    xp[:, :, pad:pad + n] = xd
    taps = np.stack([xp[:, :, j * d:j * d + lout] for j in range(k)], axis=-1)  # x under tap j of output o
    z = (taps * wd[None, :, None, :]).sum(-1) + bd[None, :, None]
    za = (np.abs(taps) * np.abs(wd)[None, :, None, :]).sum(-1) + np.abs(bd)[None, :, None] * (b is not None)
    if act == 1:
        s = 1 / (1 + np.exp(-z))
        g = gyd * s * (1 + z * (1 - s))
        gs = np.abs(g) + 0.5 * np.abs(gyd) * za
    else:
        g, gs = gyd, np.abs(gyd)

    def grads(g, xs, ws):
        gx = np.zeros((p.batch, p.channels, width))
        for j in range(k):
            gx[:, :, j * d:j * d + lout] += g * ws[None, :, None, j]
        gw = np.stack([(g * xs[..., j]).sum((0, 2)) for j in range(k)], axis=-1)
        return gx[:, :, pad:pad + n], gw[:, None, :], g.sum((0, 2))
    gx, gw, gb = grads(g, taps, wd)
    sx, sw, sb = grads(gs, np.abs(taps), np.abs(wd))
    t = [torch.from_numpy(np.ascontiguousarray(a)) for a in (gx, gw, gb, sx, sw, sb)]
    return tuple(t[:3]), tuple(t[3:])


def run_on_cpu(exe: Path, p: Problem, act: int, seed: int, tmp: Path):
    """Gradients the kernel computes for the check's inputs of seed, and the outcome of the float64 check."""
    import torch

    x, w, b = make_inputs(p, seed, "cpu")
    gy = grad_output(p, seed, "cpu")
    mem = (lambda t: t.transpose(1, 2)) if p.layout == "blc" else (lambda t: t)
    blob = raw(mem(x)) + raw(mem(gy)) + raw(w) + (raw(b) if b is not None else b"")
    inp, out = tmp / f"{exe.name}.{p.key}.{act}.in", tmp / f"{exe.name}.{p.key}.{act}.out"
    inp.write_bytes(blob)
    args = [exe, inp, out, p.batch, p.channels, p.length, p.out_length, p.padding, act, int(b is not None),
            p.kernel_size]
    proc = run_both_schedules(args, out)
    assert proc.returncode == 0, f"{p.key}: exit {proc.returncode} {proc.stderr[-2000:]}"
    data = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.uint8)
    dt = x.dtype
    n_x, n_w = x.numel() * x.element_size(), w.numel() * w.element_size()
    got = (mem(data[:n_x].view(dt).view(mem(x).shape)), data[n_x:n_x + n_w].view(dt).view(w.shape),
           data[n_x + n_w:].view(dt))
    refs, scales = reference(p, x, w, b, gy, act)
    for what, g, ref, scale in zip(("grad_x", "grad_weight", "grad_bias"), got, refs, scales, strict=True):
        outcome = compare(p, g, ref, scale)
        if not outcome.ok:
            return replace(outcome, message=f"seed {seed} act {act}: {what}: {outcome.message}")
    return outcome


def test_the_numpy_reference_is_the_checks():
    import torch

    for p, act in ((Problem(2, 3, 50, 4, 1, 3, 2, "bf16", bias=True), 1), (Problem(1, 2, 40, 3, 1, 0), 0)):
        x, w, b = make_inputs(p, 0, "cpu")
        gy = grad_output(p, 0, "cpu")
        q = replace(p, activation="silu" if act else "none")
        for got, want in zip(sum(reference(p, x, w, b, gy, act), ()), sum(backward_reference(q, x, w, b, gy), ()),
                             strict=True):
            assert torch.allclose(got, want.reshape(got.shape), rtol=1e-12, atol=1e-12)


# (problem, config): the tuned target designs in each stage, the run widths a raw stage loads in 16, 8 and 4
# bytes, dilation, fp16's conversions, (B, L, C), and K from 1 to 31; the problems' edges come from each
# variant's own edge list (lengths past a tile, paddings past the halo, rows that are not whole vectors).
CASES = [
    (Problem(2, 3, 2051, 3, 1, 1, 1, "bf16"), Config(threads=128, outs=16, stage="raw")),
    (Problem(2, 3, 2051, 3, 1, 1, 1, "bf16"), Config(threads=128, outs=16, stage="rawp")),
    (Problem(2, 3, 2051, 3, 1, 1, 1, "bf16"), Config(threads=128, outs=16)),
    (Problem(2, 3, 2051, 3, 1, 1, 1, "fp32"), Config(threads=128, outs=16, stage="raw")),
    (Problem(2, 3, 2051, 3, 1, 1, 1, "fp32"), Config(threads=128, outs=16)),
    (Problem(2, 3, 999, 4, 1, 3, 2, "fp16"), Config(threads=128, outs=4, stage="raw")),
    (Problem(2, 3, 999, 5, 1, 2, 1, "bf16"), Config(threads=128, outs=2, stage="raw")),
    (Problem(2, 3, 999, 4, 1, 3, 1, "fp16"), Config(threads=128, outs=4, stage="rawp")),
    (Problem(2, 3, 999, 5, 1, 2, 1, "bf16"), Config(threads=128, outs=2, stage="rawp")),
    (Problem(2, 3, 999, 3, 1, 1, 1, "fp32"), Config(threads=128, outs=2, stage="raw")),
    (Problem(1, 2, 4000, 7, 1, 3, 1, "fp16"), Config(threads=256, outs=8, stage="raw")),
    (Problem(1, 2, 4000, 3, 1, 2, 1, "fp16"), Config(threads=128, outs=16, stage="raw")),
    (Problem(2, 32, 999, 4, 1, 3, 1, "bf16", layout="blc"), Config(threads=256, outs=8, tc=32)),
    # (B, L, C): Mamba's causal design (SiLU in registers, the whole-window fetch and whole-run stores), the
    # last tile's grad_out tail through SiLU (L a multiple of the tile), 64 and 16 channels a block, fp32;
    # channel tiles past C (the per-vector fetch) come from the edge problems
    (Problem(2, 64, 999, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0), Config(threads=256, outs=16, tc=32)),
    # the last tile's tail in fp32: its 3 terms of 1027 would hide under bf16's tolerance
    (Problem(1, 32, 1024, 4, 1, 3, 1, "fp32", layout="blc"), Config(threads=256, outs=16, tc=32)),
    (Problem(1, 128, 999, 4, 1, 3, 1, "fp16", layout="blc", padding_right=0), Config(threads=256, outs=16, tc=64)),
    (Problem(2, 16, 999, 3, 1, 1, 2, "bf16", layout="blc"), Config(threads=128, outs=8, tc=16)),
    (Problem(2, 32, 999, 4, 1, 3, 1, "fp32", layout="blc", padding_right=0), Config(threads=256, outs=16, tc=32)),
    # the weight sums' reduce-scatter over 2 and over 32 sums (K1, K31)
    (Problem(2, 3, 600, 1, 1, 0, 1, "bf16"), Config(threads=128, outs=4, stage="raw")),
    (Problem(1, 2, 1500, 31, 1, 15, 1, "fp16"), Config(threads=128, outs=8, stage="raw")),
    (Problem(1, 2, 1500, 31, 1, 15, 1, "fp32"), Config(threads=128, outs=8)),
    (Problem(1, 2, 1500, 9, 1, 4, 1, "fp32"), Config(threads=128, outs=8)),
    (Problem(1, 2, 1500, 15, 1, 7, 1, "bf16"), Config(threads=128, outs=8, stage="raw")),
    # blocks walking several tiles of a row (the last block's share short, the last tile's tail inside it)
    (Problem(2, 3, 2051, 3, 1, 1, 1, "bf16"), Config(threads=128, outs=8, stage="raw", tiles=4)),
    (Problem(2, 3, 999, 4, 1, 3, 1, "bf16", padding_right=0), Config(threads=128, outs=4, stage="rawp", tiles=2)),
    (Problem(2, 3, 2051, 3, 1, 1, 1, "fp32"), Config(threads=128, outs=8, tiles=2)),
    (Problem(2, 32, 999, 4, 1, 3, 1, "bf16", layout="blc"), Config(threads=256, outs=8, tc=32, tiles=2)),
    # walks that go on into the next batch row: rows of one tile (as Mamba's 2048 with o16), rows of two
    # tiles with a walk of 4 (a block's share straddles rows), and the last block short
    (Problem(3, 3, 1024, 4, 1, 3, 1, "bf16", padding_right=0),
     Config(threads=128, outs=8, stage="rawp", tiles=4, walk="across")),
    (Problem(3, 3, 1500, 3, 1, 1, 1, "bf16"), Config(threads=128, outs=8, stage="raw", tiles=4, walk="across")),
    (Problem(5, 2, 512, 3, 1, 1, 1, "fp32"), Config(threads=128, outs=4, tiles=8, walk="across")),
    # (B, L, C) staged by cp.async: Mamba's causal SiLU design walking rows (tiles past the ring of two,
    # the last block short), a walk inside a row with the last tile's tail, fp32, and no walk
    (Problem(3, 64, 32, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0),
     Config(threads=128, outs=16, tc=64, stage="async", tiles=4, walk="across")),
    (Problem(2, 32, 999, 4, 1, 3, 1, "bf16", layout="blc"), Config(threads=256, outs=8, tc=32, stage="async", tiles=2)),
    (Problem(1, 32, 1024, 4, 1, 3, 1, "fp32", layout="blc"),
     Config(threads=128, outs=8, tc=32, stage="async", tiles=4)),
    (Problem(2, 16, 999, 3, 1, 1, 2, "fp16", layout="blc"), Config(threads=128, outs=8, tc=16, stage="async",
                                                                    tiles=4)),
    # the lane family (causal, rows of whole vectors): Mamba's row as one chunk, rows walked in chunks from
    # their ends (fp32, dilation 2), two batch rows a block, each fetching the next step's runs ahead (across
    # chunks and rows), a halo of one word and of 7 elements, K1 (none)
    (Problem(3, 3, 2048, 4, 1, 3, 1, "bf16", padding_right=0), bwdlane.Config(threads=128, outs=16)),
    (Problem(2, 3, 1000, 3, 1, 4, 2, "fp32", padding_right=0), bwdlane.Config(threads=64, outs=8, rows=2)),
    (Problem(2, 3, 1000, 3, 1, 4, 2, "fp32", padding_right=0), bwdlane.Config(threads=64, outs=8, rows=2, ahead=True)),
    (Problem(3, 3, 2048, 4, 1, 3, 1, "bf16", padding_right=0), bwdlane.Config(threads=64, outs=8, rows=4, ahead=True)),
    (Problem(3, 2, 1056, 4, 1, 3, 1, "fp16", padding_right=0), bwdlane.Config(threads=64, outs=32, rows=4)),
    (Problem(2, 2, 1040, 3, 1, 2, 1, "bf16", padding_right=0), bwdlane.Config(threads=64, outs=8, rows=2)),
    (Problem(2, 2, 776, 8, 1, 7, 1, "bf16", padding_right=0), bwdlane.Config(threads=128, outs=8)),
    (Problem(2, 2, 512, 1, 1, 0, 1, "fp32", padding_right=0), bwdlane.Config(threads=64, outs=8)),
    # two runs a thread a block's width apart: Mamba's row as one chunk, chunks walked with the carry between
    # them (and fetched ahead), fp32 dilated over two rows a block
    (Problem(3, 3, 2048, 4, 1, 3, 1, "bf16", padding_right=0), bwdlane.Config(threads=128, outs=8, halves=2)),
    (Problem(2, 3, 1000, 4, 1, 3, 1, "fp16", padding_right=0),
     bwdlane.Config(threads=64, outs=8, rows=2, ahead=True, halves=2)),
    (Problem(3, 2, 1000, 3, 1, 4, 2, "fp32", padding_right=0), bwdlane.Config(threads=64, outs=8, rows=2, halves=2)),
    # the lane family centred (P = H // 2, the rest on the right, no activation): K3 P1 in bf16 over two rows a
    # block, K7 P3 with two runs a thread, fp32 dilated (H 4, P 2), an even filter (K4: 1 left, 2 right), fp16 K9
    # P4 (halos of 4 elements both ways, the run's whole width of 8), each walked in chunks
    (Problem(2, 3, 2048, 3, 1, 1, 1, "bf16"), bwdlane.Config(threads=64, outs=8, rows=2)),
    (Problem(3, 2, 1040, 7, 1, 3, 1, "bf16"), bwdlane.Config(threads=64, outs=8, rows=2, halves=2)),
    (Problem(2, 3, 1000, 3, 1, 2, 2, "fp32"), bwdlane.Config(threads=64, outs=8, ahead=True)),
    (Problem(2, 2, 1000, 4, 1, 1, 1, "fp32", padding_right=2), bwdlane.Config(threads=64, outs=8)),
    (Problem(2, 2, 1056, 9, 1, 4, 1, "fp16"), bwdlane.Config(threads=64, outs=8, rows=2)),
    # the walking family over (B, L, C) (causal): Mamba's design, 4- 8- and 16-byte vectors, fp32 dilated,
    # rows of several blocks and walks cut short by the row's end; channel tiles past C come from the edges
    (Problem(2, 64, 300, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=2, seg=32, unroll=8)),
    (Problem(2, 64, 300, 4, 1, 3, 1, "fp16", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=4, seg=32, unroll=4)),
    (Problem(1, 40, 500, 3, 1, 4, 2, "fp32", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=2, seg=64, unroll=8)),
    (Problem(2, 72, 200, 2, 1, 1, 1, "bf16", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=8, seg=32, unroll=4)),
    # the walk with right padding (Lout > L): symmetric K4 P3 over bf16 rows (ring and registers), fp32 K3 D2
    # P4 symmetric, and right padding past the halo (grad_out positions whose products are only grad_bias's)
    (Problem(2, 64, 300, 4, 1, 3, 1, "bf16", layout="blc"),
     bwdwalk.Config(threads=128, ct=16, vec=4, seg=32, unroll=4, stages=3)),
    (Problem(2, 64, 300, 4, 1, 3, 1, "bf16", layout="blc"),
     bwdwalk.Config(threads=128, ct=16, vec=2, seg=32, unroll=8)),
    (Problem(1, 40, 500, 3, 1, 4, 2, "fp32", layout="blc"),
     bwdwalk.Config(threads=128, ct=16, vec=2, seg=64, unroll=8)),
    (Problem(2, 64, 300, 4, 1, 3, 1, "bf16", layout="blc", padding_right=9),
     bwdwalk.Config(threads=128, ct=16, vec=4, seg=32, unroll=4)),
    # the walk's loads through a cp.async ring of 3 and 6 batches (walks shorter than the ring, the row's end)
    (Problem(2, 64, 300, 4, 1, 3, 1, "bf16", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=4, seg=32, unroll=4, stages=6)),
    (Problem(1, 40, 500, 3, 1, 4, 2, "fp32", layout="blc", padding_right=0),
     bwdwalk.Config(threads=128, ct=16, vec=2, seg=64, unroll=8, stages=3)),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bwd_cpu")
    vs = [Variant(p, c, "bwd") for p, c in CASES]
    with ThreadPoolExecutor(max_workers=4) as pool:
        return {v.name: exe for v, exe in zip(vs, pool.map(lambda v: build(v, tmp, MAIN), vs), strict=True)}, tmp


@pytest.mark.parametrize("p,c", CASES, ids=[Variant(p, c, "bwd").name for p, c in CASES])
def test_matches_float64_on_cpu(binaries, p, c):
    exes, tmp = binaries
    v = Variant(p, c, "bwd")
    assert not violations(p, c, "bwd")
    problems = [p, replace(p, bias=True)] + [q for q in v.edge_problems() if q.length <= 5000]
    for q in problems:
        for act in (ACTIVATIONS.index(a) for a in v.family.activations(q)):
            outcome = run_on_cpu(exes[v.name], q, act, seed=q.length % 7, tmp=tmp)
            assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"



# The fast generic backward kernels' design for K 10 to 16 (the family's default, generated/manifest.json), built as
# the freeze builds it (on the signature's stand-in problem) and run on paddings past the halo, both layouts: the
# dispatcher sends any padding at stride and dilation 1 to it; the gate checks the same through the op on the GPU.
PAST_THE_HALO = [
    (Problem(2, 3, 777, 12, 1, 14, 1, "fp32", padding_right=13, bias=True), Config(threads=256, outs=8)),
    (Problem(1, 2, 1300, 15, 1, 16, 1, "fp16", padding_right=20), Config(threads=256, outs=8)),
    (Problem(2, 64, 301, 10, 1, 12, 1, "bf16", layout="blc", padding_right=11), Config(threads=256, outs=8, tc=64)),
]


@pytest.mark.parametrize("p,c", PAST_THE_HALO, ids=[p.key for p, _ in PAST_THE_HALO])
def test_paddings_past_the_halo_match_float64_on_cpu(p, c, tmp_path):
    v = shipped_generic(p, c, "bwd")
    exe = build(v, tmp_path, MAIN)
    assert min(p.padding, p.padding_right) > p.kernel_size - 1 and p.out_length > p.length
    for act in (ACTIVATIONS.index(a) for a in v.family.activations(p)):
        outcome = run_on_cpu(exe, p, act, seed=3, tmp=tmp_path)
        assert outcome.ok, f"{v.name} on {p.key}: {outcome.message}"

# search.generic's backward candidates that take every problem of their signature (the fused family's raw, rawp,
# register-capped, row-walking and, over (B, L, C), cp.async designs), every one at a short and a long K, each
# built as the freeze builds a fast generic kernel and run where the dispatcher may send one: paddings past the
# halo on both sides, and causal, at lengths that leave a partial last tile. (The lane and split backwards'
# candidates serve some calls only: tests/test_causal_families.py and tests/test_bwdtc.py run them.)
def _generic_backward_candidates() -> list[tuple]:
    from search.generic import candidate_variants

    return [(k, dtype, layout, v.config) for layout in ("bcl", "blc") for dtype in ("fp32", "bf16")
            for k in (4, 13) for v in candidate_variants(k, dtype, layout, "bwd")
            if v.family.generic_scope == "any"]


GENERIC_CANDIDATES = _generic_backward_candidates()


@pytest.mark.parametrize("k,dtype,layout,c", GENERIC_CANDIDATES,
                         ids=[Variant(shipped_generic(Problem(1, 8, 64, k, 1, 0, 1, d, layout=lay), c, "bwd").problem,
                                      c, "bwd").name for k, d, lay, c in GENERIC_CANDIDATES])
def test_generic_backward_candidates_take_any_padding_on_cpu(k, dtype, layout, c, tmp_path):
    channels = 64 if layout == "blc" else 3
    past = Problem(2, channels, 2333, k, 1, k + 1, 1, dtype, layout=layout, padding_right=k + 2, bias=True)
    causal = Problem(1, channels, 1700, k, 1, k - 1, 1, dtype, layout=layout, padding_right=0)
    v = shipped_generic(past, c, "bwd")
    exe = build(v, tmp_path, MAIN)
    for q in (past, causal):
        for act in (ACTIVATIONS.index(a) for a in v.family.activations(q)):
            outcome = run_on_cpu(exe, q, act, seed=5, tmp=tmp_path)
            assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"


# search.generic's lane backward candidates, built as the freeze builds a narrow fast generic kernel (on its scope's
# stand-in: sizes and padding are run-time) and run where the dispatcher may send one: causal calls, plain and
# with SiLU, and centred ones, on batches that are not whole walks and rows of whole vectors from one vector to
# past a chunk.
def _generic_lane_candidates() -> list[tuple]:
    from search.generic import candidate_variants

    return [(k, dtype, v.config) for dtype in ("fp32", "bf16") for k in (4, 9)
            for v in candidate_variants(k, dtype, "bcl", "bwd") if v.family.name == "dw1d_bwdlane"]


GENERIC_LANE = _generic_lane_candidates()


@pytest.mark.parametrize("k,dtype,c", GENERIC_LANE, ids=[f"{d}_k{k}_{'_'.join(bwdlane.name_tokens(c))}"
                                                         for k, d, c in GENERIC_LANE])
def test_generic_lane_candidates_take_any_causal_or_centred_call_on_cpu(k, dtype, c, tmp_path):
    from dwgen.space import generic_problem, scope_admits, scope_stand_in

    v = Variant(scope_stand_in(generic_problem(k, dtype), "causal_or_centred"), c, "bwd")
    exe = build(v, tmp_path, MAIN)
    vec, h = 16 // v.problem.elem_bytes, k - 1
    for b, ch, length in ((1, 3, vec), (3, 2, 37 * vec), (5, 2, 300 * vec)):
        for left, right in ((h, 0), (h // 2, h - h // 2)):
            q = Problem(b, ch, length, k, 1, left, 1, dtype, padding_right=right, bias=b % 2 == 1)
            assert scope_admits("causal_or_centred", q)
            for act in (ACTIVATIONS.index(a) for a in v.family.activations(q)):
                outcome = run_on_cpu(exe, q, act, seed=length % 7, tmp=tmp_path)
                assert outcome.ok, f"{v.name} on {q.key} (activation {act}): {outcome.message}"


# x = 1 but an Inf at each row's first or last position, grad_out = 1, w = 1, K4, fp32: weight gradient tap k
# sums x over positions o - P + k for o in [0, Lout), so the taps whose range misses the Inf must stay finite
# (grad_out's zeros outside the row meet the Inf in the kernels' windows, and 0 x Inf is NaN).
INF_MAIN = r"""
#include <cmath>
int main(int argc, char** argv) {
    const long long B = 1, C = std::atoll(argv[1]), L = std::atoll(argv[2]), K = 4, P = std::atoll(argv[4]);
    const long long Lout = L + P + std::atoll(argv[5]) - (K - 1);
    const bool blc = std::atoi(argv[3]) != 0, at_end = std::atoi(argv[6]) != 0;
    const long long n = B * C * (L > Lout ? L : Lout);
    float* x = static_cast<float*>(std::aligned_alloc(64, (4 * n + 63) / 64 * 64 + 64));
    float* gy = static_cast<float*>(std::aligned_alloc(64, (4 * n + 63) / 64 * 64 + 64));
    float* gx = static_cast<float*>(std::aligned_alloc(64, (4 * n + 63) / 64 * 64 + 64));
    float w[64 * 4], gw[64 * 4], gb[64];
    for (long long i = 0; i < n; ++i) x[i] = gy[i] = 1.0f;
    const long long l = at_end ? L - 1 : 0;
    for (long long c = 0; c < C; ++c) {
        x[blc ? l * C + c : c * L + l] = INFINITY;
        for (int k = 0; k < K; ++k) w[c * K + k] = 1.0f;
    }
    const long long ws = CAT(dwgen_workspace_, NAME)(B, C, L, Lout, P);
    float* work = static_cast<float*>(std::aligned_alloc(64, (4 * ws + 63) / 64 * 64 + 64));
    const int rc = CAT(dwgen_launch_, NAME)(gy, x, w, nullptr, gx, gw, gb, work, B, C, L, Lout, P, 0, nullptr);
    if (rc != 0) return 10 + rc;
    for (long long c = 0; c < C; ++c) {
        std::printf("%g %g %g %g\n", gw[c * K], gw[c * K + 1], gw[c * K + 2], gw[c * K + 3]);
    }
    return 0;
}
"""


def weight_grad_with_an_inf(p: Problem, at_end: bool) -> list[float]:
    inf_at = p.length - 1 if at_end else 0
    taps = []
    for k in range(p.kernel_size):
        seen = [i for i in (o - p.padding + k for o in range(p.out_length)) if 0 <= i < p.length]
        taps.append(float("inf") if inf_at in seen else float(len(seen)))
    return taps


CAUSAL4 = Problem(1, 2, 516, 4, 1, 3, 1, "fp32", padding_right=0)
CENTRED4 = Problem(1, 2, 516, 4, 1, 1, 1, "fp32", padding_right=2)


@pytest.mark.parametrize("p,c,at_end", [
    (CAUSAL4, bwdlane.Config(threads=64, outs=8), True),
    (replace(CAUSAL4, length=1032), bwdlane.Config(threads=64, outs=32), True),
    (CENTRED4, bwdlane.Config(threads=64, outs=8), False),
    (CENTRED4, bwdlane.Config(threads=64, outs=8), True),
    (replace(CAUSAL4, channels=32, layout="blc"), bwdwalk.Config(threads=128, ct=16, vec=2, seg=32, unroll=8), True),
    # the fused family: causal at the row's end, symmetric (Lout = L - 1) at its start, a walk of tiles,
    # (B, L, C)
    (CAUSAL4, Config(threads=128, outs=4), True),
    (replace(CAUSAL4, padding_right=1, padding=1), Config(threads=128, outs=4), False),
    (replace(CAUSAL4, length=2051), Config(threads=128, outs=4, tiles=2), True),
    (replace(CAUSAL4, channels=32, layout="blc"), Config(threads=128, outs=8, tc=32), True),
], ids=["lane_o8", "lane_o32", "lane_centred_start", "lane_centred_end", "walk", "fused", "fused_start",
        "fused_tiles", "fused_blc"])
def test_an_inf_near_a_rows_end_leaves_the_taps_that_miss_it_finite(p, c, at_end, tmp_path):
    assert not violations(p, c, "bwd")
    exe = build(Variant(p, c, "bwd"), tmp_path, INF_MAIN)
    args = (p.channels, p.length, int(p.layout == "blc"), p.padding, p.padding_right, int(at_end))
    out = run_both_schedules([exe, *args], None)
    assert out.returncode == 0, out.stderr
    want = weight_grad_with_an_inf(p, at_end)
    assert any(t != float("inf") for t in want) and any(t == float("inf") for t in want)
    for line in out.stdout.split("\n")[:p.channels]:
        assert [float(t) for t in line.split()] == want, line
