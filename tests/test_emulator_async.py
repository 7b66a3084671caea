"""The CPU emulator's cp.async (tests/cuda_on_cpu.h: emu::cp_async, cp_async_commit, cp_async_wait): a copy lands
only when a wait_group retires its group, its destination NaN until then, and a thread that returns with a copy in
flight fails the launch. Templates whose host branch copies at once cannot show a wrong wait count; these can."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.cuda_on_cpu import _compile

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")

PROGRAM = r"""
#include "cuda_on_cpu.h"
#include <cmath>

// Each of two threads copies src[t] and src[t + 2] as two groups into its own slots, and records what it reads
// before any wait, after wait_group 1 (the first group only) and after wait_group 0; a slot of -1 in src is copied
// as zeros (no source).
__global__ void kernel(const float* src, float* seen, int leave_in_flight) {
    __shared__ float slot[2][2];
    const int t = threadIdx.x;
    emu::cp_async(&slot[t][0], src + t, 4);
    emu::cp_async_commit();
    emu::cp_async(&slot[t][1], src[t + 2] < 0 ? nullptr : src + t + 2, 4);
    emu::cp_async_commit();
    seen[6 * t + 0] = slot[t][0];
    seen[6 * t + 1] = slot[t][1];
    emu::cp_async_wait(1);
    seen[6 * t + 2] = slot[t][0];
    seen[6 * t + 3] = slot[t][1];
    if (leave_in_flight) return;
    emu::cp_async_wait(0);
    seen[6 * t + 4] = slot[t][0];
    seen[6 * t + 5] = slot[t][1];
}

int main(int argc, char** argv) {
    const float src[4] = {1.0f, 2.0f, 3.0f, -1.0f};
    float seen[12];
    emu::launch(kernel, 1u, 2, 0, nullptr, src, seen, argc > 1);
    for (float s : seen) {
        if (std::isnan(s)) std::printf("nan ");
        else std::printf("%g ", s);
    }
    return 0;
}
"""


def test_a_copy_lands_at_the_wait_that_retires_its_group(tmp_path):
    exe = _compile("emu_async", PROGRAM, tmp_path)
    seen = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout.split()
    # thread 0: src 1 then 3; thread 1: src 2 then none (zeros)
    assert seen[:6] == ["nan", "nan", "1", "nan", "1", "3"]
    assert seen[6:] == ["nan", "nan", "2", "nan", "2", "0"]


def test_a_thread_that_returns_with_a_copy_in_flight_fails_the_launch(tmp_path):
    exe = _compile("emu_async_left", PROGRAM, tmp_path)
    proc = subprocess.run([str(exe), "leave"], capture_output=True, text=True)
    assert proc.returncode == 4 and "cp.async copies in flight" in proc.stderr
