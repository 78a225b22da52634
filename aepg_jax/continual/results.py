"""What a continual run records and reports: the per-seed trackers and metric writers
(`Bookkeeping`), results.json's dict, the multi-seed summary, the plots and terminal tables.

The driver writes these records to metrics.jsonl (accuracies and entropies as in
`metrics.summary`, percent):

    * `"train"`: `task, step` (global optimizer step), `task_step, epoch, loss, alpha, entropy,
      lr` (the rate Adam applied to the head), `[lr_peft]` (only where PEFT trained at another
      rate), `grad_norm, images_per_s, train_peft`
    * `"eval"`: `task` (evaluated after it), `step`, `accuracy` ({predictor: [acc of task i
      for i <= task]} in %), `A_t`, `acc_pooled`, `entropy`, `forgetting`, and (primary
      predictor, as far as evaluated) `forgetting_stepwise`, `bwt`, `old_accuracy`,
      `new_accuracy`, `task_incremental_A_t` and `task_incremental_accuracy` (as `accuracy`,
      argmax over each task's own classes)

`results.json` is the run's final record, assembled by `build_results` (see there for keys).

Task numbering: people see the paper's t = 1..T (progress bars, "after task t", the final table,
the plots); the files keep 0-based indices (metrics.jsonl's `task`, results.json's
`accuracy_matrix[i][j]` and `A_t[j]`, `tasks_evaluated`), so index i is task i + 1.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import tqdm

from aepg_jax import metrics
from aepg_jax.continual import plots, setup
from aepg_jax.continual.setup import Run
from aepg_jax.runs import checkpointing, predictions, records
from aepg_jax.runs.records import to_jsonable
from aepg_jax.system import environment

SEED_METRICS = ("A_T", "avg_inc_acc", "forgetting", "acc_pooled_T")
# Reported over seeds too, in a second table: the task-incremental and transfer figures.
SEED_METRICS_MORE = (
    "task_incremental_A_T",
    "task_incremental_avg_inc_acc",
    "bwt",
    "forgetting_stepwise",
)


def build_results(
    tracker: metrics.AccuracyTracker,
    config: Mapping[str, Any],
    wall_time_s: float,
    seed: int,
    head_sizes: Sequence[int],
    provenance: Mapping[str, Any] | None = None,
    class_order: Sequence[int] | None = None,
) -> dict[str, Any]:
    """The results.json dict.

    Keys: `config`, `seed`, `num_tasks`, `head_sizes`, `predictors` (the first is the primary
    one), `methods` ({predictor: `metrics.summary`}), every key of the primary predictor's
    summary copied to the top level (`accuracy_matrix`, `A_t`, `A_T`, `avg_inc_acc`,
    `forgetting`, `forgetting_per_task`, `acc_pooled`, `acc_pooled_T`, `tasks_evaluated`,
    `forgetting_stepwise`, `bwt`, `old_new_accuracy`, `task_incremental_matrix`,
    `task_incremental_A_t`, `task_incremental_A_T`, `task_incremental_avg_inc_acc`; %),
    `class_order` (the original class ids in the order trained; only when given), `entropy`
    (per evaluation, None where not recorded, and everywhere with `entropy_note`: the logits
    `predict` names are scores, not probabilities), `wall_time_s`, `tracker`
    (`AccuracyTracker.to_dict()`, enough to rebuild everything), and `provenance`'s keys
    (the driver's: `backbone_fingerprint`, `backbone_source`, `environment`).
    """
    methods = {p: metrics.summary(tracker, p) for p in tracker.predictors}
    primary = tracker.predictors[0]
    return {
        "config": to_jsonable(config),
        "seed": int(seed),
        "num_tasks": tracker.num_tasks,
        "head_sizes": [int(h) for h in head_sizes],
        "predictors": list(tracker.predictors),
        "methods": methods,
        **methods[primary],
        **({} if class_order is None else {"class_order": [int(c) for c in class_order]}),
        "entropy": tracker.logged_entropy(),
        **({"entropy_note": tracker.entropy_note} if tracker.entropy_note else {}),
        "wall_time_s": float(wall_time_s),
        "tracker": tracker.to_dict(),
        **to_jsonable(dict(provenance or {})),
    }


def seeds_summary(
    per_seed: Sequence[Mapping[str, Any]], config: Mapping[str, Any], wall_time_s: float
) -> dict[str, Any]:
    """results_seeds.json of a multi-seed run (`records.seeds_summary`): mean +- std over seeds.

    `metrics` is {predictor: {metric: {mean, std, values}}} for `SEED_METRICS` and
    `SEED_METRICS_MORE`; besides it, `predictors`, `accuracy_matrix_mean` and
    `task_incremental_matrix_mean` (primary predictor, %), and `class_order` when every seed
    has the same one.
    """
    predictors = list(per_seed[0]["predictors"])
    table = {
        p: {
            k: records.mean_std([r["methods"][p].get(k) for r in per_seed])
            for k in SEED_METRICS + SEED_METRICS_MORE
        }
        for p in predictors
    }
    orders = [r.get("class_order") for r in per_seed]
    same_order = orders[0] is not None and all(o == orders[0] for o in orders)
    return records.seeds_summary(
        per_seed,
        config,
        wall_time_s,
        table,
        predictors=predictors,
        accuracy_matrix_mean=_mean_matrix([r["accuracy_matrix"] for r in per_seed]),
        task_incremental_matrix_mean=_mean_matrix(
            [r.get("task_incremental_matrix") for r in per_seed]
        ),
        **({"class_order": orders[0]} if same_order else {}),
    )


def _mean_matrix(matrices: Sequence[Any]) -> list[list[float | None]] | None:
    """The entrywise mean over seeds of JSON matrices, None where no seed has the entry (or
    None when a seed has no matrix)."""
    if any(m is None for m in matrices):
        return None
    stacked = np.stack([metrics.as_float_array(m) for m in matrices])
    with warnings.catch_warnings():  # entries no seed has (j < i) stay NaN without a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean = np.nanmean(stacked, axis=0)
    return [[None if not math.isfinite(v) else float(v) for v in row] for row in mean]


def seeds_table(summary: Mapping[str, Any]) -> str:
    """The terminal summary of a multi-seed run: per-seed A_T and mean +- std per predictor."""
    seeds = summary["seeds"]
    primary = summary["predictors"][0]
    lines = [f"{len(seeds)} seeds {seeds}, A_T (%) per seed ({primary}):"]
    lines.append(
        "  "
        + "  ".join(
            f"{s}: {_fmt(v, 0)}"
            for s, v in zip(seeds, summary["metrics"][primary]["A_T"]["values"], strict=True)
        )
    )
    lines.append("")
    lines.extend(_mean_std_rows(summary["metrics"], SEED_METRICS, SEED_METRICS))
    more = [k for k in SEED_METRICS_MORE if k in summary["metrics"][primary]]
    if more:
        lines.append("")
        lines.extend(_mean_std_rows(summary["metrics"], more, [_short(k) for k in more]))
    lines.append(f"{'wall time':<12}{_fmt_duration(summary.get('wall_time_s')):>18}")
    return "\n".join(lines)


def _mean_std_rows(
    metrics: Mapping[str, Mapping[str, Any]], keys: Sequence[str], headers: Sequence[str]
) -> list[str]:
    """A header of `headers`, then per predictor the mean +- std of each of `keys` ("-" where
    no seed has it)."""
    lines = [f"{'predictor':<12}" + "".join(f"{h:>18}" for h in headers)]
    for p, table in metrics.items():
        cells = []
        for k in keys:
            m, sd = table[k]["mean"], table[k]["std"]
            cells.append(f"{_fmt(m, 0)} +- {_fmt(sd, 0)}" if m is not None else "-")
        lines.append(f"{p:<12}" + "".join(f"{c:>18}" for c in cells))
    return lines


def _short(key: str) -> str:
    """A metric's column title: `task_incremental_` shortened to `TI_`."""
    return key.replace("task_incremental_", "TI_")


def _fmt(x: Any, width: int = 7, digits: int = 2) -> str:
    return f"{x:>{width}.{digits}f}" if records.is_number(x) else f"{'-':>{width}}"


def _calibration_cells(m: Mapping[str, Any]) -> str:
    """A predictor's ECE_T, NLL_T and H_T columns, or "scores, not probabilities" instead."""
    if m.get("calibration_note"):
        return f"  {metrics.SCORES}"
    ece, nll, h = m.get("ece_T"), m.get("nll_T"), m.get("test_entropy_T")
    return f"{_fmt(ece, 8)}{_fmt(nll, 9, 3)}{_fmt(h, 8, 3)}"


def _fmt_duration(seconds: Any) -> str:
    if not records.is_number(seconds):
        return "-"
    s = round(seconds)
    return f"{seconds:.1f} s ({s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d})"


def final_table(results: Mapping[str, Any]) -> str:
    """The terminal summary of a results dict: accuracy matrix (%), scalars, predictors.

    Besides the class-incremental scalars: the task-incremental A_T and avg_inc_acc (`TI`),
    BWT, CODA-Prompt's stepwise forgetting and the old / new classes' accuracy after the last
    evaluated task (those of a results dict that has them)."""
    rows = results["accuracy_matrix"]
    primary = results["predictors"][0]
    lines = [f"Accuracy (%) of task i (rows) after task j (columns), tasks 1..T, {primary}:"]
    lines.append("        " + "".join(f"{f'j={j + 1}':>7}" for j in range(len(rows))))
    for i, row in enumerate(rows):
        lines.append(f"{f'i={i + 1}':<8}" + "".join(_fmt(v, 7, 1) for v in row))
    lines.append("")
    scalars = [
        ("A_T (%)", results.get("A_T")),
        ("avg_inc_acc (%)", results.get("avg_inc_acc")),
        ("forgetting (%)", results.get("forgetting")),
        (
            "acc_pooled_T (%)",
            results.get("acc_pooled_T", (results.get("acc_pooled") or [None])[-1]),
        ),
    ]
    lines += [f"{name:<18}{_fmt(value, 8)}" for name, value in scalars]
    more = [
        ("TI A_T (%)", "task_incremental_A_T"),
        ("TI avg_inc (%)", "task_incremental_avg_inc_acc"),
        ("bwt (%)", "bwt"),
        ("fgt stepwise (%)", "forgetting_stepwise"),
        ("ECE_T (%)", "ece_T"),
        ("NLL_T (nats)", "nll_T"),
    ]
    for name, key in more:
        if key in results:
            note = metrics.note_of(results, key)
            value = f"  {metrics.SCORES}" if note else _fmt(results.get(key), 8)
            lines.append(f"{name:<18}{value}")
    n = results.get("tasks_evaluated")
    old_new = results.get("old_new_accuracy")
    if old_new and isinstance(n, int) and n > 0:
        old, new = old_new[n - 1]
        lines.append(f"{'old / new (%)':<18}{_fmt(old, 8)}{_fmt(new, 8)}")
    lines.append(f"{'wall time':<18}{_fmt_duration(results.get('wall_time_s')):>8}")
    methods = results.get("methods") or {}
    if len(methods) > 1:
        lines.append("")
        lines.append(f"{'predictor':<18}{'A_T':>8}{'avg_inc':>9}{'forget':>8}{'pooled_T':>9}")
        for name, m in methods.items():
            lines.append(
                f"{name:<18}{_fmt(m.get('A_T'), 8)}{_fmt(m.get('avg_inc_acc'), 9)}"
                f"{_fmt(m.get('forgetting'), 8)}{_fmt(m.get('acc_pooled_T'), 9)}"
            )
        if any("task_incremental_A_T" in m for m in methods.values()):
            lines.append("")
            lines.append(f"{'predictor':<18}{'TI A_T':>8}{'TI avg':>9}{'bwt':>8}{'fgt_step':>9}")
            for name, m in methods.items():
                lines.append(
                    f"{name:<18}{_fmt(m.get('task_incremental_A_T'), 8)}"
                    f"{_fmt(m.get('task_incremental_avg_inc_acc'), 9)}"
                    f"{_fmt(m.get('bwt'), 8)}{_fmt(m.get('forgetting_stepwise'), 9)}"
                )
        if any("ece_T" in m for m in methods.values()):
            lines.append("")
            lines.append(f"{'predictor':<18}{'ECE_T':>8}{'NLL_T':>9}{'H_T':>8}")
            for name, m in methods.items():
                lines.append(f"{name:<18}{_calibration_cells(m)}")
    return "\n".join(lines)


class Bookkeeping:
    """The host-side records of a run: accuracy trackers and metric writers (one per seed),
    elapsed time, and the `meta` that every checkpoint stores to resume them. Only process 0
    writes files."""

    def __init__(self, run: Run):
        self.run = run
        self.seed_dirs = records.seed_dirs(run.workdir, run.axis.seeds)
        self.writers = records.open_writers(run.cfg, self.seed_dirs, enabled=run.is_main)
        self.trackers = [self._tracker(run.num_tasks) for _ in run.axis.seeds]
        self.elapsed_before = 0.0
        self.started = time.time()

    def _tracker(self, num_tasks: int, saved: dict | None = None) -> metrics.AccuracyTracker:
        """A seed's tracker (from a checkpoint's `saved` dict), with the method's notes on the
        predictors that output scores (the method decides, also for an older checkpoint)."""
        m = self.run.method
        notes, entropy = m.calibration_notes(), m.entropy_note()
        if saved is None:
            return metrics.AccuracyTracker(num_tasks, m.predictors, notes, entropy)
        return metrics.AccuracyTracker.from_dict({**saved, "notes": notes, "entropy_note": entropy})

    def elapsed(self) -> float:
        """Wall seconds of this run, earlier (resumed) sessions included."""
        return self.elapsed_before + time.time() - self.started

    def meta(self, task: int, phase: str, epoch: int) -> dict:
        """What a checkpoint stores beside the state."""
        return {
            "state_layout": setup.STATE_LAYOUT,
            "method_layout": self.run.method.layout,
            "task": task,
            "phase": phase,
            "epoch": epoch,
            "seeds": list(self.run.axis.seeds),
            "trackers": [t.to_dict() for t in self.trackers],
            "head_sizes": list(self.run.head_sizes[: task + 1]),
            "backbone_sha256": self.run.fingerprint,
            "elapsed_s": self.elapsed(),
        }

    def resume_from(self, meta: dict) -> None:
        """Takes the trackers and elapsed time of a restored checkpoint."""
        self.trackers = [self._tracker(d["num_tasks"], d) for d in meta["trackers"]]
        self.elapsed_before = meta["elapsed_s"]

    def rewind(self, cut: records.Cut) -> None:
        """Drops from each seed's records what follows the checkpoint resumed from
        (`records.MetricsWriter.rewind`)."""
        for writer in self.writers:
            writer.rewind(cut)

    def record_eval(self, task: int, step: int, results: list[dict]) -> None:
        """Writes each seed's kept predictions and eval record; prints A_t (mean +- std over
        seeds)."""
        predictors = self.run.method.predictors
        primary = predictors[0]
        a_t = []
        records_of = zip(results, self.trackers, self.writers, self.seed_dirs, strict=True)
        for result, tracker, writer, directory in records_of:
            if self.run.is_main:
                predictions.write(directory, task, result["kept"], self._kept_meta())
            a = tracker.matrix(primary)
            a_t.append(100.0 * metrics.incremental_accuracy(a, task))
            writer.write(
                {
                    "type": "eval",
                    "task": task,
                    "step": step,
                    "accuracy": {
                        p: [result["per_task"][i][p] for i in range(task + 1)] for p in predictors
                    },
                    "A_t": a_t[-1],
                    "acc_pooled": 100.0
                    * metrics.pooled_accuracy(
                        tracker.correct[primary], tracker.total[primary], task
                    ),
                    "entropy": tracker.entropy[task],  # NaN (null) with an entropy note
                    "calibration": {
                        p: {k: tracker.calibration[p][k][task] for k in metrics.CALIBRATION}
                        for p in predictors
                    },
                    # Mean forgetting of tasks < task (NaN -> null after the first task).
                    "forgetting": 100.0 * metrics.mean_forgetting(a[: task + 1, : task + 1]),
                    **self._more(result, tracker, task),
                }
            )
        if not self.run.is_main:
            return
        if self.run.axis.vmapped:
            summary = (
                f"{np.mean(a_t):.2f} +- {np.std(a_t, ddof=1):.2f}% over "
                f"{len(a_t)} seeds ({primary})"
            )
        else:
            summary = f"{a_t[0]:.2f}% ({primary})"
        tqdm.tqdm.write(f"after task {task + 1}: A_t = {summary}")

    def _kept_meta(self) -> dict:
        """The kept predictions' metadata (`predictions.py`)."""
        tasks = self.run.data.tasks
        method = self.run.method
        notes = method.calibration_notes()
        return {
            "format": predictions.FORMAT,
            "predictors": list(method.predictors),
            "notes": [notes.get(p, "") for p in method.predictors],
            "entropy_note": method.entropy_note() or "",
            "task_offsets": [t.offset for t in tasks.tasks],
            "task_sizes": [t.num_classes for t in tasks.tasks],
            "num_classes": sum(self.run.head_sizes),
            "scenario": tasks.scenario,
        }

    def _more(self, result: dict, tracker: metrics.AccuracyTracker, task: int) -> dict:
        """The eval record's task-incremental, transfer and old / new figures (%; NaN becomes
        null): the primary predictor's, on the tasks evaluated so far."""
        predictors = self.run.method.predictors
        primary = predictors[0]
        a = tracker.matrix(primary)[: task + 1, : task + 1]
        old, new = metrics.old_new_accuracy(tracker.correct[primary], tracker.total[primary])[task]
        own = tracker.task_matrix(primary)
        return {
            "forgetting_stepwise": 100.0 * metrics.mean_stepwise_forgetting(a),
            "bwt": 100.0 * metrics.backward_transfer(a),
            "old_accuracy": 100.0 * old,
            "new_accuracy": 100.0 * new,
            "task_incremental_A_t": 100.0 * metrics.incremental_accuracy(own, task),
            "task_incremental_accuracy": {
                p: [result["task_incremental"][i][p] for i in range(task + 1)] for p in predictors
            },
        }

    def close(self) -> None:
        for writer in self.writers:
            writer.close()


def provenance(run: Run, seed_index: int, env: dict) -> dict:
    """What one seed's numbers depend on besides its config: the frozen backbone's fingerprint
    (as a single run of that seed computes it), the backbone's file, the environment."""
    fingerprint = (
        run.fingerprint
        if run.frozen_axis is None
        else checkpointing.backbone_fingerprint(run.frozen_of(seed_index))
    )
    return {
        "backbone_fingerprint": fingerprint,
        "backbone_source": run.backbone_source,
        "environment": env,
    }


def report(
    run: Run,
    book: Bookkeeping,
    wall: float,
    compilations: dict | None = None,
    finished: bool = False,
) -> dict:
    """Writes each seed's results.json and plots (plus the seeds' summary, results_seeds.json),
    prints the terminal table and returns the run's results;
    `compilations` (`compiles.Counter.summary`) goes into each results file. `finished`: the
    run had finished before this process started; its results files stay as they are
    (`records.kept_results`) and only the plots and the table are made again from them."""
    write = records.kept_results if finished else records.write_results
    env = environment.describe()
    per_seed = [
        build_results(
            tracker,
            records.seed_config(run.cfg, seed),
            wall,
            seed,
            list(run.head_sizes),
            provenance(run, i, env),
            run.data.tasks.class_order,
        )
        for i, (tracker, seed) in enumerate(zip(book.trackers, run.axis.seeds, strict=True))
    ]
    for res, directory in zip(per_seed, book.seed_dirs, strict=True):
        if compilations is not None:
            res["compilations"] = compilations
        kept_file = os.path.join(directory, predictions.FILE)
        if run.is_main and os.path.exists(kept_file):
            res["predictions"] = {"file": predictions.FILE, "sha256": predictions.sha256(kept_file)}
    if run.is_main:
        for i, directory in enumerate(book.seed_dirs):
            kept = write(directory, per_seed[i])
            per_seed[i] = kept if finished else per_seed[i]
            res = per_seed[i]
            plots.write_plots(
                directory, res, records.read_metrics(os.path.join(directory, records.METRICS_FILE))
            )
    if not run.axis.vmapped:
        if run.is_main:
            print(final_table(per_seed[0]))
        return per_seed[0]
    summary = seeds_summary(per_seed, run.cfg.to_dict(), wall)
    if compilations is not None:
        summary["compilations"] = compilations
    if run.is_main:
        kept = write(run.workdir, summary, records.SEEDS_RESULTS_FILE)
        summary = kept if finished else summary
        print(seeds_table(summary))
    return summary
