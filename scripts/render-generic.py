"""Renders the generic kernels of the templates as they are now into a folder, one source a direction and dtype
(src_fwd_f16.cu ... src_bwd_f32.cu), for scripts/generic-harness.cu to time side by side with another rendering
(a patch applied, or another commit's templates rendered from a worktree):

    python scripts/render-generic.py renders/new
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dwgen import render  # noqa: E402
from dwgen.dtypes import DTYPES  # noqa: E402


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python scripts/render-generic.py OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[0])
    out.mkdir(parents=True, exist_ok=True)
    for dtype in ("fp16", "bf16", "fp32"):
        (out / f"src_fwd_{DTYPES[dtype].token}.cu").write_text(render.render_any(dtype))
        (out / f"src_bwd_{DTYPES[dtype].token}.cu").write_text(render.render_bwd_any(dtype))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
