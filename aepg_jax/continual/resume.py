"""Resuming a run from the newest restorable checkpoint in `<workdir>/checkpoints`.

A checkpoint of phase `task_done` resumes at the next task's start; one of phase `in_task` at
its task step (the loader replays the same batch order). The frozen backbone is not saved: its
fingerprint must match, so a changed weights file or pretraining cannot go unnoticed.
"""

from __future__ import annotations

import logging

import jax
import tqdm

from aepg_jax.continual import state as state_lib
from aepg_jax.continual import train_step as ts
from aepg_jax.continual.bookkeeping import Bookkeeping
from aepg_jax.continual.setup import Run
from aepg_jax.runs import checkpointing


def restore(
    run: Run, book: Bookkeeping, ckpt: checkpointing.Checkpointer
) -> tuple[ts.TrainState | None, int, int]:
    """(state, first task, first task step) from the newest checkpoint, or (None, 0, 0)."""
    restored = ckpt.restore_latest(lambda meta: state_lib.checkpoint_target(run, meta))
    if restored is None:
        return None, 0, 0
    items, meta = restored
    state = items["state"]
    state = jax.device_put(state, run.replicated)
    if meta["backbone_sha256"] != run.fingerprint:
        raise ValueError(
            "The frozen backbone differs from the one this run was checkpointed with "
            "(fingerprint mismatch): the weights file or pretraining changed. Use a new "
            "workdir, or restore the original weights."
        )
    book.resume_from(meta)
    if meta["phase"] == "task_done":
        start_task, start_step = meta["task"] + 1, 0
    else:
        start_task, start_step = meta["task"], run.axis.first(state.task_step)
    logging.info("Resuming at task %d, step %d.", start_task, start_step)
    if run.is_main:
        tqdm.tqdm.write(_resume_line(ckpt.directory, start_task, start_step, run.num_tasks))
    return state, start_task, start_step


def _resume_line(directory: str, task: int, step: int, num_tasks: int) -> str:
    """What a resumed run tells the user (a finished one: that there is nothing to train)."""
    if task >= num_tasks:
        return (
            f"the run in {directory} is finished ({num_tasks} tasks): rewriting its reports "
            "only; use a new --workdir to train again."
        )
    return f"resuming from {directory}: task {task + 1}, step {step}"
