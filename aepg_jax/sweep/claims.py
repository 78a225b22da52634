"""Sweep workers: any number of `aepg_jax.sweep` processes on one sweep directory cooperate.

Each worker goes down the runs (most expensive first) and claims the first one that is not
finished, has not failed since this worker started, and is not held: the claim is the run's
own lock (`runs/lock.py`), held until the run ends, so no run directory is ever written by two
processes. When every unfinished run is held by another worker it waits (AEPG_SWEEP_POLL_S
seconds between looks) so that a run whose worker dies (its lock freed by the kernel, or its
heartbeat gone stale) is claimed again and resumes from its checkpoint. It ends when every run
is done or has failed since it started (a run that failed before is tried again), or on a
stop signal (`system/preemption.py`): the run in progress checkpoints its step and the worker
claims no other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from aepg_jax.experiments import layout
from aepg_jax.runs import lock
from aepg_jax.system import preemption

ENV_POLL = "AEPG_SWEEP_POLL_S"
DEFAULT_POLL_S = 5.0


def poll_seconds() -> float:
    try:
        return float(os.environ.get(ENV_POLL, DEFAULT_POLL_S))
    except ValueError:
        return DEFAULT_POLL_S


def failed_since(root: str, unit: layout.Unit, started: float) -> bool:
    """Whether `unit` failed (its error file written) at or after `started` (epoch seconds)."""
    try:
        return os.path.getmtime(os.path.join(root, unit.name, layout.ERROR_FILE)) >= started
    except OSError:
        return False


def pending(root: str, units: Sequence[tuple[int, layout.Unit]], started: float):
    """The units still to run: not done and not failed since `started`."""
    return [
        (k, u)
        for k, u in units
        if layout.unit_status(root, u) != "done" and not failed_since(root, u, started)
    ]


def claim(root: str, unit: layout.Unit, started: float) -> bool:
    """Takes `unit`'s lock if it is free and the unit still to run; the caller releases it
    (`lock.release`) when True."""
    workdir = os.path.join(root, unit.name)
    try:
        lock.acquire(workdir)
    except lock.Busy:
        return False
    if layout.unit_status(root, unit) == "done" or failed_since(root, unit, started):
        lock.release(workdir)  # finished by another worker between the look and the claim
        return False
    return True


def work(
    root: str,
    units: Sequence[tuple[int, layout.Unit]],
    run_one: Callable[[int, layout.Unit, int], None],
    started: float,
) -> None:
    """Claims and runs `units` (in their order) with `run_one(position, unit, left)` until
    none is left to run; `left`: the units still pending besides this one."""
    waiting = False
    while True:
        signum = preemption.requested()
        if signum:  # between runs: each run's own checkpoints hold everything done
            raise preemption.Preempted(signum, "between runs")
        todo = pending(root, units, started)
        if not todo:
            return
        for k, unit in todo:
            if claim(root, unit, started):
                try:
                    run_one(k, unit, len(todo) - 1)
                finally:
                    lock.release(os.path.join(root, unit.name))
                waiting = False
                break
        else:
            if not waiting:
                print(f"waiting: the {len(todo)} runs left are held by other workers.", flush=True)
                waiting = True
            time.sleep(poll_seconds())
