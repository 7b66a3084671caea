"""Loading cubins and launching their kernels through the CUDA driver API (ctypes, no extension build)."""
from __future__ import annotations

import ctypes
from pathlib import Path

_lib = None


class CudaDriverError(RuntimeError):
    pass


def _driver():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise CudaDriverError("libcuda.so.1 not found: this needs an NVIDIA GPU and its driver") from e
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuModuleUnload.argtypes = [ctypes.c_void_p]
        lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p)]
        lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        lib.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
            ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        _lib = lib
    return _lib


def _check(code: int, what: str) -> None:
    if code != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(code, ctypes.byref(name))
        raise CudaDriverError(f"{what} failed: {(name.value or b'?').decode()} ({code})")


class Kernel:
    """One __global__ function of a loaded cubin, launched on torch's current stream."""

    def __init__(self, cubin: str | Path, name: str):
        import torch

        torch.cuda.init()
        torch.empty(1, device="cuda")  # makes torch's primary context current on this thread
        self._image = Path(cubin).read_bytes()  # the driver reads it during the load; keep it alive
        self._module = ctypes.c_void_p()
        _check(_driver().cuModuleLoadData(ctypes.byref(self._module), self._image), f"loading {cubin}")
        self._func = ctypes.c_void_p()
        _check(_driver().cuModuleGetFunction(ctypes.byref(self._func), self._module, name.encode()),
               f"finding {name}")
        self.name = name

    def resident_blocks(self, threads: int) -> int:
        """Blocks of this kernel one SM holds at once, as the driver computes it (registers, shared memory)."""
        n = ctypes.c_int()
        _check(_driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(n), self._func, threads, 0),
               f"occupancy of {self.name}")
        return max(1, n.value)

    def unload(self) -> None:
        """Free the module now; a search loads thousands and the driver keeps each until told."""
        if self._module:
            _check(_driver().cuModuleUnload(self._module), f"unloading {self.name}")
            self._module = ctypes.c_void_p()
            self._func = ctypes.c_void_p()

    def prepare(self, grid: int, block: int, args: list) -> Launch:
        return Launch(self, grid, block, args)


class Launch:
    """A launch with its arguments marshalled once, so repeating it costs one driver call."""

    def __init__(self, kernel: Kernel, grid: int, block: int, args: list):
        self.kernel, self.grid, self.block = kernel, grid, block
        self._args = args  # ctypes values; the pointer array below points into them
        self._params = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])

    def __call__(self) -> None:
        import torch

        stream = torch.cuda.current_stream().cuda_stream
        _check(_driver().cuLaunchKernel(self.kernel._func, self.grid, 1, 1, self.block, 1, 1, 0,
                                        ctypes.c_void_p(stream), self._params, None),
               f"launching {self.kernel.name}")


def ptr(t) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() if t is not None else 0)


def i32(v: int) -> ctypes.c_int:
    return ctypes.c_int(v)
