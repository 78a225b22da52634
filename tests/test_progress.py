"""Progress bars: on a terminal tqdm redraws in place; written to a file or pipe, a bar is plain
lines (no carriage return) at most every `LINE_EVERY_S` seconds and once when it closes, and
`tqdm.write` lines between them stay whole."""

from __future__ import annotations

import io

import tqdm

from aepg_jax.system import progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_bar_written_to_a_file_is_plain_lines(monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 0.0)
    out = io.StringIO()
    bar = progress.bar(10, unit="step", desc="task 1/2", file=out, mininterval=0)
    assert isinstance(bar, progress.LineBar)
    progress.started(bar, 1)
    for _ in range(9):
        bar.update(1)
        tqdm.tqdm.write("a line of the run", file=out)
    bar.close()
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert lines.count("a line of the run") == 9
    bars = [line for line in lines if line.startswith("task 1/2")]
    assert bars[-1].startswith("task 1/2: 100%") and "10/10" in bars[-1]
    assert len(bars) == len(set(bars))  # a count is shown once


def test_a_file_bar_waits_between_lines_and_a_terminal_bar_redraws(monkeypatch):
    monkeypatch.setattr(progress, "LINE_EVERY_S", 3600.0)
    out = io.StringIO()
    bar = progress.new(total=100, desc="caching", file=out, mininterval=0)
    for _ in range(100):
        bar.update(1)
    bar.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and "0/100" in lines[0] and "100/100" in lines[1]  # first and last
    term = _Terminal()
    bar = progress.new(total=3, desc="caching", file=term, mininterval=0)
    assert not isinstance(bar, progress.LineBar)
    bar.update(3)
    bar.close()
    assert "\r" in term.getvalue()
