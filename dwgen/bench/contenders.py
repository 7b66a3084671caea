"""What a user would run instead of dwgen, each as a callable factory for one problem (GPU only)."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from dwgen.bench.cases import Case
from dwgen.problem import Problem

Factory = Callable[[Problem, object, object, object], Callable[[], object]]
# For the training rows: a case -> its forward as a function of (x, weight, bias), differentiable.
TrainingFactory = Callable[[Case], Callable[[object, object, object], object]]


def eager(p: Problem, x, w, b):
    from dwgen import bench

    return bench.torch_operands(p, x, w, b)


def compiled(p: Problem, x, w, b):
    import torch

    from dwgen import bench

    torch._dynamo.reset()  # a fresh compile per problem: one function across 12 shapes hits the recompile limit
    fn = torch.compile(lambda x, w, b: bench.torch_forward(p, x, w, b), dynamic=False)
    return lambda: fn(x, w, b)


def _no_activation(p: Problem) -> None:
    """The simple contenders compute the convolution alone (any padding: P on the left, the rest in Lout)."""
    if p.activation != "none":
        raise NotImplementedError(f"computes no {p.activation}")


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

    if p.layout != "bcl":
        raise NotImplementedError("reads (B, C, L) rows only")
    _no_activation(p)
    block = 1024
    grid = (p.rows, triton.cdiv(p.out_length, block))

    def run():
        y = torch.empty(p.batch, p.channels, p.out_length, device=x.device, dtype=x.dtype)
        kernel[grid](x, w, b if b is not None else x, y, p.channels, p.length, p.out_length, p.stride, p.padding,
                     p.dilation, p.kernel_size, b is not None, block)
        return y

    return run


_NAIVE: dict = {}


def _naive_library(dtype: str):
    """The naive CUDA kernel of a dtype, compiled once per process through dwgen's own nvcc path."""
    if dtype not in _NAIVE:
        import tempfile

        import torch

        from dwgen import build, contract, render
        from dwgen.driver import Library

        name = render.naive_name(dtype)
        src, digest = render.render_naive(dtype)
        arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
        b = build.compile_library(name, src, build.build_key(digest, arch),
                                  Path(tempfile.gettempdir()) / "dwgen-bench", arch)
        if not b.ok:
            raise RuntimeError(f"naive contender did not compile: {b.log[-500:]}")
        _NAIVE[dtype] = Library(b.library, contract.launch_symbol(name), ("in",) * 3 + ("out",) + ("i64",) * 8
                                + ("out",))
    return _NAIVE[dtype]


def naive_cuda(p: Problem, x, w, b):
    import torch

    if p.layout != "bcl":
        raise NotImplementedError("reads (B, C, L) rows only")
    _no_activation(p)
    lib = _naive_library(p.dtype)

    def run():
        y = torch.empty(p.batch, p.channels, p.out_length, device=x.device, dtype=x.dtype)
        lib.prepare(x, w, b, y, p.batch, p.channels, p.length, p.out_length, p.kernel_size, p.stride, p.padding,
                    p.dilation)()
        return y

    return run


def dwgen_frozen(p: Problem, x, w, b):
    import generated

    kwargs = p.call_kwargs
    return lambda: generated.depthwise_conv1d(x, w, b, **kwargs)


CONTENDERS: dict[str, Factory] = {
    "pytorch": eager,
    "torch.compile": compiled,
    "triton (simple)": triton_simple,
    "cuda (naive)": naive_cuda,
    "dwgen": dwgen_frozen,
}


def case_forward(case: Case, x, w, b):
    """A case as PyTorch users write it (bench.torch_forward: when causal, padding K-1 on both sides and then
    the first Lout outputs, as Mamba does; SiLU where named). Also the float64 reference of the training rows."""
    from dwgen import bench

    return bench.torch_forward(case, x, w, b)


def eager_training(case: Case):
    return lambda x, w, b: case_forward(case, x, w, b)


def compiled_training(case: Case):
    import torch

    torch._dynamo.reset()  # a fresh compile per case, as for the forward rows
    return torch.compile(lambda x, w, b: case_forward(case, x, w, b), dynamic=False)


def dwgen_training(case: Case):
    import generated

    kwargs = case.call_kwargs
    return lambda x, w, b: generated.depthwise_conv1d(x, w, b, **kwargs)


# The contenders with a backward (the simple Triton and naive CUDA kernels have none).
TRAINING: dict[str, TrainingFactory] = {
    "pytorch": eager_training,
    "torch.compile": compiled_training,
    "dwgen": dwgen_training,
}
