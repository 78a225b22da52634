"""Does the run's train step fit the device it runs on? Checked once, before any training step.

The step of the run's first task is compiled ahead of time (`jit(...).lower(...).compile()`,
the same program every task runs) and XLA's memory analysis read: the step needs
`temp + output - alias + code` bytes beyond its arguments, which already sit in memory. That
is compared with what the device has left: on the CPU the memory available to the process
(`MemAvailable` in /proc/meminfo, or the cgroup's limit minus its usage when lower); on a GPU or
TPU the device's `bytes_limit - bytes_in_use`. A step that cannot fit stops the run with one
line (exit 2 from `aepg_jax.main`) instead of the kernel's OOM killer or XLA's
RESOURCE_EXHAUSTED deep inside training.

`AEPG_FIT_CHECK=0` skips it (it compiles the step once more than training does).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import jax

ENV = "AEPG_FIT_CHECK"
GIB = 2**30


class DoesNotFit(ValueError):
    """The compiled step needs more memory than the device has left."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def host_available() -> int | None:
    """Bytes the process may still allocate on the host: MemAvailable, capped by the cgroup."""
    avail = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    limit = _read_int("/sys/fs/cgroup/memory.max") or _read_int(
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    )
    usage = _read_int("/sys/fs/cgroup/memory.current") or _read_int(
        "/sys/fs/cgroup/memory/memory.usage_in_bytes"
    )
    if limit and usage is not None and limit < 2**60:
        cgroup = max(limit - usage, 0)
        avail = cgroup if avail is None else min(avail, cgroup)
    return avail


def device_available(device: jax.Device) -> int | None:
    """Bytes left on an accelerator (`memory_stats`), None where it reports none."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def step_needs(step: Callable, args: tuple) -> int | None:
    """Bytes the compiled `step(*args)` needs beyond its arguments (None: no memory analysis)."""

    def fit_check_step(*a):
        return step(*a)

    compiled = jax.jit(fit_check_step).lower(*args).compile()
    m = compiled.memory_analysis()
    if m is None:
        return None
    return int(
        m.temp_size_in_bytes
        + m.output_size_in_bytes
        - m.alias_size_in_bytes
        + m.generated_code_size_in_bytes
    )


def check(step: Callable, args: tuple, batch_size: int) -> None:
    """Raises `DoesNotFit` (one line) when the train step `step(*args)` cannot fit the device;
    `batch_size` is `optim.batch_size`, named in the advice."""
    if not enabled():
        return
    device = jax.devices()[0]
    needed = step_needs(step, args)
    cpu = device.platform == "cpu"
    available = host_available() if cpu else device_available(device)
    if needed is None or available is None or needed <= available:
        return
    where = "host memory available to this process" if cpu else f"free memory on {device}"
    raise DoesNotFit(
        f"the train step needs {needed / GIB:.1f} GiB beyond its parameters and data, the "
        f"{where} is {available / GIB:.1f} GiB; lower optim.batch_size (now "
        f"{batch_size}), use model.dtype=bfloat16 or a smaller model.image_size, "
        f"or find the largest batch that fits with `python -m aepg_jax.plan --max_batch` "
        f"({ENV}=0 skips this check)."
    )
