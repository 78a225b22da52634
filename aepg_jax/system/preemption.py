"""Stopping: a run told to stop (SIGTERM, SIGUSR1, Ctrl-C) stops at its next step, checkpointed.

SLURM (on `scancel`, a time limit, `scontrol requeue` or preemption), spot VMs and preemptible
TPUs send SIGTERM and, after a grace period, SIGKILL; an sbatch `--signal=B:USR1@<seconds>`
asks for SIGUSR1 ahead of the time limit; Ctrl-C sends SIGINT. Inside `catch()` these signals
are recorded instead of ending the process: the trainers ask `agree()` after every step (the
last step of a task or epoch included, before its evaluation), and on a signal `save_and_stop`
writes the checkpoint, waits for it and raises `Preempted`; a signal during an evaluation is
acted on at the next checkpoint that follows it. Then `aepg_jax.main` and `aepg_jax.sweep`
end with one line and exit status `128 + signal number` (143 for SIGTERM, 138 for SIGUSR1, 130
for SIGINT), what a shell reports for a process that the signal ended. Running the same
command again resumes exactly.

A second Ctrl-C is the user's "now": it raises `KeyboardInterrupt` at once (the step in
progress, or the checkpoint being written, is abandoned; `aepg_jax.main` says from where the
rerun resumes), unless the stop's checkpoint is already on disk. On a terminal the first one
is acknowledged at once with a line saying so (a step, an evaluation or a compilation may take
a while before the stop).

Signals reach a process, not a function: the handler writes the one fact that the signal
arrived into this module's `_received`, which `catch()` owns (set on entry, cleared on exit).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, Protocol

import jax
import numpy as np
from jax.experimental import multihost_utils

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
ACKNOWLEDGED = (
    "Ctrl-C: stopping once the step in progress is checkpointed (Ctrl-C again stops at once, "
    "without that checkpoint)"
)

_received: list[int] = []  # the signals received inside `catch()`, first one first
_written: list[bool] = []  # [True] once the stop's checkpoint is on disk (`save_and_stop`)


def how(signum: int) -> str:
    """How a run stopped by `signum` says so: "interrupted" (Ctrl-C) or "stopped by SIGTERM"."""
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"


class Preempted(Exception):
    """The run stopped on a signal after writing what it needs to resume."""

    def __init__(self, signum: int, where: str):
        self.signum = signum
        self.status = 128 + signum
        self.how = how(signum)
        super().__init__(f"{self.how} {where}")


class Saver(Protocol):
    """What `save_and_stop` needs of a checkpointer (`runs.checkpointing.Checkpointer`)."""

    directory: str

    def save(
        self,
        step: int,
        items: Mapping[str, Any],
        meta: Mapping[str, Any],
        resumes: str | None = None,
    ) -> None: ...

    def wait(self) -> None: ...


def save_and_stop(
    signum: int,
    ckpt: Saver,
    step: int,
    items: Mapping[str, Any],
    meta: Mapping[str, Any],
    where: str,
    resumes: str | None = None,
) -> NoReturn:
    """Saves checkpoint `step` (`resumes`: what a run resumed from it does, in words), waits
    until it is written, raises `Preempted` saying `where` the run stopped and which
    checkpoint resumes it."""
    ckpt.save(step, items, meta, resumes)
    ckpt.wait()
    _written[:] = [True]  # a second Ctrl-C from now on has nothing left to cut short
    raise Preempted(signum, f"{where} (checkpoint {step} in {ckpt.directory})")


def requested() -> int | None:
    """The first signal received inside `catch()`, or None."""
    return _received[0] if _received else None


def agree(checkpoint_due: bool) -> tuple[int | None, bool]:
    """`(requested(), checkpoint_due)` as every process of the run sees them: a checkpoint is
    a collective, so one process's signal or clock decides for all (one small all-gather with
    several processes, none with one)."""
    signum = requested()
    if jax.process_count() == 1:
        return signum, checkpoint_due
    both = multihost_utils.process_allgather(
        np.asarray([signum or 0, int(checkpoint_due)], np.int32)
    )
    return int(both[:, 0].max()) or None, bool(both[:, 1].max())


@contextlib.contextmanager
def catch(signals: tuple[int, ...] = SIGNALS) -> Iterator[None]:
    """Within the block, `signals` are recorded (`requested()`), not fatal; a second SIGINT
    raises `KeyboardInterrupt` (unless the stop's checkpoint is written). Outside the main
    thread (where Python cannot install handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def record(signum, _frame):
        if signum == signal.SIGINT and signal.SIGINT in _received:
            if not _written:
                raise KeyboardInterrupt
            return
        if signum == signal.SIGINT:
            _acknowledge()
        _received.append(signum)

    previous = {s: signal.signal(s, record) for s in signals}
    _received.clear()
    _written.clear()
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _received.clear()
        _written.clear()


def _acknowledge() -> None:
    """The first Ctrl-C's line, on a terminal only (a log or a pipe gets the stop's line alone),
    from process 0. `os.write`: a signal handler may run inside a `print` to stderr."""
    try:
        if not os.isatty(2) or jax.process_index() != 0:
            return
        os.write(2, f"\n{ACKNOWLEDGED}\n".encode())
    except OSError:
        pass
