"""Progress bars whose rate and ETA leave out compilation, and where a run is (for Ctrl-C).

A jitted step's first call compiles it (seconds on a CPU), so a bar that starts its clock before
that call shows an ETA of hours at step 1. `bar(...)` shows "compiling" until `started(bar, n)`
is called after the first call returns; that restarts the bar's clock at step `n`, so the rate
and ETA count only compiled steps.

`at(...)` records where the run is, in people's terms (task t = 1..T, as the console prints);
`interrupted_message()` is the line `main` prints on Ctrl-C.
"""

from __future__ import annotations

from typing import Any

import tqdm

_where: str | None = None


def bar(total: int, initial: int = 0, **kwargs: Any) -> tqdm.tqdm:
    """A tqdm bar that says "compiling" until `started` is called."""
    b = tqdm.tqdm(total=total, initial=initial, dynamic_ncols=True, **kwargs)
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


def interrupted_message() -> str:
    """The one line printed on Ctrl-C."""
    where = f"at {_where}" if _where else "before training started"
    return f"interrupted {where}; run the same command to resume"
