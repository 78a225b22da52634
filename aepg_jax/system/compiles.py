"""Counting XLA compilations: how many programs a run compiled and the seconds it spent.

`Counter` listens to JAX's monitoring event `/jax/core/compile/backend_compile_duration`
(recorded once per backend compilation, with the program's name) while it is active:

    with compiles.Counter() as counter:
        ...
    counter.summary()  # {"count": n, "seconds": s, "programs": {name: count}}

Small eager ops compile too (e.g. `jnp.copy` on the host); `summary` counts every program.
"""

from __future__ import annotations

import collections
import threading

from jax import monitoring

EVENT = "/jax/core/compile/backend_compile_duration"

_lock = threading.Lock()
_active: list[Counter] = []
_registered = False


def _listener(event: str, duration: float, **kwargs) -> None:
    if event != EVENT:
        return
    name = str(kwargs.get("fun_name", "?"))
    with _lock:
        for counter in _active:
            counter.record(name, duration)


class Counter:
    """Compilations (count, seconds, per program name) while the counter is active."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.programs: collections.Counter[str] = collections.Counter()
        self.program_seconds: collections.defaultdict[str, float] = collections.defaultdict(float)

    def record(self, name: str, seconds: float) -> None:
        self.count += 1
        self.seconds += seconds
        self.programs[name] += 1
        self.program_seconds[name] += seconds

    def __enter__(self) -> Counter:
        global _registered
        with _lock:
            if not _registered:  # listeners cannot be removed one by one: register once
                monitoring.register_event_duration_secs_listener(_listener)
                _registered = True
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)

    def summary(self) -> dict:
        """`{"count", "seconds", "programs": {name: {"count", "seconds"}}}`, for results.json."""
        return {
            "count": self.count,
            "seconds": round(self.seconds, 3),
            "programs": {
                name: {"count": n, "seconds": round(self.program_seconds[name], 3)}
                for name, n in sorted(self.programs.items())
            },
        }

    def line(self) -> str:
        """One line for the end of a run."""
        return f"compilations  {self.count} programs, {self.seconds:.1f} s compiling"
