"""The record of one variant's evaluation: status, times and the baselines measured beside it."""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from dwgen.space import DIRECTIONS

# Statuses: only "ok" may be timed, chosen or frozen.
STATUSES = ("ok", "skipped", "compile_error", "timeout", "wrong", "crashed", "launch_error")


@dataclass(frozen=True)
class Result:
    name: str
    digest: str
    status: str
    message: str = ""
    kernel_ms: float | None = None
    copy_ms: float | None = None
    torch_ms: float | None = None
    reps: int = 0
    max_rel_error: float | None = None
    registers: int = -1
    spill_bytes: int = -1
    smem_bytes: int = -1
    compile_s: float = 0.0
    # fwd: kernel_ms is the forward and torch_ms PyTorch's; bwd: the whole backward launch (grad_x, grad_weight
    # and grad_bias) and PyTorch's autograd backward. Results stored before it was a field are forward ones.
    direction: str = "fwd"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")
        if self.direction not in DIRECTIONS:
            raise ValueError(f"unknown direction {self.direction!r}")

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.kernel_ms is not None

    @property
    def x_copy(self) -> float | None:
        return self.kernel_ms / self.copy_ms if self.ok and self.copy_ms else None

    @property
    def speedup(self) -> float | None:
        return self.torch_ms / self.kernel_ms if self.ok and self.torch_ms else None

    def with_(self, **kw) -> Result:
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Result:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def summary(self) -> str:
        if not self.ok:
            return f"{self.name}: {self.status} {self.message[:160]}"
        return (f"{self.name}: {self.kernel_ms:.4f} ms, {self.x_copy:.3f}x copy, "
                f"{self.speedup:.2f}x faster than PyTorch")
