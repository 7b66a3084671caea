"""Shared-memory wavefronts of the backward's raw stage over (B, C, L), one warp, by a bank model.

    python scripts/bank-model.py [--run-words 8]

Banks are 4 bytes wide, 32 of them; a warp's access is split into phases of 128 bytes (8 threads for 16-byte
accesses, 16 for 8-byte, 32 for 4-byte), and a phase takes as many wavefronts as the most distinct words any
one bank holds. The model takes the template's layout: window vector i (16 bytes) lands `s` words before
chunk i + 1 (s = off / E, 0 to 3), and thread t's run starts at word run_words * t + 4 (the vector of room in
front). It prints the run loads and the vector commits of one warp with chunks where they are now and where
docs/proposed/bwdswizzle.diff places them (chunk_at), as that patch's analysis counted them.
"""
from __future__ import annotations

import argparse


def wavefronts(first_words: list[int], width: int) -> int:
    """Wavefronts of one warp-wide access of `width` words a thread starting at first_words[t]."""
    per_phase = {4: 8, 2: 16, 1: 32}[width]
    total = 0
    for phase in range(0, 32, per_phase):
        banks: dict[int, set[int]] = {}
        for t in range(phase, phase + per_phase):
            for k in range(width):
                w = first_words[t] + k
                banks.setdefault(w % 32, set()).add(w)
        total += max(len(words) for words in banks.values())
    return total


def placed(swz: int):
    """Word w's place: chunks counted from chunk 1 and XORed by their group of 8 (swz = 0: as stored now)."""
    def at(w: int) -> int:
        u = (w >> 2) + 7
        return ((u ^ ((u >> 3) & swz)) - 7) * 4 + (w & 3)
    return at


def commits(at, s: int, pair: bool) -> int:
    """Wavefronts to commit one vector a thread at word shift s (16, 2 x 8 or 4 x 4 bytes; 4 + 8 + 4 if pair)."""
    base = [4 * (t + 1) - s for t in range(32)]
    if s == 0:
        return wavefronts([at(b) for b in base], 4)
    if s == 2:
        return sum(wavefronts([at(b + m) for b in base], 2) for m in (0, 2))
    if pair:
        return (wavefronts([at(b) for b in base], 1) + wavefronts([at(b + 1) for b in base], 2)
                + wavefronts([at(b + 3) for b in base], 1))
    return sum(wavefronts([at(b + m) for b in base], 1) for m in range(4))


def main() -> None:
    ap = argparse.ArgumentParser(prog="python scripts/bank-model.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-words", type=int, default=8, choices=(4, 8, 16, 32),
                    help="words between neighbouring runs: OUTS / E (8 for bf16 o16, the target's design)")
    a = ap.parse_args()
    s_words = a.run_words
    chunks = (s_words + 4 + 3) // 4  # a run and its halo: one chunk more than its own
    swz = min(s_words // 4, 8) - 1
    print(f"runs {s_words} words apart: wavefronts per warp (at least 4 for a warp's 16-byte access, 2 for an "
          "8-byte and 1 for a 4-byte one; a vector's commit writes 16 bytes a thread in one access or several)")
    for label, at, pair in (("as stored now", placed(0), False), ("bwdswizzle.diff", placed(swz), True)):
        loads = [wavefronts([at(s_words * t + 4 + 4 * i) for t in range(32)], 4) for i in range(chunks)]
        stores = {s: commits(at, s, pair) for s in range(4)}
        print(f"  {label:16s} run loads {loads} (sum {sum(loads)}); commit a vector, by word shift {stores}")


if __name__ == "__main__":
    main()
