"""A fused backward variant as the search builds it: the contract's launch and workspace functions, exported
by the library the worker loads, and the workspace it asks for (tune.py --direction bwd)."""
from __future__ import annotations

import ctypes
import subprocess

import pytest

from dwgen import build, contract, render
from dwgen.problem import Problem
from dwgen.space import enumerate_space

LAUNCH = ("(const void* gy, const void* x, const void* w, const void* b, void* gx, void* gw, void* gb, void* work, "
          "long long B, long long C, long long L, long long Lout, long long P, long long act, void* stream)")


def test_every_variant_renders_the_backward_contract():
    p = Problem(4, 64, 1000)
    for v in enumerate_space(p, "bwd"):
        flat = " ".join(render.render_variant(v).split())
        assert f'extern "C" int {contract.launch_symbol(v.name)}{LAUNCH}' in flat
        args = ", ".join(f"long long {a}" for a in contract.WORKSPACE_ARGS)
        assert f'extern "C" long long {contract.workspace_symbol(v.name)}({args})' in flat


@pytest.mark.nvcc
def test_the_library_exports_both_and_sizes_its_workspace(tmp_path):
    p = Problem(4, 64, 1000)
    v = enumerate_space(p, "bwd")[0]
    assert v.name == "dw1d_bwd_f32_k3_t128_o2"
    b = build.compile_many([(v.name, render.render_variant(v), build.build_key(v.digest, "sm_90"))], tmp_path)[0]
    assert b.ok, b.log
    out = subprocess.run(["nm", "-D", "--defined-only", b.library], capture_output=True, text=True, check=True).stdout
    assert {contract.launch_symbol(v.name), contract.workspace_symbol(v.name)} <= {
        line.split()[-1] for line in out.splitlines() if line.strip()}
    # host code: callable here without a GPU. Tiles of 128 x 2 = 256 positions cover max(L, Lout + 1) = 1001
    # (grad_out starts one before x's tile at P = 1 < H = 2): 4 tiles of K + 1 = 4 partial sums per channel
    ws = ctypes.CDLL(b.library)[contract.workspace_symbol(v.name)]
    ws.restype, ws.argtypes = ctypes.c_longlong, [ctypes.c_longlong] * len(contract.WORKSPACE_ARGS)
    assert ws(4, 64, 1000, 1000, 1) == 4 * 4 * 64 * 4
    assert ws(1, 3, 1024, 1022, 0) == 1 * 4 * 3 * 4  # P = 0: grad_out from 2 before the tile, max(1024, 1024)


@pytest.mark.nvcc
def test_raw_stage_shared_memory_is_the_size_we_computed(tmp_path):
    from dwgen.families.bwd import Config
    from dwgen.space import Variant

    vs = [Variant(Problem(32, 512, 8192, dtype="bf16"), Config(threads=128, outs=16, stage="raw"), "bwd"),
          Variant(Problem(32, 512, 8192, dtype="bf16"), Config(threads=128, outs=16, stage="rawp"), "bwd"),
          Variant(Problem(4, 64, 4096, 4, 1, 3, 2, "fp16"), Config(threads=256, outs=4, stage="raw"), "bwd"),
          Variant(Problem(32, 512, 8192), Config(threads=128, outs=2, stage="raw"), "bwd")]
    builds = build.compile_many([(v.name, render.render_variant(v), build.build_key(v.digest, "sm_90")) for v in vs],
                                tmp_path, workers=2)
    for v, b in zip(vs, builds, strict=True):
        assert b.ok, b.log
        assert b.smem_bytes == v.tiling.smem_bytes and b.spill_bytes == 0, v.name
