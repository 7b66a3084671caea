"""Progress display: a bar on a terminal, plain lines in a pipe or file, nothing when quiet."""
from __future__ import annotations

import io

import pytest

from dwgen.progress import Progress, best_text, choose_mode, clock


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("stream, quiet, mode", [
    (Tty(), False, "bar"), (io.StringIO(), False, "lines"), (Tty(), True, "off"), (io.StringIO(), True, "off"),
])
def test_mode_follows_the_stream_and_quiet(stream, quiet, mode):
    assert choose_mode(stream, quiet) == mode
    assert Progress(3, "x", quiet=quiet, stream=stream).mode == mode


def test_bar_on_a_terminal_shows_counts_and_note():
    out = Tty()
    with Progress(4, "compiling", stream=out) as p:
        p.set_note("best 0.2553 ms, 0.99x copy, 4.99x PyTorch")
        p.advance(3)
    text = out.getvalue()
    assert "compiling" in text and "3/4" in text and "\r" in text  # redrawn in place, tqdm style
    assert "best 0.2553 ms, 0.99x copy, 4.99x PyTorch" in text


def test_plain_lines_are_periodic_with_elapsed_and_remaining():
    out, t = io.StringIO(), Clock()
    p = Progress(10, "compiling", stream=out, every_s=15.0, clock_fn=t)
    t.t = 1.0
    p.advance()  # too soon for a line
    assert out.getvalue() == ""
    t.t = 20.0
    p.set_note("1 failed")
    p.advance()
    assert out.getvalue().splitlines() == ["compiling: 2/10 variants, 1 failed, 0:20 elapsed, ~1:20 left"]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()  # nothing a log file cannot show


def test_plain_lines_end_with_where_it_stopped():
    out, t = io.StringIO(), Clock()
    with Progress(120, "search", stream=out, clock_fn=t) as p:
        t.t = 1.0
        p.advance(40)  # a search that ran out of space before its trials
    assert out.getvalue().splitlines() == ["search: 40/120 variants, 0:01 elapsed, ~0:02 left"]


def test_quiet_prints_nothing_and_wrap_leaves_log_alone():
    out, seen = Tty(), []
    with Progress(2, "x", quiet=True, stream=out) as p:
        log = p.wrap(seen.append)
        p.advance(2)
        log("a line")
    assert out.getvalue() == "" and seen == ["a line"] and log == seen.append


def test_log_lines_print_above_a_bar(capsys):
    out = Tty()
    with Progress(2, "x", stream=out) as p:
        p.wrap(print)("variant line")
    assert capsys.readouterr().out == "variant line\n"


def test_clock_and_best_text():
    assert [clock(5), clock(125), clock(3725)] == ["0:05", "2:05", "1:02:05"]
    assert best_text(None) == ""
    assert best_text(0.25534, 0.987, 4.991) == "best 0.2553 ms, 0.99x copy, 4.99x PyTorch"
    assert best_text(0.25534) == "best 0.2553 ms"
