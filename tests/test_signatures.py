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
    sizes = {(p.batch, p.channels, p.length) for p in read_suite(ROOT / "benchmarks" / "signatures.txt")}
    for name in ("suite.txt", "untuned.txt", "training.txt"):
        benched = {(p.batch, p.channels, p.length) for p in read_cases(ROOT / "benchmarks" / name)}
        assert not sizes & benched, name
