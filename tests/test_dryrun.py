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


def test_no_backward_variant_reasons():
    from dwgen.dryrun import BWD_STRIDE_ONE, no_variant_reason
    from dwgen.problem import Problem

    strided = Problem(4, 2048, 8192, 3, 2, 1)
    assert no_variant_reason(strided) is None  # the forward has variants at stride 2
    assert no_variant_reason(strided, "bwd") == BWD_STRIDE_ONE == (
        "the fused backward is stride 1 only; other strides use the generic backward")
    assert no_variant_reason(Problem(4, 64, 1000), "bwd") is None
    why = no_variant_reason(Problem(2, 10, 4096, layout="blc"), "bwd")  # 10 fp32 channels: no whole vectors
    assert why.startswith("no variant of the bwd of 2x10x4096_k3_s1_p1_d1_fp32_blc_nobias can be built")
