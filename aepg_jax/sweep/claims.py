"""Sweep workers: any number of `aepg_jax.sweep` processes on one sweep directory cooperate.

Each worker goes down the runs (most expensive first) and claims the first one that is not
finished, has not failed since this worker started, and is not held: the claim is the run's
own lock (`runs/lock.py`), held until the run ends, so no run directory is ever written by two
processes. "Failed since this worker started" compares no clocks: the worker notes each run's
error file (inode, size, mtime, content) when it starts (`Started`); an error file that is new
or changed since, or a run this worker itself tried, counts as failed now. A run whose lock
cannot be used (`lock.LockError`: a full disk, an unreadable `.lock`) is run anyway, which fails
in one line before touching anything and is recorded as failed; a run taken over by another
process while this worker was paused (`lock.Lost`) is left to it.

When every unfinished run is held by another worker it waits (AEPG_SWEEP_POLL_S
seconds between looks) so that a run whose worker dies (its lock freed by the kernel, or its
heartbeat gone stale) is claimed again and resumes from its checkpoint. It ends when every run
is done or has failed since it started (a run that failed before is tried again), or on a
stop signal (`system/preemption.py`): the run in progress checkpoints its step and the worker
claims no other. A worker with nothing left to run ends normally, even after a signal that
its last run finished despite (SLURM then has nothing to requeue).
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


def _error_identity(root: str, unit: layout.Unit) -> tuple | None:
    """What tells one error file of `unit` from another: inode, size, mtime, content."""
    path = os.path.join(root, unit.name, layout.ERROR_FILE)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            return st.st_ino, st.st_size, st.st_mtime_ns, f.read(4096)
    except OSError:
        return None


class Started:
    """A worker's start: the error files of `units` as they were then, and the runs tried
    since."""

    def __init__(self, root: str, units: Sequence[tuple[int, layout.Unit]]):
        self.errors = {u.name: _error_identity(root, u) for _, u in units}
        self.tried: set[str] = set()


def failed_since(root: str, unit: layout.Unit, started: Started) -> bool:
    """Whether `unit` failed since `started`: tried by this worker, or its error file written
    (new or changed) by another."""
    if unit.name in started.tried:
        return layout.unit_status(root, unit) != "done"
    now = _error_identity(root, unit)
    return now is not None and now != started.errors.get(unit.name)


def pending(root: str, units: Sequence[tuple[int, layout.Unit]], started: Started):
    """The units still to run: not done and not failed since `started`."""
    return [
        (k, u)
        for k, u in units
        if layout.unit_status(root, u) != "done" and not failed_since(root, u, started)
    ]


def claim(root: str, unit: layout.Unit, started: Started) -> bool | None:
    """Takes `unit`'s lock if it is free and the unit still to run; the caller releases it
    (`lock.release`) when True. None: its lock cannot be used (`lock.LockError`)."""
    workdir = os.path.join(root, unit.name)
    try:
        lock.acquire(workdir)
    except lock.Busy:
        return False
    except lock.LockError:
        return None
    if layout.unit_status(root, unit) == "done" or failed_since(root, unit, started):
        lock.release(workdir)  # finished by another worker between the look and the claim
        return False
    return True


def work(
    root: str,
    units: Sequence[tuple[int, layout.Unit]],
    run_one: Callable[[int, layout.Unit, int], None],
    started: Started,
) -> None:
    """Claims and runs `units` (in their order) with `run_one(position, unit, left)` until
    none is left to run; `left`: the units still pending besides this one."""
    waiting = False
    while True:
        todo = pending(root, units, started)
        if not todo:  # nothing left: a signal that came during the last run stops nothing
            return
        signum = preemption.requested()
        if signum:  # between runs: each run's own checkpoints hold everything done
            raise preemption.Preempted(signum, "between runs")
        for k, unit in todo:
            claimed = claim(root, unit, started)
            if claimed is False:
                continue
            started.tried.add(unit.name)
            try:  # unclaimed (None): the run fails on its lock in one line, recorded as failed
                run_one(k, unit, len(todo) - 1)
            except lock.Lost as lost:  # this worker was paused; the run goes on elsewhere
                print(f"{unit.name}: {lost}", flush=True)
            except OSError as err:
                if claimed:
                    raise
                # Its failure could not be recorded either (e.g. the disk is full): said here.
                print(f"{unit.name}: FAILED ({err.strerror}: {err.filename}); not retried by "
                      "this worker.", flush=True)  # fmt: skip
            finally:
                if claimed:
                    lock.release(os.path.join(root, unit.name))
            waiting = False
            break
        else:
            if not waiting:
                print(f"waiting: the {len(todo)} runs left are held by other workers.", flush=True)
                waiting = True
            time.sleep(poll_seconds())
