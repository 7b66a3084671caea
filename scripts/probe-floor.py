"""The floor of a pass over three tensors (two read, one written), as the backward's x, grad_out and grad_x: PyTorch's
add and addcmul over bf16 tensors of the Mamba shape's size beside copy_ of one (median of 40 timed calls each;
fifty-eighth session, docs/perf-notes.md)."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dwgen.bench import Timer  # noqa: E402


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("probe-floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    a = torch.randn(8 * 4096 * 2048, device="cuda", dtype=torch.bfloat16)
    b, c = torch.randn_like(a), torch.empty_like(a)
    timer = Timer(flush=False)
    copy = timer.time(lambda: c.copy_(a), reps=40, warmup=5).median_ms
    print(f"{torch.cuda.get_device_name()}: copy_ {copy:.4f} ms")
    for name, fn in (("add", lambda: torch.add(a, b, out=c)), ("addcmul", lambda: torch.addcmul(a, a, b, out=c))):
        t = timer.time(fn, reps=40, warmup=5).median_ms
        print(f"{name} {t:.4f} ms, {t / copy:.3f}x copy_")
    return 0


if __name__ == "__main__":
    sys.exit(main())
