"""The (B, C, L) forward's own source (templates/dw1d.cu.j2), run on the CPU through its launch function
(tests/cuda_on_cpu.h: a block's threads as fibers) and checked against float64: rows that are not whole
vectors (each R of tile_step_r), the order rows are taken in, the edge outputs, an x that starts inside a
vector, for machines without a GPU. The l1 and smem halos with the tile and row walks: the emulation has no
cp.async (async halo), no shuffle down (shfl) and no occupancy query (persistent walk). It says nothing of
speed, and the CPU build takes the portable SiLU spelling."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dwgen.check import compare, make_inputs, reference
from dwgen.families.bcl import Config
from dwgen.problem import Problem
from dwgen.space import Variant, violations
from tests.cuda_on_cpu import build_all, forward_checks, raw, run_both_schedules, shipped_generic

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

# argv after the sizes: xoff, elements x starts past a 64-byte boundary (a view such as x[..., 1:])
MAIN = r"""
int main(int argc, char** argv) {
    if (argc != 12) return 2;
    const auto [B, C, L, Lout, P, act, bias, K] = sizes(argv);
    const long long xoff = std::atoll(argv[11]);
    const long long e = sizeof({{ storage }});
    FILE* in = std::fopen(argv[1], "rb");
    const size_t nx = static_cast<size_t>(B * C * L * e);
    unsigned char* xbuf = static_cast<unsigned char*>(std::aligned_alloc(64, (nx + xoff * e) / 64 * 64 + 128));
    if (std::fread(xbuf + xoff * e, 1, nx, in) != nx) return 3;
    void* w = slurp(in, C * K * e);
    void* b = bias ? slurp(in, C * e) : nullptr;
    std::fclose(in);
    const long long ny = B * C * Lout * e;
    unsigned char* y = static_cast<unsigned char*>(std::aligned_alloc(64, static_cast<size_t>((ny + 63) / 64 * 64)));
    for (long long i = 0; i < ny; ++i) y[i] = 0xff;  // NaN in every float type: an unwritten output fails
    const int rc = CAT(dwgen_launch_, NAME)(xbuf + xoff * e, w, b, y, B, C, L, Lout, P, act, nullptr);
    if (rc != 0) return 10 + rc;
    FILE* out = std::fopen(argv[2], "wb");
    std::fwrite(y, 1, static_cast<size_t>(ny), out);
    std::fclose(out);
    return 0;
}
"""


def run_on_cpu(exe: Path, p: Problem, seed: int, tmp: Path, xoff: int = 0):
    """The outcome of the float64 check of the kernel's output for the check's inputs of seed."""
    import torch

    x, w, b = make_inputs(p, seed, "cpu")
    inp, out = tmp / f"{exe.name}.{p.key}.{xoff}.in", tmp / f"{exe.name}.{p.key}.{xoff}.out"
    inp.write_bytes(raw(x) + raw(w) + (raw(b) if b is not None else b""))
    args = [exe, inp, out, p.batch, p.channels, p.length, p.out_length, p.padding, int(p.activation == "silu"),
            int(b is not None), p.kernel_size, xoff]
    proc = run_both_schedules(args, out)
    assert proc.returncode == 0, f"{p.key}: exit {proc.returncode} {proc.stderr[-2000:]}"
    y = torch.frombuffer(bytearray(out.read_bytes()), dtype=torch.uint8).view(x.dtype).view(
        p.batch, p.channels, p.out_length)
    ref, scale = reference(p, x, w, b)
    return compare(p, y, ref, scale)


def bcl(b, c, n, k, s, pad, d, dtype, **kw) -> Problem:
    return Problem(b, c, n, k, s, pad, d, dtype, **kw)


# Rows of odd length (every R in turn; B * C a multiple of V but in one case and some edge problems), the
# suite's and the generic kernels' designs: the 16-bit tile walk over the l1 halo, Mamba's causal SiLU, fp32,
# a walked row with a staged halo, several rows of one channel a block (not reordered), stride and dilation.
CASES = [
    (bcl(2, 8, 2061, 3, 1, 1, 1, "bf16"), Config(threads=64, vec=8, outs=2, halo="l1", cap=True)),
    (bcl(2, 4, 2051, 4, 1, 3, 1, "bf16", padding_right=0, activation="silu"),
     Config(threads=64, vec=8, outs=2, halo="l1", cap=True)),
    (bcl(1, 8, 3001, 9, 1, 4, 1, "fp16"), Config(threads=64, vec=8, outs=2, halo="l1")),
    (bcl(2, 6, 1999, 4, 1, 1, 1, "fp32"), Config(threads=128, vec=4, outs=2, halo="l1")),
    (bcl(2, 4, 2050, 4, 1, 1, 1, "fp16"), Config(threads=128, vec=8, outs=1, walk="row", halo="smem")),
    (bcl(4, 3, 701, 5, 1, 2, 1, "bf16"), Config(threads=64, vec=8, outs=1, walk="row", batches=2, halo="l1")),
    (bcl(2, 4, 1201, 3, 2, 1, 1, "bf16"), Config(threads=64, vec=8, outs=1, halo="smem")),
    (bcl(2, 2, 1003, 3, 1, 2, 2, "fp32", activation="silu"), Config(threads=64, vec=4, outs=1, run=2, halo="l1")),
]


@pytest.fixture(scope="module")
def binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bcl_fwd_cpu")
    return build_all([Variant(p, c) for p, c in CASES], tmp, MAIN), tmp


@pytest.mark.parametrize("p,c", CASES, ids=[Variant(p, c).name for p, c in CASES])
def test_matches_float64_on_cpu(binaries, p, c):
    exes, tmp = binaries
    v = Variant(p, c)
    assert not violations(p, c, "fwd")
    for q in forward_checks(v):
        outcome = run_on_cpu(exes[v.name], q, seed=q.length % 7, tmp=tmp)
        assert outcome.ok, f"{v.name} on {q.key}: {outcome.message}"
    outcome = run_on_cpu(exes[v.name], p, seed=1, tmp=tmp, xoff=1)  # x starting one element into a vector
    assert outcome.ok, f"{v.name} on {p.key} with x one element past a vector: {outcome.message}"


# Designs the fast generic kernels use (generated/manifest.json: fp32 K10 and K11, 16-bit K9 and K15, bf16 K3) or
# may (search.generic's candidates), on
# paddings past the halo: the dispatcher sends any padding at stride and dilation 1 to them, so outputs longer
# than the input (zeros in at both ends) must come out right; the gate checks the same through the op on the GPU.
PAST_THE_HALO = [
    (bcl(2, 3, 301, 10, 1, 12, 1, "fp32", padding_right=14, bias=True), Config(threads=128, vec=4, outs=2, halo="l1")),
    (bcl(1, 3, 1000, 15, 1, 20, 1, "fp16", padding_right=17), Config(threads=64, vec=8, outs=2, halo="l1", cap=True)),
    (bcl(2, 2, 777, 9, 1, 11, 1, "fp16", padding_right=9, activation="silu"),
     Config(threads=64, vec=8, outs=2, halo="l1", cap=True)),
    (bcl(2, 3, 129, 3, 1, 5, 1, "bf16", padding_right=40), Config(threads=64, vec=8, outs=2, halo="l1", cap=True)),
    # the fp32 candidate of one group of two runs (search.generic, forty-third session)
    (bcl(2, 3, 301, 4, 1, 9, 1, "fp32", padding_right=6, bias=True),
     Config(threads=64, vec=4, outs=1, run=2, halo="l1")),
]


@pytest.fixture(scope="module")
def past_binaries(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bcl_past_halo_cpu")
    return build_all([shipped_generic(p, c) for p, c in PAST_THE_HALO], tmp, MAIN), tmp


@pytest.mark.parametrize("p,c", PAST_THE_HALO, ids=[p.key for p, _ in PAST_THE_HALO])
def test_paddings_past_the_halo_match_float64_on_cpu(past_binaries, p, c):
    exes, tmp = past_binaries
    v = shipped_generic(p, c)
    assert min(p.padding, p.padding_right) > p.kernel_size - 1 and p.out_length > p.length
    outcome = run_on_cpu(exes[v.name], p, seed=3, tmp=tmp)
    assert outcome.ok, f"{v.name} on {p.key}: {outcome.message}"
