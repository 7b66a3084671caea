"""A causal SiLU problem (Mamba's conv, small) tuned on the GPU in both directions, end to end: frozen through
the gate into a copy of generated/, chosen by that module only for calls with the same paddings and activation
(the same sizes called symmetric or without SiLU take what the module took before the tune: a fast generic
kernel, wide or of a narrower scope), and right through its ops."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from dwgen import freeze
from dwgen.problem import Problem
from search import workflow
from tests.conftest import ROOT

pytestmark = [pytest.mark.gpu, pytest.mark.slow]  # the freeze gates and builds the whole frozen module

P = Problem(4, 256, 1024, 4, 1, 3, dtype="bf16", layout="blc", padding_right=0, activation="silu")

# Run where no other frozen module has registered the dwgen ops: a process of its own. CHOOSE asks the module
# under sys.argv[1] which kernel each call takes (no build needed); CHECK then runs the problem through its ops.
CHOOSE = """
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import generated
from dwgen import check
from dwgen.problem import Problem

p = Problem(**json.loads(sys.argv[2]))
x, w, b = check.make_inputs(p, 0)
calls = {"tuned": p.call_kwargs, "no_silu": {**p.call_kwargs, "activation": None},
         "symmetric": {**p.call_kwargs, "padding": 3}}
chosen = {f"{name}|{d}": generated.kernel_for(x, w, b, **kw, direction=d) for name, kw in calls.items()
          for d in ("fwd", "bwd")}
"""
CHECK = CHOOSE + """
generated.build()
failures = []
with torch.no_grad():
    out = check.check(p, lambda q, x, w, b, y: y.copy_(generated.depthwise_conv1d(x, w, b, **q.call_kwargs)))
failures.append(out.message)
op = torch.ops.dwgen.depthwise_conv1d_backward.default
failures.append(check.check_backward(p, check.through_backward_op(op)).message)
print(json.dumps({"chosen": chosen, "failures": [m for m in failures if m]}))
"""


def run_module(script: str, root, problem: Problem) -> dict:
    r = subprocess.run([sys.executable, "-c", script, str(root), json.dumps(problem.to_dict())], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_a_tuned_causal_silu_problem_is_frozen_and_dispatched_only_as_itself(tmp_path):
    out = tmp_path / "generated"
    shutil.copytree(ROOT / "generated", out)
    winners: list = []
    for direction in ("fwd", "bwd"):
        rc = workflow.tune([P], trials=4, timeout_s=None, sampler="tpe", seed=0, storage="memory",
                           runs_dir=tmp_path / "runs", out_dir=out, freeze=True, jobs=None, quiet=True,
                           report=winners.extend, direction=direction)
        assert rc == 0
    fwd, bwd = winners
    assert fwd.result.ok and bwd.result.ok and fwd.variant.problem == bwd.variant.problem == P
    m = freeze.read_manifest(out)
    mine = [e for e in m["entries"] if e["key"] == P.key]
    assert sorted((e["direction"], e["kernel"]) for e in mine) == [("bwd", bwd.variant.name),
                                                                   ("fwd", fwd.variant.name)]
    assert all((e["problem"]["padding_right"], e["problem"]["activation"]) == (0, "silu") for e in mine)
    assert freeze.stale_entries(out) == []
    got = run_module(CHECK, tmp_path, P)
    assert got["failures"] == []
    assert got["chosen"]["tuned|fwd"] == fwd.variant.name and got["chosen"]["tuned|bwd"] == bwd.variant.name
    # Not the problem it was tuned for: each of these calls takes what the module took before the tune (the
    # generic kernels of their signature and scope; the walking backward serves causal (B, L, C) calls).
    before = run_module(CHOOSE + "print(json.dumps({'chosen': chosen}))", ROOT, P)["chosen"]
    for call in ("no_silu", "symmetric"):
        for d in ("fwd", "bwd"):
            assert got["chosen"][f"{call}|{d}"] == before[f"{call}|{d}"], (call, d)
    generic = {name for table, _, narrow in freeze.FAST_TABLES for entry in m["generic"][table].values()
               for name in (entry if narrow else [entry])}  # every table's kernels, narrow ones listed
    assert all(before[f"{call}|{d}"] in generic for call in ("no_silu", "symmetric") for d in ("fwd", "bwd"))
