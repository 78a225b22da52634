"""The harness of the ViT train-step benchmark `bench_step.py` (the PyTorch/timm step:
`torch_step.py`).

* `our_step(...)`: our real jitted train step (`continual.steps.make_train_step`) built
  as the task loop builds it, compiled, on a fixed uint8 batch copied to the device each step;
  options switch pieces off or add what a later task has.
* Timing: `time_steps` (wall seconds per step), `timed` (wall, page faults, system CPU per
  step, `getrusage`), `measure` (median of those after a warm-up call), `ForeignLoad` (other
  processes' CPU share while timing).
* `machine_lines()`: date, machine, versions, XLA flags and allocator settings, printed with
  every result.

Importing this module imports JAX; a script that must set the allocator first
(`aepg_jax.system.memory`) imports it afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from aepg_jax import losses, methods, schedules
from aepg_jax.config import schema
from aepg_jax.continual import setup
from aepg_jax.continual import steps as ts
from aepg_jax.models import head, partition, vit

PEFT_KINDS = ("lora", "adapter", "prefix")
MODELS = ("vit_b16", "vit_tiny")
LOSSES = ("ce", "aepg")
TOTAL_STEPS = 10_000  # T of the aEPG alpha schedule (only its value at small t matters)
# `our_step(off=...)`: pieces of our step that can be switched off (`patched`, plain Adam, no
# donation); `add=...`: what a later task adds.
OFF = ("augment", "exact_gelu", "partitioned_adam", "grad_norm", "donate")
ADD = ("head_only_cond", "five_heads", "lae_ema")
# Environment that changes memory allocation (printed with the results).
ALLOC_ENV = (
    "AEPG_MALLOC",
    "GLIBC_TUNABLES",
    "LD_PRELOAD",
    "MALLOC_ARENA_MAX",
    "MALLOC_MMAP_MAX_",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "OMP_NUM_THREADS",
)


@dataclasses.dataclass
class Runner:
    """One benchmarked step: `step()` runs one complete train step and returns when done."""

    name: str
    step: Callable[[], Any]
    setup_s: float  # build (+ compile) seconds
    batch: int
    model: Any = None  # the torch module (for inspection); None for JAX
    compiled: Any = None  # the compiled JAX step (HLO, memory analysis); None for torch


def store_size(image_size: int) -> int:
    """The stored (pre-crop) image side: 256 for 224 px, in the same 8/7 proportion otherwise."""
    return round(image_size * 256 / 224)


def make_batch(batch: int, size: int, num_classes: int, seed: int) -> dict[str, np.ndarray]:
    """A random uint8 image batch (B, S, S, 3) and int32 labels in [0, num_classes)."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (batch, size, size, 3), dtype=np.uint8),
        "label": rng.integers(0, num_classes, (batch,), dtype=np.int32),
    }


def run_config(
    model: str, kind: str, loss: str, image_size: int | None, dtype: str = "float32"
) -> Any:
    """The project config of one benchmark case (the defaults of docs/algorithm.md otherwise)."""
    for value, valid, what in ((model, MODELS, "model"), (kind, PEFT_KINDS, "PEFT kind")):
        if value not in valid:
            raise ValueError(f"Unknown {what} {value!r}; valid: {', '.join(valid)}.")
    if loss not in LOSSES:
        raise ValueError(f"Unknown loss {loss!r}; valid: {', '.join(LOSSES)}.")
    cfg = schema.base_config(model)
    cfg.model.peft.kind = kind
    cfg.model.dtype = dtype
    if image_size is not None:
        cfg.model.image_size = image_size
    cfg.loss.name = loss
    cfg.data.store_size = store_size(cfg.model.image_size)
    return cfg


# --- our step ----------------------------------------------------------------------------------


@contextlib.contextmanager
def patched(off: set[str]) -> Iterator[None]:
    """Pieces of our step switched off while it is traced (restored afterwards): `augment` (a
    slice + normalise instead of the random resized crop), `exact_gelu` (tanh GELU),
    `grad_norm` (0)."""
    from aepg_jax.continual import steps as train_step

    saved = []

    def swap(obj, name, value):
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    if "augment" in off:
        slice_only = lambda key, images, size, **kw: (
            images[:, :size, :size].astype(jnp.float32) / 127.5 - 1.0
        )
        swap(train_step.augment, "train_augment", slice_only)
    if "exact_gelu" in off:
        swap(vit.nn, "gelu", lambda x, approximate=False: jax.nn.gelu(x, approximate=True))
    if "grad_norm" in off:
        swap(optax.tree, "norm", lambda tree: jnp.zeros([]))
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def our_step(
    model: str = "vit_b16",
    kind: str = "lora",
    batch: int = 8,
    image_size: int | None = None,
    num_classes: int = 20,
    loss: str = "ce",
    seed: int = 0,
    dtype: str = "float32",
    off: frozenset[str] | set[str] = frozenset(),
    add: frozenset[str] | set[str] = frozenset(),
) -> Runner:
    """Our jitted train step, compiled, with its state donated and a fixed uint8 batch.

    Task 0 with one `num_classes` head and no head-only phase, unless `add` names what a later
    task has: `head_only_cond` (the head-only `lax.cond` of tasks >= 1), `five_heads` (task 4
    of 5, 4 classes each), `lae_ema` (LAE's EMA, on five heads). `off` switches pieces off
    (`OFF`: see `patched`; `partitioned_adam`: plain Adam; `donate`: no donation).
    """
    unknown = (set(off) - set(OFF)) | (set(add) - set(ADD))
    if unknown:
        raise ValueError(f"Unknown pieces {sorted(unknown)}; off: {OFF}, add: {ADD}.")
    start = time.perf_counter()
    cfg = run_config(model, kind, loss, image_size, dtype)
    cfg.method.name = "lae" if "lae_ema" in add else "plain"
    key = jax.random.PRNGKey(seed)
    params = vit.init_params(cfg.model, jax.random.fold_in(key, 0))
    trainable, frozen = partition.split(params, partition.label_params(params), partition.TRAINABLE)
    sizes = (4,) * 5 if add & {"five_heads", "lae_ema"} else (num_classes,)
    for i, size in enumerate(sizes):
        trainable = head.grow(
            trainable, jax.random.fold_in(key, i + 1), size, cfg.model.hidden_size
        )
    task = methods.TaskSpec(
        index=len(sizes) - 1,
        offset=sum(sizes[:-1]),
        num_classes=sizes[-1],
        freeze_steps=10**6 if "head_only_cond" in add else 0,
        head_sizes=sizes,
    )
    optimizer = ts.optimizer(cfg, trainable)
    if "partitioned_adam" in off:
        optimizer = optax.with_extra_args_support(optax.adam(cfg.optim.learning_rate))
    method = methods.get(cfg.method.name)(cfg)
    method_state = method.init_state(trainable)
    method_state = jax.tree.map(jnp.zeros_like, method_state)
    hyper = schema.schedule_kwargs(cfg)
    host = make_batch(batch, cfg.data.store_size, num_classes, seed)
    host["label"] = host["label"] % sizes[-1] + task.offset
    train_peft = jnp.asarray(True) if "head_only_cond" in add else None
    with patched(set(off)):
        step_fn = ts.make_train_step(
            method,
            methods.Network(cfg.model),
            losses.get_loss(cfg.loss.name, **schema.loss_kwargs(cfg)),
            losses.is_annealed(cfg.loss.name),
            lambda total: schedules.get_schedule(cfg.schedule.name, total, **hyper),
            optimizer,
            partition.label_params(trainable),
            task.freeze_steps > 0,
            setup.step_config(cfg),
            ts.learning_rate(cfg, 1),
        )
        spec, total = task.traced(), jnp.asarray(TOTAL_STEPS, jnp.int32)
        state = ts.TrainState(
            trainable=trainable,
            opt_state=optimizer.init(trainable),
            method_state=method_state,
            task_step=jnp.zeros([], jnp.int32),
            global_step=jnp.zeros([], jnp.int32),
            rng=jax.random.fold_in(key, 7),
            first_bad_step=jnp.asarray(-1, jnp.int32),
        )
        compiled = (
            jax.jit(step_fn, donate_argnums=() if "donate" in off else (0,))
            .lower(state, frozen, jax.device_put(host), spec, total, train_peft)
            .compile()
        )
    holder = [state]

    def step() -> None:
        holder[0], metrics = compiled(
            holder[0], frozen, jax.device_put(host), spec, total, train_peft
        )
        jax.block_until_ready((holder[0], metrics))

    return Runner("jax", step, time.perf_counter() - start, batch, compiled=compiled)


# --- timing ------------------------------------------------------------------------------------


def time_steps(runner: Runner, n: int) -> list[float]:
    """Wall seconds of each of `n` consecutive steps."""
    return [wall for wall, _, _ in timed(runner.step, n)]


def timed(step: Callable[[], Any], n: int) -> list[tuple[float, int, float]]:
    """(wall s, page faults, system CPU s) of each of `n` consecutive calls of `step`."""
    out = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        step()
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        out.append((wall, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime))
    return out


def measure(step: Callable[[], Any], n: int) -> tuple[float, float, float]:
    """(median seconds, page faults per call, system CPU seconds per call) of `n` calls after
    one warm-up call."""
    step()
    samples = timed(step, n)
    return (
        statistics.median(s[0] for s in samples),
        sum(s[1] for s in samples) / n,
        sum(s[2] for s in samples) / n,
    )


class ForeignLoad:
    """CPU time used by *other* processes (and the hypervisor) while timing: a fairness check.

    From `/proc/stat` (all busy jiffies, steal included) minus this process's own CPU time,
    as a fraction of `wall x cores`; None where `/proc/stat` is unavailable.
    """

    def __init__(self) -> None:
        self._start = self._sample()

    @staticmethod
    def _sample() -> tuple[float, float, float] | None:
        try:
            with open("/proc/stat") as f:
                fields = [int(v) for v in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        tick = os.sysconf("SC_CLK_TCK")
        busy = sum(fields[:8]) - fields[3] - fields[4]  # all but idle and iowait
        own = os.times()
        return busy / tick, own.user + own.system, time.perf_counter()

    def fraction(self) -> float | None:
        end = self._sample()
        if self._start is None or end is None:
            return None
        busy, own, wall = (b - a for a, b in zip(self._start, end, strict=True))
        return max(busy - own, 0.0) / max(wall * (os.cpu_count() or 1), 1e-9)


# --- what was measured where -------------------------------------------------------------------


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def machine_lines(kept_pages: bool) -> list[str]:
    """Date, machine, library versions, XLA flags and allocator settings."""
    import flax
    import jaxlib

    allocator = ", ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k in ALLOC_ENV)
    return [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"machine: {platform.node()}, {cpu_name()}, os.cpu_count()={os.cpu_count()}, "
        f"{platform.platform()}, Python {platform.python_version()}",
        f"jax {jax.__version__}, jaxlib {jaxlib.__version__}, flax {flax.__version__}, "
        f"optax {optax.__version__}; devices {jax.devices()}; XLA CPU intra-op pool: all "
        f"cores (default); XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')}",
        f"aepg_jax.system.memory keep_pages_mapped applied: {kept_pages}; allocator env: "
        + (allocator or "none"),
    ]
