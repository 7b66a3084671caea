"""Static SASS of named variants, without a GPU: registers, shared memory and instruction counts per kernel.

    python scripts/sass.py --shape 32x512x8192 -k 3 --padding 1 --dtype bf16 --direction bwd \
        dw1d_bwd_bf16_k3_t128_o16_rawp_b4

Each variant is rendered from the templates as they are now (apply a patch from docs/proposed first to see
its effect), compiled with the search's nvcc flags to a cubin for --arch and read back with cuobjdump. Static
counts say what a change does to the code; what runs is what ncu counts (gpu-session.sh ncu). cuobjdump is
looked for in $CUOBJDUMP, on PATH, then in CUDA_HOME/bin.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dwgen import cli, render  # noqa: E402
from dwgen.build import ToolchainError, cuda_home, kernel_instance, nvcc_path  # noqa: E402
from dwgen.problem import ProblemError  # noqa: E402
from dwgen.space import NVCC_FLAGS, variant_from_name  # noqa: E402
from dwgen.suite import add_problem_arguments, problem_from_args  # noqa: E402

# Opcodes worth a column: memory traffic, barriers, the FMA pipe's work and the 16-bit unpacking.
SHOWN = ("LDG", "STG", "LDS", "STS", "BAR", "SHFL", "MUFU", "FFMA", "FMUL", "FADD", "PRMT", "LOP3", "IMAD", "IADD3")
_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
_FUNCTION = re.compile(r"Function : (\S+)")
_RESOURCES = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)")


def cuobjdump() -> str:
    for found in (os.environ.get("CUOBJDUMP"), shutil.which("cuobjdump"), str(Path(cuda_home(), "bin", "cuobjdump"))):
        if found and Path(found).exists():
            return found
    raise ToolchainError("cuobjdump not found: set CUOBJDUMP to its path (it ships with the CUDA toolkit)")


def short_name(function: str) -> str:
    """A kernel's name with its template argument (the activation), e.g. dw1d_..._b4<1>, not its mangling."""
    name, act = kernel_instance(function)
    return name if act is None else f"{name}<{act}>"


def kernel_table(cubin: Path) -> list[tuple[str, int, int, int, collections.Counter]]:
    """(function, registers, stack bytes, static shared bytes, opcode counts) for each kernel of a cubin."""
    tool = cuobjdump()
    sass = subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    res = subprocess.run([tool, "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    resources = {m[0]: tuple(int(v) for v in m[1:]) for m in _RESOURCES.findall(res)}
    counts: dict[str, collections.Counter] = {}
    current = None
    for line in sass.splitlines():
        if m := _FUNCTION.search(line):
            current = counts.setdefault(m.group(1), collections.Counter())
        elif current is not None and (m := _INSTRUCTION.search(line)):
            current[m.group(1)] += 1
    return [(f, *resources.get(f, (-1, -1, -1)), c) for f, c in counts.items()]


def main(argv: list[str]) -> int:
    ap = cli.OneLineParser(prog="python scripts/sass.py", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    add_problem_arguments(ap)
    ap.add_argument("names", nargs="+", help="variant names as tune.py prints them")
    ap.add_argument("--direction", choices=("fwd", "bwd"), default="fwd")
    ap.add_argument("--arch", default="sm_90", help="nvcc -arch (default sm_90, the H200)")
    ap.add_argument("--keep", type=Path, help="keep each variant's .cu and .cubin in this folder")
    a = ap.parse_args(argv)
    try:
        problem = problem_from_args(a)
        variants = [variant_from_name(n, problem, a.direction) for n in a.names]
        nvcc = nvcc_path()
    except (ProblemError, ValueError, ToolchainError) as e:
        print(f"python scripts/sass.py: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        out = a.keep or Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        for v in variants:
            src, cubin = out / f"{v.name}.cu", out / f"{v.name}.cubin"
            src.write_text(render.render_variant(v))
            built = subprocess.run([nvcc, "-cubin", f"-arch={a.arch}", *NVCC_FLAGS, "-o", str(cubin), str(src)],
                                   capture_output=True, text=True)
            if built.returncode != 0:
                print(f"python scripts/sass.py: {v.name} did not compile:\n{built.stderr[-2000:]}", file=sys.stderr)
                return 1
            try:
                table = kernel_table(cubin)
            except ToolchainError as e:
                print(f"python scripts/sass.py: {e}", file=sys.stderr)
                return 2
            print(v.name)
            print(f"  {'kernel':44s} {'regs':>4s} {'stack':>5s} {'smem':>6s} {'total':>6s}  " +
                  " ".join(f"{o:>5s}" for o in SHOWN))
            for function, regs, stack, smem, counts in table:
                print(f"  {short_name(function)[-44:]:44s} {regs:4d} {stack:5d} {smem:6d} {sum(counts.values()):6d}  " +
                      " ".join(f"{counts[o]:5d}" for o in SHOWN))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
