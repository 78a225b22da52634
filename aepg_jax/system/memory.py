"""glibc allocator settings that stop XLA:CPU from faulting its temporaries in every step.

XLA's CPU runtime allocates each execution's temporaries (1.8 GiB for a ViT-B/16 LoRA batch-8
train step) with `malloc` and frees them afterwards. glibc serves blocks above its mmap
threshold (at most 32 MiB) with a fresh `mmap` and returns them with `munmap`, so every step
faults the same memory in again, 4 KiB at a time: ~0.4M minor faults and ~1 s of system CPU
per step on the project's 2-core machine. `keep_pages_mapped()`
sets, through `mallopt`: one arena, no mmap for large blocks, never trim; freed temporaries
stay mapped and the next step reuses them. The cost: the process keeps its peak heap, and
what compilation used stays mapped (ViT-B/16 batch-8 step: peak
RSS 3.2 -> 6.7 GiB; `AEPG_MALLOC=default` below opts out).

Between a run's phases (after a task's training, after its evaluation) the trainers call
`release_free_pages()` (glibc's `malloc_trim(0)`): the kept heap's free pages go back to the
kernel, so the process holds one phase's peak at a time instead of the union of every phase's
(and of their fragments) for good; the next phase faults its temporaries in once, not per step.

It must run before JAX's backend starts (its thread pool's threads would otherwise keep arenas
of their own, which the settings do not reach). `aepg_jax.main` calls `apply_default()` first:

    AEPG_MALLOC=auto     (default) keep pages mapped when no accelerator plugin is installed
                         or JAX_PLATFORMS=cpu; else leave glibc's defaults (device memory is
                         not malloc'd, and host threads keep their own arenas)
    AEPG_MALLOC=keep     always;   AEPG_MALLOC=default   never

Linux with glibc only; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.metadata
import importlib.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
# mallopt takes an int; a trim threshold of -1 becomes SIZE_MAX (never trim, man mallopt(3)).
# 2**31 - 1 is not enough: a step's freed temporaries can leave a top chunk above 2 GiB.
SETTINGS = ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1))
ENV = "AEPG_MALLOC"
MODES = ("auto", "keep", "default")


def keep_pages_mapped() -> bool:
    """Apply `SETTINGS` with `mallopt`; True when applied (glibc on Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    return all(mallopt(option, value) == 1 for option, value in SETTINGS)


def accelerator_plugin_installed() -> bool:
    """Whether JAX could find a GPU/TPU plugin (entry points or the `jax_plugins` package)."""
    if os.environ.get("JAX_PLATFORMS", "").strip().lower() == "cpu":
        return False
    if importlib.metadata.entry_points(group="jax_plugins"):
        return True
    return any(importlib.util.find_spec(name) for name in ("jax_plugins", "libtpu"))


def apply_default() -> bool:
    """Apply `keep_pages_mapped` as `AEPG_MALLOC` says; True when applied."""
    mode = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r} is unknown; use one of {', '.join(MODES)}.")
    if mode == "default" or (mode == "auto" and accelerator_plugin_installed()):
        return False
    return keep_pages_mapped()


def release_free_pages() -> bool:
    """Returns the free pages of glibc's heap to the kernel (`malloc_trim(0)`); True when it
    released any. A no-op (False) where the C library has no `malloc_trim`."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    return trim(0) == 1
