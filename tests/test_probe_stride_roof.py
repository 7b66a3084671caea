"""scripts/probe-stride-roof.py on the CPU: its problems parse, and every load its kernels make stays inside x (the
probe runs raw kernels without bounds checks on the GPU)."""
from __future__ import annotations

import argparse
import importlib.util
import shlex
from pathlib import Path

import pytest

from dwgen.suite import add_problem_arguments, problem_from_args

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("probe_stride_roof", ROOT / "scripts" / "probe-stride-roof.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


@pytest.mark.parametrize("line", probe.SHAPES)
def test_every_load_stays_inside_x(line):
    ap = argparse.ArgumentParser()
    add_problem_arguments(ap)
    p = problem_from_args(ap.parse_args(shlex.split(line)))
    n, nout = probe.sizes(p)
    assert n % 8 == 0 and nout % 32 == 0 and nout > 0
    s = p.stride
    # own: thread i reads vectors i*S .. i*S + S-1; spread and read: the warp from w*S reads w*S + 32*m + lane
    last_own = (nout - 1) * s + s - 1
    last_spread = (nout - 32) * s + 32 * (s - 1) + 31
    assert max(last_own, last_spread) < n // 8
