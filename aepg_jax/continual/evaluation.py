"""The evaluation after a task: every seen task's test set through the run's evaluation program,
counted per predictor (class- and task-incremental in one pass), its predictions kept.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax.continual.programs import Programs, task_spec
from aepg_jax.continual.results import Bookkeeping
from aepg_jax.continual.setup import Run
from aepg_jax.continual.steps import TrainState
from aepg_jax.data import loader
from aepg_jax.runs import predictions
from aepg_jax.system import hosts


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
