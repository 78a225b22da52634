"""A run's tasks as its programs see them, and the programs: built once per run, each compiled
once for every task.

    plan_task       a task's step counts: epochs x batches (capped), the head-only steps
    task_spec       a task as its compiled step and the method's hooks see it (traced inside
                    the programs, so one program serves every task)
    train_batches   a task's training batches of one epoch, from the host loader
    build_programs  the train step (vmapped over seeds), its `lax.scan` over device-resident
                    data (`scanned_program`), the evaluation; none compiled yet
    run_step_fn, eval_fn_of   the same programs with a task bound, for `aepg_jax.plan`

The trainer (`continual/trainer.py`) runs them; the fit check (`continual/fit.py`) compiles
them first to read their memory; `aepg_jax.plan` lowers them for other devices.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections

from aepg_jax import methods, schedules
from aepg_jax.config import schema
from aepg_jax.continual import setup, steps
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader, splits
from aepg_jax.models import partition
from aepg_jax.system import compiles

# ---------------------------------------------------------------------------------------------
# A task: its step counts, and how its compiled step and the method's hooks see it.


@dataclasses.dataclass(frozen=True)
class TaskPlan:
    """Step counts of one task."""

    steps_per_epoch: int
    total_steps: int
    freeze_steps: int


def plan_task(cfg: ml_collections.ConfigDict, task: splits.Task) -> TaskPlan:
    """`epochs * floor(examples / batch)` steps (capped by `max_steps_per_task`; none on a task
    the method does not train, which may be smaller than a batch), the first
    `total * peft_freeze_epochs / epochs` of them head-only for tasks >= 1."""
    o = cfg.optim
    per_epoch = loader.num_batches(len(task.train_indices), o.batch_size, drop_last=True)
    if not methods.get(cfg.method.name)(cfg).trains_task(task.index):
        return TaskPlan(per_epoch, 0, 0)
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
    plan = plan_task(run.cfg, task)
    return methods.TaskSpec(
        index=t,
        offset=task.offset,
        num_classes=task.num_classes,
        freeze_steps=plan.freeze_steps,
        head_sizes=run.head_sizes,
        scenario=run.data.tasks.scenario,
        steps_per_epoch=plan.steps_per_epoch,
    )


def task_args(run: Run, t: int) -> tuple[methods.TaskSpec, jax.Array]:
    """`(task, total_steps)`: the traced task arguments of the train step."""
    plan = plan_task(run.cfg, run.data.tasks.tasks[t])
    return task_spec(run, t).traced(), jnp.asarray(plan.total_steps, jnp.int32)


def task_context(run: Run, t: int, seed_index: int) -> methods.TaskContext:
    """One seed's view of task `t` for the method's host-side hooks."""
    task = run.data.tasks.tasks[t]

    def train_batches():
        return loader.iterate(
            run.data.train.images,
            run.data.tasks.train_labels,
            task.train_indices,
            run.cfg.eval.batch_size,
            run.mesh,
            train=False,
        )

    def key():
        return jax.random.fold_in(run.keys[seed_index], 3000 + t)

    return methods.TaskContext(run.net, run.frozen_of(seed_index), train_batches, key)


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


def trained_from(run: Run, t: int) -> list[int]:
    """The tasks from `t` on that have optimizer steps."""
    tasks = run.data.tasks.tasks
    return [i for i in range(t, run.num_tasks) if plan_task(run.cfg, tasks[i]).total_steps]


# ---------------------------------------------------------------------------------------------
# The programs: built once per run (`build_programs`), each compiled once for every task.


def train_step_fn(run: Run, phase: bool | None = None) -> Callable:
    """`step(state, frozen, batch, task, total_steps) -> (state, metrics)` of every task,
    vmapped over seeds, not jitted (`steps.make_train_step`). The optimizer is built inside the
    step from the traced `task.steps_per_epoch`: a per-epoch learning-rate decay reads its
    position from the task, so tasks of different sizes share one program.

    `phase` True / False fixes the PEFT-training flag (`aepg_jax.plan` costs each phase of a
    task alone); None (training) reads it from the task step."""
    cfg = run.cfg
    one_seed = run.axis.unstack(setup.trainable_for(run, 0))[0]
    labels = partition.label_params(one_seed)
    has_peft = bool(jax.tree.leaves(partition.split(labels, labels, (partition.PEFT,))[0]))
    hyper = schema.schedule_kwargs(cfg)
    vmapped = run.axis.vmapped

    def step(state, frozen, batch, task, total_steps):
        per_epoch = task.steps_per_epoch  # traced: the schedule's position, not a shape
        step_fn = steps.make_train_step(
            run.method,
            run.net,
            run.loss_fn,
            run.annealed,
            lambda total: schedules.get_schedule(cfg.schedule.name, total, **hyper),
            steps.optimizer(cfg, one_seed, per_epoch, run.method.lr_scales),
            labels,
            has_peft and cfg.optim.peft_freeze_epochs > 0,
            run.step_cfg,
            steps.learning_rate(cfg, per_epoch),
            run.method.lr_scales,
        )
        lifted = run.axis.lift(step_fn, (0, run.frozen_axis, 0, None, None, None))
        # Every seed is at the same task step: one unbatched phase flag for all of them.
        train_peft = state.task_step[0] >= task.freeze_steps if vmapped else None
        if phase is not None:
            train_peft = jnp.asarray(phase)
        return lifted(state, frozen, batch, task, total_steps, train_peft)

    return step


def scanned_steps_fn(run: Run, step: Callable) -> Callable:
    """`multi_step(state, frozen, images, labels, rows, task, total) -> (state, metrics)`: `k`
    train steps as one `lax.scan`, step i's batch `images[rows[i]]` gathered on the device
    (rows ([S,] B) per step); metrics `[S,] k`."""
    vmapped = run.axis.vmapped
    sharded = (loader.seeds_batch_sharding if vmapped else loader.batch_sharding)(run.mesh)

    def multi_step(state, frozen, images, labels, rows, task, total):
        def body(st, r):
            batch = jax.lax.with_sharding_constraint(
                {"image": images[r], "label": labels[r]}, sharded
            )
            return step(st, frozen, batch, task, total)

        state, ms = jax.lax.scan(body, state, rows)  # metrics (k, [S])
        return state, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), ms) if vmapped else ms

    return multi_step


def eval_step_fn(run: Run) -> Callable:
    """`eval(trainable, method_state, frozen, batch, task, evaluated) -> sums`, vmapped over
    seeds, not jitted (`steps.make_eval_step`)."""
    step = steps.make_eval_step(run.method, run.net, run.step_cfg)
    return run.axis.lift(step, (0, 0, run.frozen_axis, None, None, None))


@dataclasses.dataclass(frozen=True)
class Programs:
    """The run's programs, each compiled once (`compiles.Once`), at its first use: the fit
    check's (`fit.check_programs`, which reads the executables' memory analysis) or training's.
    One train step serves every task (its size and epoch length are traced arguments);
    `scanned` is keyed by the steps per call, made at first use (`scanned_program`): the task's
    data is padded to the largest task's, so its size is no key."""

    step: Callable  # the train step, not jitted (`aepg_jax.plan` lowers it)
    train: compiles.Once  # the step, the state donated
    scanned: dict[int, compiles.Once]  # multi_step of k steps per call, the state donated
    evaluate: compiles.Once  # eval_step


def build_programs(run: Run) -> Programs:
    """Every program of the run, none compiled yet."""
    step = train_step_fn(run)
    return Programs(
        step=step,
        train=compiles.Once(step, donate_argnums=(0,)),
        scanned={},
        evaluate=compiles.Once(eval_step_fn(run)),
    )


def scanned_program(run: Run, programs: Programs, k: int) -> compiles.Once:
    """The scanned train program of `k` steps per call."""
    if k not in programs.scanned:
        multi_step = scanned_steps_fn(run, programs.step)
        programs.scanned[k] = compiles.Once(multi_step, donate_argnums=(0,))
    return programs.scanned[k]


def largest_task(run: Run) -> int:
    """The trained task with the most training examples (the first of them): the scanned
    program holds every task's data padded to its size."""
    tasks = run.data.tasks.tasks
    trained = trained_from(run, 0) or [0]
    return max(trained, key=lambda i: len(tasks[i].train_indices))


def run_step_fn(run: Run, t: int, phase: bool | None = None) -> Callable:
    """`run_step(state, frozen, batch) -> (state, metrics)`: task `t`'s step with its task
    arguments bound, not jitted (for `aepg_jax.plan`, which lowers it per phase)."""
    step, (task, total) = train_step_fn(run, phase), task_args(run, t)

    def run_step(state, frozen, batch):  # named: the plan's HLO dumps are found by it
        return step(state, frozen, batch, task, total)

    return run_step


def eval_fn_of(run: Run, task: int) -> Callable:
    """The evaluation after task `task` of that task's test set, not jitted: `eval(trainable,
    method_state, frozen, batch) -> sums` (for `aepg_jax.plan`)."""
    step, spec = eval_step_fn(run), task_spec(run, task).traced()
    return lambda trainable, method_state, frozen, batch: step(
        trainable, method_state, frozen, batch, spec, spec
    )
