"""benchmarks/signatures.txt, the stand-ins whose tuned kernels are lent to every problem of their signature:
each is a valid problem past the fast generic kernels, no signature twice or already tuned by the suite, and
none of the benchmark's own problems (those must measure the lent kernels on sizes they were not tuned on)."""
from __future__ import annotations

from pathlib import Path

from dwgen.bench.cases import read_cases
from dwgen.dryrun import no_variant_reason
from dwgen.frozen_dispatch import FAST_MAX_K
from dwgen.suite import read_suite

ROOT = Path(__file__).resolve().parents[1]


def _signature(p) -> tuple:
    return (p.kernel_size, p.stride, p.dilation, p.dtype, p.layout, p.activation)


def test_each_stand_in_is_a_signature_the_fast_kernels_do_not_cover():
    problems = read_suite(ROOT / "benchmarks" / "signatures.txt")
    for p in problems:
        assert not no_variant_reason(p, "fwd"), p.key
        assert p.stride > 1 or p.dilation > 1 or p.kernel_size > FAST_MAX_K, p.key
    sigs = [_signature(p) for p in problems]
    assert len(set(sigs)) == len(sigs), "a signature listed twice"
    assert not set(sigs) & {_signature(p) for p in read_suite(ROOT / "benchmarks" / "suite.txt")}


def test_no_stand_in_is_a_benchmarked_problem():
    """Neither at its own size nor at the other sizes tune.py --stand-in weighs its finalists at."""
    from search.standin import lent_reason, other_sizes

    problems = read_suite(ROOT / "benchmarks" / "signatures.txt")
    sizes = {(q.batch, q.channels, q.length) for p in problems for q in (p, *other_sizes(p))}
    for name in ("suite.txt", "untuned.txt", "training.txt"):
        benched = {(p.batch, p.channels, p.length) for p in read_cases(ROOT / "benchmarks" / name)}
        assert not sizes & benched, name
    assert not [p.key for p in problems if lent_reason(p)]  # --stand-in takes every one


def test_each_frozen_stand_in_can_lend_its_kernel():
    """A stand-in exists to lend its winner: one frozen with a kernel whose launch takes fixed sizes lends nothing
    (move it to a size that family does not take, as the file's header says)."""
    from dwgen import freeze

    manifest = freeze.read_manifest(ROOT / "generated")
    kernels = {k["name"]: k for k in manifest["kernels"]}
    frozen = {e["key"]: e["kernel"] for e in manifest["entries"] if e["direction"] == "fwd"}
    stand_ins = [p for p in read_suite(ROOT / "benchmarks" / "signatures.txt") if p.key in frozen]
    assert stand_ins, "no stand-in of benchmarks/signatures.txt is frozen in generated/"
    for p in stand_ins:
        assert kernels[frozen[p.key]]["sizes_at_run_time"], f"{p.key} froze {frozen[p.key]}, which is not lent"


def test_the_blc_retune_list_is_every_tuned_blc_forward():
    """scripts/blc-fwd-tuned.txt, what a change to dw1d_cl.cu.j2 re-tunes, copies the (B, L, C) lines of the suite
    and of the stand-ins: it must list exactly those, and cover every (B, L, C) forward frozen in generated/."""
    import json

    listed = {p.key for p in read_suite(ROOT / "scripts" / "blc-fwd-tuned.txt")}
    sources = read_suite(ROOT / "benchmarks" / "suite.txt") + read_suite(ROOT / "benchmarks" / "signatures.txt")
    assert listed == {p.key for p in sources if p.layout == "blc"}
    manifest = json.loads((ROOT / "generated" / "manifest.json").read_text())
    frozen = {e["key"] for e in manifest["entries"] if e["direction"] == "fwd" and e["problem"]["layout"] == "blc"}
    assert frozen <= listed, sorted(frozen - listed)
