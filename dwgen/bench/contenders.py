"""What a user would run instead of dwgen, each as a callable factory for one problem (GPU only)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dwgen.problem import Problem

Factory = Callable[[Problem, object, object, object], Callable[[], object]]


def eager(p: Problem, x, w, b):
    import torch.nn.functional as F

    return lambda: F.conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation, groups=p.channels)


def compiled(p: Problem, x, w, b):
    import torch
    import torch.nn.functional as F

    torch._dynamo.reset()  # a fresh compile per problem: one function across 12 shapes hits the recompile limit
    fn = torch.compile(lambda x, w, b: F.conv1d(x, w, b, stride=p.stride, padding=p.padding,
                                                dilation=p.dilation, groups=p.channels), dynamic=False)
    return lambda: fn(x, w, b)


def triton_simple(p: Problem, x, w, b):
    """The obvious Triton answer: a block of outputs, one shifted masked load per tap."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x_ptr, w_ptr, b_ptr, y_ptr, C, L, Lout, S: tl.constexpr, P: tl.constexpr, D: tl.constexpr,
               K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0)
        j = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        c = row % C
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        if HAS_BIAS:
            acc += tl.load(b_ptr + c)
        for k in tl.static_range(K):
            a = j * S - P + k * D
            m = (a >= 0) & (a < L) & (j < Lout)
            acc += tl.load(x_ptr + row * L + a, mask=m, other=0.0) * tl.load(w_ptr + c * K + k)
        tl.store(y_ptr + row * Lout + j, acc, mask=j < Lout)

    block = 1024
    grid = (p.rows, triton.cdiv(p.out_length, block))

    def run():
        y = torch.empty(p.batch, p.channels, p.out_length, device=x.device)
        kernel[grid](x, w, b if b is not None else x, y, p.channels, p.length, p.out_length, p.stride, p.padding,
                     p.dilation, p.kernel_size, b is not None, block)
        return y

    return run


class _Naive:
    """The naive CUDA kernel, compiled once per process through dwgen's own nvcc and driver path."""

    kernel = None

    @classmethod
    def get(cls):
        if cls.kernel is None:
            import tempfile

            import torch

            from dwgen import build, render
            from dwgen.driver import Kernel

            src, digest = render.render_naive()
            arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
            b = build.compile_cubin(render.NAIVE_NAME, src, build.build_key(digest, arch),
                                    Path(tempfile.gettempdir()) / "dwgen-bench", arch)
            if not b.ok:
                raise RuntimeError(f"naive contender did not compile: {b.log[-500:]}")
            cls.kernel = Kernel(b.cubin, render.NAIVE_NAME)
        return cls.kernel


def naive_cuda(p: Problem, x, w, b):
    import torch

    from dwgen.driver import i32, ptr

    kernel = _Naive.get()

    def run():
        y = torch.empty(p.batch, p.channels, p.out_length, device=x.device)
        threads = min(1024, max(32, -(-p.out_length // 32) * 32))
        kernel.prepare(p.rows, threads, [ptr(x), ptr(w), ptr(b), ptr(y), i32(p.channels), i32(p.length),
                                         i32(p.out_length), i32(p.kernel_size), i32(p.stride), i32(p.padding),
                                         i32(p.dilation)])()
        return y

    return run


def dwgen_frozen(p: Problem, x, w, b):
    import generated

    return lambda: generated.depthwise_conv1d(x, w, b, stride=p.stride, padding=p.padding, dilation=p.dilation)


CONTENDERS: dict[str, Factory] = {
    "pytorch": eager,
    "torch.compile": compiled,
    "triton (simple)": triton_simple,
    "cuda (naive)": naive_cuda,
    "dwgen": dwgen_frozen,
}
