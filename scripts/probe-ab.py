"""A/B a kernel idea on tuned variants without touching the templates: each named variant is rendered as the
templates are now (A) and again with a named edit applied to that rendered source (B), both built with the
search's flags, both checked as the search checks a candidate (the problem and the family's edge problems
against float64, outputs NaN-filled, and on a side stream), then timed interleaved with copy_ of the same
bytes, round by round, in one process, each round in a fresh order (no side always follows copy_).

    python scripts/probe-ab.py --shape 8x4096x2048 -k 4 --padding causal --activation silu --dtype bf16 \
        --direction bwd --edit stream --edit l2pf dw1d_bwdlane_bf16_k4_t128_o8_n2_h2

Prints, per variant, each side's median ms, its x copy_ with the 10th-90th percentile over the rounds, and B's
change against A in the same rounds (median and spread of B/A). A quick look before a template change, not a
benchmark: an edit that wins here still goes through a template, a re-tune and the gate. Without --edit it
times the named variants as they are, side by side (one design against another on the same rounds).
"""
from __future__ import annotations

import argparse
import hashlib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import probecli  # noqa: E402  (beside this script)

from dwgen import build, render  # noqa: E402

# 16-byte and 8-byte global loads through the non-coherent path with an L2 prefetch of the 256-byte sector
# group around them (PTX ISA: ld's .L2::256B prefetch size); `l1` says whether L1 keeps the line.
_PREFETCH_LOAD = """__device__ __forceinline__ vec_t ld_prefetch(const vec_t* q) {{
    if constexpr (sizeof(vec_t) == 16) {{
        uint4 r;
        asm("ld.global.nc{l1}.L2::256B.v4.u32 {{%0, %1, %2, %3}}, [%4];"
            : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(q));
        return *reinterpret_cast<const vec_t*>(&r);
    }} else if constexpr (sizeof(vec_t) == 8) {{
        uint2 r;
        asm("ld.global.nc{l1}.L2::256B.v2.u32 {{%0, %1}}, [%2];" : "=r"(r.x), "=r"(r.y) : "l"(q));
        return *reinterpret_cast<const vec_t*>(&r);
    }} else {{
        return __ldg(q);
    }}
}}
__device__ __forceinline__ vec_t load_vec(const T* p) {{"""

# The weight sums' second launch as a programmatic dependent launch (Hopper): queued behind the kernel before it
# in the stream, its blocks wait in cudaGridDependencySynchronize for that kernel's writes instead of the launch
# waiting for its end, so the gap between the two launches closes.
_PDL_LAUNCH = """#include <cuda_runtime.h>
template <typename... P, typename... A>
static cudaError_t dwgen_pdl_launch(void (*kernel)(P...), unsigned grid, unsigned block, cudaStream_t s, A... args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(grid);
    cfg.blockDim = dim3(block);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
}
"""

# The channel forward's step loop with its next inputs fetched R - 1 steps ahead by cp.async into a ring in shared
# memory (each thread its own slots: no barrier), zeros outside the row by the copy's source size, in place of one
# step ahead in registers: more bytes in flight without more registers.
_RING_LOOP = """    constexpr int R = {ring};
    static_assert(sizeof(vec_t) == 4 || sizeof(vec_t) == 8 || sizeof(vec_t) == 16, "cp.async copies 4, 8 or 16 bytes");
    __shared__ alignas(16) vec_t ring[R][NEW][THREADS];
    const int tid = static_cast<int>(threadIdx.x);
    auto fetch = [&](int s) {{  // the NEW inputs step s's window adds, into ring slot s % R
        const int js = j0 + s * OUTS;
        const int an = js * S - P + KEEP;
#pragma unroll
        for (int i = 0; i < NEW; ++i) {{
            const int a = an + i;
            const bool in = s < STEPS && js < Lout && a >= 0 && a < L;
            const T* src = in ? xn + a * C : xn;
            const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(&ring[s % R][i][tid]));
            constexpr int BYTES = static_cast<int>(sizeof(vec_t));
            if constexpr (BYTES == 16)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" :: "r"(dst), "l"(src), "r"(in ? 16 : 0));
            else
                asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;"
                             :: "r"(dst), "l"(src), "n"(BYTES), "r"(in ? BYTES : 0));
        }}
        asm volatile("cp.async.commit_group;");
    }};
#pragma unroll
    for (int s = 1; s < R; ++s) fetch(s);
#pragma unroll 1
    for (int s = 0; s < STEPS; ++s) {{
        const int js = j0 + s * OUTS;
        if (js >= Lout) break;
        fetch(s + R);
        T* ys = yn + js * C;
        const bool whole = js + OUTS <= Lout;  // every output of this step exists: stores without a test
#pragma unroll
        for (int o = 0; o < OUTS; ++o) {{
            float acc[V];
#pragma unroll
            for (int v = 0; v < V; ++v) acc[v] = bias[v];
#pragma unroll
            for (int k = 0; k < K; ++k) {{
#pragma unroll
                for (int v = 0; v < V; ++v) acc[v] = fmaf(wk[k][v], xw[o * S + k * D][v], acc[v]);
            }}
            if (act == 1) {{
#pragma unroll
                for (int v = 0; v < V; ++v) acc[v] = dw_silu_ftz(acc[v]);
            }}
            if (whole || js + o < Lout) store_vec(ys + o * C, pack(acc));
        }}
        asm volatile("cp.async.wait_group %0;" :: "n"(R - 1));
#pragma unroll
        for (int i = 0; i < KEEP; ++i) {{
#pragma unroll
            for (int v = 0; v < V; ++v) xw[i][v] = xw[i + WIN - KEEP][v];
        }}
#pragma unroll
        for (int i = 0; i < NEW; ++i) unpack_x(xw[KEEP + i], ring[(s + 1) % R][i][tid]);
    }}
    asm volatile("cp.async.wait_all;");
}}

// The launch contract"""
_RING_OLD = re.compile(r"#pragma unroll 1\n    for \(int s = 0; s < STEPS; \+\+s\) \{\n"
                       r"        const int js = j0 \+ s \* OUTS;\n        if \(js >= Lout\) break;\n"
                       r"        const bool more.*?\n\}\n\n// The launch contract", re.S)


def _unroll_edit(u: int) -> tuple[str, list]:
    """The channel forward's step loop unrolled by u (0: every step) and its window's shift made unconditional:
    in an unrolled loop the shift is a renaming of registers, not moves."""
    pragma = "#pragma unroll\n" if u == 0 else f"#pragma unroll {u}\n"
    return (f"the channel forward's step loop unrolled ({u or 'fully'}), its window's shift unconditional (dw1d_cl)",
            [("        if (more) {\n#pragma unroll\n            for (int i = 0; i < KEEP; ++i) {",
              "        {  // unconditional: past the last step the shifted window is never read\n#pragma unroll\n"
              "            for (int i = 0; i < KEEP; ++i) {"),
             ("#pragma unroll 1\n    for (int s = 0; s < STEPS; ++s) {",
              pragma + "    for (int s = 0; s < STEPS; ++s) {")])


# name -> (what it tries, [(old text or pattern, new text), ...]); an edit whose old text a source lacks leaves
# it alone
EDITS = {
    "stream": ("evict-first loads and stores (__ldcs/__stcs) in load_vec and store_vec",
               [("constexpr bool STREAM = false;", "constexpr bool STREAM = true;")]),
    "l2pf": ("load_vec through ld.global.nc.L2::256B (L1 kept)",
             [("__device__ __forceinline__ vec_t load_vec(const T* p) {", _PREFETCH_LOAD.format(l1="")),
              ("return __ldg(q);   // read-only path", "return ld_prefetch(q);   // read-only path")]),
    "l2pf_nol1": ("load_vec through ld.global.nc.L1::no_allocate.L2::256B",
                  [("__device__ __forceinline__ vec_t load_vec(const T* p) {",
                    _PREFETCH_LOAD.format(l1=".L1::no_allocate")),
                   ("return __ldg(q);   // read-only path", "return ld_prefetch(q);   // read-only path")]),
    "ring256": ("the walk's ring copies (cp.async.ca) with an L2::256B prefetch",
                [("cp.async.ca.shared.global [", "cp.async.ca.shared.global.L2::256B [")]),
    "async256": ("cp.async.cg copies with an L2::256B prefetch",
                 [("cp.async.cg.shared.global [", "cp.async.cg.shared.global.L2::256B [")]),
    **{f"unroll{u}": _unroll_edit(u) for u in (0, 2, 3, 4)},
    **{f"ring{n}": (f"the channel forward's next inputs fetched {n - 1} steps ahead by cp.async into a ring in "
                    "shared memory (dw1d_cl)", [(_RING_OLD, _RING_LOOP.format(ring=n).replace("\\", "\\\\"))])
       for n in (2, 4)},
    **{f"blocks{n}": (f"each kernel with a one-argument __launch_bounds__ asked for {n} blocks an SM (ptxas caps "
                      "its registers to fit, spilling where it must)",
                      [(re.compile(r"__launch_bounds__\((\d+)\)"), rf"__launch_bounds__(\1, {n})")])
       for n in (3, 4, 5, 6)},
    # The batch walkers' two-argument bounds ask 2048 threads an SM (32 registers at 64 threads), but the fp32
    # K31 design's two shared stages (8.3 KB) already hold it to 24 blocks: a lower ask lets a run of two vectors
    # keep its window in registers (it spills at 32), for half the shared-memory reads an output.
    **{f"minblocks{n}": (f"each kernel's two-argument __launch_bounds__ asking {n} blocks an SM instead (its "
                         "register ceiling moves with it)",
                         [(re.compile(r"__launch_bounds__\((\d+), \d+\)"), rf"__launch_bounds__(\1, {n})")])
       for n in (16, 24)},
    # Resident blocks of the walk cover every channel chunk of a few (row, part) pairs: whole 8 KB position rows
    # of the Mamba shape read together. Swapped, they cover a few chunks of many rows: is DRAM locality what the
    # walk's 80% of peak lacks (fifty-eighth session)?
    "gridswap": ("the walking backward's grid x and y swapped: consecutive blocks walk one channel chunk's rows",
                 [("const int c = (static_cast<int>(blockIdx.x) * CT + ct) * CV;",
                   "const int c = (static_cast<int>(blockIdx.y) * CT + ct) * CV;"),
                  ("const int n = static_cast<int>(blockIdx.y) / parts, part_of_row = static_cast<int>(blockIdx.y)",
                   "const int n = static_cast<int>(blockIdx.x) / parts, part_of_row = static_cast<int>(blockIdx.x)"),
                  ("const int c0 = static_cast<int>(blockIdx.x) * CT * CV;",
                   "const int c0 = static_cast<int>(blockIdx.y) * CT * CV;"),
                  ("part[(static_cast<long long>(blockIdx.y) * C + c0 + cc)",
                   "part[(static_cast<long long>(blockIdx.x) * C + c0 + cc)"),
                  (re.compile(r"kernel<<<dim3\((static_cast<unsigned>\(\(C \+ CT \* CV - 1\) / \(CT \* CV\)\)), "
                              r"(static_cast<unsigned>\(g\))\)"),
                   r"kernel<<<dim3(\2, \1)")]),
    "pdl": ("the weight sums' launch programmatic-dependent on the kernel before it (backward families)",
            [("#include <cuda_runtime.h>\n", _PDL_LAUNCH),
             ("    constexpr int COLS = 32, GROUPS = 8;",
              "    cudaGridDependencySynchronize();  // the partial sums of the launch before are written\n"
              "    constexpr int COLS = 32, GROUPS = 8;"),
             (re.compile(r"(\w+_sum)<<<(static_cast<unsigned>\(\(sums \+ 31\) / 32\)), 256, 0, s>>>\("),
              r"dwgen_pdl_launch(\1, \2, 256, s, ")]),
}


def edited(source: str, edit: str, name: str | None = None) -> str | None:
    """The source with every substitution of the edit made (edits joined by + are made in turn; `same` only
    appends a comment: the control, A built again, which should read 1.000), or None where one finds nothing.
    `from:DIR` is not an edit of A but another rendering of variant `name`, DIR/<name>.cu (made from another
    checkout of the templates by scripts/render-variants.py: a template change before and after, in one
    process), or None where DIR lacks it."""
    if edit.startswith("from:"):
        if name is None:
            raise ValueError("from:DIR needs the variant's name")
        path = Path(edit[len("from:"):]) / f"{name}.cu"
        return path.read_text() if path.is_file() else None
    for part in edit.split("+"):
        if part == "same":
            source += "\n// probe-ab: the same kernel, built again\n"
            continue
        for old, new in EDITS[part][1]:
            if isinstance(old, re.Pattern):
                source, count = old.subn(new, source)
                if not count:
                    return None
            elif old not in source:
                return None
            else:
                source = source.replace(old, new, 1 if old.startswith("#include") else -1)
    return source


def build_jobs(sides: list, arch: str) -> list[tuple[str, str, str]]:
    """(name, source, build key) of each side, keyed by a digest of the side's own source. build_key keeps a
    digest's first 24 characters, so a key of the variant's digest with the source's hash appended (as until the
    thirty-fourth session) named every side of a variant alike: all of them loaded one library, whichever side
    compiled last, and every edit measured as no change."""
    return [(v.name, src, build.build_key(hashlib.sha256((v.digest + src).encode()).hexdigest(), arch))
            for v, _, src in sides]


def edit_name(text: str) -> str:
    if text.startswith("from:"):
        if not Path(text[len("from:"):]).is_dir():
            raise argparse.ArgumentTypeError(f"{text}: no such folder of renderings")
        return text
    unknown = [name for name in text.split("+") if name != "same" and name not in EDITS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown edit {unknown[0]!r}: use same or {', '.join(sorted(EDITS))}, "
                                         "joined by + to make several")
    return text


def timed_rounds(timer, fns: dict, rounds: int, shuffle: bool) -> tuple[dict, dict[str, list[str]]]:
    """fns timed in rounds, each round in a fresh (seeded) order where shuffle is set: a fixed cyclic order
    has one side always run after copy_ (2-3% slower on 0.1 ms backwards, read from a control side) and the
    others after a kernel that read the same inputs. Returns each side's Timing and, per sample, what ran
    before it."""
    import random
    import statistics

    import torch

    from dwgen.bench import Timing

    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    rng, names, prev = random.Random(0), list(fns), None
    events: dict[str, list] = {k: [] for k in names}
    after: dict[str, list[str]] = {k: [] for k in names}
    for _ in range(rounds):
        if shuffle:
            rng.shuffle(names)
        for k in names:
            events[k].append(timer._once(fns[k]))
            after[k].append(prev or "")
            prev = k
    torch.cuda.synchronize()
    out = {}
    for k, evs in events.items():
        times = [s.elapsed_time(e) for s, e in evs]
        out[k] = Timing(statistics.median(times), min(times), len(times), tuple(times))
    return out, after


def warm_calls(text: str) -> int:
    """--warm's N: a whole number of calls a sample, 1 or more."""
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--warm takes a number of calls a sample, 1 or more, not {text!r}")
    return int(text)


def repeated(fn, n: int):
    """fn called n times back to back: one sample of --warm."""
    def calls():
        for _ in range(n):
            fn()
    return calls


def per_call(t, n: int):
    """A Timing of n calls a sample as the Timing of one call."""
    from dwgen.bench import Timing

    return Timing(t.median_ms / n, t.min_ms / n, t.reps, tuple(s / n for s in t.samples))


def spread(samples: list[float]) -> tuple[float, float, float]:
    from dwgen.bench import percentile

    return percentile(samples, 10), percentile(samples, 50), percentile(samples, 90)


def main(argv: list[str]) -> int:
    ap = probecli.parser("scripts/probe-ab.py", __doc__)
    ap.add_argument("--edit", action="append", type=edit_name, default=[],
                    help=f"same (the control), from:DIR (DIR/NAME.cu, another rendering) or one of "
                         f"{', '.join(sorted(EDITS))}; a+b makes both; none: the "
                         "named variants alone, side by side (designs against each other, half the builds)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--warm", type=warm_calls, default=0, metavar="N",
                    help="time N back-to-back calls a sample with no L2 flush (times per call): on a problem whose "
                         "tensors fit in L2, what holds a kernel apart from DRAM (issue, latency, occupancy)")
    ap.add_argument("--order", choices=("shuffled", "fixed"), default="shuffled",
                    help="each round in a fresh order (default), or copy_, A, then the edits every round")
    a = ap.parse_args(argv)
    resolved = probecli.resolve(a, "probe-ab")
    if resolved is None:
        return 2
    p, variants, arch = resolved
    import torch

    from dwgen import bench
    from dwgen.worker import Candidate, _Bench, _BwdBench

    sides = []  # (variant, side label, source)
    for v in variants:
        base = render.render_variant(v)
        sides.append((v, "A", base))
        for e in a.edit:
            src = edited(base, e, v.name)
            if src is None:
                why = f"{e[len('from:'):]} has no {v.name}.cu" if e.startswith("from:") else "finds nothing to change"
                print(f"{v.name}: edit {e}: {why}; skipped")
            else:
                sides.append((v, e, src))
    builds = build.compile_many(build_jobs(sides, arch), ROOT / "runs" / "build", arch=arch)
    evaluator = (_BwdBench if a.direction == "bwd" else _Bench)(p)
    fns, launchers, bad = {"copy_": bench.copy_operands(p)}, [], 0
    try:
        for (v, side, _), b in zip(sides, builds, strict=True):
            label = f"{v.name} [{side}]"
            if not b.ok:
                print(f"{label}: build failed\n{b.log[-1500:]}", file=sys.stderr)
                bad += 1
                continue
            launcher = evaluator.launcher(Candidate(v, b.library))
            launchers.append(launcher)
            wrong = [o for o in [*evaluator.checks(launcher), evaluator.stream_check(launcher)] if not o.ok]
            if wrong:
                print(f"{label}: WRONG: {wrong[0].message}")
                bad += 1
                continue
            fns[label] = evaluator.timed(launcher)
        timer = evaluator.timer
        if a.warm:
            timer, fns = bench.Timer(flush=False), {k: repeated(fn, a.warm) for k, fn in fns.items()}
        times, after = timed_rounds(timer, fns, a.rounds, shuffle=a.order == "shuffled")
        if a.warm:
            times = {k: per_call(t, a.warm) for k, t in times.items()}
    finally:
        torch.cuda.synchronize()
        for launcher in launchers:
            launcher.unload()
    copy = times.pop("copy_")
    # Every kernel side reads the same x (and grad_out): one that runs right after another may find the tail
    # of those in L2, one after copy_ (its own tensors) cannot. Pooled over the sides, each sample over its
    # side's median, by what ran before it:
    pooled = {"after copy_": [], "after a kernel": []}
    for label, t in times.items():
        for ms, prev in zip(t.samples, after[label], strict=True):
            if prev:  # the first sample of all follows the warm-up
                pooled["after copy_" if prev == "copy_" else "after a kernel"].append(ms / t.median_ms)
    print(f"{p.key} {a.direction}, {a.rounds} interleaved rounds; copy_ {copy.median_ms:.4f} ms")
    print(f"{'variant [edit]':60s} {'ms':>8s}  x copy (p10-p90)      B/A (p10-p90)")
    for label, t in times.items():
        lo, mid, hi = spread([s / c for s, c in zip(t.samples, copy.samples, strict=True)])
        line = f"{label:60s} {t.median_ms:8.4f}  {mid:.3f}x ({lo:.3f}-{hi:.3f})"
        a_label = label.rsplit(" [", 1)[0] + " [A]"
        if not label.endswith("[A]") and a_label in times:
            r = spread([s / r for s, r in zip(t.samples, times[a_label].samples, strict=True)])
            line += f"   {r[1]:.3f} ({r[0]:.3f}-{r[2]:.3f})"
        print(line)
    print("  ".join(f"{k}: {spread(v)[1]:.3f} of the side's median ({len(v)} samples)" for k, v in pooled.items()
                    if v))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
