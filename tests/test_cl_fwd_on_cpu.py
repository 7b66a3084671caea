"""The (B, L, C) forward's own source (templates/dw1d_cl.cu.j2), run on the CPU through its launch function
(tests/cuda_on_cpu.h: a block's threads as fibers) and checked against float64: the kernel's index, window,
tail and padding logic, for machines without a GPU. It says nothing of speed, and the CPU build takes the
portable SiLU spelling (the device one differs only in ex2's flush of results below 2^-126)."""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dwgen.check import compare, make_inputs, reference
from dwgen.families.blc import Config
from dwgen.problem import Problem
from dwgen.space import Variant, violations
from tests.cuda_on_cpu import MAIN_OPEN, build_all, forward_checks, raw, run_both_schedules, shipped_generic

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

MAIN = MAIN_OPEN + r"""
    void* x = slurp(in, B * C * L * e);
    void* w = slurp(in, C * K * e);
    void* b = bias ? slurp(in, C * e) : nullptr;
    std::fclose(in);
    const long long ny = B * C * Lout * e;
    unsigned char* y = static_cast<unsigned char*>(std::aligned_alloc(64, static_cast<size_t>((ny + 63) / 64 * 64)));
    for (long long i = 0; i < ny; ++i) y[i] = 0xff;  // NaN in every float type: an unwritten output fails
    const int rc = CAT(dwgen_launch_, NAME)(x, w, b, y, B, C, L, Lout, P, act, nullptr);
    if (rc != 0) return 10 + rc;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(y, 1, static_cast<size_t>(ny), out);
    std::fclose(out);
    return 0;
}
"""



def run_on_cpu(exe: Path, p: Problem, seed: int, tmp: Path):
    """The kernel's output for the check's inputs of seed (y as (B, C, Lout), a view of (B, Lout, C) memory),
    and the outcome of the float64 check."""
    import torch

    x, w, b = make_inputs(p, seed, "cpu")  # x is (B, C, L) viewing (B, L, C) memory
    blob = raw(x.transpose(1, 2)) + raw(w) + (raw(b) if b is not None else b"")
    inp, out = tmp / f"{exe.name}.{p.key}.in", tmp / f"{exe.name}.{p.key}.out"
    inp.write_bytes(blob)
    act = int(p.activation == "silu")
    args = [exe, inp, out, p.batch, p.channels, p.length, p.out_length, p.padding, act, int(b is not None),
            p.kernel_size]
    proc = run_both_schedules(args, out)
    assert proc.returncode == 0, f"{p.key}: exit {proc.returncode} {proc.stderr[-2000:]}"
    data = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.uint8).view(x.dtype)
    y = data.view(p.batch, p.out_length, p.channels).transpose(1, 2)
    ref, scale = reference(p, x, w, b)
    return y, compare(p, y, ref, scale)


def blc(b, c, n, k, s, pad, d, dtype, **kw) -> Problem:
    return Problem(b, c, n, k, s, pad, d, dtype, layout="blc", **kw)


# The suite's tuned designs and the generic ones at their problems (Mamba's P3 and causal SiLU, odd output
# lengths), and the template's other paths: stride, dilation, 1- and 2-element vectors (bf16's word unpack
# needs V >= 2), fp32, a window with no overlap (KEEP = 0), one step a thread.
CASES = [
    (blc(1, 64, 300, 4, 1, 3, 1, "bf16"), Config(threads=128, vec=4, outs=4, steps=4, cthreads=32)),
    (blc(1, 512, 300, 4, 1, 3, 1, "bf16", padding_right=0, activation="silu"),
     Config(threads=128, vec=8, outs=4, steps=16, cthreads=64)),
    (blc(2, 24, 301, 5, 1, 2, 1, "fp16"), Config(threads=128, vec=4, outs=8, steps=4, cthreads=32)),
    (blc(2, 32, 207, 3, 1, 1, 1, "bf16", activation="silu"), Config(threads=64, vec=4, outs=4, steps=1, cthreads=32)),
    (blc(2, 16, 257, 3, 2, 1, 1, "bf16"), Config(threads=64, vec=2, outs=2, steps=4, cthreads=8)),
    (blc(2, 8, 199, 5, 1, 4, 2, "fp16", activation="silu"), Config(threads=64, vec=1, outs=4, steps=4, cthreads=8)),
    (blc(2, 12, 131, 4, 1, 3, 1, "fp32", padding_right=0, activation="silu"),
     Config(threads=64, vec=2, outs=8, steps=4, cthreads=16)),
    (blc(1, 16, 97, 2, 3, 1, 1, "bf16"), Config(threads=64, vec=4, outs=1, steps=16, cthreads=16)),
    # the ring of cp.async copies (ring > 1): 8-, 16- and 4-byte vectors, a stride, causal SiLU, walks longer
    # and shorter than the ring
    (blc(2, 64, 333, 9, 1, 4, 1, "fp16"), Config(threads=128, vec=4, outs=4, steps=16, cthreads=32, ring=4)),
    (blc(1, 128, 301, 4, 1, 3, 1, "bf16", bias=True), Config(threads=128, vec=8, outs=2, steps=16, cthreads=16,
                                                              ring=2)),
    (blc(2, 16, 257, 3, 2, 1, 1, "bf16"), Config(threads=64, vec=2, outs=2, steps=4, cthreads=8, ring=4)),
    (blc(2, 12, 131, 4, 1, 3, 1, "fp32", padding_right=0, activation="silu"),
     Config(threads=64, vec=2, outs=8, steps=4, cthreads=16, ring=4)),
    (blc(1, 32, 300, 15, 1, 7, 1, "fp16"), Config(threads=128, vec=2, outs=4, steps=16, cthreads=32, ring=2)),
]
# every case again with the window slid by renaming registers: the step loop unrolled over the slots' period
# (fp16 K15 at 4 outputs a step: 20 slots, 5 steps, a ragged last round), and the walk without tests inside a row
CASES += [(p, replace(c, rename=True)) for p, c in CASES]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cl_fwd_cpu")
    return build_all([Variant(p, c) for p, c in CASES], tmp, MAIN), tmp


@pytest.mark.parametrize("p,c", CASES, ids=[Variant(p, c).name for p, c in CASES])
def test_matches_float64_on_cpu(binaries, p, c):
    exes, tmp = binaries
    v = Variant(p, c)
    assert not violations(p, c, "fwd")
    for q in forward_checks(v):
        _, outcome = run_on_cpu(exes[v.name], q, seed=q.length % 7, tmp=tmp)
        assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"


# The (B, L, C) fast generic kernels' designs for K 10 to 16 (generated/manifest.json), built as the freeze builds
# them (on the signature's stand-in problem) and run on paddings past the halo: the dispatcher sends any padding at
# stride and dilation 1 to them; the gate checks the same through the op on the GPU.
PAST_THE_HALO = [
    (blc(2, 16, 301, 12, 1, 14, 1, "fp32", padding_right=16, bias=True),
     Config(threads=128, vec=2, outs=8, steps=4, cthreads=32)),
    (blc(1, 24, 500, 15, 1, 19, 1, "fp16", padding_right=15),
     Config(threads=128, vec=2, outs=4, steps=16, cthreads=32)),
    (blc(2, 32, 99, 10, 1, 10, 1, "bf16", padding_right=30, activation="silu"),
     Config(threads=128, vec=4, outs=4, steps=16, cthreads=32)),
    (blc(1, 24, 500, 9, 1, 12, 1, "fp16", padding_right=12), Config(threads=128, vec=4, outs=4, steps=16, cthreads=32,
                                                                    ring=4)),
]
PAST_THE_HALO += [(p, replace(c, rename=True)) for p, c in PAST_THE_HALO]


@pytest.fixture(scope="module")
def past_binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cl_past_halo_cpu")
    return build_all([shipped_generic(p, c) for p, c in PAST_THE_HALO], tmp, MAIN), tmp


@pytest.mark.parametrize("p,c", PAST_THE_HALO, ids=[p.key for p, _ in PAST_THE_HALO])
def test_paddings_past_the_halo_match_float64_on_cpu(past_binaries, p, c):
    exes, tmp = past_binaries
    v = shipped_generic(p, c)
    assert min(p.padding, p.padding_right) > p.kernel_size - 1 and p.out_length > p.length
    _, outcome = run_on_cpu(exes[v.name], p, seed=3, tmp=tmp)
    assert outcome.ok, f"{v.name} on {p.key}: {outcome.message}"
