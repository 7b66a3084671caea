"""The op's parameters: what one depthwise conv1d call computes, parsed, validated and keyed."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dwgen.dtypes import DTYPES

KNOWN_DTYPES = tuple(DTYPES)
# Memory order of x and y: bcl is (B, C, L) contiguous; blc is (B, L, C) contiguous, the tensor passed
# as its (B, C, L) view x.transpose(1, 2), as Mamba-style blocks hold it.
LAYOUTS = ("bcl", "blc")


class ProblemError(ValueError):
    """A problem the user described that makes no sense or that dwgen cannot compute yet."""


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int, int]:
    """Parse 'BxCxL' such as '32x512x8192' into three ints."""
    m = _SHAPE_RE.match(text)
    if not m:
        raise ProblemError(f"malformed shape {text!r}: write it as BxCxL, e.g. 32x512x8192")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def conv_out_length(length: int, kernel_size: int, stride: int, padding: int, dilation: int) -> int:
    """Output length exactly as torch computes it for Conv1d."""
    return (length + 2 * padding - dilation * (kernel_size - 1) - 1) // stride + 1


@dataclass(frozen=True)
class Problem:
    """One depthwise conv1d: x (batch, channels, length) in `layout`'s memory order, weight (channels, 1, K)."""

    batch: int
    channels: int
    length: int
    kernel_size: int = 3
    stride: int = 1
    padding: int = 1
    dilation: int = 1
    dtype: str = "fp32"
    bias: bool = False
    layout: str = "bcl"

    def __post_init__(self) -> None:
        for name in ("batch", "channels", "length", "kernel_size", "stride", "dilation"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ProblemError(f"{name} must be a positive integer, got {v!r}")
        if type(self.padding) is not int or self.padding < 0:
            raise ProblemError(f"padding must be a non-negative integer, got {self.padding!r}")
        if type(self.bias) is not bool:
            raise ProblemError(f"bias must be True or False, got {self.bias!r}")
        if self.dtype not in KNOWN_DTYPES:
            raise ProblemError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(KNOWN_DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ProblemError(f"unknown layout {self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if self.out_length < 1:
            raise ProblemError(
                f"no output: length {self.length} with padding {self.padding} is shorter than the "
                f"dilated kernel ({self.dilation * (self.kernel_size - 1) + 1}); raise --padding or the length"
            )
        if self.rows * max(self.length, self.out_length) >= 2**31:
            raise ProblemError("problem has 2**31 or more elements; split the batch into smaller calls")

    @classmethod
    def from_shape(cls, shape: str, **kw) -> Problem:
        b, c, n = parse_shape(shape)
        return cls(batch=b, channels=c, length=n, **kw)

    @property
    def rows(self) -> int:
        return self.batch * self.channels

    @property
    def out_length(self) -> int:
        return conv_out_length(self.length, self.kernel_size, self.stride, self.padding, self.dilation)

    @property
    def elem_bytes(self) -> int:
        return DTYPES[self.dtype].bytes

    @property
    def min_bytes(self) -> int:
        """Bytes the op must move: input read once, output written once (weights and bias are noise)."""
        return (self.rows * (self.length + self.out_length)) * self.elem_bytes

    @property
    def key(self) -> str:
        """Canonical, filename-safe key: equal problems have equal keys, different ones differ."""
        return (
            f"{self.batch}x{self.channels}x{self.length}_k{self.kernel_size}_s{self.stride}"
            f"_p{self.padding}_d{self.dilation}_{self.dtype}_{self.layout}_{'bias' if self.bias else 'nobias'}"
        )

    def to_dict(self) -> dict:
        return asdict(self)
