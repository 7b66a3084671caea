"""Loading a variant's shared library and calling its launch function (ctypes, no extension build)."""
from __future__ import annotations

import _ctypes
import ctypes
from collections.abc import Sequence
from pathlib import Path

from dwgen import contract

_CTYPES = {"in": ctypes.c_void_p, "out": ctypes.c_void_p, "i64": ctypes.c_longlong}


class CudaLaunchError(RuntimeError):
    pass


def _error_name(code: int) -> str:
    try:
        rt = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)  # already loaded by torch: no new copy
        rt.cudaGetErrorName.restype = ctypes.c_char_p
        return (rt.cudaGetErrorName(code) or b"?").decode()
    except OSError:
        return "?"


class Library:
    """One variant's library: its launch function (the launch contract) or another exported launcher."""

    def __init__(self, path: str | Path, symbol: str, kinds: Sequence[str] = contract.kinds()):
        import torch

        torch.cuda.init()  # the library uses torch's CUDA runtime: load it and make its context current first
        torch.empty(1, device="cuda")
        self.path, self.symbol = str(path), symbol
        self._lib = ctypes.CDLL(self.path, mode=ctypes.RTLD_LOCAL)
        self._fn = getattr(self._lib, symbol)
        self._fn.argtypes = [_CTYPES[k] for k in kinds]
        self._fn.restype = ctypes.c_int
        self._kinds = tuple(kinds)

    def prepare(self, *values) -> Launch:
        """A launch with its arguments marshalled once; the stream is torch's current one at each call."""
        if len(values) != len(self._kinds) - 1:
            raise TypeError(f"{self.symbol} takes {len(self._kinds) - 1} arguments before the stream")
        return Launch(self, [_CTYPES[k](_raw(v)) for k, v in zip(self._kinds, values, strict=False)],
                      [v for v in values if hasattr(v, "data_ptr")])

    def workspace(self, symbol: str, *sizes: int) -> int:
        """What another exported host function of the library returns for these sizes: a backward variant's
        dwgen_workspace_<name>(B, C, L, Lout, P), the floats of scratch its launch needs (host code only)."""
        fn = getattr(self._lib, symbol)
        fn.argtypes = [ctypes.c_longlong] * len(sizes)
        fn.restype = ctypes.c_longlong
        return int(fn(*sizes))

    def unload(self) -> None:
        """Close the library now; a search loads thousands. Only after its last launch has finished."""
        if self._lib is not None:
            _ctypes.dlclose(self._lib._handle)
            self._lib = self._fn = None


class Launch:
    def __init__(self, lib: Library, args: list, tensors: list = ()):
        # The tensors whose addresses the arguments hold stay alive as long as the launch (a scratch buffer
        # made only for it, say).
        self.lib, self._args, self._tensors = lib, args, list(tensors)

    def __call__(self) -> None:
        import torch

        code = self.lib._fn(*self._args, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
        if code != 0:
            raise CudaLaunchError(f"launching {self.lib.symbol} failed: {_error_name(code)} ({code})")


def _raw(v):
    """A tensor's address (0 for None), or the int itself."""
    if v is None:
        return 0
    return v.data_ptr() if hasattr(v, "data_ptr") else int(v)
