"""One line a problem from the `renders` step's log (scripts/gpu-session.sh renders): each rendering's fastest and
slowest median over the rounds, and whether every rendering's output hashed the same (bit-identical results).

    python scripts/renders-table.py renders.log [base new ...]   # the folders' last path parts; default: all
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict

HEADER = re.compile(r"== (\S+) \(round")
LINE = re.compile(r"(.{26}) rc (\d+)\s+([\d.]+) ms(?:\s+memcpy [\d.]+ ms\s+[\d.]+x)?\s+hash (\w+)")


def table(lines, names: list[str] | None = None) -> list[str]:
    times: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    hashes: dict[str, set[str]] = defaultdict(set)
    seen: list[str] = []
    current = None
    for line in lines:
        if m := HEADER.match(line):
            current = m.group(1).rstrip("/").split("/")[-1]
            if current not in seen:
                seen.append(current)
        elif (m := LINE.match(line)) and current:
            tag = m.group(1).strip()
            times[tag][current].append(float(m.group(3)))
            hashes[tag].add(m.group(4))
    names = names or seen
    out = [f"{'problem':28s} " + " ".join(f"{n:>15s}" for n in names) + "  same output"]
    for tag, by_name in times.items():
        cells = [f"{min(by_name[n]):.4f}/{max(by_name[n]):.4f}" if by_name.get(n) else f"{'-':>13s}" for n in names]
        same = "yes" if len(hashes[tag]) == 1 else "NO"
        out.append(f"{tag:28s} " + " ".join(f"{c:>15s}" for c in cells) + f"  {same}")
    return out


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    try:
        with open(argv[0]) as f:
            print("\n".join(table(f, argv[1:] or None)))
    except OSError as e:
        print(f"scripts/renders-table.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
