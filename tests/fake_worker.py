"""A worker of tune.py --workers with the GPU faked (python -m tests.fake_worker MARKS PLAN_ARGS...): the same
search.parallel.run_worker on the shared study, a fake builder, and an evaluator that notes each variant it
evaluates, with the GPU it was given, in MARKS."""
from __future__ import annotations

import json
import os
import sys
import time

from dwgen.problem import Problem
from search import parallel
from search import study as st
from tests.test_search import FakeBuilder, FakeEvaluator


class NotingEvaluator(FakeEvaluator):
    def __init__(self, marks: str):
        super().__init__()
        self.marks = marks

    def evaluate(self, cand, base):
        with open(self.marks, "a") as f:
            f.write(f"{cand.variant.digest} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
        time.sleep(0.05)  # long enough for the other workers' asks to interleave with this one's
        return super().evaluate(cand, base)


def main(argv: list[str]) -> int:
    marks, problem, storage, trials, sampler, seed, worker = argv
    parallel.run_worker(Problem(**json.loads(problem)), st.open_storage(storage), FakeBuilder(),
                        NotingEvaluator(marks), trials=int(trials), sampler=sampler, seed=int(seed), worker=worker,
                        log=lambda s: None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
