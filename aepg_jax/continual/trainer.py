"""The continual trainer: one class- or domain-incremental run from its config to its results.

    run(cfg, workdir)
      build            the data cut into tasks, every seed's backbone and fresh PEFT, the
                       method (`setup.build`), then the run's programs
                       (`programs.build_programs`: the train step, its `lax.scan` over
                       device-resident data, the evaluation), each compiled once, at first use
      restore          the newest checkpoint of `<workdir>/checkpoints`, if any (`restore`)
      for each task t:
        begin_task     the method's begin hook (e.g. LwF's frozen copy), its task leaves, a
                       fresh optimizer state
        fit check      once, before this process's first step: compiles the programs and
                       reads their memory analysis: do they fit the device?
                       (`fit.check_programs`)
        train_task     the step loop: `optim.epochs` epochs (the last `max_steps_per_task`
                       capped), the alpha schedule restarting per task, PEFT frozen for the first
                       `optim.peft_freeze_epochs` epochs of tasks >= 1; logging every
                       `log_every_steps`, checkpoints every `checkpoint_every_steps`, a stop at
                       the first non-finite loss; on a stop signal, a checkpoint of the step
                       (the last one too, before end_task) and `Preempted`
        end_task       the method's end hook (e.g. LAE's offline copy after task 0)
        evaluate       every seen task's test set, task-agnostic and, in the same pass, with the
                       task given (argmax over its own classes; docs/algorithm.md §4, §17;
                       `evaluation.evaluate`)
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

import logging
import os
import time
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import tqdm

from aepg_jax.continual import evaluation, fit, setup, steps
from aepg_jax.continual.programs import (
    Programs,
    TaskPlan,
    build_programs,
    largest_task,
    plan_task,
    scanned_program,
    task_args,
    task_context,
    task_spec,
    train_batches,
)
from aepg_jax.continual.results import Bookkeeping, report
from aepg_jax.continual.setup import Run
from aepg_jax.data import loader
from aepg_jax.models import partition
from aepg_jax.runs import checkpointing, records
from aepg_jax.system import compiles, memory, preemption, progress

TrainState = steps.TrainState
Chunks = Iterator[tuple[TrainState, int, int, dict]]  # (state, task step, k steps, metrics)


# ---------------------------------------------------------------------------------------------
# A task's start and end: the method's hooks, per seed.


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
                    fit.check_programs(r, programs, t, state)
                state = train_task(r, programs, book, ckpt, t, state, start_step)
                memory.release_free_pages()  # the step's temporaries (system/memory.py)
                state = end_task(r, t, state)
                results = evaluation.evaluate(r, programs, t, state, book)
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
