"""Frozen dwgen kernels: depthwise_conv1d, tuned for the problems in manifest.json, generic elsewhere.

Written by dwgen's freeze step (from dwgen/frozen_dispatch.py); do not edit. Needs only torch, plus nvcc
and ninja for the first build, which compiles every kernel source as its own unit, in parallel, and which
torch caches by content.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import torch

_HERE = Path(__file__).resolve().parent
MANIFEST: dict = json.loads((_HERE / "manifest.json").read_text()) if (_HERE / "manifest.json").exists() else {}
_KEY_FIELDS = ("batch", "channels", "length", "kernel_size", "stride", "padding", "dilation", "dtype", "bias",
               "layout")
_KERNELS = {k["name"]: (i, k) for i, k in enumerate(MANIFEST.get("kernels", []))}
# Tuned problems first: an exact match runs the kernel tuned for it.
_TUNED = {tuple(e["problem"][f] for f in _KEY_FIELDS): e["kernel"] for e in MANIFEST.get("entries", [])}
# Then the fast generic kernels, one per (dtype, layout, K), for stride 1 and dilation 1.
_FAST = MANIFEST.get("generic", {}).get("fast", {})
_DTYPES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_INT32_LIMIT = 2**31

_ext = None
_lock = threading.Lock()


def _sources() -> list[str]:
    files = ([k["file"] for k in MANIFEST["kernels"]] + [r["file"] for r in MANIFEST["generic"]["scalar"].values()]
             + [MANIFEST["launcher"]])
    return [str(_HERE / f) for f in files]


def build(verbose: bool = False):
    """Compile (once, cached by torch by content) and return the extension holding the kernels."""
    global _ext
    if _ext is not None:  # every call comes here: no lock once built
        return _ext
    with _lock:
        if _ext is not None:
            return _ext
        if not MANIFEST:
            raise RuntimeError("dwgen: generated/manifest.json is missing; run `python tune.py` to create it")
        sources = _sources()
        h = hashlib.sha256()
        for path in sources:
            h.update(Path(path).read_bytes())
        # torch reads CUDA_HOME when cpp_extension is first imported; a bare `which nvcc` can mislead it.
        if "CUDA_HOME" not in os.environ and os.path.exists("/usr/local/cuda/bin/nvcc"):
            os.environ["CUDA_HOME"] = "/usr/local/cuda"
        from torch.utils.cpp_extension import load

        arch_before = os.environ.get("TORCH_CUDA_ARCH_LIST")
        if arch_before is None:  # build for this GPU only (or Hopper when there is none, as in CI)
            cap = torch.cuda.get_device_capability() if torch.cuda.is_available() else (9, 0)
            os.environ["TORCH_CUDA_ARCH_LIST"] = f"{cap[0]}.{cap[1]}"
        try:
            _ext = load(
                name=f"dwgen_generated_{h.hexdigest()[:16]}",
                sources=sources,
                extra_cuda_cflags=list(MANIFEST["nvcc_flags"]),
                build_directory=os.environ.get("DWGEN_BUILD_DIR") or None,
                verbose=verbose,
            )
        finally:
            if arch_before is None:
                del os.environ["TORCH_CUDA_ARCH_LIST"]
        return _ext


def _layout(x: torch.Tensor) -> str | None:
    """bcl when x is (B, C, L) contiguous, blc when it is a (B, L, C) tensor viewed as (B, C, L), else None."""
    if x.is_contiguous():
        return "bcl"
    if x.transpose(1, 2).is_contiguous():
        return "blc"
    return None


def _validate(x, weight, bias, stride, padding, dilation) -> int:
    """The output length, or one line saying what is wrong (the device is checked last, so every other
    mistake reads the same whether or not the tensors are on the GPU)."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3:
        raise ValueError("dwgen: x must be a (batch, channels, length) tensor")
    # No backward yet: a result cut off from autograd would train silently wrong, so refuse instead.
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in (x, weight, bias)):
        raise RuntimeError("dwgen: depthwise_conv1d has no backward yet and would return a detached result; "
                           "call it under torch.no_grad() or use F.conv1d where gradients are needed")
    if x.dtype not in _DTYPES:
        raise TypeError(f"dwgen: x must be float32, float16 or bfloat16, got {x.dtype}")
    channels = x.shape[1]
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3 or weight.shape[0] != channels or weight.shape[1] != 1:
        raise ValueError(f"dwgen: weight must have shape ({channels}, 1, K) for depthwise conv, "
                         f"got {tuple(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if weight.shape[2] < 1:
        raise ValueError("dwgen: weight has K = 0 taps; a convolution needs at least one")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (channels,)):
        raise ValueError(f"dwgen: bias must have shape ({channels},) or be None")
    for t in (weight, bias):
        if t is not None and (t.device != x.device or t.dtype != x.dtype):
            raise ValueError(f"dwgen: weight and bias must be {x.dtype} on {x.device}, like x")
    for name, v, low in (("stride", stride, 1), ("padding", padding, 0), ("dilation", dilation, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"dwgen: {name} must be an int >= {low}, got {v!r}")
    k = weight.shape[2]
    out_length = (x.shape[2] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    if out_length < 1:
        raise ValueError(f"dwgen: no output for length {x.shape[2]}, kernel {k}, padding {padding}, "
                         f"dilation {dilation}; raise padding or the length")
    if not x.is_cuda:
        raise ValueError("dwgen: x must be on a CUDA device; move it with x.cuda()")
    return out_length


def _choose(x, layout, k: int, has_bias: bool, stride: int, padding: int, dilation: int, out_length: int):
    """The specialised kernel for this call, or None for the generic path that handles everything."""
    if layout is None:
        return None
    dtype = _DTYPES[x.dtype]
    name = _TUNED.get((*x.shape, k, stride, padding, dilation, dtype, has_bias, layout))
    if name is None and stride == 1 and dilation == 1:
        name = _FAST.get(f"{dtype}_{layout}_k{k}")
    if name is None or max(x.numel(), x.shape[0] * x.shape[1] * out_length) >= _INT32_LIMIT:
        return None
    index, kernel = _KERNELS[name]
    if x.shape[1] % kernel["channel_multiple"] != 0:
        return None
    # A (B, C, L) kernel reads from the vector boundary before a misaligned view (x[..., 1:]); a (B, L, C)
    # one needs x on a vector boundary.
    align = x.element_size() if kernel["peels_misalignment"] else kernel["align_bytes"]
    if x.data_ptr() % align != 0:
        return None
    return index, name


def _empty_output(x: torch.Tensor, layout: str | None, out_length: int) -> torch.Tensor:
    """The result in x's memory order: a (B, L, C) input gets a (B, L, C) output, viewed as (B, C, L)."""
    batch, channels, _ = x.shape
    if layout == "blc":
        return torch.empty((batch, out_length, channels), device=x.device, dtype=x.dtype).transpose(1, 2)
    return torch.empty((batch, channels, out_length), device=x.device, dtype=x.dtype)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t itself when it starts on a 16-byte boundary (kernels read weights and bias as vectors), else a copy."""
    return t if t.data_ptr() % 16 == 0 else t.clone()


def kernel_for(x, weight, bias=None, stride=1, padding=0, dilation=1) -> str:
    """Name of the kernel depthwise_conv1d would run for these arguments."""
    out_length = _validate(x, weight, bias, stride, padding, dilation)
    chosen = _choose(x, _layout(x), weight.shape[2], bias is not None, stride, padding, dilation, out_length)
    return chosen[1] if chosen else MANIFEST["generic"]["scalar"][_DTYPES[x.dtype]]["name"]


def depthwise_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                     stride: int = 1, padding: int = 0, dilation: int = 1) -> torch.Tensor:
    """F.conv1d(x, weight, bias, stride, padding, dilation, groups=channels), on dwgen's kernels.

    x may be (B, C, L) contiguous or a (B, L, C) tensor viewed as (B, C, L); the result has x's memory order.
    Any other strides are read as they are by the generic kernel, which writes a (B, C, L) result."""
    out_length = _validate(x, weight, bias, stride, padding, dilation)
    layout = _layout(x)
    y = _empty_output(x, layout, out_length)
    if y.numel() == 0:
        return y
    k = weight.shape[2]
    chosen = _choose(x, layout, k, bias is not None, stride, padding, dilation, out_length)
    weight = _aligned(weight.contiguous())
    bias = _aligned(bias.contiguous()) if bias is not None else None
    ext = build()
    if chosen is not None:  # the launchers set x's device themselves
        ext.launch(chosen[0], x, weight, bias, y, padding)
    else:
        ext.launch_any(x, weight, bias, y, k, stride, padding, dilation)
    return y
