"""What a run's numbers depend on besides its config: the JAX/jaxlib versions, the devices and
the CPU model, recorded in results.json (`environment`).

Single-seed results differ between machines by a few points even with the same code and the same
backbone (small floating-point differences in XLA:CPU's kernels grow over training); these fields
say which machine made a figure.
"""

from __future__ import annotations

import platform
import sys


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else `platform.processor()`."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def describe() -> dict[str, str | int]:
    """jax / jaxlib versions, backend, device kind and count, CPU model, Python and platform."""
    import jax
    import jaxlib

    devices = jax.devices()
    return {
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind if devices else "none",
        "num_devices": len(devices),
        "cpu_model": cpu_model(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
    }
