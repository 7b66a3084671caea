"""What the variant probes (probe-variant.py, probe-ab.py) share: a problem and named variants of it from the
command line, on a CUDA GPU, with the arch the search builds for."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dwgen.problem import ProblemError  # noqa: E402
from dwgen.space import variant_from_name  # noqa: E402
from dwgen.suite import add_problem_arguments, problem_from_args  # noqa: E402


def parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """The problem's arguments, --direction, and the variants' names last (add a probe's own options)."""
    ap = argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(ap)
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("names", nargs="+", metavar="NAME")
    return ap


def resolve(a: argparse.Namespace, prog: str):
    """(problem, variants, arch) from parsed arguments, or None after one line on stderr (bad input, no GPU)."""
    import torch

    try:
        p = problem_from_args(a)
        variants = [variant_from_name(n, p, a.direction) for n in a.names]
    except (ProblemError, ValueError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None
    if not torch.cuda.is_available():
        print(f"{prog}: needs a CUDA GPU (it launches the variants)", file=sys.stderr)
        return None
    major, minor = torch.cuda.get_device_capability()
    return p, variants, f"sm_{major}{minor}"
