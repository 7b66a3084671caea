"""Running a rendered variant's own source on the CPU: its launches become calls of emu::launch
(tests/cuda_on_cpu.h runs a block's threads as fibers), and a test's main() reads inputs from a file and writes
the outputs to another. Shared by the CPU tests of the backward and of the (B, L, C) forward."""
from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest

from dwgen import render
from dwgen.dtypes import DTYPES
from dwgen.render import render_variant
from dwgen.space import Variant, generic_problem

HERE = Path(__file__).resolve().parent

# The emulator's two ways of scheduling a block's warps (tests/cuda_on_cpu.h): as env overrides for a test binary.
SCHEDULES = ({}, {"EMU_GREEDY_WARPS": "1"})


def run_both_schedules(cmd: list, out: Path | None, timeout: int = 600) -> subprocess.CompletedProcess:
    """A test binary run under both warp schedules: round robin, then each warp as far ahead as the barriers let it.
    A kernel's outputs depend on no interleaving (no float atomics, every race a bug), so the two runs must exit
    alike and write the same bytes to `out` (or, without one, to stdout); returns the first run, its output left
    in `out`."""
    import os

    runs = []
    for schedule in SCHEDULES:
        proc = subprocess.run([str(a) for a in cmd], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **schedule})
        written = out.read_bytes() if out is not None and proc.returncode == 0 and out.exists() else b""
        runs.append((proc, written if out is not None else proc.stdout.encode()))
    (first, bytes0), (second, bytes1) = runs
    assert first.returncode == second.returncode, (
        f"exit {first.returncode} round robin, {second.returncode} greedy warps: {second.stderr[-2000:]}")
    assert bytes0 == bytes1, "the greedy warp schedule wrote other outputs than round robin: a race between warps"
    if first.returncode == 0 and out is not None:
        out.write_bytes(bytes0)
    return first

# Ahead of a test's main(): CAT(dwgen_launch_, NAME) names the launch function, slurp reads an input,
# sizes the problem's numbers from the command line.
PRELUDE = r"""
#include <cstdio>
#include <cstdlib>
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)

static void* slurp(FILE* f, long long bytes) {
    void* p = std::aligned_alloc(64, static_cast<size_t>((bytes + 63) / 64 * 64 + 64));
    if (bytes > 0 && std::fread(p, 1, static_cast<size_t>(bytes), f) != static_cast<size_t>(bytes)) std::exit(3);
    return p;
}

// argv: input file, output file, then B, C, L, Lout, P, act, bias, K
struct Sizes {
    long long B, C, L, Lout, P, act, bias, K;
};
static Sizes sizes(char** argv) {
    long long v[8];
    for (int i = 0; i < 8; ++i) v[i] = std::atoll(argv[3 + i]);
    return {v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]};
}
"""


# How a test's main() begins when it takes PRELUDE's ten arguments: the sizes, T's width, the input file open.
MAIN_OPEN = r"""
int main(int argc, char** argv) {
    if (argc != 11) return 2;
    const auto [B, C, L, Lout, P, act, bias, K] = sizes(argv);
    const long long e = sizeof({{ storage }});
    FILE* in = std::fopen(argv[1], "rb");
"""


# The PTX primitives of templates/_warp_mma.cu.j2, lane by lane for the CPU emulator: ldmatrix and mma.sync
# gather the warp's operands through a shared table at a warp barrier, as the fragment layouts say (PTX ISA);
# cp.async lands at its thread's wait (below).
WARP_MMA_ON_CPU = r"""
static const void* emu_rows[1024];
static unsigned emu_frag[1024][6];

static float emu_widen(const unsigned bits) {
{% if mma_type == "f16" %}
    __half h;
    h.x = static_cast<unsigned short>(bits);
    return __half2float(h);
{% else %}
    return __uint_as_float(bits << 16);
{% endif %}
}

inline void ldsm_x4_trans(unsigned (&r)[4], const void* row) {
    const unsigned t = threadIdx.x, w = t / 32 * 32, l = t % 32;
    emu_rows[t] = row;
    emu::warp_barriers[t / 32].wait();
    for (unsigned j = 0; j < 4; ++j) {
        const auto* r0 = static_cast<const unsigned short*>(emu_rows[w + 8 * j + 2 * (l % 4)]);
        const auto* r1 = static_cast<const unsigned short*>(emu_rows[w + 8 * j + 2 * (l % 4) + 1]);
        r[j] = r0[l / 4] | static_cast<unsigned>(r1[l / 4]) << 16;
    }
    emu::warp_barriers[t / 32].wait();
}

inline void mma16816(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
    const unsigned t = threadIdx.x, w = t / 32 * 32, l = t % 32, g = l / 4, q = l % 4;
    for (int i = 0; i < 4; ++i) emu_frag[t][i] = a[i];
    emu_frag[t][4] = b0;
    emu_frag[t][5] = b1;
    emu::warp_barriers[t / 32].wait();
    auto half = [&](unsigned lane, unsigned reg, unsigned k) {
        return emu_widen((emu_frag[w + lane][reg] >> (16 * (k % 2))) & 0xffffu);
    };
    for (unsigned rr = 0; rr < 4; ++rr) {
        const unsigned row = g + 8 * (rr >> 1), col = 2 * q + (rr & 1);
        float s = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {  // A (row, k) and B (k, col) from the lanes that hold them
            s += half(4 * (row % 8) + (k % 8) / 2, row / 8 + 2 * (k / 8), k)
                 * half(4 * col + (k % 8) / 2, 4 + k / 8, k);
        }
        d[rr] += s;
    }
    emu::warp_barriers[t / 32].wait();
}

// cp.async through the emulator's own (tests/cuda_on_cpu.h, emu::cp_async): a copy lands when its thread waits on
// its group, as the device only promises; until then its destination reads as NaN (0xff bytes in every float
// type), so a read before the wait (or before the barrier after it, for another thread's copies) gives a wrong
// output.
inline void emu_copy_issue(void* dst, const void* src, const bool valid) {
    emu::cp_async(dst, valid ? src : nullptr, 16);
}
inline void cp_async16(void* dst, const void* src) { emu::cp_async(dst, src, 16); }
inline void cp_async_commit() { emu::cp_async_commit(); }
template <int PENDING> inline void cp_async_wait() { emu::cp_async_wait(PENDING); }
"""


# templates/_warp_mma_extra.cu.j2 lane by lane: ldmatrix meets the warp's row addresses in a shared table at a
# warp barrier, the m16n8k8 product is WARP_MMA_ON_CPU's m16n8k16 with zeros in its upper halves; the
# zero-filling copy is deferred to its wait as WARP_MMA_ON_CPU's cp.async. Shared memory here starts as zeros,
# where the device's holds whatever was there: so ldmatrix exits the program (code 4) on a row that no copy of
# its block wrote.
WARP_LDST_ON_CPU = r"""
static void* emu_ldst_rows[1024];
static std::unordered_set<const void*> emu_copied;  // 16-byte rows the current block's copies wrote
static unsigned long long emu_copied_block = ~0ull;

template <int N>
inline void emu_ldsm(unsigned (&r)[N], const void* row) {
    const unsigned t = threadIdx.x, w = t / 32 * 32, l = t % 32;
    emu_ldst_rows[t] = const_cast<void*>(row);
    emu::warp_barriers[t / 32].wait();
    for (unsigned j = 0; j < N; ++j) {  // matrix j's rows come from lanes 8j .. 8j + 7
        const void* src = emu_ldst_rows[w + 8 * j + l / 4];
        if (emu_copied_block != emu::block_serial() || !emu_copied.count(src)) {
            std::fprintf(stderr, "block %u: ldmatrix row not staged by its copies\n", blockIdx.x);
            std::exit(4);
        }
        r[j] = static_cast<const unsigned*>(src)[l % 4];
    }
    emu::warp_barriers[t / 32].wait();
}
inline void ldsm_x4(unsigned (&r)[4], const void* row) { emu_ldsm(r, row); }
inline void ldsm_x2(unsigned (&r)[2], const void* row) { emu_ldsm(r, row); }
inline void ldsm_x1(unsigned (&r)[1], const void* row) { emu_ldsm(r, row); }

// m16n8k8 is m16n8k16 with A's columns 8 to 15 and B's rows 8 to 15 zero: the same sums, the zeros adding nothing.
inline void mma1688(float (&d)[4], const unsigned a0, const unsigned a1, const unsigned b) {
    const unsigned a[4] = {a0, a1, 0u, 0u};
    mma16816(d, a, b, 0u);
}

inline void cp_async16_or_zero(void* dst, const void* src, const bool valid) {
    if (emu_copied_block != emu::block_serial()) {
        emu_copied.clear();
        emu_copied_block = emu::block_serial();
    }
    emu_copied.insert(dst);
    emu_copy_issue(dst, src, valid);
}
"""


def _emulated(source: str) -> str:
    """CUDA source for the host: cuda_on_cpu.h instead of the CUDA headers, each launch (templated ones included)
    a call of emu::launch."""
    src = re.sub(r"#include <cuda[^>]*>\n", "", source)
    src = re.sub(r"([\w<>]+)<<<", r"emu::launch(\1, ", src).replace(">>>(", ", ")
    return '#include "cuda_on_cpu.h"\n' + src


def cpu_source(v: Variant, main: str) -> str:
    """The variant's source with its launches made calls of emu::launch, then PRELUDE and main ({{ storage }}:
    x's type)."""
    return _emulated(render_variant(v)) + PRELUDE + main.replace("{{ storage }}", DTYPES[v.problem.dtype].storage)


def _compile(name: str, text: str, tmp: Path) -> Path:
    """g++ build of a CPU test program (its text includes cuda_on_cpu.h), with NAME defined as name."""
    src, exe = tmp / f"{name}.cpp", tmp / name
    src.write_text(text)
    proc = subprocess.run(["g++", "-std=c++17", "-O1", "-fno-strict-aliasing", "-pthread", "-w", f"-I{HERE}",
                           f"-DNAME={name}", "-o", str(exe), str(src)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return exe


def build(v: Variant, tmp: Path, main: str) -> Path:
    return _compile(v.name, cpu_source(v, main), tmp)


def build_generic(name: str, source: str, dtype: str, main: str, tmp: Path) -> Path:
    """A generic kernel's rendered source with main after it, T_ its element type."""
    return _compile(name, _emulated(source) + f"\nusing T_ = {DTYPES[dtype].storage};\n" + main, tmp)


def build_walking(name_of, render_of, main: str, tmp: Path) -> dict[str, Path]:
    """fp32 and bf16 builds of a generic kernel rendered with ROW_BLOCKS 1, so that each block of its row kernel walks
    all its row's tiles (at the default, the CPU tests' few rows leave one tile a block)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(render, "ANY_ROW_BLOCKS", 1)
        return {dtype: build_generic(name_of(dtype), render_of(dtype), dtype, main, tmp) for dtype in ("fp32", "bf16")}


def strided_raw(t) -> tuple[bytes, int]:
    """t's elements from its first to its last by its strides (the bytes a kernel given t's strides may read), and
    how many."""
    import torch

    n = sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True)) + 1
    return raw(torch.as_strided(t, (n,), (1,), t.storage_offset())), n


def build_all(variants: list[Variant], tmp: Path, main: str) -> dict[str, Path]:
    """Each variant's CPU binary by name, two builds at a time (the cores of this machine and CI's)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip([v.name for v in variants], pool.map(lambda v: build(v, tmp, main), variants), strict=True))


def forward_checks(v: Variant) -> list:
    """The problems a forward variant is checked on here: its own, with the other bias, and its family's edge
    problems up to 5000 long (longer ones only cost time on the CPU)."""
    p = v.problem
    return [p, replace(p, bias=not p.bias)] + [q for q in v.edge_problems() if q.length <= 5000]


def raw(t) -> bytes:
    """A tensor's bytes in its logical order (16-bit types as int16, which numpy can hold)."""
    import torch

    t = t.contiguous()
    return (t.view(torch.int16) if t.element_size() == 2 else t).numpy().tobytes()


def shipped_generic(p, config, direction: str = "fwd") -> Variant:
    """A fast generic kernel as the freeze renders it: on its signature's stand-in problem (sizes, padding and bias
    are run-time), to be run on p."""
    return Variant(generic_problem(p.kernel_size, p.dtype, p.layout), config, direction)
