"""The layer: DepthwiseConv1d, a drop-in for nn.Conv1d(C, C, K, groups=C) on dwgen's kernels, and swap_conv1d.

Written by dwgen's freeze step to generated/layers.py (from dwgen/frozen_layers.py); do not edit there.
Needs only torch. The functional op comes from the package this file sits in (generated/), looked up at
the first forward, so importing this module never depends on how far generated/__init__.py has got.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

_PADDING_NAMES = ("same", "causal")
_ACTIVATIONS = (None, "silu")
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_op = None


def _functional():
    """generated.depthwise_conv1d, imported once (a module-level import would be circular: __init__ imports us)."""
    global _op
    if _op is None:
        from . import depthwise_conv1d

        _op = depthwise_conv1d
    return _op


def _is_int(v, low: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= low


class DepthwiseConv1d(nn.Module):
    """nn.Conv1d(channels, channels, kernel_size, groups=channels, ...) on dwgen's kernels.

    Its parameters and state_dict are exactly nn.Conv1d's (`weight` (C, 1, K), `bias` (C,)), initialised
    the same way, so state dicts load both ways and a seeded model starts from the same numbers.
    `padding` is an int (both sides), "same" (stride 1; PyTorch's split) or "causal" (dilation*(K-1) on
    the left only: the output has the input's length, with no extra outputs and no slice).
    `activation="silu"` returns silu(conv(x) + bias), fused into the kernels forward and backward.
    It is an nn.Module, not an nn.Conv1d subclass: code that finds nn.Conv1d by isinstance reads
    `padding` as the same on both sides, which "causal" is not.
    """

    def __init__(self, channels: int, kernel_size: int, stride: int = 1, padding: int | str = 0,
                 dilation: int = 1, bias: bool = True, activation: str | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        for name, v in (("channels", channels), ("kernel_size", kernel_size), ("stride", stride),
                        ("dilation", dilation)):
            if not _is_int(v, 1):
                raise ValueError(f"DepthwiseConv1d: {name} must be an int >= 1, got {v!r}")
        if not (_is_int(padding, 0) or padding in _PADDING_NAMES):
            raise ValueError(f"DepthwiseConv1d: padding must be an int >= 0, 'same' or 'causal', got {padding!r}")
        if padding == "same" and stride != 1:
            raise ValueError(f"DepthwiseConv1d: padding='same' needs stride 1 (as in nn.Conv1d), got stride {stride}")
        if activation not in _ACTIVATIONS:
            raise ValueError(f"DepthwiseConv1d: activation must be None or 'silu', got {activation!r}")
        self.channels = channels
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self.activation = activation
        factory = {"device": device, "dtype": dtype}
        # Created in nn.Conv1d's order (weight, then bias, then reset_parameters), so a seeded model matches.
        self.weight = nn.Parameter(torch.empty((channels, 1, kernel_size), **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(channels, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """nn.Conv1d's initialisation: kaiming_uniform_(a=sqrt(5)) for the weight, U(+-1/sqrt(K)) for the bias."""
        with torch.no_grad():
            nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
            if self.bias is not None:
                bound = 1 / math.sqrt(self.kernel_size)  # fan_in = in_channels / groups * K = K
                nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _functional()(x, self.weight, self.bias, stride=self.stride, padding=self.padding,
                             dilation=self.dilation, activation=self.activation)

    def extra_repr(self) -> str:
        s = f"{self.channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != 0:
            s += f", padding={self.padding}"
        if self.dilation != 1:
            s += f", dilation={self.dilation}"
        if self.bias is None:
            s += ", bias=False"
        if self.activation is not None:
            s += f", activation={self.activation}"
        return s

    @classmethod
    def from_conv1d(cls, conv: nn.Conv1d, activation: str | None = None) -> DepthwiseConv1d:
        """The same convolution as `conv`, sharing its Parameter objects (not copies), so an optimizer that
        holds them keeps training the new module. `activation="silu"` adds SiLU after it: drop the caller's
        own SiLU then. Raises ValueError, in one line, for a conv it cannot stand in for, saying why."""
        why = _ineligible(conv)
        if why is not None:
            raise ValueError(f"DepthwiseConv1d.from_conv1d: {why}")
        padding = conv.padding if isinstance(conv.padding, str) else conv.padding[0]
        m = cls(conv.in_channels, conv.kernel_size[0], conv.stride[0], 0 if padding == "valid" else padding,
                conv.dilation[0], bias=conv.bias is not None, activation=activation, device="meta",
                dtype=conv.weight.dtype)  # meta: nothing allocated or drawn; the conv's parameters go in below
        m.weight = conv.weight
        if conv.bias is not None:
            m.bias = conv.bias
        return m.train(conv.training)


def _ineligible(conv) -> str | None:
    """Why DepthwiseConv1d cannot stand in for this module, or None when it can."""
    if not isinstance(conv, nn.Conv1d):
        return f"expected an nn.Conv1d, got {type(conv).__name__}"
    if type(conv) is not nn.Conv1d:
        return f"{type(conv).__name__} subclasses nn.Conv1d and may compute something else; only nn.Conv1d is replaced"
    if conv._forward_pre_hooks or conv._forward_hooks:
        return "it has forward hooks (weight_norm, spectral_norm, ...), which a replacement would drop"
    c, groups = conv.in_channels, conv.groups
    if not (groups == c == conv.out_channels):
        return (f"not depthwise: in_channels={c}, out_channels={conv.out_channels}, groups={groups}; "
                "DepthwiseConv1d needs groups == in_channels == out_channels")
    if conv.padding_mode != "zeros":
        return f"padding_mode={conv.padding_mode!r}; DepthwiseConv1d pads with zeros only"
    if conv.weight.dtype not in _DTYPES:
        return f"its weight is {conv.weight.dtype}; dwgen's kernels are float32, float16 and bfloat16"
    return None


@dataclass
class SwapReport:
    """What swap_conv1d did: the names it replaced, and each nn.Conv1d it left with the reason."""

    replaced: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"swap_conv1d: replaced {len(self.replaced)} nn.Conv1d with DepthwiseConv1d, "
                 f"left {len(self.skipped)}"]
        lines += [f"  replaced {name}" for name in self.replaced]
        lines += [f"  left     {name or '(the model itself)'}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def swap_conv1d(model: nn.Module) -> SwapReport:
    """Replace every eligible nn.Conv1d inside `model`, in place, by DepthwiseConv1d.from_conv1d of it.

    The replacements share the convs' parameters, so the state_dict, its keys and an optimizer built
    before the swap are unchanged. A conv reached under several names gets one replacement, shared the
    same way. The model itself is never replaced (there is nothing to replace it in)."""
    report = SwapReport()
    if isinstance(model, nn.Conv1d):
        report.skipped.append(("", "the model itself is the conv: use DepthwiseConv1d.from_conv1d(model)"))
    swaps = []  # (parent, attribute name, dotted name, conv), collected before anything changes
    for parent_name, parent in model.named_modules(remove_duplicate=False):
        for child_name, child in parent.named_children():
            if isinstance(child, nn.Conv1d):
                swaps.append((parent, child_name, f"{parent_name}.{child_name}" if parent_name else child_name, child))
    made: dict[int, nn.Module] = {}
    for parent, child_name, name, conv in swaps:
        if id(conv) not in made:
            why = _ineligible(conv)
            if why is not None:
                report.skipped.append((name, why))
                continue
            made[id(conv)] = DepthwiseConv1d.from_conv1d(conv)
        setattr(parent, child_name, made[id(conv)])
        report.replaced.append(name)
    return report
