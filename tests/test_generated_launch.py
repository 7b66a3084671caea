"""The frozen module's fast generic backward kernels take, in their own launch, every call its dispatcher sends them.

A fast generic backward serves every call of its (dtype, layout, K) at stride and dilation 1 that fits its table
entry (under 2^31 elements, channels a multiple of its vector, aligned): any batch, length, padding (past the halo
too), bias and activation. A launch that refused one would reach the user as an error. Each kernel here is built
from the file in generated/ (the text users compile), run on the CPU with EMU_DRY_LAUNCH (tests/cuda_on_cpu.h):
the launch validates the call and sizes its grid against the device's limits, and no block runs, so the calls
can have a GPU's sizes."""
from __future__ import annotations

import random
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest

from dwgen import freeze
from tests.cuda_on_cpu import PRELUDE, _compile, _emulated
from tests.test_generic_bwd_launch import DRY_MAIN, launch_codes

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

KEYS = [f"{dtype}_{layout}_k{k}" for dtype in ("fp32", "fp16", "bf16") for layout in ("bcl", "blc") for k in (1, 4, 16)]


def random_calls(rng: random.Random, k: int, channel_multiple: int, n: int) -> list:
    """n calls the dispatcher would send a fast generic kernel of K: (B, C, L, Lout, left padding, act, bias),
    under 2^31 elements, from single positions to rows of 2^30, paddings from none to past the halo."""
    h, calls = k - 1, []
    while len(calls) < n:
        b, c = rng.choice([1, 3, 64, 65535, 65536, 1 << 20]), channel_multiple * rng.choice([1, 7, 512, 4096, 1 << 16])
        length = rng.choice([1, 5, 300, 4099, 1 << 16, 1 << 20, 1 << 30])
        left, right = rng.choice([0, h // 2, h, 2 * k, 100]), rng.choice([0, h - h // 2, h, 100])
        out = length + left + right - h
        if out >= 1 and b * c * max(length, out) < 2**31:
            calls.append((b, c, length, out, left, rng.randint(0, 1), rng.randint(0, 1)))
    return calls


def built_from_generated(kernels: dict, names, main: str, tmp) -> dict:
    """Each named kernel's CPU binary, from its file in generated/ with main after it, two builds at a time."""
    def built(name):
        source = (freeze.DEFAULT_DIR / kernels[name]["file"]).read_text()
        return _compile(name, _emulated(source) + PRELUDE + main, tmp)

    names = sorted(names)
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(names, pool.map(built, names), strict=True))


def test_each_fast_generic_backward_takes_every_call_the_dispatcher_sends_it(tmp_path):
    m = freeze.read_manifest(freeze.DEFAULT_DIR)
    kernels = {e["name"]: e for e in m["kernels"]}
    exes = built_from_generated(kernels, {m["generic"]["fast_bwd"][key] for key in KEYS}, DRY_MAIN, tmp_path)
    rng = random.Random(5)
    for key in KEYS:
        name = m["generic"]["fast_bwd"][key]
        k = int(key.rsplit("_k", 1)[1])
        calls = [as_call(*c) for c in random_calls(rng, k, kernels[name]["channel_multiple"], 150)]
        refused = [f"{c.key}: {rc}" for c, rc in zip(calls, launch_codes(exes[name], calls), strict=True) if rc != 0]
        assert not refused, f"{key}: {name} refused {len(refused)} calls, e.g. {refused[:3]}"


def as_call(b, c, length, out, left, act, bias):
    """A call as launch_codes reads it (the sizes of a Problem, without its 2^31 bound)."""
    from types import SimpleNamespace

    from dwgen.problem import ACTIVATIONS

    return SimpleNamespace(batch=b, channels=c, length=length, out_length=out, padding=left,
                           activation=ACTIVATIONS[act], bias=bool(bias),
                           key=f"{b}x{c}x{length} Lout {out} P{left} act {act} bias {bias}")


# stdin as DRY_MAIN's; the forward's launch contract (x, w, b, y, sizes, P, act, stream)
FWD_DRY_MAIN = r"""
int main() {
    void* buf[4];
    for (auto& p : buf) p = std::aligned_alloc(64, 64);
    long long v[7];
    while (std::scanf("%lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6]) == 7) {
        std::printf("%d\n", CAT(dwgen_launch_, NAME)(buf[0], buf[1], v[6] ? buf[2] : nullptr, buf[3], v[0], v[1], v[2],
                                                     v[3], v[4], v[5], nullptr));
    }
    return 0;
}
"""


def test_each_fast_generic_forward_without_ptx_takes_every_call_the_dispatcher_sends_it(tmp_path):
    """The same for the forward's fast kernels, but those whose source has inline PTX the emulator lacks (the
    tensor-core ones and the cp.async row walks, `_async`): about half the (dtype, layout, K) keys."""
    m = freeze.read_manifest(freeze.DEFAULT_DIR)
    kernels = {e["name"]: e for e in m["kernels"]}
    fast = {key: name for key, name in m["generic"]["fast"].items() if "_tc_" not in name and "_async" not in name}
    assert len(fast) >= 40
    exes = built_from_generated(kernels, set(fast.values()), FWD_DRY_MAIN, tmp_path)
    rng = random.Random(6)
    for key, name in sorted(fast.items()):
        k = int(key.rsplit("_k", 1)[1])
        calls = [as_call(*c) for c in random_calls(rng, k, kernels[name]["channel_multiple"], 60)]
        refused = [f"{c.key}: {rc}" for c, rc in zip(calls, launch_codes(exes[name], calls), strict=True) if rc != 0]
        assert not refused, f"{key}: {name} refused {len(refused)} calls, e.g. {refused[:3]}"
