"""Progress of long work: a live tqdm bar on a terminal, a plain line now and then elsewhere, nothing when quiet."""
from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

# Plain lines go to logs and CI output: often enough to show life, rarely enough not to drown the results.
PLAIN_EVERY_S = 15.0


def choose_mode(stream: TextIO, quiet: bool) -> str:
    """'off' when asked to be quiet, 'bar' on a terminal, 'lines' when the output is a file or a pipe."""
    if quiet:
        return "off"
    isatty = getattr(stream, "isatty", None)
    return "bar" if isatty is not None and isatty() else "lines"


def clock(seconds: float) -> str:
    """Seconds as m:ss or h:mm:ss, the way tqdm shows elapsed and remaining time."""
    s = int(seconds)
    h, m = divmod(s // 60, 60)
    return f"{h}:{m:02d}:{s % 60:02d}" if h else f"{m}:{s % 60:02d}"


def best_text(ms: float | None, x_copy: float | None = None, speedup: float | None = None) -> str:
    """The search's best so far, in the words tune.py's summary uses."""
    if ms is None:
        return ""
    parts = [f"best {ms:.4f} ms"]
    if x_copy:
        parts.append(f"{x_copy:.2f}x copy")
    if speedup:
        parts.append(f"{speedup:.2f}x PyTorch")
    return ", ".join(parts)


class Progress:
    """done/total of one long step, shown as the output allows; a no-op when quiet.

    The stream is stderr by default, so that stdout keeps only results (tables, --json)."""

    def __init__(self, total: int, desc: str, *, quiet: bool = False, stream: TextIO | None = None,
                 unit: str = "variant", every_s: float = PLAIN_EVERY_S,
                 clock_fn: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.mode = choose_mode(self.stream, quiet)
        self.total, self.desc, self.unit, self.done = total, desc, unit, 0
        self.note = ""
        self._clock, self._every_s = clock_fn, every_s
        self._t0 = self._last = clock_fn()
        self._shown = -1  # `done` at the last plain line, so that close() does not repeat it
        self._bar = None
        if self.mode == "bar":
            try:
                from tqdm import tqdm  # comes with optuna; without it a terminal gets the plain lines
            except ImportError:
                self.mode = "lines"
            else:
                self._bar = tqdm(total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True,
                                 smoothing=0.1, leave=True)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        self._maybe_line(final=self.done >= self.total)

    def describe(self, desc: str) -> None:
        """What is happening now (e.g. 'compiling 3/32'), in place of the description given at the start."""
        self.desc = desc
        if self._bar is not None:
            self._bar.set_description_str(desc, refresh=True)
        self._maybe_line()

    def set_note(self, note: str) -> None:
        """Text after the counts: the best so far, failures."""
        self.note = note
        if self._bar is not None:
            self._bar.set_postfix_str(note, refresh=True)

    def wrap(self, log: Callable[[str], None]) -> Callable[[str], None]:
        """`log`, made to print above the bar instead of through it."""
        if self._bar is None:
            return log

        def log_above(line: str) -> None:
            with self._paused():
                log(line)
        return log_above

    @contextlib.contextmanager
    def _paused(self) -> Iterator[None]:
        from tqdm import tqdm

        # Clears the bars on stdout/stderr, lets the caller print, then draws them again below.
        with tqdm.external_write_mode(file=sys.stdout):
            yield

    def line(self) -> str:
        """The plain progress line: the same facts as the bar, for logs."""
        elapsed = self._clock() - self._t0
        text = f"{self.desc}: {self.done}/{self.total} {self.unit}s"
        if self.note:
            text += f", {self.note}"
        text += f", {clock(elapsed)} elapsed"
        if 0 < self.done < self.total:
            text += f", ~{clock(elapsed / self.done * (self.total - self.done))} left"
        return text

    def _maybe_line(self, final: bool = False) -> None:
        if self.mode != "lines":
            return
        now = self._clock()
        if final or now - self._last >= self._every_s:
            self._last, self._shown = now, self.done
            print(self.line(), file=self.stream, flush=True)

    def close(self) -> None:
        if self.mode == "lines" and self.done != self._shown:
            self._maybe_line(final=True)  # where it ended: a search may stop before its total
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
