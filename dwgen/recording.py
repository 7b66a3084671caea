"""dwgen.record: the depthwise conv1d problems a model runs, written as a suite file that tune.py --suite takes.

    with dwgen.record("my-model.suite", conv1d=True):
        model(example)
    # then: python tune.py --suite my-model.suite

Inside the context, every call of generated.depthwise_conv1d (and, with conv1d=True, every depthwise call of
torch.nn.functional.conv1d, which nn.Conv1d goes through) is recorded from its tensors; the call itself runs
unchanged and returns what it would have. The hooks are process-wide for the duration of the context.
"""
from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dwgen.problem import Problem, ProblemError, causal_padding
from dwgen.suite import DILATIONS, KERNEL_SIZES, STRIDES

_DTYPE_NAMES = {"torch.float32": "fp32", "torch.float16": "fp16", "torch.bfloat16": "bf16"}


class Recorder:
    """What one record() context saw: problems with their call counts, and skipped calls by reason."""

    def __init__(self) -> None:
        self.calls: Counter[Problem] = Counter()
        self.skipped: Counter[str] = Counter()

    def see(self, x, weight, bias, stride, padding, dilation, groups: int | None = None, activation=None) -> None:
        found = problem_of(x, weight, bias, stride, padding, dilation, groups, activation)
        if isinstance(found, Problem):
            self.calls[found] += 1
        elif found:
            self.skipped[found] += 1

    def suite_text(self) -> str:
        lines = [f"# recorded by dwgen.record: {len(self.calls)} problem(s) from "
                 f"{sum(self.calls.values())} call(s); tune them with: python tune.py --suite FILE"]
        lines += [f"{suite_line(p)}  # {n} call(s)" for p, n in self.calls.items()]
        lines += [f"# skipped {n} call(s): {why}" for why, n in self.skipped.items()]
        return "\n".join(lines) + "\n"


def _one(v) -> int | str | None:
    """conv1d's stride, padding and dilation come as an int, a 1-tuple (nn.Conv1d's) or a padding string."""
    if isinstance(v, (tuple, list)):
        return v[0] if len(v) == 1 else None
    return v


def problem_of(x, weight, bias, stride, padding, dilation, groups: int | None = None,
               activation=None) -> Problem | str:
    """The Problem a depthwise conv1d call computes (padding "causal" and activation "silu" included, as
    generated.depthwise_conv1d takes them), or why it is not one dwgen tunes ('' when it is not a depthwise
    call at all, which is not worth a note)."""
    import torch

    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor) or x.dim() != 3 or weight.dim() != 3:
        return ""
    channels = x.shape[1]
    if groups is not None and not (groups == channels == weight.shape[0] and weight.shape[1] == 1):
        return ""  # an ordinary or grouped conv1d: not dwgen's op
    if weight.shape[0] != channels or weight.shape[1] != 1:
        return ""
    k = weight.shape[2]
    stride, padding, dilation = _one(stride), _one(padding), _one(dilation)
    if activation is not None and activation != "silu":
        return f"activation {activation!r}: dwgen fuses none or 'silu'"
    right = None  # the same as the left
    total = causal_padding(k, dilation if isinstance(dilation, int) else 1)  # (K-1)*dilation, padded in all
    if padding == "valid":
        padding = 0
    elif padding == "causal":
        padding, right = total, 0
    elif padding == "same":
        # torch splits the total evenly when it can; an odd total pads one side more, which tune.py's
        # --padding (an int, 'same' for odd K, or 'causal') does not describe
        if total % 2:
            return (f"padding 'same' with an odd total padding ({total}): tune.py takes symmetric or causal "
                    "padding only")
        padding = total // 2
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (stride, padding, dilation)):
        return f"stride, padding or dilation not one integer ({stride!r}, {padding!r}, {dilation!r})"
    dtype = _DTYPE_NAMES.get(str(x.dtype))
    if dtype is None:
        return f"dtype {x.dtype}: dwgen has kernels for float32, float16 and bfloat16"
    if x.is_contiguous():
        layout = "bcl"
    elif x.transpose(1, 2).is_contiguous():
        layout = "blc"
    else:
        return "x neither (B, C, L) contiguous nor a (B, L, C) tensor viewed as (B, C, L)"
    for name, v, (lo, hi) in (("K", k, KERNEL_SIZES), ("stride", stride, STRIDES), ("dilation", dilation, DILATIONS)):
        if not lo <= v <= hi:
            return f"{name} {v} is outside what tune.py takes ({lo} to {hi})"
    try:
        return Problem(x.shape[0], channels, x.shape[2], kernel_size=k, stride=stride, padding=padding,
                       padding_right=right, dilation=dilation, dtype=dtype, bias=bias is not None, layout=layout,
                       activation=activation or "none")
    except ProblemError as e:
        return str(e)


def suite_line(p: Problem) -> str:
    """One line of a suite file, in tune.py's problem flags (its padding an int or causal)."""
    return (f"--shape {p.batch}x{p.channels}x{p.length} --kernel-size {p.kernel_size} --stride {p.stride} "
            f"--padding {p.padding_arg} --dilation {p.dilation} --dtype {p.dtype} --layout {p.layout}"
            + (" --bias" if p.bias else "") + ("" if p.activation == "none" else f" --activation {p.activation}"))


@contextmanager
def record(path: str | Path, conv1d: bool = False) -> Iterator[Recorder]:
    """Record the depthwise conv1d problems run inside the context; on leaving it, write them to `path`."""
    import torch.nn.functional as F

    rec = Recorder()
    restore: list[tuple[object, str, object]] = []
    generated = _generated()
    if generated is not None:
        validate = generated._validate
        entry = generated._call_checked.__code__

        # Hooked at the check of the checked path, which every depthwise_conv1d call takes while recording
        # (_FAST off), not at depthwise_conv1d itself: a model that did `from generated import
        # depthwise_conv1d` holds the function, not the module's name, and would pass a replaced name by.
        # kernel_for also checks its arguments: only calls that come from depthwise_conv1d are recorded.
        def checked(x, weight, bias, stride, padding, dilation, activation=None, meta=False):
            if sys._getframe(1).f_code is entry:
                rec.see(x, weight, bias, stride, padding, dilation, activation=activation)
            return validate(x, weight, bias, stride, padding, dilation, activation, meta=meta)

        restore.append((generated, "_validate", validate))
        restore.append((generated, "_FAST", generated._FAST))
        generated._validate = checked
        generated._FAST = False
    if conv1d:
        conv = F.conv1d

        def conv1d_recorded(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
            rec.see(input, weight, bias, stride, padding, dilation, groups)
            return conv(input, weight, bias, stride, padding, dilation, groups)

        restore.append((F, "conv1d", conv))
        F.conv1d = conv1d_recorded
    try:
        yield rec
    finally:
        for module, name, original in reversed(restore):
            setattr(module, name, original)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(rec.suite_text())


def _generated():
    """The frozen module when it can be imported (it is optional for recording nn.Conv1d layers)."""
    try:
        import generated
    except ImportError:
        return None
    return generated
