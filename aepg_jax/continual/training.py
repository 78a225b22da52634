"""Training one task: the jitted step over the task's batches, per step from the host loader or
`optim.steps_per_call` steps per call as a `lax.scan` over device-resident data; logging,
periodic checkpoints and the non-finite-loss stop on the way."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import tqdm

from aepg_jax import methods, schedules
from aepg_jax.config import schema
from aepg_jax.continual import state as state_lib
from aepg_jax.continual import train_step as ts
from aepg_jax.continual.bookkeeping import Bookkeeping
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader, splits
from aepg_jax.models import partition
from aepg_jax.runs import checkpointing
from aepg_jax.system import progress

Chunks = Iterator[tuple[ts.TrainState, int, int, dict]]  # (state, task step, k steps, metrics)


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """Step counts of one task."""

    steps_per_epoch: int
    total_steps: int
    freeze_steps: int


def plan_task(cfg, task: splits.Task) -> TaskPlan:
    o = cfg.optim
    per_epoch = loader.num_batches(len(task.train_indices), o.batch_size, drop_last=True)
    if per_epoch == 0:
        raise ValueError(
            f"Task {task.index} has {len(task.train_indices)} training examples, fewer than "
            f"optim.batch_size={o.batch_size}; lower the batch size or use fewer tasks."
        )
    total = o.epochs * per_epoch
    if cfg.max_steps_per_task:
        total = min(total, cfg.max_steps_per_task)
    freeze = int(total * o.peft_freeze_epochs / o.epochs) if task.index >= 1 else 0
    return TaskPlan(per_epoch, total, freeze)


def task_spec(run: Run, t: int) -> methods.TaskSpec:
    """Task `t` as its compiled step and the method hooks see it (Python ints; traced inside
    the programs, which serve every task)."""
    task = run.data.tasks.tasks[t]
    return methods.TaskSpec(
        index=t,
        offset=task.offset,
        num_classes=task.num_classes,
        freeze_steps=plan_task(run.cfg, task).freeze_steps,
        head_sizes=run.head_sizes,
    )


def check_finite(
    run: Run, state: ts.TrainState, task: int, ckpt: checkpointing.Checkpointer
) -> None:
    """Stops the run at the first non-finite loss, naming the step and the last checkpoint."""
    bad = run.axis.per_seed(state.first_bad_step)
    if not (bad >= 0).any():
        return
    steps = ckpt.steps()
    last = f"checkpoint {steps[-1]} in {ckpt.directory}" if steps else "none (no checkpoint yet)"
    i = int(np.argmax(bad >= 0))
    which = f" (seed {run.axis.seeds[i]})" if run.axis.vmapped else ""
    raise FloatingPointError(
        f"Non-finite loss in task {task} at global step {int(bad[i])}{which}. Last good "
        f"checkpoint: {last}. Lower optim.learning_rate or check the data and loss settings."
    )


_STEPS: dict[int, tuple[weakref.ref, dict]] = {}  # id(run) -> (run, {key: step fn})


def _run_cache(run: Run) -> dict:
    """This run's cache of step functions (one per static key), so that every task reuses
    the same jitted programs."""
    ref, cache = _STEPS.get(id(run), (None, None))
    if ref is None or ref() is not run:
        cache = {}
        _STEPS[id(run)] = (weakref.ref(run, lambda _: _STEPS.pop(id(run), None)), cache)
    return cache


def _static_key(run: Run, t: int) -> int | None:
    """What of task `t` stays a Python constant in its step: the steps per epoch of a per-epoch
    learning-rate decay (None: a constant learning rate, one program for every task)."""
    if run.cfg.optim.lr_schedule == "constant":
        return None
    return plan_task(run.cfg, run.data.tasks.tasks[t]).steps_per_epoch


def task_step_fn(run: Run, t: int, phase: bool | None = None) -> Callable:
    """`step(state, frozen, batch, task, total_steps) -> (state, metrics)`, vmapped over seeds,
    the same function object for every task of the run (jit it once: one compilation).

    `phase` True / False fixes the PEFT-training flag (`aepg_jax.plan` costs each phase of a
    task alone); None (training) reads it from the task step."""
    cache = _run_cache(run)
    key = ("step", _static_key(run, t), phase)
    if key in cache:
        return cache[key]
    cfg = run.cfg
    one_seed = run.axis.unstack(state_lib.trainable_for(run, 0))[0]
    labels = partition.label_params(one_seed)
    has_peft = bool(jax.tree.leaves(partition.split(labels, labels, (partition.PEFT,))[0]))
    hyper = schema.schedule_kwargs(cfg)
    step_fn = ts.make_train_step(
        run.method,
        run.net,
        run.loss_fn,
        run.annealed,
        lambda total: schedules.get_schedule(cfg.schedule.name, total, **hyper),
        state_lib.optimizer(cfg, one_seed, _static_key(run, t) or 1),
        labels,
        has_peft and cfg.optim.peft_freeze_epochs > 0,
        run.step_cfg,
    )
    lifted = run.axis.lift(step_fn, (0, run.frozen_axis, 0, None, None, None))
    vmapped = run.axis.vmapped

    def step(state, frozen, batch, task, total_steps):
        # Every seed is at the same task step: one unbatched phase flag for all of them.
        train_peft = state.task_step[0] >= task.freeze_steps if vmapped else None
        if phase is not None:
            train_peft = jnp.asarray(phase)
        return lifted(state, frozen, batch, task, total_steps, train_peft)

    cache[key] = step
    return step


def task_args(run: Run, t: int) -> tuple[methods.TaskSpec, jax.Array]:
    """`(task, total_steps)`, the traced task arguments of `task_step_fn`'s step."""
    plan = plan_task(run.cfg, run.data.tasks.tasks[t])
    return task_spec(run, t).traced(), jnp.asarray(plan.total_steps, jnp.int32)


def run_step_fn(run: Run, t: int, state: ts.TrainState, phase: bool | None = None) -> Callable:
    """`run_step(state, frozen, batch) -> (state, metrics)` of task `t` (`task_step_fn` with the
    task's arguments bound; `state` is unused, kept for callers)."""
    step, (task, total) = task_step_fn(run, t, phase), task_args(run, t)

    def run_step(state, frozen, batch):  # named: the plan's HLO dumps are found by it
        return step(state, frozen, batch, task, total)

    return run_step


def _jitted(run: Run, name: str, fn: Callable) -> Callable:
    """`jax.jit(fn, donate_argnums=(0,))` cached per run under (`name`, `fn`)."""
    cache = _run_cache(run)
    key = (name, id(fn))
    if key not in cache:
        cache[key] = (fn, jax.jit(fn, donate_argnums=(0,)))
    return cache[key][1]


def train_batches(run: Run, t: int, epoch: int, start: int = 0):
    """Task t's training batches of `epoch` (within the task) from the host loader, from batch
    `start` on; a seed axis first when seeds are vmapped."""
    seeds = run.axis.seeds
    return loader.iterate(
        run.data.train.images,
        run.data.tasks.train_labels,
        run.data.tasks.tasks[t].train_indices,
        run.cfg.optim.batch_size,
        run.mesh,
        train=True,
        seed=list(seeds) if run.axis.vmapped else seeds[0],
        epoch=t * 100_000 + epoch,
        start=start,
    )


def _step_chunks(run: Run, run_step: Callable, t: int, plan: TaskPlan, state, step: int) -> Chunks:
    """One jitted step per batch from the host loader; yields (state, step, 1, metrics)."""
    jit_step = _jitted(run, "step", run_step)
    spec, total = task_args(run, t)
    while step < plan.total_steps:
        epoch = step // plan.steps_per_epoch
        for batch in train_batches(run, t, epoch, start=step - epoch * plan.steps_per_epoch):
            state, m = jit_step(state, run.frozen, batch, spec, total)
            step += 1
            yield state, step, 1, m
            if step == plan.total_steps:
                return


def _scanned_chunks(
    run: Run, run_step: Callable, t: int, plan: TaskPlan, state, step: int
) -> Chunks:
    """`optim.steps_per_call` steps per call as one jitted `lax.scan`, the task's training
    data resident on the device; batches in the loader's order (per seed). Yields (state,
    step, k, metrics[[S,] k])."""
    task = run.data.tasks.tasks[t]
    batch_size, n = run.cfg.optim.batch_size, len(task.train_indices)
    images = jax.device_put(run.data.train.images[task.train_indices], run.replicated)
    labels = jax.device_put(
        run.data.tasks.train_labels[task.train_indices].astype(np.int32), run.replicated
    )
    vmapped = run.axis.vmapped
    sharded = (loader.seeds_batch_sharding if vmapped else loader.batch_sharding)(run.mesh)

    cache = _run_cache(run)
    if ("multi", run_step) not in cache:

        def multi_step(state, frozen, images, labels, rows, spec, total):
            def body(st, r):  # r: ([S,] B) rows of this step
                batch = jax.lax.with_sharding_constraint(
                    {"image": images[r], "label": labels[r]}, sharded
                )
                return run_step(st, frozen, batch, spec, total)

            state, ms = jax.lax.scan(body, state, rows)  # metrics (k, [S])
            return state, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), ms) if vmapped else ms

        cache[("multi", run_step)] = jax.jit(multi_step, donate_argnums=(0,))
    jit_multi = cache[("multi", run_step)]
    spec, total = task_args(run, t)
    while step < plan.total_steps:
        epoch = step // plan.steps_per_epoch
        within = step - epoch * plan.steps_per_epoch
        k = min(
            run.cfg.optim.steps_per_call, plan.steps_per_epoch - within, plan.total_steps - step
        )
        rows = np.stack(
            [
                loader.epoch_order(np.arange(n), seed, t * 100_000 + epoch)[
                    within * batch_size : (within + k) * batch_size
                ].reshape(k, batch_size)
                for seed in run.axis.seeds
            ],
            axis=1,
        )  # (k, S, B)
        if not vmapped:
            rows = rows[:, 0]
        rows = jnp.asarray(rows, jnp.int32)
        state, ms = jit_multi(state, run.frozen, images, labels, rows, spec, total)
        step += k
        yield state, step, k, ms


class _Logger:
    """Writes the train records of the logged steps of each chunk and updates the bar."""

    def __init__(self, run: Run, book: Bookkeeping, t: int, plan: TaskPlan, start_step: int):
        self.run, self.book, self.t, self.plan = run, book, t, plan
        self.last_log, self.last_time = start_step, time.time()

    def __call__(self, state, step: int, k: int, metrics_chunk: dict, bar: tqdm.tqdm) -> bool:
        """Logs the chunk's steps due for logging; False when none was."""
        run, plan, every = self.run, self.plan, self.run.cfg.log_every_steps
        first = step - k + 1
        logged = [s for s in range(first, step + 1) if s % every == 0 or s == plan.total_steps]
        if not logged:
            return False
        # One host sync per logged chunk; arrays (S, k).
        host = {key: run.axis.per_seed(v).reshape(-1, k) for key, v in metrics_chunk.items()}
        now = time.time()
        ips = (step - self.last_log) * run.cfg.optim.batch_size / max(now - self.last_time, 1e-9)
        self.last_log, self.last_time = step, now
        global_end = run.axis.first(state.global_step)
        for s in logged:
            j = s - first
            for i, writer in enumerate(self.book.writers):
                m = {key: value[i, j] for key, value in host.items()}
                writer.write(
                    "train",
                    task=self.t,
                    step=global_end - (step - s),
                    task_step=s,
                    epoch=(s - 1) // plan.steps_per_epoch,
                    loss=float(m["loss"]),
                    **self._alpha(float(m["alpha"])),
                    entropy=float(m["entropy"]),
                    lr=run.cfg.optim.learning_rate,
                    grad_norm=float(m["grad_norm"]),
                    images_per_s=ips,
                    train_peft=bool(m["train_peft"]),
                )
        shown = self._alpha(float(host["alpha"][0, -1]))
        bar.set_postfix(
            loss=f"{float(np.mean(host['loss'][:, logged[-1] - first])):.3f}",
            **{k: f"{v:.3f}" for k, v in shown.items()},
        )
        return True

    def _alpha(self, scheduled: float) -> dict[str, float]:
        """`{"alpha": value}` when the loss uses one (aEPG's alpha_t, a fixed mix's constant),
        else nothing: a loss without alpha logs none."""
        if self.run.annealed:
            return {"alpha": scheduled}
        if self.run.fixed_alpha is not None:
            return {"alpha": self.run.fixed_alpha}
        return {}


def train_task(
    run: Run,
    book: Bookkeeping,
    ckpt: checkpointing.Checkpointer,
    t: int,
    state: ts.TrainState,
    start_step: int,
) -> ts.TrainState:
    """Trains task `t` from `start_step`; logs, checkpoints and checks for NaN on the way."""
    cfg = run.cfg
    plan = plan_task(cfg, run.data.tasks.tasks[t])
    chunks = _scanned_chunks if cfg.optim.steps_per_call > 1 else _step_chunks
    seeds = f" x {len(run.axis.seeds)} seeds" if run.axis.vmapped else ""
    bar = progress.bar(
        plan.total_steps,
        initial=start_step,
        unit="step",
        desc=f"task {t + 1}/{run.num_tasks}{seeds}",
        disable=not run.is_main,
    )
    log = _Logger(run, book, t, plan, start_step)
    every = cfg.checkpoint_every_steps
    stream = chunks(run, task_step_fn(run, t), t, plan, state, start_step)
    progress.at(task=f"{t + 1}/{run.num_tasks}", step=f"{start_step}/{plan.total_steps}")
    for state, step, k, metrics_chunk in stream:
        if step - k == start_step:  # the first call compiled the step: the clock starts now
            jax.block_until_ready(state)
            progress.started(bar, step)
        else:
            bar.update(k)
        progress.at(task=f"{t + 1}/{run.num_tasks}", step=f"{step}/{plan.total_steps}")
        if log(state, step, k, metrics_chunk, bar):
            check_finite(run, state, t, ckpt)
        if every and step // every > (step - k) // every and step < plan.total_steps:
            check_finite(run, state, t, ckpt)
            ckpt.save(
                run.axis.first(state.global_step),
                {"state": state},
                book.meta(t, "in_task", step // plan.steps_per_epoch),
            )
    bar.close()
    check_finite(run, state, t, ckpt)
    return state
