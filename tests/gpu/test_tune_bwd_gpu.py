"""tune.py --direction bwd on the GPU, end to end: a small problem's backward tuned with a few trials, frozen
through the gate into a copy of generated/, kept beside the forward entries, and chosen by that module's
kernel_for(..., direction="bwd") and its backward op, which computes the gradients right."""
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

P = Problem(4, 64, 4096, 5, 1, 2)

# Run where no other frozen module has registered the dwgen ops: a process of its own.
CHECK = """
import dataclasses, json, sys
import torch
sys.path.insert(0, sys.argv[1])
import generated
from dwgen import check
from dwgen.problem import Problem

p = Problem(**json.loads(sys.argv[2]))
x, w, b = check.make_inputs(p, 0)
chosen = {d: generated.kernel_for(x, w, b, **p.call_kwargs, direction=d) for d in ("fwd", "bwd")}
generated.build()
op = torch.ops.dwgen.depthwise_conv1d_backward.default
outcomes = []
for activation in ("none", "silu"):
    q = dataclasses.replace(p, activation=activation)
    outcomes.append(check.check_backward(q, check.through_backward_op(op)).message)
print(json.dumps({"chosen": chosen, "failures": [m for m in outcomes if m]}))
"""


def test_a_tuned_backward_is_frozen_beside_the_forward_and_dispatched(tmp_path):
    out = tmp_path / "generated"
    shutil.copytree(ROOT / "generated", out)
    before = freeze.read_manifest(out)
    winners: list = []
    rc = workflow.tune([P], trials=4, timeout_s=None, sampler="tpe", seed=0, storage="memory",
                       runs_dir=tmp_path / "runs", out_dir=out, freeze=True, jobs=None, quiet=True,
                       report=winners.extend, direction="bwd")
    assert rc == 0 and len(winners) == 1
    (w,) = winners
    assert w.variant.direction == w.result.direction == "bwd" and w.result.ok
    assert w.result.kernel_ms > 0 and w.result.copy_ms > 0 and w.result.torch_ms > 0
    m = freeze.read_manifest(out)
    def ours(e: dict) -> bool:
        return (e["key"], freeze.entry_direction(e)) == (P.key, "bwd")
    assert [(e["kernel"], e["digest"]) for e in m["entries"] if ours(e)] == [(w.variant.name, w.variant.digest)]
    # every other entry, of either direction, is carried over as it was (with its direction written out)
    assert [e for e in m["entries"] if not ours(e)] == [{**e, "direction": freeze.entry_direction(e)}
                                                        for e in before["entries"] if not ours(e)]
    assert freeze.stale_entries(out) == []
    r = subprocess.run([sys.executable, "-c", CHECK, str(tmp_path), json.dumps(P.to_dict())], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["chosen"]["bwd"] == w.variant.name and got["chosen"]["fwd"] != w.variant.name
    assert got["failures"] == []
