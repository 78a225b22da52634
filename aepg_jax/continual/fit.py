"""Does the run fit the memory it has? Checked once, before any training step.

Every program the run executes is compiled ahead of time (`jit(...).lower(...).compile()`: the
train step, whose one program holds both phases of a task as a `lax.cond`, or with
`optim.steps_per_call > 1` its `lax.scan` over the task's training data held on the device; the
evaluation; a method's own passes such as InfLoRA's covariance) and XLA's memory analysis read.
These are the executables training then runs (`programs.Programs`; `check_programs`): the
check compiles nothing that training would not. A program's memory analysis says:
a program needs `temp + output - alias + code` bytes beyond its arguments, which already sit in
memory, plus what is placed in memory for it alone (the scanned program's task data, sized for
the largest task the process will train: the programs' shapes are the same for every task, the
tasks' sizes are not). The trainer runs one program at a time and returns the heap's free pages
between phases (`system/memory.py`), so the run needs the largest of these. That is compared
with what is left: on the CPU the memory available to the process (`system/host_memory.py`:
`MemAvailable` capped by every enclosing memory cgroup's limit less its working set, cgroup v1
or v2, reclaimable page cache not counted: a SLURM or systemd job's limit counts); on a GPU or
TPU the least free memory of the local devices (`bytes_limit - bytes_in_use`). A run that cannot
fit stops with one line (exit 2 from `aepg_jax.main`) naming the program, what it needs, what
is free and about the largest batch that would fit, instead of the kernel's OOM killer or XLA's
RESOURCE_EXHAUSTED deep inside training.

Before that, before anything is built (no cache, no pretraining), `check_config` refuses a config
whose attention scores alone cannot fit: every block materialises the scores of its heads,
`B x heads x T x T` values in the compute dtype (`T` tokens: patches + the class token), so one
block's scores are a lower bound on a step's memory. A mistyped `model.image_size` (2044 for
224) stops there within seconds. The method's own config-fixed memory is checked there too
(`Method.memory_problems`: RanPAC's `method.ranpac_m`, whose Gram matrix is M^2 floats) with
every seed of the method state on every device that holds one (`seeds_held`) and the run's own
memory (`OWN_BYTES`) beyond what the process holds then; `check_programs` checks it again once
the run's data, model, programs and method state are in memory.

`AEPG_FIT_CHECK=0` skips both (the programs then compile at their first call).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from aepg_jax import methods
from aepg_jax.continual.programs import (
    Programs,
    largest_task,
    plan_task,
    scanned_program,
    task_args,
    task_spec,
    train_batches,
    trained_from,
)
from aepg_jax.continual.setup import Run
from aepg_jax.continual.steps import TrainState
from aepg_jax.data import loader
from aepg_jax.system import host_memory

ENV = "AEPG_FIT_CHECK"
GIB = 2**30
# What a run's peak RSS adds to the process's own before anything is built (its data, model,
# programs and their runtime), beyond a method's own memory: 0.31-0.39 GiB measured with the
# default config (BENCHMARKS.md); what a larger model adds is its programs' (`check_programs`).
OWN_BYTES = GIB * 4 // 10


class DoesNotFit(ValueError):
    """A compiled program needs more memory than the process has left."""


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def device_available(device: jax.Device) -> int | None:
    """Bytes left on an accelerator (`memory_stats`), None where it reports none."""
    stats = device.memory_stats() if hasattr(device, "memory_stats") else None
    if not stats or "bytes_limit" not in stats:
        return None
    return int(stats["bytes_limit"]) - int(stats.get("bytes_in_use", 0))


def needs(compiled: jax.stages.Compiled) -> int | None:
    """Bytes the compiled program needs beyond its arguments (None: no memory analysis)."""
    m = compiled.memory_analysis()
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
        return host_memory.available(), "host memory available to this process"
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
    batch (per device, all seeds) exceed the memory left, or the method's config-fixed memory
    (`Method.memory_problems`) does: made from the config alone."""
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
    left, where = left - OWN_BYTES, f"{where} less the run's own {OWN_BYTES / GIB:.1f} GiB"
    method_memory(cfg, left, where)


def seeds_held(cfg: ml_collections.ConfigDict) -> int:
    """Seeds of the method state in the memory `available` measures: the state's seed axis is
    replicated, so every device holds every seed, and the host's memory holds each of its
    (CPU) devices' copy."""
    devices = jax.local_devices()
    return cfg.num_seeds * (len(devices) if devices[0].platform == "cpu" else 1)


def method_memory(cfg: ml_collections.ConfigDict, left: int, where: str) -> None:
    """Raises `DoesNotFit` with the first of the method's `memory_problems` for `left`."""
    method = methods.get(cfg.method.name)
    problems = method.memory_problems(cfg, left, where, seeds_held(cfg))
    if problems:
        raise DoesNotFit(f"{problems[0][:-1]} ({ENV}=0 skips this check).")


def held_bytes(tree) -> int:
    """Bytes of `tree`'s arrays in the memory `available` measures: on the CPU every local
    shard (the host's), on accelerators the most one device holds."""
    per_device: dict[jax.Device, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            per_device[shard.device] = per_device.get(shard.device, 0) + shard.data.nbytes
    if not per_device:
        return 0
    on_cpu = next(iter(per_device)).platform == "cpu"
    return sum(per_device.values()) if on_cpu else max(per_device.values())


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled program of the run to check, the config field of its batch size, and
    `resident`: bytes of data placed in memory for this program alone, on top of what it
    needs beyond its arguments (`optim.steps_per_call > 1`: the task's training images and
    labels, which the scanned program reads on the device)."""

    compiled: jax.stages.Compiled
    batch_field: str
    batch_size: int
    resident: int = 0


def check(programs: dict[str, Program]) -> None:
    """Raises `DoesNotFit` (one line) when the largest of `programs` (`needs + resident`)
    cannot fit."""
    if not enabled():
        return
    sized = [(needs(p.compiled), name) for name, p in programs.items()]
    sized = [(n + programs[name].resident, name) for n, name in sized if n is not None]
    left, where = available()
    if not sized or left is None:
        return
    needed, name = max(sized)
    if needed <= left:
        return
    p = programs[name]
    what, lower = f"{needed / GIB:.1f} GiB beyond its parameters and data", ""
    if p.resident:
        data = f"{p.resident / GIB:.1f} GiB"
        what = f"{needed / GIB:.1f} GiB beyond its parameters ({data} of it the task's data)"
        lower = "use optim.steps_per_call=1 (the task's data then stays on the host), "
        if left <= p.resident:
            raise DoesNotFit(
                f"{name} holds the task's data on the device, {data}; the {where} is "
                f"{left / GIB:.1f} GiB; use optim.steps_per_call=1 (the task's data then stays "
                f"on the host) ({ENV}=0 skips this check)."
            )
    # The batch scales the program's own need, not the resident data.
    fits = max(int(p.batch_size * (left - p.resident) / (needed - p.resident)) // 8 * 8, 1)
    lower += f"lower {p.batch_field} (now {p.batch_size}; about {fits} would fit)"
    raise DoesNotFit(
        f"{name} needs {what}, the {where} is {left / GIB:.1f} GiB; {lower}, use "
        f"model.dtype=bfloat16 or a smaller model.image_size, or find the largest batch with "
        f"`python -m aepg_jax.plan --max_batch` ({ENV}=0 skips this check)."
    )


# ---------------------------------------------------------------------------------------------
# The continual run's programs, measured before its first step.


def _scanned_train_program(
    run: Run, programs: Programs, t: int, state: TrainState
) -> tuple[str, Program]:
    """(name, program): the scanned train program (the trainer's `_scanned_chunks`) compiled
    for its longest chunk of steps, as `check` measures it, with the task data it holds on
    each device while a task trains (`resident`: every task's data padded to the largest
    task's)."""
    cfg, tasks = run.cfg, run.data.tasks.tasks
    largest = largest_task(run)
    n, images = len(tasks[largest].train_indices), run.data.train.images
    plan = plan_task(cfg, tasks[largest])
    k = min(cfg.optim.steps_per_call, plan.steps_per_epoch, plan.total_steps)
    seeds = (len(run.axis.seeds),) if run.axis.vmapped else ()
    args = (
        state,
        run.frozen,
        jax.ShapeDtypeStruct((n, *images.shape[1:]), images.dtype, sharding=run.replicated),
        jax.ShapeDtypeStruct((n,), jnp.int32, sharding=run.replicated),
        jax.ShapeDtypeStruct((k, *seeds, cfg.optim.batch_size), jnp.int32),
        *task_args(run, t),
    )
    compiled = scanned_program(run, programs, k).compile(*args)
    resident = n * (int(np.prod(images.shape[1:])) * images.dtype.itemsize + 4)
    name = f"the train program scanning task {largest + 1}'s {n} examples"
    return name, Program(compiled, "optim.batch_size", cfg.optim.batch_size, resident)


def check_programs(run: Run, programs: Programs, t: int, state: TrainState) -> None:
    """`check` of every program tasks `t`.. run, compiled here for training to run (each
    once: `Programs`): the train step on the first trained task's first batch (its shapes are
    those of every task), or with `optim.steps_per_call > 1` the scanned program holding the
    largest task's data on the device (neither when no task from `t` on trains); the
    evaluation; the method's own passes (`AEPG_FIT_CHECK=0` skips: the programs then compile
    at their first call)."""
    if not enabled():
        return
    cfg = run.cfg
    test = loader.iterate(
        run.data.test.images,
        run.data.tasks.test_labels,
        run.data.tasks.tasks[0].test_indices,
        cfg.eval.batch_size,
        run.mesh,
        train=False,
    )
    eval_batch = next(iter(test))
    spec = task_spec(run, t).traced()
    eval_args = (state.trainable, state.method_state, run.frozen, eval_batch, spec, spec)
    checked = {
        "the evaluation": Program(
            programs.evaluate.compile(*eval_args), "eval.batch_size", cfg.eval.batch_size
        ),
    }
    trained = trained_from(run, t)
    if trained and cfg.optim.steps_per_call > 1:
        train_name, train = _scanned_train_program(run, programs, t, state)
        checked[train_name] = train
    elif trained:
        first = trained[0]
        batch = next(train_batches(run, first, epoch=0))
        compiled = programs.train.compile(state, run.frozen, batch, *task_args(run, first))
        checked["the train step"] = Program(compiled, "optim.batch_size", cfg.optim.batch_size)
    one = run.axis.unstack(state.trainable)[0], run.axis.unstack(state.method_state)[0]
    hosted = run.method.host_programs(*one, run.frozen_of(0), eval_batch, t)
    for name, (fn, args, _passes) in hosted.items():
        # The method's hook calls the same jitted `fn`: jax keeps this compilation for it.
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        checked[f"{run.method.name}'s {name}"] = Program(
            jitted.lower(*args).compile(), "eval.batch_size", cfg.eval.batch_size
        )
    check(checked)
    # The method's own memory again, now that the run's data, model and programs are in memory
    # (what `available` no longer counts) and its state is (what it counts again).
    left, where = available()
    if left is not None:
        method_memory(cfg, left + held_bytes(state.method_state), where)
