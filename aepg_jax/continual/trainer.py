"""The continual trainer: one class- or domain-incremental run from its config to its results.

    run(cfg, workdir)
      build            the data cut into tasks, every seed's backbone and fresh PEFT, the
                       method (`setup.build`), then the run's programs (`build_programs`: the
                       train step, its `lax.scan` over device-resident data, the evaluation),
                       each compiled once, at its first use
      restore          the newest checkpoint of `<workdir>/checkpoints`, if any (`restore`)
      for each task t:
        begin_task     the method's begin hook (e.g. LwF's frozen copy), its task leaves, a
                       fresh optimizer state
        fit check      once, before this process's first step: compiles the programs and
                       reads their memory analysis: do they fit the device?
        train_task     the step loop: `optim.epochs` epochs (the last `max_steps_per_task`
                       capped), the alpha schedule restarting per task, PEFT frozen for the first
                       `optim.peft_freeze_epochs` epochs of tasks >= 1; logging every
                       `log_every_steps`, checkpoints every `checkpoint_every_steps`, a stop at
                       the first non-finite loss; on a stop signal, a checkpoint of the step
                       (the last one too, before end_task) and `Preempted`
        end_task       the method's end hook (e.g. LAE's offline copy after task 0)
        evaluate       every seen task's test set, task-agnostic and, in the same pass, with the
                       task given (argmax over its own classes; docs/algorithm.md §4, §17)
        record         the eval records and A_t, then a checkpoint of phase `task_done`
      report           results.json and plots per seed, the seeds' summary, the terminal table

The method (`methods/`) is reached only through its hooks and its `forward`/`predict`. Every
program is built once per run and serves every task: the task (index, class offset and count,
freeze steps, schedule length) is a traced argument. With `num_seeds > 1` every per-seed tree
carries a leading seed axis and the programs are vmapped over it (`runs/seeds.py`).

A resumed run ends with the same results as an uninterrupted one: a `task_done` checkpoint
resumes at the next task's start, an `in_task` one at its task step (the loader replays the same
batch order; at the task's last step, with end_task and the evaluation). Its records are first
rewound to the checkpoint (`records.Cut`), so each step is recorded once. The frozen backbone is
not saved: its fingerprint must match.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from aepg_jax import methods, schedules
from aepg_jax.config import schema
from aepg_jax.continual import fit, setup, steps
from aepg_jax.continual.results import Bookkeeping, report
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader, splits
from aepg_jax.models import partition
from aepg_jax.runs import checkpointing, predictions, records
from aepg_jax.system import compiles, hosts, memory, preemption, progress

TrainState = steps.TrainState
Chunks = Iterator[tuple[TrainState, int, int, dict]]  # (state, task step, k steps, metrics)


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


def _per_seed(run: Run, trainable, method_state):
    return zip(run.axis.unstack(trainable), run.axis.unstack(method_state), strict=True)


def begin_task(run: Run, t: int, state: TrainState | None) -> TrainState:
    """Task `t`'s first state: the method's begin hook, its task leaves, a fresh optimizer."""
    spec = task_spec(run, t)
    if state is None:
        trainable = setup.first_trainable(run)
        method_state, global_step = setup.initial_method_state(run), 0
    else:
        trainable, method_state = state.trainable, state.method_state
        global_step = run.axis.first(state.global_step)
    if setup.overrides(run.method, "begin_task"):  # else nothing to unstack and restack
        pairs = [
            run.method.begin_task(spec, tr, ms, task_context(run, t, i))
            for i, (tr, ms) in enumerate(_per_seed(run, trainable, method_state))
        ]
        trainable = run.axis.stack([p[0] for p in pairs])
        method_state = run.axis.stack([p[1] for p in pairs])
    trainable = setup.grow(run, trainable, t)
    return setup.fresh_state(run, trainable, method_state, global_step)


def end_task(run: Run, t: int, state: TrainState) -> TrainState:
    """Applies the method's end hook to every seed."""
    if not setup.overrides(run.method, "end_task"):
        return state
    spec = task_spec(run, t)
    method_state = run.axis.stack(
        [
            run.method.end_task(spec, tr, ms, task_context(run, t, i))
            for i, (tr, ms) in enumerate(_per_seed(run, state.trainable, state.method_state))
        ]
    )
    return state.replace(method_state=method_state)


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
    check's (`check_fit`, which reads the executables' memory analysis) or training's. One
    train step serves every task (its size and epoch length are traced arguments); `scanned`
    is keyed by the steps per call, made at first use (`scanned_program`): the task's data is
    padded to the largest task's, so its size is no key."""

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
    trained = _trained_from(run, 0) or [0]
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


# ---------------------------------------------------------------------------------------------
# Resuming.


def restore(
    run: Run, book: Bookkeeping, ckpt: checkpointing.Checkpointer
) -> tuple[TrainState | None, int, int]:
    """(state, first task, first task step) from the newest checkpoint, or (None, 0, 0)."""
    restored = ckpt.restore_latest(lambda meta: setup.checkpoint_target(run, meta))
    if restored is None:
        book.rewind(records.Cut(0))  # a run killed before its first checkpoint starts again
        return None, 0, 0
    items, meta = restored
    state = jax.device_put(items["state"], run.replicated)
    if meta["backbone_sha256"] != run.fingerprint:
        raise ValueError(
            "The frozen backbone differs from the one this run was checkpointed with "
            "(fingerprint mismatch): the weights file or pretraining changed. Use a new "
            "workdir, or restore the original weights."
        )
    book.resume_from(meta)
    # What the stopped process recorded after this checkpoint is recorded again from here.
    book.rewind(records.Cut(run.axis.first(state.global_step), meta["phase"] == "task_done"))
    if meta["phase"] == "task_done":
        start_task, start_step = meta["task"] + 1, 0
    else:
        start_task, start_step = meta["task"], run.axis.first(state.task_step)
    logging.info("Resuming at task %d, step %d.", start_task, start_step)
    ckpt.restored(_resume_point(run, start_task, start_step))
    if run.is_main:
        if start_task >= run.num_tasks:
            line = (
                f"the run in {ckpt.directory} is finished ({run.num_tasks} tasks): its results "
                "files stay as written, its plots are made again; use a new --workdir to train "
                "again."
            )
        else:
            line = f"resuming from {ckpt.directory}: task {start_task + 1}, step {start_step}"
        tqdm.tqdm.write(line)
    return state, start_task, start_step


def _resume_point(run: Run, task: int, step: int) -> str:
    """What the same command does from a checkpoint at `step` of `task` (0-based; step 0: the
    task's start, task T: the run is finished), for the line a second Ctrl-C prints."""
    if task >= run.num_tasks:
        return "the run is finished"
    if step == 0:
        return f"task {task + 1}/{run.num_tasks} starts over"
    total = plan_task(run.cfg, run.data.tasks.tasks[task]).total_steps
    return f"it resumes at task {task + 1}/{run.num_tasks}, step {step}/{total}"


# ---------------------------------------------------------------------------------------------
# Training one task: the step loop.


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


def _step_chunks(run: Run, train: Callable, t: int, plan: TaskPlan, state, step: int) -> Chunks:
    """One jitted step per batch from the host loader; yields (state, step, 1, metrics)."""
    task, total = task_args(run, t)
    while step < plan.total_steps:
        epoch = step // plan.steps_per_epoch
        for batch in train_batches(run, t, epoch, start=step - epoch * plan.steps_per_epoch):
            state, m = train(state, run.frozen, batch, task, total)
            step += 1
            yield state, step, 1, m
            if step == plan.total_steps:
                return


def _scanned_chunks(
    run: Run, programs: Programs, t: int, plan: TaskPlan, state, step: int
) -> Chunks:
    """`optim.steps_per_call` steps per call (`scanned_steps_fn`), the task's training data
    resident on the device, padded with zeros to the largest task's size (the rows never read
    the padding; one program serves every task); batches in the loader's order (per seed).
    Yields (state, step, k, metrics[[S,] k])."""
    task_data = run.data.tasks.tasks[t]
    batch_size, n = run.cfg.optim.batch_size, len(task_data.train_indices)
    padded = len(run.data.tasks.tasks[largest_task(run)].train_indices)
    images = np.zeros((padded, *run.data.train.images.shape[1:]), run.data.train.images.dtype)
    images[:n] = run.data.train.images[task_data.train_indices]
    labels = np.zeros((padded,), np.int32)
    labels[:n] = run.data.tasks.train_labels[task_data.train_indices]
    images, labels = jax.device_put((images, labels), run.replicated)
    task, total = task_args(run, t)
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
        if not run.axis.vmapped:
            rows = rows[:, 0]
        scanned = scanned_program(run, programs, k)
        state, ms = scanned(
            state, run.frozen, images, labels, jnp.asarray(rows, jnp.int32), task, total
        )
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
                    **_rates(m),
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


def _rates(m: dict) -> dict[str, float]:
    """A train record's learning rates: `lr`, the rate Adam applied to the head, and `lr_<label>`
    for each other label (`peft`) that trained at that step at a different rate."""
    # float32 as its shortest decimal: the configured 1e-3 reads 0.001, not 0.0010000000475.
    rates = {k: float(str(np.float32(v))) for k, v in m.items() if k.startswith("lr_")}
    head = rates.pop(f"lr_{partition.HEAD}")
    out = {"lr": head}
    for key, value in rates.items():
        trains = key != f"lr_{partition.PEFT}" or bool(m["train_peft"])
        if trains and value != head:
            out[key] = value
    return out


def check_finite(run: Run, state: TrainState, task: int, ckpt: checkpointing.Checkpointer) -> None:
    """Stops the run at the first non-finite loss, naming the step and the last checkpoint."""
    bad = run.axis.per_seed(state.first_bad_step)
    if not (bad >= 0).any():
        return
    saved = ckpt.steps()
    last = f"checkpoint {saved[-1]} in {ckpt.directory}" if saved else "none (no checkpoint yet)"
    i = int(np.argmax(bad >= 0))
    which = f" (seed {run.axis.seeds[i]})" if run.axis.vmapped else ""
    raise FloatingPointError(
        f"Non-finite loss in task {task} at global step {int(bad[i])}{which}. Last good "
        f"checkpoint: {last}. Lower optim.learning_rate or check the data and loss settings."
    )


def train_task(
    run: Run,
    programs: Programs,
    book: Bookkeeping,
    ckpt: checkpointing.Checkpointer,
    t: int,
    state: TrainState,
    start_step: int,
) -> TrainState:
    """Trains task `t` from `start_step`; logs, checkpoints and checks for NaN on the way."""
    cfg = run.cfg
    plan = plan_task(cfg, run.data.tasks.tasks[t])
    if plan.total_steps == 0:  # a task the method does not train: no bar, nothing compiled
        return state
    if cfg.optim.steps_per_call > 1:
        stream = _scanned_chunks(run, programs, t, plan, state, start_step)
    else:
        stream = _step_chunks(run, programs.train, t, plan, state, start_step)
    seeds = f" x {len(run.axis.seeds)} seeds" if run.axis.vmapped else ""
    bar = progress.bar(
        plan.total_steps,
        initial=start_step,
        unit="step",
        desc=f"task {t + 1}/{run.num_tasks}{seeds}",
        disable=not run.is_main,
    )
    log = _Logger(run, book, t, plan, start_step)
    every, minutes = cfg.checkpoint_every_steps, cfg.checkpoint_every_minutes
    last_save = time.monotonic()
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
        # The task's last step is checkpointed only on a signal: end_task and the evaluation
        # follow, then the task's own checkpoint.
        last = step == plan.total_steps
        periodic = not last and bool(every) and step // every > (step - k) // every
        timed = not last and minutes > 0 and time.monotonic() - last_save >= 60.0 * minutes
        signum, timed = preemption.agree(timed)
        if not (periodic or timed or signum):
            continue
        check_finite(run, state, t, ckpt)
        global_step = run.axis.first(state.global_step)
        items, meta = {"state": state}, book.meta(t, "in_task", step // plan.steps_per_epoch)
        resumes = _resume_point(run, t, step)
        if signum:
            bar.close()
            where = f"at task {t + 1}/{run.num_tasks}, step {step}/{plan.total_steps}"
            preemption.save_and_stop(signum, ckpt, global_step, items, meta, where, resumes)
        ckpt.save(global_step, items, meta, resumes)
        last_save = time.monotonic()
    bar.close()
    check_finite(run, state, t, ckpt)
    return state


def _trained_from(run: Run, t: int) -> list[int]:
    """The tasks from `t` on that have optimizer steps."""
    tasks = run.data.tasks.tasks
    return [i for i in range(t, run.num_tasks) if plan_task(run.cfg, tasks[i]).total_steps]


def _scanned_fit_program(
    run: Run, programs: Programs, t: int, state: TrainState
) -> tuple[str, fit.Program]:
    """(name, program): the scanned train program (`_scanned_chunks`) compiled for its longest
    chunk of steps, as `fit.check` measures it, with the task data it holds on each device while
    a task trains (`resident`: every task's data padded to the largest task's)."""
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
    return name, fit.Program(compiled, "optim.batch_size", cfg.optim.batch_size, resident)


def check_fit(run: Run, programs: Programs, t: int, state: TrainState) -> None:
    """`fit.check` of every program tasks `t`.. run, compiled here for training to run (each
    once: `Programs`): the train step on the first trained task's first batch (its shapes are
    those of every task), or with `optim.steps_per_call > 1` the scanned program holding the
    largest task's data on the device (neither when no task from `t` on trains); the
    evaluation; the method's own passes (`AEPG_FIT_CHECK=0` skips: the programs then compile
    at their first call)."""
    if not fit.enabled():
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
        "the evaluation": fit.Program(
            programs.evaluate.compile(*eval_args), "eval.batch_size", cfg.eval.batch_size
        ),
    }
    trained = _trained_from(run, t)
    if trained and cfg.optim.steps_per_call > 1:
        train_name, train = _scanned_fit_program(run, programs, t, state)
        checked[train_name] = train
    elif trained:
        first = trained[0]
        batch = next(train_batches(run, first, epoch=0))
        compiled = programs.train.compile(state, run.frozen, batch, *task_args(run, first))
        checked["the train step"] = fit.Program(compiled, "optim.batch_size", cfg.optim.batch_size)
    one = run.axis.unstack(state.trainable)[0], run.axis.unstack(state.method_state)[0]
    hosted = run.method.host_programs(*one, run.frozen_of(0), eval_batch, t)
    for name, (fn, args, _passes) in hosted.items():
        # The method's hook calls the same jitted `fn`: jax keeps this compilation for it.
        jitted = fn if hasattr(fn, "lower") else jax.jit(fn)
        checked[f"{run.method.name}'s {name}"] = fit.Program(
            jitted.lower(*args).compile(), "eval.batch_size", cfg.eval.batch_size
        )
    fit.check(checked)


# ---------------------------------------------------------------------------------------------
# Evaluating after a task.


def evaluate(run: Run, programs: Programs, task: int, state: TrainState, book: Bookkeeping):
    """Accuracy of every predictor on tasks 0..task, per seed, recorded in `book.trackers`:
    class-incremental (argmax over the seen classes) and task-incremental (argmax over task
    i's own classes), both counted in the same pass.

    Returns per seed `{"per_task": {i: {predictor: acc %}}, "task_incremental": {i: {predictor:
    acc %}}, "entropy": mean entropy, "kept": the evaluation's kept predictions}`, the entropy
    of the softmax over the seen classes, averaged over every seen test example; each
    predictor's calibration over the kept predictions is recorded in the trackers.
    """
    predictors = run.method.predictors
    spec = task_spec(run, task).traced()
    num_seeds = len(run.axis.seeds)
    entropy_sum, count_all = np.zeros(num_seeds), 0
    per_task: list[dict] = [{} for _ in range(num_seeds)]
    per_task_il: list[dict] = [{} for _ in range(num_seeds)]
    kept: list[list[dict]] = [[] for _ in range(num_seeds)]
    for i in range(task + 1):
        evaluated = task_spec(run, i).traced()
        sums, rows = None, []
        for batch in loader.iterate(
            run.data.test.images,
            run.data.tasks.test_labels,
            run.data.tasks.tasks[i].test_indices,
            run.cfg.eval.batch_size,
            run.mesh,
            train=False,
        ):
            out, batch_rows = programs.evaluate(
                state.trainable, state.method_state, run.frozen, batch, spec, evaluated
            )
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
            rows.append(batch_rows)
        for s, seed_rows in enumerate(_kept_rows(run, rows, task, i)):
            kept[s].append(seed_rows)
        sums = jax.tree.map(run.axis.per_seed, sums)
        count, own = int(sums["count"][0]), sums["task_incremental"]
        for s, tracker in enumerate(book.trackers):
            for p in predictors:
                tracker.record(task, p, i, int(sums[p][s]), count, int(own[p][s]))
            per_task[s][i] = {p: 100.0 * int(sums[p][s]) / max(count, 1) for p in predictors}
            per_task_il[s][i] = {p: 100.0 * int(own[p][s]) / max(count, 1) for p in predictors}
        entropy_sum += sums["entropy_sum"]
        count_all += count
    results = []
    for s, tracker in enumerate(book.trackers):
        entropy = float(entropy_sum[s]) / max(count_all, 1)
        tracker.record_entropy(task, entropy)
        evaluation = predictions.flatten(predictions.concat(kept[s]))
        for p in predictors:
            tracker.record_calibration(task, p, predictions.calibration_of(evaluation, p))
        results.append(
            {
                "per_task": per_task[s],
                "task_incremental": per_task_il[s],
                "entropy": entropy,
                "kept": evaluation,
            }
        )
    return results


def _kept_rows(run: Run, rows: list, after_task: int, task: int) -> list[dict]:
    """Per seed, task `task`'s kept predictions after `after_task` on the host (the batches'
    rows, padding dropped), with their `after_task`, `task` and dataset `index` columns."""
    indices = run.data.tasks.tasks[task].test_indices
    rows = hosts.gather(rows)  # every process's rows (multi-process), one host copy
    out = []
    for s in range(len(run.axis.seeds)):
        mine = [jax.tree.map(lambda x, s=s: x[s], r) for r in rows] if run.axis.vmapped else rows
        columns = predictions.host_rows(predictions.concat(mine), len(indices), sum(run.head_sizes))
        n = len(indices)
        columns["after_task"] = np.full(n, after_task, np.int16)
        columns["task"] = np.full(n, task, np.int16)
        columns["index"] = np.asarray(indices, np.int32)
        out.append(columns)
    return out


# ---------------------------------------------------------------------------------------------
# The run.


def _stop_if_requested(run: Run, ckpt: checkpointing.Checkpointer, where: str) -> None:
    """Raises `Preempted` when a stop signal arrived (outside a task's steps: everything done
    so far is in the newest checkpoint)."""
    signum, _ = preemption.agree(False)
    if signum:
        saved = ckpt.steps()
        last = f"checkpoint {saved[-1]} in {ckpt.directory}" if saved else "no checkpoint yet"
        raise preemption.Preempted(signum, f"{where} ({last})")


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the continual experiment `cfg` in `workdir`; returns its results.

    One seed: results.json's dict. `num_seeds > 1`: the seeds' summary (results_seeds.json),
    each seed's own results.json being in `<workdir>/seed_<s>/`.
    """
    os.makedirs(workdir, exist_ok=True)
    # First: a checkpoint directory that cannot be written is refused before any data work.
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
    with compiles.Counter() as counter:
        fit.check_config(cfg, jax.device_count())  # before any cache or pretraining
        r = setup.build(cfg, workdir)
        programs = build_programs(r)
        book = Bookkeeping(r)
        try:
            state, start_task, start_step = restore(r, book, ckpt)
            for t in range(start_task, r.num_tasks):
                _stop_if_requested(r, ckpt, f"before task {t + 1}/{r.num_tasks}")
                if start_step == 0:
                    state = begin_task(r, t, state)
                if t == start_task:  # before the first training step of this process
                    check_fit(r, programs, t, state)
                state = train_task(r, programs, book, ckpt, t, state, start_step)
                memory.release_free_pages()  # the step's temporaries (system/memory.py)
                state = end_task(r, t, state)
                results = evaluate(r, programs, t, state, book)
                memory.release_free_pages()
                step = r.axis.first(state.global_step)
                book.record_eval(t, step, results)
                meta = book.meta(t, "task_done", 0)
                ckpt.save(step, {"state": state}, meta, _resume_point(r, t + 1, 0))
                ckpt.wait()
                start_step = 0
            ckpt.wait()
            finished = start_task >= r.num_tasks  # before this process: its results stay
            out = report(r, book, book.elapsed(), counter.summary(), finished)
            if r.is_main:
                print(counter.line())
            return out
        except KeyboardInterrupt:  # a second Ctrl-C (system/preemption.py)
            progress.resumes(ckpt.on_disk())  # said by aepg_jax.main
            ckpt.abandon()  # the process ends at once (checkpointing.Checkpointer.abandon)
            raise
        finally:
            ckpt.close()  # waits for a pending asynchronous save
            book.close()
