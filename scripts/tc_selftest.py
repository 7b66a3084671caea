"""Self-test of the tensor-core forward (templates/dw1d_tc.cu.j2) on the GPU host: correctness on edge problems
against float64, refusals, then timings of the target problems beside copy_ and F.conv1d; one table.

    python scripts/tc_selftest.py            # on the GPU host; exits 1 if any check fails
    python scripts/tc_selftest.py --dry-run  # renders and compiles every library with nvcc, launches nothing

A check passes when no output is NaN (outputs start as NaN, inside NaN guard bands that must stay NaN) and the
largest error against F.conv1d in float64 is at most twice PyTorch's own 16-bit F.conv1d's on the same inputs,
plus a floor of one rounding of the largest output (unit roundoff x max |ref|).
"""
from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dwgen import build, contract  # noqa: E402
from dwgen.dtypes import torch_dtype  # noqa: E402
from dwgen.families import tc  # noqa: E402
from dwgen.problem import Problem  # noqa: E402

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8}
REPS = 50
SEEDS = (0, 1)
CACHE = Path(tempfile.gettempdir()) / "dwgen-tc-selftest"
DEVICE = "cuda"  # where inputs live; the checks' logic runs on the CPU too, against an emulated kernel

# Targets: (problem, the configs to try; None for every valid one).
TARGETS = [
    Problem(32, 512, 1024, 31, 1, 15, 1, "fp16"),
    Problem(16, 1024, 4096, 7, 1, 3, 1, "bf16"),
    Problem(32, 512, 8192, 3, 1, 1, 1, "bf16"),
]
# Signatures of the edge checks (dtype, K, D) and the configs each is built as.
EDGE_SIGNATURES = [
    ("fp16", 1, 1), ("fp16", 3, 1), ("fp16", 4, 1), ("fp16", 31, 1), ("fp16", 64, 1), ("fp16", 7, 2),
    ("fp16", 31, 2), ("bf16", 3, 1), ("bf16", 4, 1), ("bf16", 7, 1), ("bf16", 31, 1), ("bf16", 3, 2),
    ("bf16", 64, 2),
]
EDGE_CONFIGS = [tc.Config(4, 2, 1024), tc.Config(2, 1, 512, "pers"), tc.Config(8, 4, 4096, "pers")]
EDGE_LENGTHS = (1, 7, 17, 1000, 1023, 4097)


@dataclass(frozen=True)
class Case:
    """One launch to check: a problem, its output length (shorter than the problem's when the right padding
    is less than the left), the activation and where x and y start past a 16-byte boundary (elements)."""

    problem: Problem
    out_length: int
    act: int = 0
    x_shift: int = 0
    y_shift: int = 0

    @property
    def label(self) -> str:
        p = self.problem
        extra = [f"Lout{self.out_length}"] if self.out_length != p.out_length else []
        extra += [f"act{self.act}"] if self.act else []
        extra += [f"x+{self.x_shift}"] if self.x_shift else []
        extra += [f"y+{self.y_shift}"] if self.y_shift else []
        return " ".join([p.key, *extra])


def representative(dtype: str, k: int, d: int) -> Problem:
    """A long problem of the signature to render the variant for (sizes, padding and bias are run-time)."""
    return Problem(32, 512, 8192, k, 1, (k - 1) // 2 * d, d, dtype)


def edge_cases(dtype: str, k: int, d: int) -> list[Case]:
    """L in EDGE_LENGTHS over paddings 0, 'same', (K-1)*D both sides and (K-1)*D left only (causal: Lout = L),
    and one larger than the row; odd rows start inside 16-byte vectors; bias, SiLU and pointer shifts vary."""
    span = (k - 1) * d
    out: list[Case] = []
    n = 0
    for length in EDGE_LENGTHS:
        b, c = (2, 3) if length > 1000 else (3, 5)
        for pad, causal in ((0, False), (span // 2, False), (span, False), (span, True), (3 * span + 37, False)):
            try:
                p = Problem(b, c, length, k, 1, pad, d, dtype, bias=n % 2 == 0)
            except ValueError:
                continue  # no output at this length and padding
            lout = length if causal else p.out_length
            out.append(Case(p, lout, act=(n // 2) % 2, x_shift=(3 * n) % 8 if n % 3 else 0,
                            y_shift=(5 * n) % 8 if n % 4 == 1 else 0))
            n += 1
    return out


@dataclass
class Built:
    problem: Problem  # the representative it was rendered for
    config: tc.Config
    name: str
    library: str = ""
    registers: str = ""


def render_all(jobs: list[tuple[Problem, tc.Config]], arch: str) -> dict[tuple, Built]:
    """Render and compile every (signature, config) once, in parallel; exits on a compile error."""
    builds: dict[tuple, Built] = {}
    todo = []
    for p, c in jobs:
        key = (p.dtype, p.kernel_size, p.stride, p.dilation, c)
        if key in builds:
            continue
        name, digest, src = tc.standalone(p, c)
        builds[key] = Built(p, c, name)
        todo.append((name, src, build.build_key(digest, arch)))
    t0 = time.perf_counter()
    results = build.compile_many(todo, CACHE, arch)
    failed = [r for r in results if not r.ok]
    for r in failed:
        print(f"COMPILE FAILED {r.name}: {r.log[-3000:]}", file=sys.stderr)
    if failed:
        sys.exit(1)
    by_name = {r.name: r for r in results}
    for bt in builds.values():
        r = by_name[bt.name]
        bt.library = r.library
        bt.registers = registers(r.log)
    print(f"compiled {len(todo)} libraries for {arch} in {time.perf_counter() - t0:.1f} s ({CACHE})")
    return builds


def registers(log: str) -> str:
    """ptxas's registers (and spill bytes, if any) of both instantiations: SiLU off/on."""
    entries = re.split(r"Compiling entry function", log)[1:]
    out = []
    for entry in entries:
        regs = re.search(r"Used (\d+) registers", entry)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", entry)
        spilled = int(spill.group(1)) + int(spill.group(2)) if spill else 0
        out.append((regs.group(1) if regs else "?") + (f" ({spilled} B spilled)" if spilled else ""))
    return "/".join(out) + " regs"


def key_of(p: Problem, c: tc.Config) -> tuple:
    return (p.dtype, p.kernel_size, p.stride, p.dilation, c)


# ---- GPU side ---------------------------------------------------------------------------------------


class Runner:
    """Loaded libraries by name, launched on torch's current stream."""

    def __init__(self):
        self.libs: dict = {}

    def lib(self, bt: Built):
        from dwgen.driver import Library

        if bt.name not in self.libs:
            self.libs[bt.name] = Library(bt.library, contract.launch_symbol(bt.name))
        return self.libs[bt.name]

    def launch(self, bt: Built, case: Case, x, w, b, y):
        p = case.problem
        return self.lib(bt).prepare(x, w, b, y, p.batch, p.channels, p.length, case.out_length, p.padding, case.act)


def shifted_empty(shape, dtype, shift: int, fill: float | None, guard: int = 0):
    """A contiguous tensor of `shape` starting `shift` elements past a 16-byte boundary, with `guard` NaN
    elements before and after it; and a function that says whether those are still NaN."""
    import torch

    n = 1
    for s in shape:
        n *= s
    buf = torch.full((guard + shift + n + guard + 8,), float("nan") if fill is None else fill, device=DEVICE,
                     dtype=dtype)
    start = guard + shift
    t = buf[start:start + n].view(*shape)

    def intact() -> bool:
        return bool(torch.isnan(buf[:start]).all()) and bool(torch.isnan(buf[start + n:]).all())

    return t, intact


def inputs(case: Case, seed: int):
    import torch

    p = case.problem
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    dt = torch_dtype(p.dtype)
    x0 = torch.randn(p.batch, p.channels, p.length, generator=g, device=DEVICE).to(dt)
    x, _ = shifted_empty(x0.shape, dt, case.x_shift, 0.0)
    x.copy_(x0)
    w = torch.randn(p.channels, 1, p.kernel_size, generator=g, device=DEVICE).to(dt)
    b = torch.randn(p.channels, generator=g, device=DEVICE).to(dt) if p.bias else None
    return x, w, b


def references(case: Case, x, w, b):
    """float64 reference and PyTorch's own 16-bit result, both cut to the case's output length."""
    import torch.nn.functional as F

    p = case.problem

    def conv(xx, ww, bb):
        return F.conv1d(xx, ww, bb, stride=1, padding=p.padding, dilation=p.dilation, groups=p.channels)

    ref = conv(x.double(), w.double(), b.double() if b is not None else None)
    mine = conv(x, w, b)
    if case.act:
        ref, mine = F.silu(ref), F.silu(mine)
    return ref[..., :case.out_length], mine[..., :case.out_length]


@dataclass
class Outcome:
    ok: bool
    max_err: float
    bound: float
    message: str = ""


_LAST: dict = {}  # the last (case, seed)'s inputs, references and bound: every config of a target reuses them


def prepared(case: Case, seed: int):
    """Inputs, the float64 reference and the error bound of a case (kept for the next call of the same)."""
    if (case, seed) not in _LAST:
        _LAST.clear()
        x, w, b = inputs(case, seed)
        ref, mine = references(case, x, w, b)
        bound = (2 * float((mine.double() - ref).abs().max()) + UNIT_ROUNDOFF[case.problem.dtype]
                 * float(ref.abs().max()) + 1e-6)
        _LAST[(case, seed)] = (x, w, b, ref, bound)
    return _LAST[(case, seed)]


def check_case(runner: Runner, bt: Built, case: Case, seeds=SEEDS) -> Outcome:
    import torch

    p = case.problem
    worst = Outcome(True, 0.0, 0.0)
    for seed in seeds:
        x, w, b, ref, bound = prepared(case, seed)
        y, intact = shifted_empty((p.batch, p.channels, case.out_length), x.dtype, case.y_shift, None, guard=64)
        runner.launch(bt, case, x, w, b, y)()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        err = (y.double() - ref).abs()
        nan = bool(torch.isnan(y).any())
        max_err = float(torch.nan_to_num(err, nan=float("inf")).max())
        if not intact():
            return Outcome(False, max_err, bound, f"seed {seed}: wrote outside its output")
        if nan or max_err > bound:
            idx = tuple(int(i) for i in (torch.nan_to_num(err, nan=float("inf")) > bound).nonzero()[0])
            return Outcome(False, max_err, bound, f"seed {seed}: first bad output {idx}: got {float(y[idx]):.6g}, "
                                                  f"want {float(ref[idx]):.6g} (bound {bound:.3g})")
        if max_err / bound >= worst.max_err / max(worst.bound, 1e-30):
            worst = Outcome(True, max_err, bound)
    return worst


def check_stream(runner: Runner, bt: Built, case: Case) -> Outcome:
    """The launch, captured into a CUDA graph on a side stream, writes nothing before the replay."""
    import torch

    p = case.problem
    x, w, b, ref, bound = prepared(case, 0)
    y, _ = shifted_empty((p.batch, p.channels, case.out_length), x.dtype, case.y_shift, None)
    launch = runner.launch(bt, case, x, w, b, y)
    torch.cuda.synchronize()
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side):
        graph.capture_begin()
        launch()
        graph.capture_end()
    torch.cuda.synchronize()
    if not bool(torch.isnan(y).all()):
        return Outcome(False, float("inf"), 0.0, "wrote its output outside the stream it was given")
    graph.replay()
    torch.cuda.synchronize()
    err = float(torch.nan_to_num((y.double() - ref).abs(), nan=float("inf")).max())
    return Outcome(err <= bound, err, bound, "" if err <= bound else "graph replay out of bound")


def check_refusals(runner: Runner, builds: dict, stride2: Built) -> list[str]:
    """A stride-2 variant refuses every launch; an x or y not on a whole element is refused as misaligned."""
    import torch

    from dwgen.driver import CudaLaunchError

    failures = []
    case = Case(Problem(2, 3, 100, 3, 1, 1, 1, "fp16"), 100)
    x, w, b = inputs(case, 0)
    y = torch.empty(2, 3, 100, device=DEVICE, dtype=x.dtype)
    bt = builds[key_of(representative("fp16", 3, 1), EDGE_CONFIGS[0])]
    raw = torch.empty(2 * 3 * 100 * 2 + 16, device=DEVICE, dtype=torch.uint8)
    odd = raw.data_ptr() + 1
    for what, args, want in (  # cudaErrorInvalidValue is 1, cudaErrorMisalignedAddress 716
        ("stride 2", (stride2, x, w, b, y), "(1)"),
        ("x on an odd byte", (bt, odd, w, b, y), "(716)"),
        ("y on an odd byte", (bt, x, w, b, odd), "(716)"),
    ):
        lib = runner.lib(args[0])
        try:
            lib.prepare(*args[1:], 2, 3, 100, 100, 1, 0)()
            failures.append(f"{what}: launched instead of refusing")
        except CudaLaunchError as e:
            if not str(e).endswith(want):
                failures.append(f"{what}: refused with {e}, want error {want}")
    torch.cuda.synchronize()
    return failures


def time_target(runner: Runner, bt: Built, p: Problem) -> float:
    from dwgen import bench

    case = Case(p, p.out_length)
    x, w, b = inputs(case, 0)
    y = torch_empty(p)
    launch = runner.launch(bt, case, x, w, b, y)
    return bench.Timer(flush=True).time(launch, reps=REPS, warmup=5).median_ms


def torch_empty(p: Problem):
    import torch

    return torch.empty(p.batch, p.channels, p.out_length, device=DEVICE, dtype=torch_dtype(p.dtype))


def baselines(p: Problem) -> tuple[float, float]:
    from dwgen import bench

    case = Case(p, p.out_length)
    x, w, b = inputs(case, 0)
    timer = bench.Timer(flush=True)
    copy = timer.time(bench.copy_operands(p), reps=REPS, warmup=5).median_ms
    eager = timer.time(bench.torch_operands(p, x, w, b), reps=REPS, warmup=5).median_ms
    return copy, eager


def target_configs(p: Problem, limit: int | None) -> list[tc.Config]:
    """Every valid config of the target, the known-good ones first."""
    import itertools

    names = list(tc.AXES)
    every = [tc.Config(**dict(zip(names, vals, strict=True))) for vals in itertools.product(*tc.AXES.values())]
    ordered = list(dict.fromkeys([*tc.KNOWN_GOOD, *every]))
    valid = [c for c in ordered if all(r(p, c) for r in tc.RESTRICTIONS)]
    return valid[:limit] if limit else valid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="render and compile only (no GPU needed)")
    ap.add_argument("--arch", default=None, help="nvcc target, e.g. sm_90 (default: the GPU's, or sm_90)")
    ap.add_argument("--configs", type=int, default=None, help="at most this many configs per target (default: all)")
    ap.add_argument("--top", type=int, default=3, help="configs shown per target (the best first)")
    ap.add_argument("--no-edges", action="store_true", help="skip the edge checks (timing only)")
    ap.add_argument("--verbose", action="store_true", help="list every library's registers")
    args = ap.parse_args(argv)

    arch = args.arch
    if arch is None:
        arch = "sm_90"
        if not args.dry_run:
            import torch

            arch = "sm_{}{}".format(*torch.cuda.get_device_capability())

    edge_jobs = [] if args.no_edges else [(representative(*s), c) for s in EDGE_SIGNATURES for c in EDGE_CONFIGS
                                          if all(r(representative(*s), c) for r in tc.RESTRICTIONS)]
    target_jobs = [(p, c) for p in TARGETS for c in target_configs(p, args.configs)]
    # A stride-2 build: the family refuses to render it, so it is rendered past the restrictions here to
    # check that its launch refuses too.
    s2 = replace(representative("fp16", 3, 1), stride=2, padding=1)
    builds = render_all(edge_jobs + target_jobs, arch)
    s2_name, s2_digest, s2_src = _render_unchecked(s2, EDGE_CONFIGS[0])
    s2_build = build.compile_library(s2_name, s2_src, build.build_key(s2_digest, arch), CACHE, arch)
    if not s2_build.ok:
        print(f"COMPILE FAILED {s2_name}: {s2_build.log[-3000:]}", file=sys.stderr)
        return 1
    if args.dry_run or args.verbose:
        print("registers (SiLU off/on):")
        for bt in sorted(builds.values(), key=lambda b: b.name):
            print(f"  {bt.name:44s} {bt.registers}")
    if args.dry_run:
        n_cases = sum(len(edge_cases(*s)) for s in EDGE_SIGNATURES) * len(EDGE_CONFIGS)
        print(f"dry run: {len(builds) + 1} libraries built; {n_cases} edge checks and "
              f"{len(target_jobs)} target timings not run")
        return 0

    import torch

    torch.cuda.init()
    runner = Runner()
    failures: list[str] = []
    checked = 0
    for sig in [] if args.no_edges else EDGE_SIGNATURES:
        for c in EDGE_CONFIGS:
            key = key_of(representative(*sig), c)
            if key not in builds:
                continue
            bt = builds[key]
            for case in edge_cases(*sig):
                try:
                    out = check_case(runner, bt, case)
                except Exception:  # a fault is sticky: say which launch it was, then stop
                    print(f"ERROR {bt.name} on {case.label}", file=sys.stderr)
                    raise
                checked += 1
                if not out.ok:
                    failures.append(f"{bt.name} on {case.label}: {out.message}")
                    print(f"FAIL {bt.name} on {case.label}: {out.message}")
            out = check_stream(runner, bt, edge_cases(*sig)[-1])
            if not out.ok:
                failures.append(f"{bt.name} stream: {out.message}")
    s2_bt = Built(s2, EDGE_CONFIGS[0], s2_name, s2_build.library)
    if not args.no_edges:
        failures += check_refusals(runner, builds, s2_bt)
    print(f"edge checks: {checked} cases, {len(failures)} failures")

    rows = []
    for p in TARGETS:
        copy_ms, torch_ms = baselines(p)
        timed = []
        for c in target_configs(p, args.configs):
            bt = builds[key_of(p, c)]
            out = check_case(runner, bt, Case(p, p.out_length), seeds=(0,))
            if not out.ok:
                failures.append(f"{bt.name} on {p.key}: {out.message}")
                print(f"FAIL {bt.name} on {p.key}: {out.message}")
                continue
            timed.append((time_target(runner, bt, p), bt, out))
        timed.sort(key=lambda t: t[0])
        for ms, bt, out in timed[:args.top]:
            rows.append((p.key, "_".join(tc.name_tokens(bt.config)) + f" ({bt.registers})", ms, ms / copy_ms,
                         ms / torch_ms, out))
        if timed:
            spread = statistics.median(t[0] for t in timed) / copy_ms
            print(f"{p.key}: {len(timed)} configs timed; best {timed[0][0] / copy_ms:.3f}x copy, median {spread:.3f}x")

    print()
    print("| problem | config | ms | x copy | x PyTorch | max error / bound |")
    print("|---|---|---|---|---|---|")
    for key, cfg, ms, xc, xt, out in rows:
        print(f"| {key} | {cfg} | {ms:.4f} | {xc:.3f} | {xt:.3f} | {out.max_err:.3g} / {out.bound:.3g} |")
    for f in failures:
        print(f"FAILED: {f}")
    print("PASS" if not failures else f"{len(failures)} FAILED")
    return 1 if failures else 0


def _render_unchecked(p: Problem, c: tc.Config) -> tuple[str, str, str]:
    """A variant rendered without the family's restrictions (for the stride-2 refusal check only)."""
    from dwgen import render, space

    name = "_".join([tc.FAMILY_NAME, *space.signature_tokens(p)[1:], *tc.name_tokens(c)])
    digest = space.content_digest({"config": c.to_dict(), "signature": space.signature(p), "unchecked": True},
                                  (tc.TEMPLATE, space.COMMON_TEMPLATE))
    return name, digest, render.render_family(tc.TEMPLATE, tc.render_context(p, c), p.dtype, name, digest)


if __name__ == "__main__":
    sys.exit(main())
