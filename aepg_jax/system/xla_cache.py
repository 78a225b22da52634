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
- files: the project's own store (`system/xla_store.py`), not jax's: each entry carries its
  key and a sha256 of both and is written to a temporary file renamed into place, so the
  processes of one run, the workers of a sweep and separate runs may share one directory
  without a lock (in a multi-process run only process 0 writes, jax's rule; every process
  reads), and a damaged entry (truncated, overwritten) or one filed under another program's
  key is a miss that the run writes again;
- problems: each is one `warning:` line on stderr (from process 0 of a launched run) and the
  run goes on: a path that is a file or cannot be created (no cache), a read-only directory
  (read, not written), a full disk (no more writes), a damaged entry (compiled and rewritten).

Why a store of our own: jax's (`jax._src.lru_cache.LRUCache`, jax 0.10) writes an entry in
place and keeps any file already under its key, so a truncated or overwritten entry fails to
decompress on every later run (one raw warning per program) and is never replaced; it takes a
`.lockfile` in the directory for every read, so a read-only cache is never read (one
`PermissionError` warning per read and write); and its errors name neither the cause nor the
directory. Checking jax's entries before jax reads them would fix none of that: they carry
no checksum, jax would still not replace them, and its lock would still be taken. jax 0.10 has
no public hook for a cache backend: it builds its backend once, at the first compilation, by
calling `jax._src.compilation_cache.get_file_cache(path)`, which `enable` replaces (`_install`)
by one returning the store (wrapped in jax's `VerificationCache` when
`jax_compilation_cache_check_contents` asks for it). Where that function is missing (another
jax version) jax's own cache is used, as before. Only that function is relied on: the entries'
payload is jax's, passed through the two methods jax calls on a backend, `get(key)` and
`put(key, bytes)`.

A cached executable is the one XLA compiled: the results are the same with and without it.
"""

from __future__ import annotations

import importlib.util
import os
import sys

from aepg_jax.launch import launch
from aepg_jax.system import xla_store

ENV = "AEPG_COMPILE_CACHE"
DEFAULT = "~/.cache/aepg_jax/xla"
MAX_BYTES = 2 * 2**30
_OFF = ("", "0", "off", "none", "false")
HINT = f" (compile_cache or {ENV} move it; {ENV}=0 turns it off)"


def directory(configured: str | None = DEFAULT) -> str | None:
    """The cache directory (absolute), or None when off: `AEPG_COMPILE_CACHE` if set, else
    `configured` (a config's `compile_cache`, a command's `--compile_cache`)."""
    value = os.environ.get(ENV, configured)
    if value is None or value.strip().lower() in _OFF:
        return None
    return os.path.abspath(os.path.expanduser(value))


def say(message: str) -> None:
    """One `warning:` line on stderr (above any progress bar), from process 0 alone of a run
    `aepg_jax.launch` started: its processes share the cache and would say the same."""
    if os.environ.get(launch.ENV_PROCESS_ID, "0") != "0":
        return
    import tqdm

    sys.stdout.flush()
    tqdm.tqdm.write(f"warning: {message}", file=sys.stderr)
    sys.stderr.flush()


def enable(path: str | None) -> xla_store.Store | None:
    """Keeps every program compiled from now on in `path` and reads them back (None: off);
    returns the store (None: off, or `path` unusable, said in one line). Must run before this
    process's first compilation: jax settles on its cache then."""
    if path is None:
        return None
    store = xla_store.Store.open(path, MAX_BYTES, say, HINT)
    if store is None:
        return None
    import jax

    installed = _install(store)
    jax.config.update("jax_compilation_cache_dir", store.path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    if not installed and importlib.util.find_spec("filelock") is not None:
        # jax's own cache: a size limit turns on its LRU eviction, whose file lock also
        # serialises every read and write (a process never reads a half-written entry).
        jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    return store


def _install(store: xla_store.Store) -> bool:
    """Makes jax build its cache backend as `store` (for `store.path`; a store of its own for
    another directory); False where this jax has no `get_file_cache` to replace."""
    import jax

    try:
        from jax._src import compilation_cache as jax_cache
    except ImportError:
        return False
    if not callable(getattr(jax_cache, "get_file_cache", None)):
        return False

    def get_file_cache(path: str):
        same = os.path.abspath(path) == store.path
        own = store if same else xla_store.Store.open(path, MAX_BYTES, say, HINT)
        if own is None:
            return None  # jax runs without a cache
        verify = getattr(jax_cache, "VerificationCache", None)
        if verify is not None and jax.config.jax_compilation_cache_check_contents:
            return verify(own), path
        return own, path

    jax_cache.get_file_cache = get_file_cache
    return True
