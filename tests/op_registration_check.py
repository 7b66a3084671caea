"""Run by tests/test_generated.py in a fresh process after building generated/ on a machine without a GPU:
the ops are registered, CPU tensors get the one-line error from C++ (through the op and through the direct
binding), and the fake implementations give the shapes and memory orders the CUDA kernels produce."""
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import generated

ext = generated.build()
assert hasattr(ext, "forward") and hasattr(ext, "install") and hasattr(ext, "launch_backward")
op, op_bwd = torch.ops.dwgen.depthwise_conv1d, torch.ops.dwgen.depthwise_conv1d_backward
x, w = torch.randn(2, 8, 100), torch.randn(8, 1, 4)
for call in (lambda: op(x, w, None, 1, 3, 0, 1, 1), lambda: ext.forward(x, w, None, 1, 3, 0, 1, 1),
             lambda: op_bwd(torch.randn(2, 8, 100), x, w, None, 1, 3, 0, 1, 0)):
    try:
        call()
        raise AssertionError("a CPU tensor was accepted")
    except ValueError as e:
        assert str(e) == "dwgen: x must be on a CUDA device; move it with x.cuda()", str(e)
try:
    op(x, torch.randn(8, 2, 4), None, 1, 1, 1, 1, 0)
    raise AssertionError("a wrong weight shape was accepted")
except ValueError as e:
    assert str(e).startswith("dwgen: weight must have shape (8, 1, K)") and "\n" not in str(e), str(e)

# The direct bindings read their arguments by hand: a wrong type is a TypeError the Python side explains.
for name in ("forward", "call_op"):
    for bad in ((x, w, None, 1.5, 1, 1, 1, 0), (x, w, None, True, 1, 1, 1, 0), (x, "w", None, 1, 1, 1, 1, 0),
                (x, w, None, 1, 1, 1, 1), (x, w, None, 1, 1, 1, 1, 2**70)):
        try:
            getattr(ext, name)(*bad)
            raise AssertionError(f"{name}{bad!r} was accepted")
        except TypeError as e:
            assert str(e).startswith(f"{name}(x, weight, bias, stride"), str(e)
try:
    generated.depthwise_conv1d(x, w, None, True, 1)
    raise AssertionError("stride=True was accepted")
except ValueError as e:
    assert str(e) == "dwgen: stride must be an int >= 1, got True", str(e)

with FakeTensorMode() as mode:
    xb = mode.from_tensor(torch.randn(2, 8, 100))
    xl = mode.from_tensor(torch.randn(2, 100, 8)).transpose(1, 2)
    wf, bf = mode.from_tensor(w), mode.from_tensor(torch.randn(8))
    y = op(xb, wf, bf, 1, 3, 0, 1, 1)  # causal: length L
    assert tuple(y.shape) == (2, 8, 100) and y.is_contiguous()
    y = op(xl, wf, None, 2, 1, 1, 2, 0)  # (B, L, C) in, (B, L, C) out
    assert tuple(y.shape) == (2, 8, (100 + 2 - 2 * 3 - 1) // 2 + 1) and y.transpose(1, 2).is_contiguous()
    gx, gw, gb = op_bwd(mode.from_tensor(torch.randn(2, 100, 8)).transpose(1, 2), xl, wf, None, 1, 3, 0, 1, 0)
    assert tuple(gx.shape) == (2, 8, 100) and gx.transpose(1, 2).is_contiguous()
    assert tuple(gw.shape) == (8, 1, 4) and tuple(gb.shape) == (8,)

# Calls with gradients reach the op through the C++ dispatcher (ext.call_op): on meta tensors (the fake
# implementations serve the Meta key) that path records the op's autograd node and runs its backward. The
# first call of a process takes the checked path, which loads the op (and refuses non-CUDA tensors itself).
generated._load_op()
xm = torch.randn(2, 8, 100, device="meta", requires_grad=True)
wm = torch.randn(8, 1, 4, device="meta", requires_grad=True)
bm = torch.randn(8, device="meta", requires_grad=True)
y = generated.depthwise_conv1d(xm, wm, bm, 1, "causal", activation="silu")
assert tuple(y.shape) == (2, 8, 100) and y.grad_fn is not None and y.grad_fn.name() == "DepthwiseConv1dBackward"
y.sum().backward()
assert xm.grad.shape == xm.shape and wm.grad.shape == wm.shape and bm.grad.shape == bm.shape

# Without gradients too (the fast C++ path refuses meta tensors, so the call falls back to the op): the
# result's shape and memory order, as F.conv1d gives shapes on meta; kernel_for, which reads alignment, refuses.
with torch.no_grad():
    y = generated.depthwise_conv1d(xm, wm, bm, 2, 1, dilation=2)
    assert y.is_meta and tuple(y.shape) == (2, 8, (100 + 2 - 2 * 3 - 1) // 2 + 1) and y.grad_fn is None
    y = generated.depthwise_conv1d(torch.empty(2, 100, 8, device="meta").transpose(1, 2), wm, None, 1, "same")
    assert y.is_meta and tuple(y.shape) == (2, 8, 100) and y.transpose(1, 2).is_contiguous()
try:
    generated.kernel_for(xm, wm, bm)
except ValueError as e:
    assert str(e).startswith("dwgen: x must be on a CUDA device"), e
else:
    raise AssertionError("kernel_for chose a kernel for a meta tensor")
try:
    generated.depthwise_conv1d(xm, wm[:4], bm)
except ValueError as e:
    assert str(e).startswith("dwgen: weight must have shape (8, 1, K)"), e
else:
    raise AssertionError("a meta call with a wrong weight passed")

# A listening TorchDispatchMode sees every call, a plain one included (it used to skip the dispatcher).
from torch.overrides import TorchFunctionMode  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402


class Seen(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


xd, wd = xm.detach(), wm.detach()
with torch.no_grad(), Seen() as seen:
    y = generated.depthwise_conv1d(xd, wd, None, 1, 3)
assert tuple(y.shape) == (2, 8, 103) and seen.ops == ["dwgen.depthwise_conv1d.default"], seen.ops


class SeenFunctions(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.funcs = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.funcs.append(str(func))
        return func(*args, **(kwargs or {}))


with torch.no_grad(), SeenFunctions() as seen_functions:
    generated.depthwise_conv1d(xd, wd, None, 1, 3)
assert any("dwgen.depthwise_conv1d" in f for f in seen_functions.funcs), seen_functions.funcs
print("registered")
