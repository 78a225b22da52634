"""Does the run fit the memory it has? Checked once, before any training step.

Every program the run executes is compiled ahead of time (`jit(...).lower(...).compile()`: the
train step, whose one program holds both phases of a task as a `lax.cond`; the evaluation; a
method's own passes such as InfLoRA's covariance) and XLA's memory analysis read: a program
needs `temp + output - alias + code` bytes beyond its arguments, which already sit in memory.
The trainer runs one program at a time and returns the heap's free pages between phases
(`system/memory.py`), so the run needs the largest of these. That is compared with what is
left: on the CPU the memory available to the process, the host's `MemAvailable` capped by every
memory cgroup the process is in (its own and each parent's limit minus usage, cgroup v1 or v2:
a SLURM or systemd job's limit counts); on a GPU or TPU the least free memory of the local
devices (`bytes_limit - bytes_in_use`). A run that cannot fit stops with one line (exit 2 from
`aepg_jax.main`) naming the program, what it needs, what is free and about the largest batch
that would fit, instead of the kernel's OOM killer or XLA's RESOURCE_EXHAUSTED deep inside
training.

Before that, before anything is built (no cache, no pretraining), `check_config` refuses a config
whose attention scores alone cannot fit: every block materialises the scores of its heads,
`B x heads x T x T` values in the compute dtype (`T` tokens: patches + the class token), so one
block's scores are a lower bound on a step's memory. A mistyped `model.image_size` (2044 for
224) stops there within seconds.

`AEPG_FIT_CHECK=0` skips both (the compiled check compiles each program once more than training
does).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import jax
import ml_collections
import numpy as np

ENV = "AEPG_FIT_CHECK"
GIB = 2**30
UNLIMITED = 2**60  # cgroup v1 writes a huge number for "no limit"


class DoesNotFit(ValueError):
    """A compiled program needs more memory than the process has left."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _mem_available(meminfo: str) -> int | None:
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cgroup_headroom(
    proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup"
) -> int | None:
    """The least `limit - usage` over the memory cgroups this process is in and their parents
    (v2: `memory.max` / `memory.current` under the unified path; v1: the `memory` controller's
    `memory.limit_in_bytes` / `memory.usage_in_bytes`); None when no level has a limit."""
    try:
        with open(proc_cgroup) as f:
            lines = [line.strip().split(":", 2) for line in f if line.strip()]
    except OSError:
        return None
    places = []  # (directory of the process's cgroup, limit file, usage file)
    for _, controllers, path in (x for x in lines if len(x) == 3):
        if controllers == "":  # v2 (or the unified half of a hybrid layout)
            base = (
                os.path.join(root, "unified")
                if os.path.isdir(os.path.join(root, "unified"))
                else root
            )
            places.append((base, path, "memory.max", "memory.current"))
        elif "memory" in controllers.split(","):
            places.append(
                (
                    os.path.join(root, "memory"),
                    path,
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                )
            )
    headroom = None
    for base, path, limit_file, usage_file in places:
        parts = [p for p in path.split("/") if p]
        for depth in range(len(parts), -1, -1):  # the process's own cgroup, then each parent
            directory = os.path.join(base, *parts[:depth])
            limit = _read_int(os.path.join(directory, limit_file))
            usage = _read_int(os.path.join(directory, usage_file))
            if limit is None or usage is None or limit >= UNLIMITED:
                continue
            left = max(limit - usage, 0)
            headroom = left if headroom is None else min(headroom, left)
    return headroom


def host_available(meminfo: str = "/proc/meminfo", **cgroup) -> int | None:
    """Bytes the process may still allocate on the host: `MemAvailable`, capped by every memory
    cgroup it is in (`cgroup_headroom`)."""
    avail, headroom = _mem_available(meminfo), cgroup_headroom(**cgroup)
    if headroom is None:
        return avail
    return headroom if avail is None else min(avail, headroom)


def device_available(device: jax.Device) -> int | None:
    """Bytes left on an accelerator (`memory_stats`), None where it reports none."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def needs(fn: Callable, args: tuple) -> int | None:
    """Bytes the compiled `fn(*args)` needs beyond its arguments (None: no memory analysis)."""

    def fit_check_program(*a):
        return fn(*a)

    m = jax.jit(fit_check_program).lower(*args).compile().memory_analysis()
    if m is None:
        return None
    return int(
        m.temp_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def available() -> tuple[int | None, str]:
    """(bytes left, where) for the run's programs: the host's for a CPU run, the least free
    local accelerator's otherwise."""
    devices = jax.local_devices()
    if devices[0].platform == "cpu":
        return host_available(), "host memory available to this process"
    free = [(device_available(d), d) for d in devices]
    known = [(b, d) for b, d in free if b is not None]
    if not known:
        return None, ""
    least, device = min(known, key=lambda x: x[0])
    return least, f"free memory on {device}"


def attention_bytes(model: ml_collections.ConfigDict, batch: int) -> int:
    """One block's attention scores for `batch` images: `batch x heads x T x T` values of the
    compute dtype, `T = (image_size / patch_size)^2 + 1`."""
    tokens = (model.image_size // model.patch_size) ** 2 + 1
    return batch * model.num_heads * tokens * tokens * np.dtype(model.dtype).itemsize


def check_config(cfg: ml_collections.ConfigDict, num_devices: int) -> None:
    """Raises `DoesNotFit` when one block's attention scores of the train or the evaluation
    batch (per device, all seeds) exceed the memory left: made from the config alone."""
    if not enabled():
        return
    left, where = available()
    if left is None:
        return
    seeds = cfg.num_seeds
    for field, batch in (
        ("optim.batch_size", cfg.optim.batch_size),
        ("eval.batch_size", cfg.eval.batch_size),
    ):
        needed = attention_bytes(cfg.model, -(-batch * seeds // num_devices))
        if needed > left:
            m = cfg.model
            tokens = (m.image_size // m.patch_size) ** 2 + 1
            raise DoesNotFit(
                f"model.image_size={m.image_size} with model.patch_size={m.patch_size} makes "
                f"{tokens} tokens: one block's attention scores at {field}={batch} need "
                f"{needed / GIB:.1f} GiB, the {where} is {left / GIB:.1f} GiB; check "
                f"model.image_size (and data.store_size), or lower {field} (`python -m "
                f"aepg_jax.plan --max_batch` finds the largest; {ENV}=0 skips this check)."
            )


@dataclasses.dataclass(frozen=True)
class Program:
    """One program of the run to check: `fn(*args)`, and the config field of its batch size."""

    fn: Callable
    args: tuple
    batch_field: str
    batch_size: int


def check(programs: dict[str, Program]) -> None:
    """Raises `DoesNotFit` (one line) when the largest of `programs` cannot fit."""
    if not enabled():
        return
    sized = [(needs(p.fn, p.args), name) for name, p in programs.items()]
    sized = [(n, name) for n, name in sized if n is not None]
    left, where = available()
    if not sized or left is None:
        return
    needed, name = max(sized)
    if needed <= left:
        return
    p = programs[name]
    fits = max(int(p.batch_size * left / needed) // 8 * 8, 1)
    raise DoesNotFit(
        f"{name} needs {needed / GIB:.1f} GiB beyond its parameters and data, the {where} is "
        f"{left / GIB:.1f} GiB; lower {p.batch_field} (now {p.batch_size}; about {fits} would "
        f"fit), use model.dtype=bfloat16 or a smaller model.image_size, or find the largest batch "
        f"with `python -m aepg_jax.plan --max_batch` ({ENV}=0 skips this check)."
    )
