"""The floor of a pass over three tensors (two read, one written), as the backward's x, grad_out and grad_x: PyTorch's
add and addcmul over bf16 tensors of the Mamba shape's size beside copy_ of one (median of 40 timed calls each;
fifty-eighth session, docs/perf-notes.md)."""
from __future__ import annotations

import sys


def median_ms(fn, n: int = 40) -> float:
    import torch

    for _ in range(5):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for s, e in zip(starts, ends, strict=True):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))[n // 2]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("probe-floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    a = torch.randn(8 * 4096 * 2048, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    copy = median_ms(lambda: c.copy_(a))
    print(f"{torch.cuda.get_device_name()}: copy_ {copy:.4f} ms")
    for name, fn in (("add", lambda: torch.add(a, b, out=c)), ("addcmul", lambda: torch.addcmul(a, a, b, out=c))):
        t = median_ms(fn)
        print(f"{name} {t:.4f} ms, {t / copy:.3f}x copy_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
