"""tune.py --workers 2 on a host with two GPUs: one study, each worker on its own GPU, every variant once."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dwgen.problem import Problem
from search import parallel
from search import study as st
from tests.conftest import ROOT

pytestmark = pytest.mark.gpu

P = Problem(4, 64, 4096)


def test_two_workers_tune_one_study(tmp_path):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    runs = tmp_path / "runs"
    r = subprocess.run([sys.executable, str(ROOT / "tune.py"), "--shape", "4x64x4096", "--trials", "12",
                        "--workers", "2", "--no-freeze", "--quiet", "--runs-dir", str(runs)],
                       capture_output=True, text=True, cwd=ROOT, timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    study = st.open_study(P, st.open_storage(st.default_storage(runs)), "tpe", 0)
    shares = parallel.measured_by(study)
    assert sorted(shares.values()) == [6, 6], shares  # two workers, each its share
    digests = [st.trial_result(t).digest for t in study.trials
               if st.trial_result(t) and not t.user_attrs.get("duplicate")]
    assert len(digests) == len(set(digests)) == 12
    assert "winner dw1d_f32_k3_" in r.stdout
