"""Counting XLA compilations: how many programs a run compiled and the seconds it spent.

`Counter` listens to JAX's monitoring event `/jax/core/compile/backend_compile_duration`
(recorded once per backend compilation, with the program's name) while it is active:

    with compiles.Counter() as counter:
        ...
    counter.summary()  # {"count": n, "seconds": s, "programs": {name: count}}

Small eager ops compile too (e.g. `jnp.copy` on the host); `summary` counts every program. A
program found in the persistent compilation cache (`system/xla_cache.py`) counts too, with the
seconds it took to read it back, and in `cached`.

`Once` compiles a jitted program ahead of time, once, and keeps the executable: the trainer's
programs are `Once`s, so the fit check measures the very executables that training runs.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

import jax
from jax import monitoring

EVENT = "/jax/core/compile/backend_compile_duration"
CACHE_HIT = "/jax/compilation_cache/cache_hits"

_lock = threading.Lock()
_active: list[Counter] = []
_registered = False


def _hit_listener(event: str, **kwargs) -> None:
    if event != CACHE_HIT:
        return
    with _lock:
        for counter in _active:
            counter.cached += 1


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
        self.cached = 0  # of `count`: read from the persistent compilation cache
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
                monitoring.register_event_listener(_hit_listener)
                _registered = True
            _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        with _lock:
            _active.remove(self)

    def summary(self) -> dict:
        """`{"count", "seconds", "cached", "programs": {name: {"count", "seconds"}}}`, for
        results.json (`cached`: how many of `count` the persistent cache held)."""
        return {
            "count": self.count,
            "seconds": round(self.seconds, 3),
            "cached": self.cached,
            "programs": {
                name: {"count": n, "seconds": round(self.program_seconds[name], 3)}
                for name, n in sorted(self.programs.items())
            },
        }

    def line(self) -> str:
        """One line for the end of a run."""
        line = f"compilations  {self.count} programs, {self.seconds:.1f} s compiling"
        if self.cached:
            line += f" ({self.cached} read from the persistent compilation cache)"
        return line


# XLA's algebraic simplifier reassociates constant factors across operations (`normal(key) *
# stddev` becomes `erf_inv(u) * (sqrt(2) * stddev)`), which op-by-op dispatch cannot do: without
# it, a jitted parameter initialisation draws bit for bit what the eager one drew.
EAGER_NUMERICS = {"xla_disable_hlo_passes": "algsimp"}


class Once:
    """A jitted program compiled once, ahead of time: `compile(*args)` lowers and compiles it
    for the shapes and shardings of `args` (`jit(fn).lower(*args).compile()`) and keeps the
    executable, whose `memory_analysis()` the fit check reads; a call runs that executable.
    Every later call must have the first's shapes (the run's programs do: run-static shapes).
    `compiler_options`: XLA's options for this program alone (`EAGER_NUMERICS`)."""

    def __init__(
        self,
        fn: Callable,
        donate_argnums: tuple[int, ...] = (),
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        self.jitted = jax.jit(fn, donate_argnums=donate_argnums)
        self.compiler_options = compiler_options
        self.executable: jax.stages.Compiled | None = None

    def compile(self, *args: Any) -> jax.stages.Compiled:
        if self.executable is None:
            lowered = self.jitted.lower(*args)
            self.executable = lowered.compile(compiler_options=self.compiler_options)
        return self.executable

    def __call__(self, *args: Any) -> Any:
        return self.compile(*args)(*args)
