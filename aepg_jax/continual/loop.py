"""The class-incremental task loop (SPEC §4, §6, §7): data -> model -> per-task training ->
evaluation of every seen task -> checkpoint -> reports.

For each task t: the method's `begin_task` (e.g. LwF's frozen copy), the method's own task
leaves (every task's head is there from the start), build a fresh optimizer state, train
`optim.epochs` epochs with the configured loss (alpha schedule restarting per task; PEFT
frozen for the first `optim.peft_freeze_epochs` epochs of tasks >= 1; one compiled program
for every task), the method's `end_task`
(e.g. LAE's offline copy after task 0), evaluate all seen tasks task-agnostically, checkpoint.
The method (`method.name`, see `methods/`) is reached only through its hooks.

`run(cfg, workdir)` resumes from the newest checkpoint in `<workdir>/checkpoints` when there is
one; a resumed run ends with the same results as an uninterrupted one.
"""

from __future__ import annotations

import os

import ml_collections

from aepg_jax import methods
from aepg_jax.continual import evaluation, fit, resume, setup, training
from aepg_jax.continual import report as report_lib
from aepg_jax.continual import state as state_lib
from aepg_jax.continual import train_step as ts
from aepg_jax.continual.bookkeeping import Bookkeeping
from aepg_jax.data import loader
from aepg_jax.runs import checkpointing
from aepg_jax.system import compiles


def task_context(run: setup.Run, t: int, seed_index: int) -> methods.TaskContext:
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

    return methods.TaskContext(run.net, run.frozen_of(seed_index), train_batches)


def begin_task(run: setup.Run, t: int, state: ts.TrainState | None) -> ts.TrainState:
    """Task `t`'s first state: the method's begin hook, its task leaves, a fresh optimizer."""
    spec = training.task_spec(run, t)
    if state is None:
        trainable = state_lib.first_trainable(run)
        method_state, global_step = state_lib.initial_method_state(run), 0
    else:
        trainable, method_state = state.trainable, state.method_state
        global_step = run.axis.first(state.global_step)

    def hook(i, tr, ms):
        return run.method.begin_task(spec, tr, ms, task_context(run, t, i))

    pairs = [hook(i, tr, ms) for i, (tr, ms) in enumerate(_per_seed(run, trainable, method_state))]
    trainable = state_lib.grow(run, run.axis.stack([p[0] for p in pairs]), t)
    method_state = run.axis.stack([p[1] for p in pairs])
    return state_lib.fresh_state(run, trainable, method_state, global_step)


def end_task(run: setup.Run, t: int, state: ts.TrainState) -> ts.TrainState:
    """Applies the method's end hook to every seed."""
    spec = training.task_spec(run, t)
    method_state = run.axis.stack(
        [
            run.method.end_task(spec, tr, ms, task_context(run, t, i))
            for i, (tr, ms) in enumerate(_per_seed(run, state.trainable, state.method_state))
        ]
    )
    return state.replace(method_state=method_state)


def _per_seed(run: setup.Run, trainable, method_state):
    return zip(run.axis.unstack(trainable), run.axis.unstack(method_state), strict=True)


def run(cfg: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the continual experiment `cfg` in `workdir`; returns its results.

    One seed: results.json's dict. `num_seeds > 1`: the seeds' summary (results_seeds.json),
    each seed's own results.json being in `<workdir>/seed_<s>/`.
    """
    os.makedirs(workdir, exist_ok=True)
    # First: a checkpoint directory that cannot be written is refused before any data work.
    ckpt = checkpointing.Checkpointer(os.path.join(workdir, "checkpoints"))
    with compiles.Counter() as counter:
        return _run(cfg, workdir, ckpt, counter)


def _run(cfg, workdir: str, ckpt: checkpointing.Checkpointer, counter: compiles.Counter) -> dict:
    r = setup.build(cfg, workdir)
    book = Bookkeeping(r, state_lib.STATE_LAYOUT)
    try:
        state, start_task, start_step = resume.restore(r, book, ckpt)
        for t in range(start_task, r.num_tasks):
            if start_step == 0:
                state = begin_task(r, t, state)
            if t == start_task:  # before the first training step of this process
                fit.check(r, t, state)
            state = training.train_task(r, book, ckpt, t, state, start_step)
            state = end_task(r, t, state)
            results = evaluation.evaluate(r, t, state, book.trackers)
            step = r.axis.first(state.global_step)
            book.record_eval(t, step, results)
            ckpt.save(step, {"state": state}, book.meta(t, "task_done", 0))
            ckpt.wait()
            start_step = 0
        ckpt.wait()
        out = report_lib.report(r, book, book.elapsed(), counter.summary())
        if r.is_main:
            print(counter.line())
        return out
    finally:
        ckpt.close()  # waits for a pending asynchronous save
        book.close()
