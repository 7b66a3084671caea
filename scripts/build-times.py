"""Where a build of the frozen module spent its time, from ninja's log in the build folder (DWGEN_BUILD_DIR):
the jobs, their summed seconds, the longest, and when the launcher's C++ started and ended.

    python scripts/build-times.py /tmp/dwgen-build/.ninja_log
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_file():
        print("usage: python scripts/build-times.py BUILD_DIR/.ninja_log", file=sys.stderr)
        return 2
    jobs = []  # (seconds, start, end, target)
    for line in Path(argv[0]).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        start, end, _, target, _ = line.split("\t")
        jobs.append(((int(end) - int(start)) / 1000, int(start) / 1000, int(end) / 1000, target))
    if not jobs:
        print("no jobs in the log", file=sys.stderr)
        return 1
    jobs.sort()
    print(f"{len(jobs)} jobs, {sum(j[0] for j in jobs):.0f} s of compiling in all, the last done at "
          f"{max(j[2] for j in jobs):.1f} s")
    for seconds, start, end, target in jobs[-3:]:
        print(f"  {target}: {seconds:.1f} s ({start:.1f} -> {end:.1f})")
    launcher = [j for j in jobs if j[3].startswith("launch-")]
    for seconds, start, end, _ in launcher:
        print(f"launcher: {seconds:.1f} s, from {start:.1f} s to {end:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
