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

# The direct binding reads its arguments by hand: a wrong type is a TypeError the Python side explains.
for bad in ((x, w, None, 1.5, 1, 1, 1, 0), (x, w, None, True, 1, 1, 1, 0), (x, "w", None, 1, 1, 1, 1, 0),
            (x, w, None, 1, 1, 1, 1), (x, w, None, 1, 1, 1, 1, 2**70)):
    try:
        ext.forward(*bad)
        raise AssertionError(f"forward{bad!r} was accepted")
    except TypeError as e:
        assert str(e).startswith("forward(x, weight, bias, stride"), str(e)
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
# Calls with gradients record the op's autograd node and run its backward; on meta tensors the fake
# implementations serve the Meta key. The first call of a process takes the checked path, which loads the op
# (and refuses non-CUDA tensors itself), so the op is loaded first.
generated._load_op()
xm = torch.randn(2, 8, 100, device="meta", requires_grad=True)
wm = torch.randn(8, 1, 4, device="meta", requires_grad=True)
bm = torch.randn(8, device="meta", requires_grad=True)
y = generated.depthwise_conv1d(xm, wm, bm, 1, "causal", activation="silu")
assert tuple(y.shape) == (2, 8, 100) and y.grad_fn is not None and y.grad_fn.name() == "DepthwiseConv1dBackward"
y.sum().backward()
assert xm.grad.shape == xm.shape and wm.grad.shape == wm.shape and bm.grad.shape == bm.shape
print("registered")
