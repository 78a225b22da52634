"""The processes of a run: starting JAX's distributed runtime, and what they must agree on.

A run of N processes (hosts, or several processes on one machine via `aepg_jax.launch`) is one
SPMD program: every process runs the same code on the same config, JAX's collectives join
their devices into one mesh, process 0 writes the files. `initialize(distributed)` starts the
runtime from the environment:

* `AEPG_NUM_PROCESSES`, `AEPG_PROCESS_ID` and `JAX_COORDINATOR_ADDRESS` (host:port of process
  0), as `aepg_jax.launch` sets them; or
* `--config.distributed=True` / `JAX_COORDINATOR_ADDRESS` alone: `jax.distributed.initialize()`
  detects the rest from the cluster (SLURM, Open MPI, Cloud TPU, Kubernetes).

`AEPG_HEARTBEAT_TIMEOUT_S` (default 100, JAX's) bounds how long the survivors of a process
that died alone keep running: JAX's coordination service then aborts them with "another task
died". On CPU, cross-process collectives use gloo (`JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo`,
JAX's default since 0.5; set explicitly here).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

import jax
import numpy as np
from jax.experimental import multihost_utils

from aepg_jax.launch.launch import (
    CPU_COLLECTIVES,
    ENV_COORDINATOR,
    ENV_LAUNCHER_PID,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
)

ENV_HEARTBEAT = "AEPG_HEARTBEAT_TIMEOUT_S"
_PR_SET_PDEATHSIG = 1


def _env_int(name: str) -> int | None:
    text = os.environ.get(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r} must be an integer.") from None


def launched_processes() -> tuple[int, int] | None:
    """(num_processes, process_id) set by `aepg_jax.launch`, or None."""
    n, i = _env_int(ENV_NUM_PROCESSES), _env_int(ENV_PROCESS_ID)
    if n is None and i is None:
        return None
    if n is None or i is None or not 0 <= i < n:
        raise ValueError(
            f"{ENV_NUM_PROCESSES}={n} and {ENV_PROCESS_ID}={i}: set both, with "
            "0 <= process id < number of processes (aepg_jax.launch does)."
        )
    if not os.environ.get(ENV_COORDINATOR):
        raise ValueError(f"{ENV_NUM_PROCESSES} is set but {ENV_COORDINATOR} (host:port) is not.")
    return n, i


def _die_with_launcher() -> None:
    """A launched process is SIGKILLed when its launcher dies (Linux), never orphaned."""
    launcher = _env_int(ENV_LAUNCHER_PID)
    if launcher is None:
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: JAX's heartbeat timeout stops an orphan
    if os.getppid() != launcher:  # the launcher died before prctl
        os.kill(os.getpid(), signal.SIGKILL)


def initialize(distributed: bool) -> bool:
    """Starts JAX's distributed runtime when the run has several processes; True if it did.

    Must run before anything touches a JAX device."""
    launched = launched_processes()
    _die_with_launcher()
    if launched is None and not (distributed or os.environ.get(ENV_COORDINATOR)):
        return False
    if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        # Cross-process all-reduce on CPU needs a collectives backend (unused on GPU/TPU).
        jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
    kwargs = {}
    heartbeat = _env_int(ENV_HEARTBEAT)
    if heartbeat is not None:
        kwargs["heartbeat_timeout_seconds"] = heartbeat
    if launched is not None:
        kwargs.update(
            coordinator_address=os.environ[ENV_COORDINATOR],
            num_processes=launched[0],
            process_id=launched[1],
        )
    jax.distributed.initialize(**kwargs)
    with _native_output_silenced():
        # The first cross-process collective connects gloo's peers, which print "[Gloo] Rank r
        # is connected to n peer ranks..." from C++: connect now, with that output dropped.
        everywhere(True)
    return True


@contextlib.contextmanager
def _native_output_silenced() -> Iterator[None]:
    """Points file descriptors 1 and 2 at /dev/null (what C++ code writes to) meanwhile."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
        os.dup2(null, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def is_main() -> bool:
    """Whether this process writes the run's files (process 0)."""
    return jax.process_index() == 0


def everywhere(value: bool) -> bool:
    """Whether `value` is true on every process: a host-side decision (e.g. "is this file
    there?") that all processes must take alike, else their collectives would diverge and
    hang. Hosts need not share a filesystem."""
    if jax.process_count() == 1:
        return value
    return bool(np.all(multihost_utils.process_allgather(np.asarray(value))))


def gather(tree: Any) -> Any:
    """A host (NumPy) copy of every array of `tree`; arrays spread over the processes of a
    multi-process run come back whole, on every process."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


# What JAX's errors say when a peer process is gone (gloo's TCP pairs, the coordination service).
_LOST_PEER = ("Gloo", "closed by peer", "reset by peer", "heartbeat", "CoordinationService")


def lost_a_process(err: BaseException) -> bool:
    """Whether `err` says that another process of a multi-process run is gone."""
    return jax.process_count() > 1 and any(m in str(err) for m in _LOST_PEER)


def leave(status: int, at_once: bool = False) -> NoReturn:
    """Ends this process with `status`. With several processes, or `at_once`, it leaves
    without the interpreter's shutdown: a process that fails alone must not wait at JAX's
    shutdown barrier (run at exit) for peers blocked in a collective it will never join (the
    launcher, or JAX's heartbeat timeout, stops them), nor join threads that never finish (a
    failed Orbax save's)."""
    if jax.process_count() == 1 and not at_once:
        sys.exit(status)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
