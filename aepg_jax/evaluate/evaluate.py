"""`python -m aepg_jax.evaluate WORKDIR`: a run's metrics recomputed from its kept predictions.

Reads each seed's `predictions.npz` (`runs/predictions.py`), no model and no checkpoint:
rebuilds the accuracy counts of every evaluation and from them the metrics of results.json
(`continual/metrics.summary`: accuracy matrices, A_t, forgetting, BWT, ...), the calibration
(ECE, NLL, test entropy) and the logged entropy, checks them against results.json, and adds
what the kept predictions allow beyond it:

    * top-5 accuracy (the label among the K = 5 most probable classes) after each task, as an
      incremental mean over the seen tasks like A_t;
    * per-class accuracy after the last task evaluated;
    * confusion between tasks after each task t >= 1 (class scenario): the fraction of the old
      tasks' examples predicted as one of task t's classes (`old_to_new`) and of task t's
      examples predicted as an old task's class (`new_to_old`).

Writes `evaluation.json` beside each results.json and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aepg_jax.continual import metrics
from aepg_jax.runs import predictions, records
from aepg_jax.system import cli

OUT_FILE = "evaluation.json"
# results.json's keys recomputed exactly from the kept counts; the logged entropy is a float32
# sum on the device during the run, recomputed here in float64 (close, not bit-equal).
EXACT = (
    "accuracy_matrix",
    "A_t",
    "A_T",
    "avg_inc_acc",
    "forgetting",
    "forgetting_per_task",
    "acc_pooled",
    "acc_pooled_T",
    "forgetting_stepwise",
    "bwt",
    "old_new_accuracy",
    "task_incremental_matrix",
    "task_incremental_A_t",
    "task_incremental_A_T",
    "task_incremental_avg_inc_acc",
    "tasks_evaluated",
    "ece",
    "ece_T",
    "nll",
    "nll_T",
    "test_entropy",
    "test_entropy_T",
)


def tracker_of(arrays: Mapping[str, np.ndarray]) -> metrics.AccuracyTracker:
    """The accuracy tracker of a run rebuilt from its kept predictions: counts, task-incremental
    counts, logged entropy and calibration of every evaluation."""
    preds = [str(p) for p in arrays["meta/predictors"]]
    num_tasks = len(arrays["meta/task_sizes"])
    tracker = metrics.AccuracyTracker(num_tasks, preds)
    after, task, label = arrays["after_task"], arrays["task"], arrays["label"]
    for j in np.unique(after):
        rows = after == j
        tracker.record_entropy(
            int(j), float(np.mean(arrays["logged_entropy"][rows], dtype=np.float64))
        )
        evaluation = {k: v[rows] for k, v in arrays.items() if not k.startswith("meta/")}
        for p in preds:
            tracker.record_calibration(int(j), p, predictions.calibration_of(evaluation, p))
            for i in np.unique(task[rows]):
                sel = rows & (task == i)
                correct = int(np.sum(arrays[f"{p}/top_classes"][sel, 0] == label[sel]))
                own = int(np.sum(arrays[f"{p}/task_pred"][sel] == label[sel]))
                tracker.record(int(j), p, int(i), correct, int(sel.sum()), own)
    return tracker


def beyond(arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Per predictor: `top5_A_t` (%, per task), `per_class_accuracy` (%, after the last task
    evaluated, None for a class without test examples there), and in the class scenario
    `old_to_new` / `new_to_old` (%, per task, None for task 0)."""
    preds = [str(p) for p in arrays["meta/predictors"]]
    offsets = np.asarray(arrays["meta/task_offsets"])
    num_classes = int(arrays["meta/num_classes"])
    class_scenario = str(arrays["meta/scenario"]) == "class"
    after, task, label = arrays["after_task"], arrays["task"], arrays["label"]
    evaluated = [int(j) for j in np.unique(after)]
    last = after == evaluated[-1]
    out: dict[str, Any] = {}
    for p in preds:
        top, pred = arrays[f"{p}/top_classes"], arrays[f"{p}/top_classes"][:, 0]
        hit5 = np.any(top == label[:, None], axis=1)
        top5 = [None] * len(offsets)
        old_to_new, new_to_old = [None] * len(offsets), [None] * len(offsets)
        for j in evaluated:
            rows = after == j
            top5[j] = 100.0 * float(
                np.mean([hit5[rows & (task == i)].mean() for i in np.unique(task[rows])])
            )
            if class_scenario and j > 0:
                new_lo = offsets[j]
                old, new = rows & (task < j), rows & (task == j)
                old_to_new[j] = _pct(np.mean(pred[old] >= new_lo)) if old.any() else None
                new_to_old[j] = _pct(np.mean(pred[new] < new_lo)) if new.any() else None
        per_class = [None] * num_classes
        for c in np.unique(label[last]):
            sel = last & (label == c)
            per_class[int(c)] = _pct(np.mean(pred[sel] == c))
        out[p] = {"top5_A_t": top5, "per_class_accuracy": per_class}
        if class_scenario:
            out[p].update(old_to_new=old_to_new, new_to_old=new_to_old)
    return out


def _pct(x: float) -> float:
    return 100.0 * float(x)


def differences(recomputed: Mapping[str, Any], results: Mapping[str, Any]) -> list[str]:
    """The keys (`predictor.key`) whose recomputed value differs from results.json's."""
    out = []
    for p, summary in recomputed.items():
        stored = results.get("methods", {}).get(p, {})
        out += [f"{p}.{k}" for k in EXACT if k in stored and summary.get(k) != stored[k]]
    mine, theirs = recomputed[next(iter(recomputed))]["entropy"], results.get("entropy")
    if theirs is not None and not _close(mine, theirs):
        out.append("entropy")
    return out


def _close(a: Sequence, b: Sequence) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if (x is None) != (y is None):
            return False
        if x is not None and not math.isclose(x, y, rel_tol=1e-5, abs_tol=1e-6):
            return False
    return True


def evaluate_dir(directory: str) -> dict[str, Any]:
    """evaluation.json's dict for one seed's directory (its predictions.npz and results.json)."""
    path = os.path.join(directory, predictions.FILE)
    arrays = predictions.load(path)
    tracker = tracker_of(arrays)
    recomputed = {p: metrics.summary(tracker, p) for p in tracker.predictors}
    recomputed[tracker.predictors[0]]["entropy"] = [
        None if not math.isfinite(v) else float(v) for v in tracker.entropy
    ]
    out: dict[str, Any] = {
        "predictions": {"file": predictions.FILE, "sha256": predictions.sha256(path)},
        "methods": recomputed,
        "beyond": beyond(arrays),
    }
    results_path = os.path.join(directory, records.RESULTS_FILE)
    if os.path.exists(results_path):
        with open(results_path, encoding="utf-8") as f:
            out["differs_from_results"] = differences(recomputed, json.load(f))
    return out


def seed_directories(workdir: str) -> list[str]:
    """The directories holding kept predictions: the run's, or each `seed_<s>` of it."""
    if os.path.exists(os.path.join(workdir, predictions.FILE)):
        return [workdir]
    seeds = sorted(
        d
        for d in os.listdir(workdir)
        if d.startswith("seed_") and os.path.exists(os.path.join(workdir, d, predictions.FILE))
    )
    return [os.path.join(workdir, d) for d in seeds]


def _fmt(x: Any) -> str:
    return "     -" if x is None else f"{x:6.2f}"


def summary_lines(directory: str, out: Mapping[str, Any]) -> list[str]:
    lines = [f"{directory}: kept predictions {out['predictions']['sha256'][:12]}"]
    lines.append(f"  {'predictor':<14}  A_T    bar-A  top5_T  BWT    ECE_T  NLL_T")
    for p, m in out["methods"].items():
        n = m["tasks_evaluated"]
        top5 = out["beyond"][p]["top5_A_t"][n - 1] if n else None
        lines.append(
            f"  {p:<14}{_fmt(m['A_T'])} {_fmt(m['avg_inc_acc'])} {_fmt(top5)} {_fmt(m['bwt'])}"
            f" {_fmt(m['ece_T'])} {_fmt(m['nll_T'])}"
        )
    diff = out.get("differs_from_results")
    if diff is None:
        lines.append("  no results.json to compare with")
    elif diff:
        lines.append(f"  DIFFERS from results.json: {', '.join(diff)}")
    else:
        lines.append("  equal to results.json (every accuracy, forgetting and calibration figure)")
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m aepg_jax.evaluate",
        description="Recompute a run's metrics from its kept predictions (no model needed); "
        f"writes {OUT_FILE} beside each results.json.",
    )
    parser.add_argument("workdir", help="the run's directory (aepg_jax.main --workdir)")
    return parser.parse_args(argv)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if not os.path.isdir(args.workdir):
        cli.fail(f"{args.workdir} is not a run's directory: name the --workdir of a run.")
    directories = seed_directories(args.workdir)
    if not directories:
        cli.fail(
            f"{args.workdir} holds no {predictions.FILE}: evaluate a run made by this version "
            "(its evaluations keep their predictions)."
        )
    differ = False
    for directory in directories:
        try:
            out = evaluate_dir(directory)
        except (OSError, ValueError, KeyError) as err:
            cli.fail(f"{os.path.join(directory, predictions.FILE)} cannot be read ({err}).")
        records.write_results(directory, out, OUT_FILE)
        print("\n".join(summary_lines(directory, out)))
        differ |= bool(out.get("differs_from_results"))
    return 1 if differ else 0
