"""The one table of element types: storage, accumulation, vector types and tolerances (C++ names live here only)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """How one element type is stored, converted, vectorised and checked."""

    name: str  # the user-facing name: fp32, fp16, bf16
    token: str  # its token in a variant name
    torch_name: str  # attribute of torch: torch.float32, ...
    bytes: int
    storage: str  # C++ storage type
    bits: str  # C++ type of the same size that __ldg reads natively (the raw bits of one element)
    aten_scalar: str  # its c10::ScalarType name (torch::kFloat, ...)
    accumulate: str  # C++ accumulation type (always float: 16-bit sums lose too much)
    header: str  # what a kernel must include to use the storage type
    to_float: str  # C++ conversion storage -> float ("" for none)
    from_float: str  # C++ conversion float -> storage (round to nearest)
    vector_types: tuple[tuple[int, str], ...]  # (elements per access, C++ type of that access)
    # Largest error of one output against the float64 reference, relative to the sum of |x|*|w| it adds
    # up: the storage format's unit roundoff for the final rounding (16-bit), plus fp32 summation.
    tolerance: float
    # Below the smallest normal number the format's steps are absolute: an output there may miss by half
    # a step whatever its size (fp16's subnormal step is 2**-24; seen on K1 outputs near 4e-5).
    absolute_floor: float = 0.0
    # The stored bits are the top half of the float's (bf16): widening one element of a 32-bit word is a
    # shift or a mask, one instruction, where extracting it first takes two.
    top_half: bool = False

    @property
    def max_vec(self) -> int:
        """Elements in one 16-byte access."""
        return 16 // self.bytes

    def vector_type(self, vec: int) -> str:
        return dict(self.vector_types)[vec]


_HALF_VECTORS = ((1, "unsigned short"), (2, "unsigned int"), (4, "uint2"), (8, "uint4"))  # raw 16-bit lanes

DTYPES: dict[str, DType] = {
    "fp32": DType("fp32", "f32", "float32", 4, "float", "float", "Float", "float", "", "", "",
                  ((1, "float"), (2, "float2"), (4, "float4")), 1e-5),
    "fp16": DType("fp16", "f16", "float16", 2, "__half", "unsigned short", "Half", "float", "cuda_fp16.h",
                  "__half2float", "__float2half_rn", _HALF_VECTORS, 2.0**-11 + 1e-5, 2.0**-24),
    "bf16": DType("bf16", "bf16", "bfloat16", 2, "__nv_bfloat16", "unsigned short", "BFloat16", "float",
                  "cuda_bf16.h", "__bfloat162float", "__float2bfloat16_rn", _HALF_VECTORS, 2.0**-8 + 1e-5,
                  top_half=True),
}


def torch_dtype(name: str):
    import torch

    return getattr(torch, DTYPES[name].torch_name)


def dtype_name(torch_dtype_) -> str | None:
    """fp32/fp16/bf16 for a torch dtype, None for any other."""
    return next((d.name for d in DTYPES.values() if str(torch_dtype_) == f"torch.{d.torch_name}"), None)
