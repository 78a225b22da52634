"""`python -m aepg_jax.evaluate WORKDIR`: a run's metrics recomputed from its kept predictions.

Reads each seed's `predictions.npz` (`runs/predictions.py`), no model and no checkpoint:
rebuilds the accuracy counts of every evaluation and from them the metrics of results.json
(`metrics.summary`: accuracy matrices, A_t, forgetting, BWT, ...), the calibration
(ECE, NLL, test entropy) and the logged entropy, checks them against results.json, and adds
what the kept predictions allow beyond it. A predictor that outputs scores, not probabilities
(a note in the file's metadata or in results.json) gets no calibration here either: null, with
its `calibration_note`.

    * top-5 accuracy (the label among the K = 5 most probable classes) after each task, as an
      incremental mean over the seen tasks like A_t;
    * per-class accuracy after the last task evaluated;
    * confusion between tasks after each task t >= 1 (class scenario): the fraction of the old
      tasks' examples predicted as one of task t's classes (`old_to_new`) and of task t's
      examples predicted as an old task's class (`new_to_old`).

Writes `evaluation.json` beside each results.json and prints a summary.

It reads only what a finished run wrote: each predictions.npz must have the sha256 its
results.json records (a truncated, damaged or edited file, or a missing one, is named in one
line, exit status 2), and a run not finished (no results.json, or evaluated after fewer than
all of its tasks) or held by a live process (`runs/lock.py`: still training) is refused in one
line. `--partial` evaluates such a run as it is, saying after which task, and prints without
writing anything into it. evaluation.json is written under the run's lock, so never into a
run that another process holds.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aepg_jax import metrics
from aepg_jax.runs import lock, predictions, records
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


def tracker_of(
    arrays: Mapping[str, np.ndarray],
    notes: Mapping[str, str] | None = None,
    entropy_note: str | None = None,
) -> metrics.AccuracyTracker:
    """The accuracy tracker of a run rebuilt from its kept predictions: counts, task-incremental
    counts, logged entropy and calibration of every evaluation (none for the predictors with a
    note, the file's and `notes`; no logged entropy with the file's or this `entropy_note`)."""
    preds = [str(p) for p in arrays["meta/predictors"]]
    num_tasks = len(arrays["meta/task_sizes"])
    kept_notes, kept_entropy = predictions.notes_of(arrays)
    tracker = metrics.AccuracyTracker(
        num_tasks, preds, {**kept_notes, **(notes or {})}, entropy_note or kept_entropy
    )
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


def evaluate_dir(directory: str, arrays: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """evaluation.json's dict for one seed's directory (its predictions.npz, `kept(directory)`
    unless given as `arrays`, and results.json)."""
    path = os.path.join(directory, predictions.FILE)
    arrays = kept(directory) if arrays is None else arrays
    results_path = os.path.join(directory, records.RESULTS_FILE)
    results = None
    if os.path.exists(results_path):
        with open(results_path, encoding="utf-8") as f:
            results = json.load(f)
    # results.json's notes hold too: where it has no calibration, none is recomputed.
    stored = (results or {}).get("methods") or {}
    notes = {p: m["calibration_note"] for p, m in stored.items() if m.get("calibration_note")}
    tracker = tracker_of(arrays, notes, (results or {}).get("entropy_note"))
    recomputed = {p: metrics.summary(tracker, p) for p in tracker.predictors}
    recomputed[tracker.predictors[0]]["entropy"] = tracker.logged_entropy()
    out: dict[str, Any] = {
        "predictions": {"file": predictions.FILE, "sha256": predictions.sha256(path)},
        "methods": recomputed,
        "beyond": beyond(arrays),
    }
    if results is not None:
        out["differs_from_results"] = differences(recomputed, results)
    return out


def _holds_a_run(directory: str) -> bool:
    return any(
        os.path.exists(os.path.join(directory, name))
        for name in (predictions.FILE, records.RESULTS_FILE)
    )


def seed_directories(workdir: str) -> list[str]:
    """The directories holding kept predictions or results: the run's, or each `seed_<s>` of
    it."""
    if _holds_a_run(workdir):
        return [workdir]
    seeds = sorted(
        d
        for d in os.listdir(workdir)
        if d.startswith("seed_") and _holds_a_run(os.path.join(workdir, d))
    )
    return [os.path.join(workdir, d) for d in seeds]


def run_directory(workdir: str) -> str:
    """The directory whose lock the run holds: `workdir`, or the run's above a `seed_<s>`
    directory of a `num_seeds > 1` run."""
    workdir = os.path.abspath(workdir)
    parent = os.path.dirname(workdir)
    seed_dir = os.path.basename(workdir).startswith("seed_")
    if seed_dir and os.path.exists(os.path.join(parent, records.SEEDS_RESULTS_FILE)):
        return parent
    if seed_dir and os.path.exists(os.path.join(parent, "config.json")):
        return parent
    return workdir


def recorded_sha256(directory: str) -> str | None:
    """The sha256 of predictions.npz that `directory`'s results.json records (None: no
    results.json, or one that records none); ValueError when results.json cannot be read."""
    path = os.path.join(directory, records.RESULTS_FILE)
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            results = json.load(f)
        recorded = (results.get("predictions") or {}).get("sha256")
    except (ValueError, AttributeError) as err:
        raise ValueError(f"{path} cannot be read ({err}); restore it from a copy.") from None
    return str(recorded) if recorded else None


def kept(directory: str) -> dict[str, np.ndarray]:
    """`directory`'s kept predictions, checked: the file is there, its sha256 is the one
    results.json records (when it records one) and it reads as a predictions file. Else
    FileNotFoundError or ValueError, one line naming the file and what to do."""
    path = os.path.join(directory, predictions.FILE)
    recorded = recorded_sha256(directory)
    if not os.path.exists(path):
        if recorded:
            raise FileNotFoundError(
                f"{path} is missing (results.json records its sha256 {recorded[:12]}...); "
                "restore it from a copy of the run to evaluate it."
            )
        raise FileNotFoundError(
            f"{directory} holds no {predictions.FILE}: evaluate a run made by this version "
            "(its evaluations keep their predictions)."
        )
    if recorded:
        actual = predictions.sha256(path)
        if actual != recorded:
            raise ValueError(
                f"{path} is not the file the run wrote: its sha256 {actual[:12]}... differs "
                f"from {recorded[:12]}... in results.json (truncated, damaged or edited); "
                "restore it from a copy of the run."
            )
    return predictions.load(path)


def evaluated_after(arrays: Mapping[str, np.ndarray]) -> tuple[int, int]:
    """(k, T): the kept predictions reach the evaluation after task k (1-based; 0: none) of
    the run's T tasks."""
    after = np.asarray(arrays["after_task"])
    return (int(after.max()) + 1 if after.size else 0), len(arrays["meta/task_sizes"])


def _fmt(x: Any) -> str:
    return "     -" if x is None else f"{x:6.2f}"


def summary_lines(directory: str, out: Mapping[str, Any]) -> list[str]:
    lines = [f"{directory}: kept predictions {out['predictions']['sha256'][:12]}"]
    lines.append(f"  {'predictor':<14}  A_T    bar-A  top5_T  BWT    ECE_T  NLL_T")
    for p, m in out["methods"].items():
        n = m["tasks_evaluated"]
        top5 = out["beyond"][p]["top5_A_t"][n - 1] if n else None
        calibration = (
            f" {metrics.SCORES}"
            if m.get("calibration_note")
            else f" {_fmt(m['ece_T'])} {_fmt(m['nll_T'])}"
        )
        lines.append(
            f"  {p:<14}{_fmt(m['A_T'])} {_fmt(m['avg_inc_acc'])} {_fmt(top5)} {_fmt(m['bwt'])}"
            + calibration
        )
    for p, more in out["beyond"].items():
        lines += [f"  {p}: {line}" for line in beyond_lines(more, out["methods"][p])]
    diff = out.get("differs_from_results")
    if diff is None:
        lines.append("  no results.json to compare with")
    elif diff:
        lines.append(f"  DIFFERS from results.json: {', '.join(diff)}")
    else:
        lines.append("  equal to results.json (every accuracy, forgetting and calibration figure)")
    return lines


def beyond_lines(more: Mapping[str, Any], summary: Mapping[str, Any]) -> list[str]:
    """`beyond`'s per-class accuracy (its range and the three lowest classes) and confusion
    between tasks (per task t >= 2) of one predictor, in short form."""
    n = summary["tasks_evaluated"]
    per_class = {c: v for c, v in enumerate(more["per_class_accuracy"]) if v is not None}
    lines = []
    if per_class:
        low = sorted(per_class, key=lambda c: (per_class[c], c))
        worst = ", ".join(f"{c}: {per_class[c]:.1f}" for c in low[:3])
        lines.append(
            f"per-class accuracy after task {n} ({len(per_class)} classes, %): mean "
            f"{np.mean(list(per_class.values())):.1f}, min {per_class[low[0]]:.1f}, max "
            f"{per_class[low[-1]]:.1f}; lowest {worst}"
        )
    for key, words in (("old_to_new", "old tasks' examples as the new task's classes"),
                       ("new_to_old", "new task's examples as an old task's class")):  # fmt: skip
        values = [(t + 1, v) for t, v in enumerate(more.get(key) or []) if v is not None]
        if values:
            text = ", ".join(f"{t}: {v:.1f}" for t, v in values)
            lines.append(f"confusion, {words} (%, after task t): {text}")
    return lines


def sweep_runs(directory: str) -> list[str]:
    """The run folders under `directory` (relative paths, sorted): folders holding a run's
    results or kept predictions (a vmapped run's `seed_<s>` folders are its own)."""
    out = []
    for here, subdirs, _ in os.walk(directory):
        if _holds_a_run(here) or seed_directories(here):
            out.append(os.path.relpath(here, directory))
            subdirs.clear()
    return sorted(out)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m aepg_jax.evaluate",
        description="Recompute a finished run's metrics from its kept predictions (no model "
        f"needed); writes {OUT_FILE} beside each results.json.",
    )
    parser.add_argument("workdir", help="the run's directory (aepg_jax.main --workdir)")
    parser.add_argument(
        "--partial",
        action="store_true",
        help="evaluate a run that is not finished (or still training) as far as it got; "
        f"prints only, writes no {OUT_FILE}",
    )
    return parser.parse_args(argv)


def _unfinished(directory: str, arrays: Mapping[str, np.ndarray]) -> str | None:
    """The words "evaluated after task k of T" when `directory`'s run is not finished, else
    None."""
    k, total = evaluated_after(arrays)
    if k < total:
        return f"evaluated after task {k} of {total}"
    if not os.path.exists(os.path.join(directory, records.RESULTS_FILE)):
        return f"evaluated after task {k} of {total}, no {records.RESULTS_FILE} yet"
    return None


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if not os.path.isdir(args.workdir):
        cli.fail(f"{args.workdir} is not a run's directory: name the --workdir of a run.")
    run_dir = run_directory(args.workdir)
    holder = lock.running(run_dir)
    held = f"{args.workdir} is in use by a live process ({holder.describe()})" if holder else ""
    directories = seed_directories(args.workdir)
    runs = [] if directories or holder else sweep_runs(args.workdir)
    if runs:
        cli.fail(
            f"{args.workdir} is a sweep's directory, not a run's: evaluate one of its "
            f"{len(runs)} run folders ({', '.join(runs)}), e.g. "
            f"python -m aepg_jax.evaluate {os.path.join(args.workdir, runs[0])}"
        )
    if not directories:
        cli.fail(
            f"{held}: run not finished, no task evaluated yet; evaluate it once it has finished."
            if holder
            else f"{args.workdir} holds no {predictions.FILE}: evaluate a run made by this "
            "version (its evaluations keep their predictions)."
        )
    try:
        loaded = {d: kept(d) for d in directories}
    except (OSError, ValueError) as err:
        cli.fail(str(err))
    unfinished = {d: _unfinished(d, a) for d, a in loaded.items()}
    first = next((u for u in unfinished.values() if u), None)
    state = f"run not finished: {first}" if first else "run finished, its files being written"
    partial = "or with --partial as it is (printed, nothing written)"
    if holder and not args.partial:
        cli.fail(f"{held}: {state}; evaluate it once that process has ended, {partial}.")
    if first and not args.partial:
        cli.fail(
            f"{args.workdir}: {state}; finish it (the run's own command resumes it), {partial}."
        )
    outs = {}
    for directory, arrays in loaded.items():
        try:
            outs[directory] = evaluate_dir(directory, arrays)
        except (ValueError, KeyError, IndexError) as err:  # a readable file of another layout
            cli.fail(f"{os.path.join(directory, predictions.FILE)} cannot be read ({err}).")
    if not args.partial:
        _write(run_dir, outs)
    differ = False
    for directory, out in outs.items():
        if unfinished[directory]:
            print(f"{directory}: run not finished: {unfinished[directory]}")
        print("\n".join(summary_lines(directory, out)))
        differ |= bool(out.get("differs_from_results"))
    return 1 if differ else 0


def _write(run_dir: str, outs: Mapping[str, Mapping[str, Any]]) -> None:
    """Writes each directory's evaluation.json under the run's lock (`runs/lock.py`): a run
    that another process holds (started since it was checked) is refused in one line."""
    try:
        with lock.hold(run_dir):
            for directory, out in outs.items():
                records.write_results(directory, out, OUT_FILE)
    except lock.Busy:
        cli.fail(
            f"{OUT_FILE} not written: a process took {run_dir} meanwhile; evaluate it once that "
            "process has ended."
        )
    except (lock.LockError, OSError, ValueError) as err:
        cli.fail(f"{OUT_FILE} not written: {cli.one_line(str(err))}")
