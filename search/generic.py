"""python -m search.generic: choose, by measurement, the fast generic kernel of each (dtype, layout, K).

Most users never tune their shape; the frozen module then runs one generic kernel per (dtype, layout, K)
(stride 1, dilation 1, any length, padding and bias) in each direction (--direction bwd: the backward's), and
beside it, where a narrower design measured faster (the split backward), one for the calls that design takes. For
each, this checks and times a few candidate designs on training shapes (chosen apart from
benchmarks/untuned.txt, which stays a held-out test), keeps the design with the best geometric mean of x copy
(a tensor-core one only by a margin: TC_MARGIN), and freezes the choices into generated/ (its manifest records
them). Each measurement, every candidate's x copy with it, is also kept under runs/generic/ as it is made, so
a run that is stopped re-measures only what it had not finished.
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

from dwgen import cli
from dwgen.dtypes import DTYPES
from dwgen.families import bcl, blc, bwd, bwdlane, bwdtc, bwdwalk, lane, tc
from dwgen.problem import LAYOUTS, Problem
from dwgen.space import (
    DIRECTIONS,
    GENERIC_KERNEL_SIZES,
    GENERIC_SCOPES,
    Variant,
    family_of_config,
    generic_choice_key,
    generic_problem,
    scope_admits,
    scope_stand_in,
    scope_violations,
    violations,
)


def candidates(dtype: str, layout: str, direction: str = "fwd") -> list:
    """Designs that measured well on some suite shape (docs/perf-notes.md), with the dtype's 16-byte vector."""
    if direction == "bwd":
        return bwd_candidates(dtype, layout)
    v = DTYPES[dtype].max_vec
    if layout == "blc":  # the Mamba shape's finalists (H200, 2026-11-30), then the first generic design; then
        # narrower vectors for long filters, whose windows the wide ones cannot hold in registers (16-bit K15's
        # 16-trial tune chose one channel a thread, 8 outputs a step, 16 threads across)
        designs = [blc.Config(threads=t, vec=vec, outs=o, steps=s, cthreads=ct)
                   for t, vec, o, s, ct in ((128, v // 2, 8, 4, 32), (64, v // 2, 4, 1, 32), (128, v // 2, 4, 16, 32),
                                            (128, v, 4, 16, 64), (128, v, 2, 16, 8), (128, v // 2, 2, 4, 32),
                                            (128, v // 4, 8, 4, 32), (128, v // 4, 4, 16, 32), (128, 1, 8, 4, 16))]
        # 16-step 16-bit walks wait on their loads: a ring 3 steps ahead takes 3-14% off their time
        if DTYPES[dtype].bytes < 4:
            designs += [replace(c, ring=4) for c in designs if c.steps == 16]
        # each also with its window slid by renaming registers, walked without tests inside a row: 4-7% off 16-bit
        # K9-15, 4% slower on an fp32 K9 design (H100, forty-eighth session): measured, not assumed
        return designs + [replace(c, rename=True) for c in designs]
    designs = [bcl.Config(threads=128, vec=v, outs=2, halo="shfl"), bcl.Config(threads=128, vec=v, outs=2, halo="l1"),
               bcl.Config(threads=64, vec=v, outs=2, halo="l1"), bcl.Config(threads=128, vec=v, outs=4, halo="l1"),
               bcl.Config(threads=256, vec=v, outs=1, walk="row", halo="async"),
               # half the row tile of the one above: on 4x2048x3072 (a row 1.5 of its tiles) causal with SiLU it read
               # 1.11x copy where the one above read 1.42x (H100, forty-first session, docs/perf-notes.md)
               bcl.Config(threads=128, vec=v, outs=1, walk="row", halo="async"),
               bcl.Config(threads=128, vec=v, outs=2, walk="persistent", halo="async")]
    if dtype == "fp32":  # one vector group of two runs a thread: the tuned fp32 K4 forward's winner (1.04x copy on
        # 8x4096x2048), where the untuned 32x256x2048 K4 row reads 1.09x through the two-group design above
        designs.append(bcl.Config(threads=64, vec=v, outs=1, run=2, halo="l1"))
    if DTYPES[dtype].bytes < 4:  # 8-half vectors take 38-40 registers at K7-K9 uncapped (bf16 K7 won capped)
        designs += [bcl.Config(threads=64, vec=v, outs=2, halo="l1", cap=True),
                    bcl.Config(threads=128, vec=v, outs=2, halo="l1", cap=True)]
        # the tensor-core family: the 16-trial tune of fp16 K15 chose w2_n2_t1024 (1.13x copy, where the fast
        # generic choice reads 1.49x), the suite's fp16 K31 tune w2_n4_t1024; its kernel takes any padding (the
        # index emulation in tests/test_tc.py runs paddings far past the halo)
        designs += [tc.Config(warps=2, nt=2, tile=1024), tc.Config(warps=2, nt=4, tile=1024),
                    tc.Config(warps=4, nt=2, tile=1024)]
    # the lane forward, for causal and centred calls on rows of whole vectors (beside the design for every call,
    # where it wins on those): the row walks of the tuned bf16 K7 (t64_o4_sp_row, 1.01x copy) and 1x768x512
    # (t128_o1_row) forwards, the Mamba forward's spread runs (tuned as a tile walk, 1.01x) walked by rows, and a
    # fetch ahead; the untuned Mamba forward reads 1.37x through the best design for every call (H200, 42nd)
    designs += [lane.Config(threads=64, vecs=4, spread=True, walk="row"), lane.Config(threads=128, vecs=1, walk="row"),
                lane.Config(threads=128, vecs=2, spread=True, walk="row"),
                lane.Config(threads=64, vecs=2, spread=True, walk="row", ahead=True)]
    return designs


def bwd_candidates(dtype: str, layout: str) -> list:
    """The fused backward's designs (the family whose launch takes every problem of a signature) that the
    suite's backward tunes chose or measured near (docs/perf-notes.md): windows staged as stored (raw; rawp for
    16-bit) and tiles walked along a row, and over (B, L, C) the cp.async stage; candidate_variants adds the
    family's first design (the fast generic backward before any measurement). Over (B, C, L) the lane
    backward's designs too (causal and centred calls on rows of whole vectors, K <= 9 at 8-position runs), and
    for 16-bit from K10 (bwdtc.MIN_TAPS) the split backward's (padding up to the halo, no SiLU): where one of
    these narrower designs wins on its scope's shapes it is chosen beside the best fused design (decide), not
    instead of it."""
    if layout == "blc":
        # and the walk backward's (left padding of the halo, any right padding, SiLU too): the suite's Mamba
        # (B, L, C) winners, 4-channel vectors (K <= 4 fit their registers), and a 2-channel one for K5-9 (the
        # fifteenth and twenty-eighth sessions: 1.72-1.79x copy for the 4-channel ring, +19% for the 2-channel one);
        # every one covers at least space.LEFT_HALO_SPAN positions a block
        return [bwd.Config(threads=256, outs=16, tc=64), bwd.Config(threads=256, outs=8, tc=64),
                bwd.Config(threads=128, outs=16, tc=64, stage="async", tiles=4),
                bwd.Config(threads=128, outs=16, tc=64, stage="async", tiles=2),
                bwd.Config(threads=256, outs=16, tc=32, stage="async", tiles=2),
                bwd.Config(threads=128, outs=8, tc=64, stage="async", tiles=2),  # long fp32 filters fit this one
                *bwdwalk.KNOWN_GOOD[:4], bwdwalk.Config(threads=256, ct=64, vec=2, seg=256, unroll=8, stages=3)]
    designs = [bwd.Config(threads=128, outs=8, stage="raw", tiles=4), bwd.Config(threads=128, outs=8, stage="raw"),
               bwd.Config(threads=128, outs=8, stage="raw", regs=56),
               bwd.Config(threads=256, outs=8, stage="raw", tiles=2)]
    # the suite's lane backward winners (sixteenth and twenty-sixth sessions): the Mamba SiLU backward's
    # t64_o8_n2_h2 and t128_o8_n4_h2, bf16 K7's t128_o8_n2, the bf16 target's t256_o8_ahead_h2, fp32 K7's
    # t128_o8_n2_ahead (bwdlane.KNOWN_GOOD); and the two frozen for tuned problems since (generated/'s manifest,
    # forty-second session): the Mamba SiLU backward's t128_o8_n2_h2 (1.57x copy) and bf16 K7's t128_o8_n16_h2
    # (1.57x; a block walks up to 16 rows of a channel, so B <= 16 takes one launch)
    designs += [bwdlane.Config(threads=64, outs=8, rows=2, halves=2),
                bwdlane.Config(threads=128, outs=8, rows=4, halves=2),
                bwdlane.Config(threads=128, outs=8, rows=2), bwdlane.Config(threads=256, outs=8, ahead=True, halves=2),
                bwdlane.Config(threads=128, outs=8, rows=2, ahead=True),
                bwdlane.Config(threads=128, outs=8, rows=2, halves=2),
                bwdlane.Config(threads=128, outs=8, rows=16, halves=2)]
    if DTYPES[dtype].bytes < 4:
        designs += [bwd.Config(threads=128, outs=8, stage="rawp", tiles=4),
                    bwd.Config(threads=128, outs=16, stage="rawp", tiles=2)]
        # fp16 K31's tunes (thirteenth and eighteenth sessions): the weight gradient on tensor cores in 64-thread
        # blocks of 16-position runs walking 4 tiles (16 measured 5% faster there, but the stand-in's 4096
        # positions make 4 tiles a row, so the walk stops at 4 anyway), grad_x as the generic tensor-core forward
        # of K10-16 (w2_n2) or the fp16 K31 forward (w2_n4); and 128-thread blocks of 8-position runs
        designs += [bwdtc.Config(threads=64, run=16, span=4, wgrad="mma", warps=2, nt=2, tile=1024),
                    bwdtc.Config(threads=64, run=16, span=4, wgrad="mma", warps=2, nt=4, tile=1024),
                    bwdtc.Config(threads=128, run=8, span=4, wgrad="mma", warps=2, nt=4, tile=1024)]
    return designs


def training_problems(k: int, dtype: str, layout: str, direction: str = "fwd") -> list[Problem]:
    """Two large shapes per K, odd and even lengths (the forward a third, causal with SiLU), none of them in the
    benchmark's suites; for the candidates that serve some calls only (the lane families over (B, C, L) in both
    directions, the walk backward over (B, L, C)), two or three more of their scope (scope_problems)."""
    return list(dict.fromkeys(p for ps in scope_problems(k, dtype, layout, direction).values() for p in ps))


def scope_problems(k: int, dtype: str, layout: str, direction: str = "fwd") -> dict[str, list[Problem]]:
    """The training shapes each scope's choice is made on: "any" (every candidate whose scope is any is measured
    on them; for the forward a third, causal with SiLU), within_halo (the two centred ones: padded within the halo,
    without an activation) and, over (B, C, L) in both directions (the lane families), causal_or_centred (a causal
    and a centred shape of whole vectors, and a causal one with SiLU whose rows end mid-tile), for the (B, L, C)
    backward left_halo (a causal shape and one padded by the halo on both sides)."""
    h = k - 1
    shapes = {"any": [Problem(8, 1024, 4000, k, 1, (k - 1) // 2, dtype=dtype, layout=layout),
                      Problem(2, 2048, 12289, k, 1, k // 2, dtype=dtype, bias=True, layout=layout)]}
    if direction == "fwd":  # Mamba's call (causal, SiLU) on rows that end mid-tile: the two centred plain shapes chose
        # a design that read 1.87x copy there (docs/proposed item 17)
        shapes["any"].append(Problem(4, 2560, 3000, k, 1, h, dtype=dtype, layout=layout, padding_right=0,
                                     activation="silu"))
    shapes["within_halo"] = [p for p in shapes["any"] if scope_admits("within_halo", p)]
    if layout == "bcl":  # the lane families' calls (both directions); the third, Mamba's call on rows ending
        # mid-tile, where the lane backward chosen on the first two read 2.20x copy against the fused design's 2.04x
        # (docs/proposed item 19)
        shapes["causal_or_centred"] = [
            Problem(8, 1024, 4000, k, 1, h, dtype=dtype, layout=layout, padding_right=0),
            Problem(2, 2048, 12288, k, 1, h // 2, dtype=dtype, bias=True, layout=layout, padding_right=h - h // 2),
            Problem(4, 2560, 3000, k, 1, h, dtype=dtype, layout=layout, padding_right=0, activation="silu")]
    if direction == "bwd" and layout == "blc":  # causal (Mamba's) and the halo on both sides (longer grad_out rows)
        shapes["left_halo"] = [Problem(8, 1024, 4000, k, 1, h, dtype=dtype, layout=layout, padding_right=0),
                               Problem(2, 2048, 12289, k, 1, h, dtype=dtype, bias=True, layout=layout)]
    return shapes


def candidate_variants(k: int, dtype: str, layout: str, direction: str = "fwd") -> list[Variant]:
    """The candidates valid for this (dtype, layout, K), as variants of its generic stand-in problem (for the
    backward, the family's first design among them)."""
    stand_in = generic_problem(k, dtype, layout)
    designs = candidates(dtype, layout, direction)
    if direction == "bwd" and (first := bwd.generic_config(stand_in)) not in designs:
        designs.append(first)
    out = []
    for c in designs:  # a narrower family's design on a stand-in of its scope (scope_stand_in)
        q = scope_stand_in(stand_in, scope := family_of_config(stand_in, c, direction).generic_scope)
        if not violations(q, c, direction) and not scope_violations(q, c, scope):
            out.append(Variant(q, c, direction))
    return out


def choose(k: int, dtype: str, layout: str, build, log=print, rounds: int = 40, direction: str = "fwd",
           worker=None) -> dict:
    """Measure every candidate on each training shape; return the record of the choice (decide) with every
    candidate's x copy kept beside it. `worker` (of the direction; else one of its own) serves every shape in
    turn: a child started once, not once a shape. Each candidate is checked on every shape it is timed on, and
    on its edge problems at the first (the same build runs them alike on every shape); a candidate that fails
    a check is dropped whole."""
    from dwgen.worker import BwdGpuWorker, Candidate, GpuWorker
    from search.loop import build_result

    variants = candidate_variants(k, dtype, layout, direction)
    t0 = time.perf_counter()
    builds = build(variants)
    built = time.perf_counter()
    problems = training_problems(k, dtype, layout, direction)
    own = worker is None
    worker = worker or (BwdGpuWorker if direction == "bwd" else GpuWorker)(problems[0])
    scores: dict[str, dict[str, float]] = {v.name: {} for v in variants}
    edges_passed: set[str] = set()
    machine: dict = {}
    try:
        for p in problems:
            worker.switch(p)
            machine = machine or worker.machine()
            passed = []
            for v, b in zip(variants, builds, strict=True):
                if v.name not in scores or not scope_admits(v.family.generic_scope, p):  # each on the shapes it serves
                    continue
                r = build_result(v, b)
                if b.ok:
                    r = worker.check(Candidate(v, b.library), r, edges=v.name not in edges_passed)
                if r.status == "ok":
                    edges_passed.add(v.name)
                    passed.append(Candidate(v, b.library))
                else:
                    scores.pop(v.name)
                    log(f"  {p.key}: {r.summary()}")
            times = worker.retime(passed, rounds) if passed else {}
            for c in passed:
                scores[c.variant.name][p.key] = times[c.variant.name] / times["copy_"]
    finally:
        if own:
            worker.close()
    log(f"  built in {built - t0:.0f} s, checked and timed on {len(problems)} shapes in "
        f"{time.perf_counter() - built:.0f} s")
    if not scores:
        key = generic_choice_key(generic_problem(k, dtype, layout), direction)
        raise RuntimeError(f"no generic candidate passed its check for {key}")
    return decide(k, dtype, layout, scores, machine, log=log, direction=direction)


# A tensor-core design must beat the best CUDA-core one by this much to be chosen. Two reasons: its non-finite
# handling spreads a NaN or Inf of x over the 16-output blocks that read it (README), and the two training shapes
# predicted it poorly once: at bf16 K3 it won them by 1% and then read 1.30x on the held-out 16x768x4099, where
# the CUDA-core design reads 1.09x (thirty-first session, docs/perf-notes.md).
TC_MARGIN = 0.05


def pick(geomeans: dict[str, float], tensor_core: set[str]) -> str:
    """The candidate with the lowest geometric mean of x copy, but a tensor-core one only where it beats every
    CUDA-core candidate by TC_MARGIN (or no CUDA-core candidate passed)."""
    best = min(geomeans, key=geomeans.get)
    cuda_core = [n for n in geomeans if n not in tensor_core]
    if best not in tensor_core or not cuda_core:
        return best
    runner_up = min(cuda_core, key=geomeans.get)
    return best if geomeans[best] < (1 - TC_MARGIN) * geomeans[runner_up] else runner_up


# The families whose non-finite handling TC_MARGIN weighs (frozen_dispatch.TC_FAMILIES, which generated/ holds
# without this package): the tensor-core forward, and the split backward that runs it for grad_x.
TENSOR_CORE_FAMILIES = (tc.FAMILY_NAME, "dw1d_bwdtc")


def decide(k: int, dtype: str, layout: str, scores: dict[str, dict[str, float]], machine: dict, log=print,
           direction: str = "fwd") -> dict:
    """The record of one (dtype, layout, K)'s choice from its candidates' x copy on each training shape: the
    best design of scope "any" (it takes every call of the key) on the "any" shapes; then under narrow, narrowest
    scope first, each narrower scope's design that is no slower on each group of shapes the scope takes and beats
    it over all of them (narrow_choice): the lane backward for causal and centred calls, the split backward within
    the halo (no key has both: K9 and bwdtc.MIN_TAPS). The dispatcher runs those for the calls they admit."""
    variants = {v.name: v for v in candidate_variants(k, dtype, layout, direction)}
    shapes = {s: [p.key for p in ps] for s, ps in scope_problems(k, dtype, layout, direction).items()}
    tensor_core = {n for n in scores if variants[n].family.name in TENSOR_CORE_FAMILIES}

    for n in sorted(scores):
        log(f"  {n:44s} " + " ".join(f"{key} {x:.3f}" for key, x in scores[n].items()))
    keys = shapes["any"]
    geo = {n: math.exp(sum(math.log(xs[key]) for key in keys) / len(keys)) for n, xs in scores.items()
           if variants[n].family.generic_scope == "any" and all(key in xs for key in keys)}
    if not geo:
        raise RuntimeError(f"no generic candidate that takes every call of "
                           f"{generic_choice_key(generic_problem(k, dtype, layout), direction)} passed its check")
    best = pick(geo, tensor_core & set(geo))
    if best != min(geo, key=geo.get):
        log(f"  {min(geo, key=geo.get)} wins by less than {TC_MARGIN:.0%}: {best} is chosen")
    log(f"  {best} is chosen for every call ({geo[best]:.3f}x copy on {', '.join(keys)})")
    record = {"kernel": best, "config": variants[best].config_dict, "x_copy": {key: scores[best][key] for key in keys},
              "geomean_x_copy": geo[best], "machine": machine, "candidates": scores}
    narrow = [n for n in (narrow_choice(scope, variants, scores, shapes, tensor_core, log) for scope in GENERIC_SCOPES)
              if n is not None]
    if narrow:
        record["narrow"] = narrow
    return record


def narrow_choice(scope: str, variants: dict, scores: dict[str, dict[str, float]], shapes: dict[str, list[str]],
                  tensor_core: set[str], log=print) -> dict | None:
    """A scope's best design (the lowest geometric mean over every training shape its scope takes), recorded
    only where it is no slower than the best design of scope "any" on each group of those shapes (it will serve
    all of them: the split backward takes the causal and centred shapes as well as the two every design is
    measured on) and beats it over all of them together, by TC_MARGIN for a tensor-core one. The margin weighs
    the tensor cores' non-finite handling once, over every call the design would take; asked of each group, a
    design 12% faster on one pair of its shapes was dropped for being 1.7% faster on the other (bf16 K12)."""
    mine = [n for n in scores if variants[n].family.generic_scope == scope]
    if not mine:
        return None
    # the shapes of each group it was measured on (every design of a scope on the same ones: a failed check drops
    # a candidate whole); at odd K the lane backward takes the first "any" shape (centred, whole vectors) too
    served = list(dict.fromkeys(g for keys in shapes.values() if (g := tuple(k for k in keys if k in scores[mine[0]]))))
    keys = list(dict.fromkeys(key for g in served for key in g))

    def geo(n: str, ks) -> float:
        return math.exp(sum(math.log(scores[n][key]) for key in ks) / len(ks))

    def rivals(ks) -> dict[str, float]:
        return {n: geo(n, ks) for n in scores if variants[n].family.generic_scope == "any"
                and all(key in scores[n] for key in ks)}

    best = min(mine, key=lambda n: geo(n, keys))
    # On each group the rivals are weighed as pick weighs them, this design without its own margin and first in
    # the dict, so that a tie goes to it (no slower is enough there); the margin is asked once, over all its shapes.
    for g in served:
        theirs = rivals(g)
        if pick({best: geo(best, g), **theirs}, tensor_core & set(theirs)) != best:
            log(f"  {best} ({scope}) is not chosen: on {', '.join(g)} it reads {geo(best, g):.3f}x copy against "
                f"{min(theirs.values()):.3f}x")
            return None
    theirs = rivals(keys)
    if pick({best: geo(best, keys), **theirs}, tensor_core & ({best} | set(theirs))) != best:
        log(f"  {best} ({scope}) is not chosen: over {', '.join(keys)} it reads {geo(best, keys):.3f}x copy against "
            f"{min(theirs.values()):.3f}x" + (", within the tensor-core margin" if best in tensor_core else ""))
        return None
    log(f"  {best} is chosen beside the fused design for the {scope} calls it takes ({geo(best, keys):.3f}x copy)")
    return {"scope": scope, "kernel": best, "config": variants[best].config_dict,
            "x_copy": {key: scores[best][key] for key in keys}, "geomean_x_copy": geo(best, keys)}


def record_path(runs: Path, k: int, dtype: str, layout: str, direction: str = "fwd") -> Path:
    """Where one (dtype, layout, K)'s measured choice is kept, named by the digests of the candidates it
    weighed: a changed template or candidate list names a new file, so an old measurement is never reused."""
    digests = sorted(v.digest for v in candidate_variants(k, dtype, layout, direction))
    keys = [p.key for p in training_problems(k, dtype, layout, direction)]
    tag = hashlib.sha256(json.dumps([digests, keys]).encode())
    key = generic_choice_key(generic_problem(k, dtype, layout), direction)
    return runs / "generic" / f"{key}-{tag.hexdigest()[:12]}.json"


@functools.cache  # once a process: the GPU does not change under a search, and each kept record asks
def this_gpu() -> str | None:
    """The first GPU's name as nvidia-smi gives it (torch's name for it too), without starting CUDA in this
    process (the measurements run in worker processes); None where there is none to ask."""
    import shutil
    import subprocess

    if not shutil.which("nvidia-smi"):
        return None
    q = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
                       capture_output=True, text=True)
    return (q.stdout.strip() or None) if q.returncode == 0 else None


def choose_or_reuse(k: int, dtype: str, layout: str, build, runs: Path, log=print, direction: str = "fwd",
                    worker=None) -> dict:
    """A measurement of the same candidates on this kind of GPU (an interrupted run, or records carried from an
    earlier call), else a new one, kept. One made on another GPU is measured again: a choice is only as good as
    the GPU it was timed on (the forty-second session froze H100 choices on an H200 this way, unsaid)."""
    path = record_path(runs, k, dtype, layout, direction)
    kept = json.loads(path.read_text()) if path.is_file() else None
    there = (kept or {}).get("machine", {}).get("gpu")
    if there and (here := this_gpu()) and there != here:
        log(f"  the measurement in {path} was made on {there}; this GPU is {here}: measuring again")
        kept = None
    if kept is not None:
        log(f"  reusing the measurement in {path}")
        if "candidates" not in kept:  # kept before the candidates' scores were (thirtieth session): as chosen then
            return kept
        return decide(k, dtype, layout, kept["candidates"], kept["machine"], log=log, direction=direction)
    rec = choose(k, dtype, layout, build, log=log, direction=direction, worker=worker)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec, indent=1))
    tmp.replace(path)  # whole or absent: a kill mid-write leaves no half record
    return rec


def _csv(text: str, allowed: tuple, what: str) -> list:
    """Comma-separated values from `allowed` (compared as text); ValueError names the first that is not."""
    names = {str(a): a for a in allowed}
    values = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in values if x not in names]
    if bad:
        raise ValueError(f"{what}={bad[0]} has no generic kernel; choose from {', '.join(names)}")
    if not values:
        raise ValueError(f"--{what.lower()} names nothing")
    return [names[x] for x in values]


def dry_run(ks: list[int], dtypes: list[str], layouts: list[str], direction: str, build) -> int:
    """Compile every candidate of each (dtype, layout, K) into the build cache; 1 when one fails to compile."""
    variants = list({v.name: v for dtype in dtypes for layout in layouts for k in ks
                     for v in candidate_variants(k, dtype, layout, direction)}.values())
    t0 = time.perf_counter()
    done = 0

    def progress(b) -> None:
        nonlocal done
        done += 1
        detail = "cached" if b.cached else f"{b.seconds:.0f} s" if b.ok else b.status
        print(f"  [{done}/{len(variants)}] {b.name}: {detail}", flush=True)

    failed = [b for b in build(variants, on_done=progress) if not b.ok]
    print(f"compiled {len(variants) - len(failed)} of {len(variants)} candidates in {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = cli.OneLineParser(prog="python -m search.generic", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernel-sizes", default=",".join(map(str, GENERIC_KERNEL_SIZES)),
                    help="comma-separated K values to (re)choose; the others keep their choice")
    ap.add_argument("--dtypes", default=",".join(DTYPES))
    ap.add_argument("--layouts", default=",".join(LAYOUTS))
    ap.add_argument("--direction", choices=DIRECTIONS, default="fwd",
                    help="the forward's generic kernels, or the backward's (bwd)")
    ap.add_argument("--out", type=cli.directory, default=None, help="the frozen module to update (default generated/)")
    ap.add_argument("--jobs", type=cli.int_range(1), default=None)
    ap.add_argument("--freeze-once", action="store_true",
                    help="freeze (through the gate) once, after the last choice, not after each dtype and layout; "
                         "runs/generic/ keeps every choice meanwhile")
    ap.add_argument("--dry-run", action="store_true",
                    help="compile the candidates into runs/build/ for --arch and stop (no GPU needed): carried to "
                         "the GPU host, the search there measures without compiling them again")
    ap.add_argument("--arch", default="sm_90", help="target of --dry-run builds (the search builds for its GPU)")
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    a = parse_args(argv)
    try:
        ks = _csv(a.kernel_sizes, GENERIC_KERNEL_SIZES, "K")
        dtypes = _csv(a.dtypes, tuple(DTYPES), "dtype")
        layouts = _csv(a.layouts, LAYOUTS, "layout")
    except ValueError as e:
        print(f"python -m search.generic: {e}", file=sys.stderr)
        return 2
    from dwgen import freeze
    from search import workflow

    if a.dry_run:
        rc = dry_run(ks, dtypes, layouts, a.direction, workflow.make_builder(Path("runs") / "build", a.arch, a.jobs))
        if rc == 0:
            print("take runs/build to the GPU host, or one archive of it (tar czf runs/build.tgz -C runs build), which "
                  "scripts/gpu-session.sh unpacks")
        return rc
    try:
        build = workflow.gpu_builder(Path("runs"), a.jobs)
    except workflow.UserError as e:
        print(f"python -m search.generic: {e}", file=sys.stderr)
        return 1
    from dwgen.worker import BwdGpuWorker, GpuWorker

    out = a.out or freeze.DEFAULT_DIR
    t0 = time.perf_counter()
    chosen: dict[str, dict] = {}
    # one child measures every key (it starts on the first call, and again after a freeze or a crash)
    worker = (BwdGpuWorker if a.direction == "bwd" else GpuWorker)(generic_problem(ks[0], dtypes[0], layouts[0]))
    try:
        for dtype in dtypes:
            for layout in layouts:
                for k in ks:
                    key = generic_choice_key(generic_problem(k, dtype, layout), a.direction)
                    print(f"{key}: candidates on "
                          f"{', '.join(p.key for p in training_problems(k, dtype, layout, a.direction))}", flush=True)
                    chosen[key] = choose_or_reuse(k, dtype, layout, build, Path("runs"), direction=a.direction,
                                                  worker=worker)
                # Frozen (through the gate) after every (dtype, layout); runs/generic/ keeps each K in between.
                if not a.freeze_once:
                    worker.close()  # the gate has the GPU to itself
                    workflow.freeze_gated([], out, generic=chosen)
        worker.close()
        if a.freeze_once:
            workflow.freeze_gated([], out, generic=chosen)
    except workflow.UserError as e:
        print(f"python -m search.generic: {e}", file=sys.stderr)
        return 1
    finally:
        worker.close()
    print(f"\n{'generic kernel':14s} {'kernel':44s} {'geomean x copy':>15s}")
    for key, rec in chosen.items():
        print(f"{key:14s} {rec['kernel']:44s} {rec['geomean_x_copy']:15.3f}")
    print(f"froze {len(chosen)} generic choices into {out} in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
