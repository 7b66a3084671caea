"""Command-line checking shared by tune.py and the python -m tools: every mistake is one line and exit status 2."""
from __future__ import annotations

import argparse
import math
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

# Optuna storages tune.py can open: SQLAlchemy URLs of these databases (with an optional +driver), Optuna's
# journal file as journal:///FILE, or 'memory'.
STORAGE_SCHEMES = ("sqlite", "postgresql", "mysql", "journal")
_STORAGE_RE = re.compile(r"^(?P<scheme>[a-z][a-z0-9]*)(\+[a-z0-9_]+)?://")


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser that reports a mistake as `prog: message` on one line of stderr and exits with 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace=None):
        return super().parse_known_args(self._attach_dash_values(sys.argv[1:] if args is None else list(args)),
                                        namespace)

    def _attach_dash_values(self, args: list[str]) -> list[str]:
        # argparse reads a value that starts with '-' (--shape -1x2x3) as a flag of its own, then reports its
        # option as missing a value. Written --shape=-1x2x3 the value reaches its own check, which says what
        # is wrong with it. A real flag after the option (--shape --dry-run) is left for argparse to report.
        takes_value = {s for a in self._actions if a.nargs is None for s in a.option_strings}
        flags = [s for a in self._actions for s in a.option_strings]
        out, i = [], 0
        while i < len(args):
            tok = args[i]
            nxt = args[i + 1] if i + 1 < len(args) else None
            if tok in takes_value and nxt is not None and nxt.startswith("-") and nxt != "--" and not any(
                    f == nxt or (nxt.startswith("--") and f.startswith(nxt.split("=", 1)[0])) for f in flags):
                out.append(f"{tok}={nxt}")
                i += 2
                continue
            out.append(tok)
            i += 1
        return out


def int_range(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer from lo to hi (no upper bound when hi is None)."""
    span = f"an integer from {lo} to {hi}" if hi is not None else f"an integer of at least {lo}"

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer: give {span}") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is out of range: give {span}")
        return v

    return parse


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(v) or v <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive, finite number of seconds")
    return v


PADDING_NAMES = ("same", "causal")


def padding(text: str) -> int | str:
    """An argparse type: 'same', 'causal', or a non-negative integer."""
    if text in PADDING_NAMES:
        return text
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is neither 'same', 'causal' nor an integer of at least 0") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{v} is out of range: give 'same', 'causal' or an integer of at least 0")
    return v


def arch(text: str) -> str:
    """An argparse type: an nvcc real architecture such as sm_90 or sm_90a (a compiled kernel needs a real one)."""
    if not re.fullmatch(r"sm_\d{2,3}[a-z]?", text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a GPU architecture: write it as sm_90, sm_90a, sm_100a")
    return text


def directory(text: str) -> Path:
    """An argparse type: a folder that exists or can be made (a file in its place is refused now, not later)."""
    p = Path(text)
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a folder")
    return p


def storage(text: str) -> str:
    """An argparse type: 'memory' or an Optuna storage URL whose database dwgen knows; opened later."""
    if text == "memory":
        return text
    m = _STORAGE_RE.match(text)
    if not m or m.group("scheme") not in STORAGE_SCHEMES or (
            m.group("scheme") == "journal" and not text.startswith("journal:///")):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a storage dwgen can open: give sqlite:///FILE, postgresql://..., mysql://..., "
            "journal:///FILE or memory")
    return text
