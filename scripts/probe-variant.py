"""Launch named variants a few times on their problem, for Nsight Compute (not a benchmark): any variant, frozen
or not, through the same launch function the search times.

    ncu --nvtx --nvtx-include probe/ python scripts/probe-variant.py --shape 32x512x1024 -k 31 \
        --padding 15 --dtype fp16 --direction bwd dw1d_bwdtc_f16_k31_t128_r8_s4_mma_w2_n4_t1024

Each variant is rendered from the templates as they are now, built (or taken from the build cache) with the
search's flags, checked once against float64 on the problem (seed 0), then launched --reps times on its inputs
inside an NVTX range named probe (so that ncu can leave the check's launches out).
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import probecli  # noqa: E402  (beside this script)

from dwgen import build, render  # noqa: E402
from dwgen.worker import BwdLauncher, Candidate, Launcher  # noqa: E402


def probe(p, v, library: str, direction: str, reps: int) -> tuple[bool, str]:
    """Check v once against float64 on p (seed 0), then launch it `reps` times on p's inputs."""
    import torch

    from dwgen import check

    x, w, bias = check.make_inputs(p, 0)
    if direction == "bwd":
        launcher = BwdLauncher(Candidate(v, library))
        gy = check.grad_output(p, 0, x.device)
        outcome = check.check_backward(p, lambda q, x, w, b, gy, gx, gw, gb: launcher.prepare(
            q, gy, x, w, b, gx, gw, gb)(), seeds=(0,))
        grads = torch.empty_like(x), torch.empty_like(w), torch.empty(w.shape[0], device=x.device, dtype=x.dtype)
        run = launcher.prepare(p, gy, x, w, bias, *grads)
    else:
        launcher = Launcher(Candidate(v, library))
        outcome = check.check(p, lambda q, x, w, b, y: launcher.prepare(q, x, w, b, y)(), seeds=(0,))
        run = launcher.prepare(p, x, w, bias, check.empty_output(p))
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_push("probe")  # what ncu --nvtx --nvtx-include probe/ profiles: not the check
    for _ in range(reps):
        run()
    torch.cuda.synchronize()
    torch.cuda.nvtx.range_pop()
    return outcome.ok, outcome.message


def main(argv: list[str]) -> int:
    ap = probecli.parser("scripts/probe-variant.py", __doc__)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args(argv)
    resolved = probecli.resolve(a, "probe-variant")
    if resolved is None:
        return 2
    p, variants, arch = resolved
    builds = build.compile_many([(v.name, render.render_variant(v), build.build_key(v.digest, arch))
                                 for v in variants], ROOT / "runs" / "build", arch=arch)  # tune.py's cache
    bad = 0
    for v, b in zip(variants, builds, strict=True):
        if not b.ok:
            print(f"{v.name}: build failed\n{b.log[-2000:]}", file=sys.stderr)
            bad += 1
            continue
        ok, message = probe(p, v, b.library, a.direction, a.reps)
        print(f"{v.name}: {'correct' if ok else 'WRONG: ' + message}, launched {a.reps} times")
        bad += not ok
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
