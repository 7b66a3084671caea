"""The dry run's summary line counts variants and bytes honestly."""
from __future__ import annotations

from dwgen.build import Build
from dwgen.dryrun import summary


def test_summary_counts_spilling_variants_and_their_bytes():
    builds = [Build("a", "ok", spill_bytes=0, seconds=1.0), Build("b", "ok", spill_bytes=24, seconds=2.0),
              Build("c", "ok", spill_bytes=8, seconds=1.0, cached=True), Build("d", "compile_error", seconds=0.5)]
    assert summary(builds, 3.25) == ("built 3/4 in 3.2 s wall (4.5 s of nvcc, 1 from the build cache); "
                                     "2 variants spill registers (32 bytes of spill stores and loads in all)")


def test_summary_without_spills():
    assert summary([Build("a", "ok", spill_bytes=0)], 1.0).endswith("; no variant spills registers")
