"""JAX's persistent compilation cache: every compiled program is kept on disk and reused by the
next run that compiles the same program (same code, shapes, devices and jax version).

`enable(path)` turns it on for this process before anything compiles; `aepg_jax.main`, the
sweep and the planner call it with `directory(...)`:

- where: `compile_cache` of the config [~/.cache/aepg_jax/xla, beside the data caches] (of
  `aepg_jax.main` and `aepg_jax.plan`), or the sweep's `--compile_cache`; the environment
  variable `AEPG_COMPILE_CACHE` overrides both: a directory moves it, `0` (or an empty value)
  turns it off, as does `compile_cache=""`;
- what: every program, the smallest included (no minimum compile time or entry size: the many
  small programs of a run start add up to seconds); the embedded default's take 0.6 MB;
- size: at most `MAX_BYTES` (2 GiB), the least recently used entries evicted beyond it;
- shared: reads and writes take the directory's file lock (the eviction's), so the processes
  of one run, the workers of a sweep and separate runs may share one directory; in a
  multi-process run only process 0 writes (jax's rule), every process reads.

A cached executable is the one XLA compiled: the results are the same with and without it.
"""

from __future__ import annotations

import importlib.util
import os

ENV = "AEPG_COMPILE_CACHE"
DEFAULT = "~/.cache/aepg_jax/xla"
MAX_BYTES = 2 * 2**30
_OFF = ("", "0", "off", "none", "false")


def directory(configured: str | None = DEFAULT) -> str | None:
    """The cache directory (absolute), or None when off: `AEPG_COMPILE_CACHE` if set, else
    `configured` (a config's `compile_cache`, a command's `--compile_cache`)."""
    value = os.environ.get(ENV, configured)
    if value is None or value.strip().lower() in _OFF:
        return None
    return os.path.abspath(os.path.expanduser(value))


def enable(path: str | None) -> None:
    """Keeps every program compiled from now on in `path` and reads them back (None: off).
    Must run before this process's first compilation: jax settles on its cache then."""
    if path is None:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    # A size limit turns on the LRU eviction, whose file lock also serialises every read and
    # write: a process never reads an entry another one is still writing (jax needs the
    # `filelock` package for it, a dependency of aepg_jax).
    if importlib.util.find_spec("filelock") is not None:
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
