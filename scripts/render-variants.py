"""Render the variants an A/B file names (scripts/probe-ab.py's argument lists, one a line) with the templates of
another checkout, into a folder, for probe-ab's `--edit from:DIR`: a template change measured against the same
designs as rendered before it, in one process on the GPU host.

    git worktree add /tmp/base HEAD~1
    python scripts/render-variants.py --root /tmp/base scripts/ab-rotate.txt .rec/old

Each variant is written as DIR/<name>.cu; one that the other checkout cannot render is reported and left out
(probe-ab then skips that side), and the exit status is 1. A bad line stops it with its place and status 2.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/render-variants.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout whose templates render (default: this one)")
    ap.add_argument("ab_file", type=Path)
    ap.add_argument("out", type=Path)
    a = ap.parse_args(argv)
    if not (a.root / "dwgen" / "render.py").is_file():
        print(f"render-variants: {a.root} is not a dwgen checkout", file=sys.stderr)
        return 2
    if not a.ab_file.is_file():
        print(f"render-variants: no such file {a.ab_file}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(a.root.resolve()))  # that checkout's dwgen, not this one's
    from dwgen.problem import ProblemError
    from dwgen.render import RenderError, render_variant
    from dwgen.space import variant_from_name
    from dwgen.suite import add_problem_arguments, problem_from_args

    class LineParser(argparse.ArgumentParser):
        def error(self, message: str):  # reported with the line's place, not by printing the usage
            raise ProblemError(message)

    # The A/B line's options as probe-ab takes them (scripts/probecli.parser), spelled here because probecli imports
    # this checkout's dwgen at import time, and the renderings must come from the other checkout's.
    line_parser = LineParser(add_help=False)
    add_problem_arguments(line_parser)
    line_parser.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    line_parser.add_argument("--edit", action="append", default=[])
    line_parser.add_argument("--rounds", type=int)
    line_parser.add_argument("--order")
    line_parser.add_argument("names", nargs="+")
    try:
        a.out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        print(f"render-variants: {a.out}: {e.strerror}", file=sys.stderr)
        return 2
    written = failed = 0
    for n, line in enumerate(a.ab_file.read_text().splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            args = line_parser.parse_args(shlex.split(line))
            p = problem_from_args(args)
        except (ProblemError, ValueError) as e:
            print(f"render-variants: {a.ab_file}:{n}: {e}", file=sys.stderr)
            return 2
        for name in args.names:
            try:
                source = render_variant(variant_from_name(name, p, args.direction))
            except (RenderError, ValueError) as e:
                print(f"{a.ab_file}:{n}: {name}: not rendered ({e})")
                failed += 1
                continue
            (a.out / f"{name}.cu").write_text(source)
            written += 1
    print(f"rendered {written} variants with {a.root}'s templates into {a.out}" + (f"; {failed} not" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
