"""Evaluation after a task (SPEC §4): every predictor of the method on every seen task's test
set, task-agnostic (argmax over all seen classes), plus the mean predictive entropy."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax import losses, methods
from aepg_jax.continual import metrics, training
from aepg_jax.continual import train_step as ts
from aepg_jax.continual.setup import Run
from aepg_jax.data import augment, loader

Params = dict[str, Any]


def make_eval_step(
    method: methods.Method, net: methods.Network, cfg: ts.StepConfig
) -> Callable[..., dict[str, jax.Array]]:
    """`eval(trainable, method_state, frozen, batch, task) -> sums` over the valid rows of a
    batch after task `task` (a traced `TaskSpec`: one program for every task): correct counts
    per predictor over the seen classes, the number of valid rows and the summed entropy of
    the softmax over the seen classes (of the logits `method.predict` names)."""

    def eval_step(
        trainable: Params, method_state: Params, frozen: Params, batch: dict, task
    ) -> dict[str, jax.Array]:
        images = augment.test_transform(batch["image"], cfg.image_size, cfg.normalize)
        mask, labels = batch["mask"], batch["label"]
        probs, logits = method.predict(net, trainable, frozen, method_state, images, task)
        out = {
            "count": jnp.sum(mask),
            "entropy_sum": jnp.sum(jnp.where(mask, losses.entropy(logits), 0.0)),
        }
        for name, p in probs.items():
            out[name] = jnp.sum((jnp.argmax(p, -1) == labels) & mask)
        return out

    return eval_step


_EVAL: dict[int, tuple[weakref.ref, Callable]] = {}  # id(run) -> (run, jitted eval)


def jitted_eval(run: Run) -> Callable[..., dict[str, jax.Array]]:
    """The run's jitted evaluation, vmapped over seeds: `eval(trainable, method_state, frozen,
    batch, task) -> sums`; one object per run, so one compilation serves every task."""
    ref, fn = _EVAL.get(id(run), (None, None))
    if ref is None or ref() is not run:
        step = make_eval_step(run.method, run.net, run.step_cfg)
        fn = jax.jit(run.axis.lift(step, (0, 0, run.frozen_axis, None, None)))
        _EVAL[id(run)] = (weakref.ref(run, lambda _: _EVAL.pop(id(run), None)), fn)
    return fn


def eval_fn_of(run: Run, task: int) -> Callable[..., dict[str, jax.Array]]:
    """The evaluation after task `task`, vmapped over seeds, not jitted:
    `eval(trainable, method_state, frozen, batch) -> sums` (`make_eval_step`, the task bound)."""
    step = run.axis.lift(
        make_eval_step(run.method, run.net, run.step_cfg), (0, 0, run.frozen_axis, None, None)
    )
    spec = training.task_spec(run, task).traced()
    return lambda trainable, method_state, frozen, batch: step(
        trainable, method_state, frozen, batch, spec
    )


def evaluate(
    run: Run, task: int, state: ts.TrainState, trackers: Sequence[metrics.AccuracyTracker]
) -> list[dict]:
    """Accuracy of every predictor on tasks 0..task, per seed, recorded in `trackers`.

    Returns per seed `{"per_task": {i: {predictor: acc %}}, "entropy": mean entropy}`.
    """
    predictors = run.method.predictors
    eval_fn, spec = jitted_eval(run), training.task_spec(run, task).traced()
    num_seeds = len(run.axis.seeds)
    entropy_sum, count_all = np.zeros(num_seeds), 0
    per_task: list[dict] = [{} for _ in range(num_seeds)]
    for i in range(task + 1):
        sums = None
        for batch in loader.iterate(
            run.data.test.images,
            run.data.tasks.test_labels,
            run.data.tasks.tasks[i].test_indices,
            run.cfg.eval.batch_size,
            run.mesh,
            train=False,
        ):
            out = eval_fn(state.trainable, state.method_state, run.frozen, batch, spec)
            sums = out if sums is None else jax.tree.map(jnp.add, sums, out)
        sums = {k: run.axis.per_seed(v) for k, v in sums.items()}
        count = int(sums["count"][0])
        for s, tracker in enumerate(trackers):
            for p in predictors:
                tracker.record(task, p, i, int(sums[p][s]), count)
            per_task[s][i] = {p: 100.0 * int(sums[p][s]) / max(count, 1) for p in predictors}
        entropy_sum += sums["entropy_sum"]
        count_all += count
    results = []
    for s, tracker in enumerate(trackers):
        entropy = float(entropy_sum[s]) / max(count_all, 1)
        tracker.record_entropy(task, entropy)
        results.append({"per_task": per_task[s], "entropy": entropy})
    return results
