"""The op's parameters: what one depthwise conv1d call computes, parsed, validated and keyed."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from dwgen.dtypes import DTYPES

KNOWN_DTYPES = tuple(DTYPES)
# Memory order of x and y: bcl is (B, C, L) contiguous; blc is (B, L, C) contiguous, the tensor passed
# as its (B, C, L) view x.transpose(1, 2), as Mamba-style blocks hold it.
LAYOUTS = ("bcl", "blc")
# What is applied to the convolution's result inside the kernels ("none": the result as it is).
ACTIVATIONS = ("none", "silu")


class ProblemError(ValueError):
    """A problem the user described that makes no sense or that dwgen cannot compute yet."""


_SHAPE_RE = re.compile(r"^\s*(\d+)\s*[xX]\s*(\d+)\s*[xX]\s*(\d+)\s*$")


def parse_shape(text: str) -> tuple[int, int, int]:
    """Parse 'BxCxL' such as '32x512x8192' into three ints."""
    m = _SHAPE_RE.match(text)
    if not m:
        raise ProblemError(f"malformed shape {text!r}: write it as BxCxL, e.g. 32x512x8192")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def causal_padding(kernel_size: int, dilation: int) -> int:
    """The left padding of a causal conv: every output sees its own position and the K-1 dilated ones before."""
    return dilation * (kernel_size - 1)


def conv_out_length(length: int, kernel_size: int, stride: int, padding: int, dilation: int,
                    padding_right: int | None = None) -> int:
    """Output length exactly as torch computes it for Conv1d (padding on both sides unless padding_right says
    otherwise: the length of F.conv1d on x padded by F.pad(x, (padding, padding_right)))."""
    right = padding if padding_right is None else padding_right
    return (length + padding + right - dilation * (kernel_size - 1) - 1) // stride + 1


@dataclass(frozen=True)
class Problem:
    """One depthwise conv1d: x (batch, channels, length) in `layout`'s memory order, weight (channels, 1, K).

    `padding` is the left padding; `padding_right` the right one, None meaning the same as the left (it is
    stored as that number, so equal problems compare and hash equal however they were written). Causal
    padding is dilation*(K-1) on the left and 0 on the right. `activation` is applied to the result (after
    the bias) inside the kernels: "none" or "silu"."""

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
    padding_right: int | None = None
    activation: str = "none"

    def __post_init__(self) -> None:
        if self.padding_right is None:
            object.__setattr__(self, "padding_right", self.padding)
        for name in ("batch", "channels", "length", "kernel_size", "stride", "dilation"):
            v = getattr(self, name)
            if type(v) is not int or v < 1:
                raise ProblemError(f"{name} must be a positive integer, got {v!r}")
        if type(self.padding) is not int or self.padding < 0:
            raise ProblemError(f"padding must be a non-negative integer, got {self.padding!r}")
        if type(self.padding_right) is not int or self.padding_right < 0:
            raise ProblemError(f"padding_right must be a non-negative integer or None, got {self.padding_right!r}")
        if self.activation not in ACTIVATIONS:
            raise ProblemError(f"unknown activation {self.activation!r}: choose one of {', '.join(ACTIVATIONS)}")
        if type(self.bias) is not bool:
            raise ProblemError(f"bias must be True or False, got {self.bias!r}")
        if self.dtype not in KNOWN_DTYPES:
            raise ProblemError(f"unknown dtype {self.dtype!r}: choose one of {', '.join(KNOWN_DTYPES)}")
        if self.layout not in LAYOUTS:
            raise ProblemError(f"unknown layout {self.layout!r}: choose one of {', '.join(LAYOUTS)}")
        if self.out_length < 1:
            raise ProblemError(
                f"no output: length {self.length} with padding {self.padding_text} is shorter than the "
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
        return conv_out_length(self.length, self.kernel_size, self.stride, self.padding, self.dilation,
                               self.padding_right)

    @property
    def halo(self) -> int:
        """How far a filter reaches past its first tap: (K - 1) * dilation inputs."""
        return causal_padding(self.kernel_size, self.dilation)

    @property
    def symmetric(self) -> bool:
        """The same padding on both sides (what F.conv1d's int padding means)."""
        return self.padding == self.padding_right

    @property
    def causal(self) -> bool:
        """dilation*(K-1) on the left, nothing on the right: output length L, each output sees no later input.
        (K = 1 pads nothing either way, which is symmetric too.)"""
        return self.padding == self.halo and self.padding_right == 0

    @property
    def paddings(self) -> tuple[int, int]:
        """(left, right): the op's pad_left and pad_right, F.pad's (left, right)."""
        return self.padding, self.padding_right

    @property
    def padding_text(self) -> str:
        """The padding as a person reads it: N when symmetric, else LEFT+RIGHT."""
        return str(self.padding) if self.symmetric else f"{self.padding}+{self.padding_right}"

    @property
    def padding_arg(self) -> int | str:
        """The padding as generated.depthwise_conv1d (and kernel_for, tune.py's --padding) take it: an int when
        symmetric, "causal" when causal; other asymmetric paddings reach the kernels only through the op's
        pad_left and pad_right (op_args)."""
        if self.symmetric:
            return self.padding
        if self.causal:
            return "causal"
        raise ProblemError(f"padding {self.padding_text} is neither symmetric nor causal: "
                           "depthwise_conv1d takes an int or 'causal'")

    @property
    def activation_arg(self) -> int:
        """The kernels' and the op's `act` argument: 0 none, 1 SiLU."""
        return ACTIVATIONS.index(self.activation)

    @property
    def call_kwargs(self) -> dict:
        """stride, padding, dilation and activation as generated.depthwise_conv1d and kernel_for take them."""
        return {"stride": self.stride, "padding": self.padding_arg, "dilation": self.dilation,
                "activation": None if self.activation == "none" else self.activation}

    @property
    def op_args(self) -> tuple[int, int, int, int, int]:
        """(stride, pad_left, pad_right, dilation, activation) as the registered ops
        dwgen::depthwise_conv1d and its backward take them after x, weight and bias."""
        return self.stride, self.padding, self.padding_right, self.dilation, self.activation_arg

    @property
    def elem_bytes(self) -> int:
        return DTYPES[self.dtype].bytes

    @property
    def min_bytes(self) -> int:
        """Bytes the op must move: input read once, output written once (weights and bias are noise)."""
        return (self.rows * (self.length + self.out_length)) * self.elem_bytes

    @property
    def key(self) -> str:
        """Canonical, filename-safe key: equal problems have equal keys, different ones differ. A symmetric
        problem without activation keeps the key it had before either existed (studies, manifests and
        results are found by it); `_pr<N>` names a right padding that differs from the left, `_silu` SiLU."""
        return (
            f"{self.batch}x{self.channels}x{self.length}_k{self.kernel_size}_s{self.stride}"
            f"_p{self.padding}_d{self.dilation}_{self.dtype}_{self.layout}_{'bias' if self.bias else 'nobias'}"
            + ("" if self.symmetric else f"_pr{self.padding_right}")
            + ("" if self.activation == "none" else f"_{self.activation}")
        )

    def to_dict(self) -> dict:
        return asdict(self)


def other_activation(p: Problem) -> str:
    """The activation p does not have ("silu" for "none" and back): a launch function takes either at run time,
    so the checks run both."""
    return "silu" if p.activation == "none" else "none"
