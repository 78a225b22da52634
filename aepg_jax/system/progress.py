"""Progress bars whose rate and ETA leave out compilation, and where a run is (for Ctrl-C).

A jitted step's first call compiles it (seconds on a CPU), so a bar that starts its clock before
that call shows an ETA of hours at step 1. `bar(...)` shows "compiling" until `started(bar, n)`
is called after the first call returns; that restarts the bar's clock at step `n`, so the rate
and ETA count only compiled steps.

On a terminal the bar redraws itself in place (carriage returns). Written to a file or a pipe
(a sweep's `sweep.log`, `python -m aepg_jax.main ... > log`, a SLURM output file), a bar is a
`LineBar` instead: its state as a plain line at most every `LINE_EVERY_S` seconds of progress
and once more when it closes, so that logs hold lines, not carriage-return redraws. `new(...)`
makes the right one for any tqdm use in the package.

`at(...)` records where the run is, in people's terms (task t = 1..T, as the console prints),
and `resumes(...)` what the same command does from the newest checkpoint on disk;
`interrupted_message()` is the line `main` prints when a second Ctrl-C stops a run at once,
without a checkpoint of where it was.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import tqdm

LINE_EVERY_S = 30.0  # a LineBar's least interval between two lines
_where: str | None = None
_resumes: str | None = None  # what the same command does from the newest checkpoint on disk


class LineBar(tqdm.tqdm):
    """A tqdm bar for a file or pipe: its state as a plain line, without a carriage return, at
    most every `LINE_EVERY_S` seconds (only when it moved) and when it closes."""

    def __init__(self, *args: Any, **kwargs: Any):
        self._line_at: float | None = None  # time.monotonic() of the last line
        self._line_n: float | None = None  # the count it showed
        super().__init__(*args, **kwargs)

    def _line(self) -> None:
        self.fp.write(str(self).strip() + "\n")
        self.fp.flush()
        self._line_at, self._line_n = time.monotonic(), self.n

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if msg is not None:  # tqdm clearing its line: a log has none to clear
            return False
        due = self._line_at is None or time.monotonic() - self._line_at >= LINE_EVERY_S
        if due and self.n != self._line_n:
            self._line()
        return True

    def clear(self, nolock: bool = False) -> None:
        """Nothing to erase before `tqdm.write` prints: the lines stay."""

    def close(self) -> None:
        if not self.disable and self._line_at is not None and self.n != self._line_n:
            self._line()  # the final count
        self.leave = False  # tqdm would end with a newline or a carriage return
        super().close()


def _terminal(kwargs: dict[str, Any]) -> bool:
    stream = kwargs.get("file") or sys.stderr
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


def new(*args: Any, **kwargs: Any) -> tqdm.tqdm:
    """`tqdm.tqdm(*args, **kwargs)` on a terminal, else a `LineBar`."""
    return (tqdm.tqdm if _terminal(kwargs) else LineBar)(*args, **kwargs)


def bar(total: int, initial: int = 0, **kwargs: Any) -> tqdm.tqdm:
    """A progress bar (`new`) that says "compiling" until `started` is called."""
    b = new(total=total, initial=initial, dynamic_ncols=True, **kwargs)
    if not b.disable:
        b.set_postfix_str("compiling")
    return b


def started(b: tqdm.tqdm, n: int) -> None:
    """Moves `b` to `n` done steps and restarts its clock: the rate and ETA start here."""
    if b.disable:
        b.n = n
        return
    b.reset(total=b.total)  # fresh clock and rate estimate; n = 0
    b.n = b.last_print_n = b.initial = n
    b.set_postfix_str("", refresh=True)


def at(**position: Any) -> None:
    """Records where the run is, e.g. `at(task=2, step=40)` (task 1-based)."""
    global _where
    _where = ", ".join(f"{k} {v}" for k, v in position.items())


def clear() -> None:
    global _where
    _where = None
    resumes(None)


def resumes(what: str | None) -> None:
    """The same command does what `what` says (e.g. "task 2/5 starts over", "it resumes at task
    2/5, step 40/180"; None: it starts from the beginning)."""
    global _resumes
    _resumes = what


def interrupted_message() -> str:
    """The one line printed when a second Ctrl-C stopped the run at once."""
    where = f"at {_where}" if _where else "before training started"
    resume = _resumes or "it starts from the beginning"
    return (
        f"interrupted at once {where}, without a checkpoint of it; run the same command: {resume}"
    )
