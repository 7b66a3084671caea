"""The launch contract: the one argument list that every variant's host launch function takes.

It is rendered into each kernel source (the function the search loads and times), into the frozen
module's dispatcher (which calls the same functions), and read by the search's ctypes launcher; the grid
rule lives in the template beside the kernel, once.
"""
from __future__ import annotations

# (name, kind): pointers to x, w, b (null when there is no bias) and y; sizes; P the left padding (any right
# padding is implied by Lout); act the fused activation (0 none, 1 SiLU); the stream to launch on.
LAUNCH_ARGS: tuple[tuple[str, str], ...] = (
    ("x", "in"), ("w", "in"), ("b", "in"), ("y", "out"),
    ("B", "i64"), ("C", "i64"), ("L", "i64"), ("Lout", "i64"), ("P", "i64"), ("act", "i64"),
    ("stream", "out"),
)
# The backward's: grad_out, x, w, b in; grad_x, grad_weight (C, K), grad_bias (C,) out, and `work`, fp32
# scratch for the per-tile partial sums (dwgen_workspace_<name>(B, C, L, Lout, P) floats, not zeroed).
BWD_LAUNCH_ARGS: tuple[tuple[str, str], ...] = (
    ("gy", "in"), ("x", "in"), ("w", "in"), ("b", "in"), ("gx", "out"), ("gw", "out"), ("gb", "out"), ("work", "out"),
    ("B", "i64"), ("C", "i64"), ("L", "i64"), ("Lout", "i64"), ("P", "i64"), ("act", "i64"),
    ("stream", "out"),
)
ARGS = {"fwd": LAUNCH_ARGS, "bwd": BWD_LAUNCH_ARGS}
_CPP = {"in": "const void*", "out": "void*", "i64": "long long"}


# What a backward variant's workspace function takes: long long dwgen_workspace_<name>(B, C, L, Lout, P).
WORKSPACE_ARGS: tuple[str, ...] = ("B", "C", "L", "Lout", "P")


def launch_symbol(name: str) -> str:
    return f"dwgen_launch_{name}"


def workspace_symbol(name: str) -> str:
    return f"dwgen_workspace_{name}"


def cpp_params(direction: str = "fwd") -> str:
    """The C++ parameter list, e.g. 'const void* x, ..., void* stream'."""
    return ", ".join(f"{_CPP[kind]} {name}" for name, kind in ARGS[direction])


def cpp_types(direction: str = "fwd") -> str:
    """The C++ parameter types alone, for a function-pointer type."""
    return ", ".join(_CPP[kind] for _, kind in ARGS[direction])


def kinds(direction: str = "fwd") -> tuple[str, ...]:
    return tuple(kind for _, kind in ARGS[direction])
