"""The launch contract: the one argument list that every variant's host launch function takes.

It is rendered into each kernel source (the function the search loads and times), into the frozen
module's dispatcher (which calls the same functions), and read by the search's ctypes launcher; the grid
rule lives in the template beside the kernel, once.
"""
from __future__ import annotations

# (name, kind): pointers to x, w, b (null when there is no bias) and y; sizes; the stream to launch on.
LAUNCH_ARGS: tuple[tuple[str, str], ...] = (
    ("x", "in"), ("w", "in"), ("b", "in"), ("y", "out"),
    ("B", "i64"), ("C", "i64"), ("L", "i64"), ("Lout", "i64"), ("P", "i64"),
    ("stream", "out"),
)
_CPP = {"in": "const void*", "out": "void*", "i64": "long long"}


def launch_symbol(name: str) -> str:
    return f"dwgen_launch_{name}"


def cpp_params() -> str:
    """The C++ parameter list, e.g. 'const void* x, ..., void* stream'."""
    return ", ".join(f"{_CPP[kind]} {name}" for name, kind in LAUNCH_ARGS)


def cpp_types() -> str:
    """The C++ parameter types alone, for a function-pointer type."""
    return ", ".join(_CPP[kind] for _, kind in LAUNCH_ARGS)


def kinds() -> tuple[str, ...]:
    return tuple(kind for _, kind in LAUNCH_ARGS)
