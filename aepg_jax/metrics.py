"""Continual-learning accuracy and calibration metrics (docs/algorithm.md §4), pure NumPy.

The scores of a run, below everything that keeps or reads them: the continual loop records
them, `runs/` stores them, `evaluate` recomputes them and `tables` reads them; this module
imports nothing of the package.

Notation (0-based): `T` tasks; accuracy matrix `a[i, j]` = accuracy on the test set of task `i`
after learning task `j`, defined for `i <= j` (NaN above the diagonal's complement, `i > j`).
`a` is class-incremental (argmax over every seen class, no task identity); the
task-incremental matrix `a_TI[i, j]` is the same evaluation with the argmax over task `i`'s own
classes only (its identity given), so `a_TI >= a` entrywise. Every function of `a` below
applies to `a_TI` as well.

    * `A_t = mean_{i<=t} a[i, t]`               incremental accuracy (mean over seen tasks)
    * `avg_inc_acc = mean_t A_t`                the paper's A-tilde
    * `f_i = max_{j<T-1} a[i, j] - a[i, T-1]`   forgetting of task `i < T-1`; `forgetting` is
                                                `mean_i f_i` (Chaudhry et al. 2018, "Riemannian
                                                Walk", as L2P and DualPrompt report it)
    * `forgetting_stepwise = mean_{1<=j<T} mean_{i<j} (a[i, j-1] - a[i, j])`
                                                the drop of the old tasks' accuracy across
                                                learning task j, averaged over the old tasks,
                                                then over j: CODA-Prompt's `calc_forgetting`
                                                (utils/calc_forgetting.py of its official code)
    * `bwt = mean_{i<T-1} (a[i, T-1] - a[i, i])`  backward transfer (Lopez-Paz & Ranzato 2017,
                                                GEM): negative when learning later tasks hurts
    * `acc_pooled_t = sum_{i<=t} correct[i, t] / sum_{i<=t} total[i, t]`
                                                LAE's "Acc": all seen test samples pooled, which
                                                differs from `A_t` when tasks differ in size
    * `old_t = sum_{i<t} correct[i, t] / sum_{i<t} total[i, t]`, `new_t = a[t, t]`
                                                accuracy after task t on the old classes' test
                                                samples pooled (PyCIL's / PILOT's "old") and on
                                                the new task's; `old_0` is undefined

All scalars over tasks are NaN (None in `summary`) where undefined: forgetting and bwt for
T = 1, or any entry they need not evaluated.

Calibration of the test predictions (`ece`, `nll`, `calibration`): for n test examples with
confidence `c_i = max_k p_i(k)` (the top probability), correctness `z_i = [argmax_k p_i(k) =
y_i]`, probability of the true class `p_i(y_i)` and entropy `H_i = -sum_k p_i(k) log p_i(k)`:

    * `ece = sum_m |B_m| / n * |acc(B_m) - conf(B_m)|`   expected calibration error over
      M = 15 equal-width confidence bins `B_m = {i: c_i in ((m-1)/M, m/M]}`, `acc(B_m)` the
      bin's mean `z_i`, `conf(B_m)` its mean `c_i` (Guo et al. 2017, "On Calibration of
      Modern Neural Networks", Eq. 3); empty bins add nothing
    * `nll = -mean_i log max(p_i(y_i), FLOOR)`        negative log-likelihood in nats; FLOOR,
      float32's smallest normal number, caps an example whose true class has probability 0
      (underflow) at 87.3 nats
    * `entropy = mean_i H_i`                          mean entropy of the predictions in nats

Each is over every seen test example after a task (the classes of later tasks have probability
0: `methods/base.py` `mask_unseen`). They are a property of a trained probability model: a
predictor that outputs scores (cosines, a ridge readout; `Method.scores`) has none. Its figures
are NaN here and null in `summary`, with `calibration_note` = "scores, not probabilities:
<why>"; likewise the logged entropy (`entropy_note`) when `predict`'s logits are scores.

Accuracies are fractions in [0, 1] everywhere in this module except in `summary`, which reports
percent (0-100) and JSON-ready `None` for values that are undefined or not yet evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

# What the reports print instead of a calibration figure of a predictor that outputs scores
# (`Method.scores`); its note reads "<SCORES>: <why>".
SCORES = "scores, not probabilities"

# The calibration figures kept per predictor and task (`calibration`).
CALIBRATION = ("ece", "nll", "entropy")
# The summary's keys of those figures, null for a predictor that outputs scores.
CALIBRATION_KEYS = ("ece", "ece_T", "nll", "nll_T", "test_entropy", "test_entropy_T")


def _finite_or_none(x: float, scale: float = 1.0) -> float | None:
    """`x * scale` as a Python float, or None for NaN / inf."""
    x = float(x)
    return x * scale if math.isfinite(x) else None


def _to_json_matrix(m: np.ndarray, scale: float = 1.0) -> list[list[float | None]]:
    return [[_finite_or_none(v, scale) for v in row] for row in m]


class AccuracyTracker:
    """Accuracy matrices of one or more predictors, plus counts and per-evaluation entropies.

    For each predictor name: `accuracy[p]` (T, T) float64 in [0, 1], NaN where not evaluated;
    `correct[p]`, `total[p]` (T, T) int64, 0 where not evaluated; `task_accuracy[p]` and
    `task_correct[p]` the same for the task-incremental evaluation (argmax over the evaluated
    task's own classes; same samples, so same `total`), NaN / 0 where not recorded. `entropy`
    (T,) float64: the mean predictive entropy after task j over all seen test samples (softmax
    over all seen classes), NaN where not recorded. `calibration[p][k]` (T,) float64 for k in
    `CALIBRATION`: the calibration of `p`'s predictions after task j over all seen test samples
    (`calibration`; ECE a fraction, NLL and entropy in nats), NaN where not recorded.

    `notes` {predictor: "scores, not probabilities: <why>"} names the predictors whose outputs
    are scores: their calibration is never recorded (NaN); `entropy_note` likewise for the
    logged entropy (`Method.calibration_notes`, `Method.entropy_note`).
    """

    def __init__(
        self,
        num_tasks: int,
        predictors: Sequence[str],
        notes: Mapping[str, str] | None = None,
        entropy_note: str | None = None,
    ):
        if num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1; got {num_tasks}.")
        predictors = tuple(predictors)
        if not predictors or len(set(predictors)) != len(predictors):
            raise ValueError(f"predictors must be non-empty and unique; got {predictors}.")
        self.num_tasks = int(num_tasks)
        self.predictors = predictors
        shape = (num_tasks, num_tasks)
        self.accuracy = {p: np.full(shape, np.nan) for p in predictors}
        self.correct = {p: np.zeros(shape, np.int64) for p in predictors}
        self.total = {p: np.zeros(shape, np.int64) for p in predictors}
        self.task_accuracy = {p: np.full(shape, np.nan) for p in predictors}
        self.task_correct = {p: np.zeros(shape, np.int64) for p in predictors}
        self.entropy = np.full((num_tasks,), np.nan)
        self.calibration = {
            p: {k: np.full((num_tasks,), np.nan) for k in CALIBRATION} for p in predictors
        }
        self.notes = {p: str(n) for p, n in (notes or {}).items() if p in predictors}
        self.entropy_note = entropy_note or None

    def matrix(self, predictor: str) -> np.ndarray:
        """The (T, T) accuracy matrix of `predictor` (fractions, NaN where not evaluated)."""
        if predictor not in self.accuracy:
            raise KeyError(f"Unknown predictor {predictor!r}; expected one of {self.predictors}.")
        return self.accuracy[predictor]

    def task_matrix(self, predictor: str) -> np.ndarray:
        """The (T, T) task-incremental accuracy matrix of `predictor` (NaN where not recorded)."""
        if predictor not in self.task_accuracy:
            raise KeyError(f"Unknown predictor {predictor!r}; expected one of {self.predictors}.")
        return self.task_accuracy[predictor]

    def _check_after_task(self, after_task: int) -> None:
        if not 0 <= after_task < self.num_tasks:
            raise ValueError(f"after_task must be in [0, {self.num_tasks}); got {after_task}.")

    def record(
        self,
        after_task: int,
        predictor: str,
        task: int,
        correct: int,
        total: int,
        task_correct: int | None = None,
    ) -> None:
        """Stores `a[task, after_task] = correct / total` for `predictor` (overwrites), and
        `a_TI[task, after_task] = task_correct / total` (not recorded when None)."""
        self._check_after_task(after_task)
        if predictor not in self.accuracy:
            raise KeyError(f"Unknown predictor {predictor!r}; expected one of {self.predictors}.")
        if not 0 <= task <= after_task:
            raise ValueError(
                f"Only seen tasks are evaluated: need 0 <= task <= after_task={after_task}; "
                f"got task={task}."
            )
        if total <= 0 or not 0 <= correct <= total:
            raise ValueError(f"Need 0 <= correct <= total and total > 0; got {correct}/{total}.")
        if task_correct is not None and not 0 <= task_correct <= total:
            raise ValueError(f"Need 0 <= task_correct <= total; got {task_correct}/{total}.")
        self.correct[predictor][task, after_task] = correct
        self.total[predictor][task, after_task] = total
        self.accuracy[predictor][task, after_task] = correct / total
        own = task_correct is not None
        self.task_correct[predictor][task, after_task] = task_correct if own else 0
        self.task_accuracy[predictor][task, after_task] = task_correct / total if own else np.nan

    def record_entropy(self, after_task: int, value: float) -> None:
        """Stores the mean predictive entropy of the evaluation after task `after_task` (NaN
        with an `entropy_note`: the entropy of scores is no property of the model)."""
        self._check_after_task(after_task)
        self.entropy[after_task] = math.nan if self.entropy_note else float(value)

    def record_calibration(self, after_task: int, predictor: str, values: Mapping[str, float]):
        """Stores `predictor`'s calibration `{"ece", "nll", "entropy"}` after `after_task`
        (nothing for a predictor with a note: its figures stay NaN)."""
        self._check_after_task(after_task)
        if predictor in self.notes:
            return
        for k in CALIBRATION:
            self.calibration[predictor][k][after_task] = float(values[k])

    def logged_entropy(self) -> list[float | None]:
        """The logged entropy per evaluation, JSON-ready (None where not recorded, and
        everywhere with an `entropy_note`)."""
        if self.entropy_note:
            return [None] * self.num_tasks
        return [_finite_or_none(v) for v in self.entropy]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; NaN and unevaluated counts become None."""

        def counts(p: str, m: np.ndarray, seen: np.ndarray | None = None) -> list[list[int | None]]:
            seen = self.total[p] > 0 if seen is None else seen
            return [
                [int(v) if s else None for v, s in zip(r, sr, strict=True)]
                for r, sr in zip(m, seen, strict=True)
            ]

        return {
            "num_tasks": self.num_tasks,
            "predictors": list(self.predictors),
            "accuracy": {p: _to_json_matrix(self.accuracy[p]) for p in self.predictors},
            "correct": {p: counts(p, self.correct[p]) for p in self.predictors},
            "total": {p: counts(p, self.total[p]) for p in self.predictors},
            "task_correct": {
                p: counts(p, self.task_correct[p], np.isfinite(self.task_accuracy[p]))
                for p in self.predictors
            },
            "entropy": [_finite_or_none(v) for v in self.entropy],
            "calibration": {
                p: {k: [_finite_or_none(v) for v in c[k]] for k in CALIBRATION}
                for p, c in self.calibration.items()
            },
            "notes": dict(self.notes),
            "entropy_note": self.entropy_note,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AccuracyTracker:
        """Inverse of `to_dict`; accuracies are re-derived from the counts. A dict without
        `task_correct` leaves the task-incremental matrices unrecorded; one without `notes`
        (an older run's) has none."""
        tracker = cls(d["num_tasks"], d["predictors"], d.get("notes"), d.get("entropy_note"))
        shape = (tracker.num_tasks, tracker.num_tasks)
        for p in tracker.predictors:
            own = (d.get("task_correct") or {}).get(p) or [[None] * shape[1]] * shape[0]
            rows = zip(d["correct"][p], d["total"][p], own, strict=True)
            for i, (row_c, row_n, row_o) in enumerate(rows):
                for j, (c, n, o) in enumerate(zip(row_c, row_n, row_o, strict=True)):
                    if n is not None:
                        tracker.record(j, p, i, int(c), int(n), None if o is None else int(o))
        tracker.entropy = np.array(
            [np.nan if v is None else v for v in d["entropy"]], dtype=np.float64
        )
        for p, c in (d.get("calibration") or {}).items():
            if p in tracker.notes:
                continue
            for k in CALIBRATION:
                tracker.calibration[p][k] = as_float_array(c[k])
        if tracker.entropy_note:
            tracker.entropy[:] = np.nan
        return tracker


# ---------------------------------------------------------------- pure functions on a matrix


def incremental_accuracy(a: np.ndarray, t: int) -> float:
    """`A_t = mean_{i<=t} a[i, t]`; NaN if any of those entries is not evaluated."""
    a = np.asarray(a, dtype=np.float64)
    if not 0 <= t < a.shape[1]:
        raise ValueError(f"t must be in [0, {a.shape[1]}); got {t}.")
    return float(np.mean(a[: t + 1, t]))


def incremental_accuracies(a: np.ndarray) -> np.ndarray:
    """`(A_0, ..., A_{T-1})`, shape (T,)."""
    a = np.asarray(a, dtype=np.float64)
    return np.array([incremental_accuracy(a, t) for t in range(a.shape[1])])


def average_incremental_accuracy(a: np.ndarray) -> float:
    """`mean_t A_t` over all T tasks (the paper's A-tilde)."""
    return float(np.mean(incremental_accuracies(a)))


def forgetting(a: np.ndarray) -> np.ndarray:
    """`f_i = max_{i<=j<T-1} a[i, j] - a[i, T-1]` for i < T-1, shape (T-1,); empty for T = 1.

    Entries with `j < i` (task i not yet seen) are ignored.
    """
    a = np.asarray(a, dtype=np.float64)
    last = a.shape[1] - 1
    return np.array([np.max(a[i, i:last]) - a[i, last] for i in range(last)], dtype=np.float64)


def mean_forgetting(a: np.ndarray) -> float:
    """Mean of `forgetting(a)`; NaN for T = 1 (nothing can be forgotten)."""
    f = forgetting(a)
    return float(np.mean(f)) if f.size else math.nan


def stepwise_forgetting(a: np.ndarray) -> np.ndarray:
    """`d_j = mean_{i<j} (a[i, j-1] - a[i, j])` for 1 <= j < T, shape (T-1,); empty for T = 1:
    how much learning task j lowered the accuracy of the tasks before it, on average."""
    a = np.asarray(a, dtype=np.float64)
    return np.array(
        [np.mean(a[:j, j - 1] - a[:j, j]) for j in range(1, a.shape[1])], dtype=np.float64
    )


def mean_stepwise_forgetting(a: np.ndarray) -> float:
    """`mean_j stepwise_forgetting(a)_j` (CODA-Prompt's forgetting); NaN for T = 1."""
    d = stepwise_forgetting(a)
    return float(np.mean(d)) if d.size else math.nan


def backward_transfer(a: np.ndarray) -> float:
    """`BWT = mean_{i<T-1} (a[i, T-1] - a[i, i])` (Lopez-Paz & Ranzato 2017); NaN for T = 1."""
    a = np.asarray(a, dtype=np.float64)
    last = a.shape[1] - 1
    if last == 0:
        return math.nan
    return float(np.mean([a[i, last] - a[i, i] for i in range(last)]))


def old_new_accuracy(correct: np.ndarray, total: np.ndarray) -> np.ndarray:
    """`(old_t, new_t)` per task t, shape (T, 2): `old_t = sum_{i<t} correct[i, t] / sum_{i<t}
    total[i, t]` (the old classes' test samples pooled), `new_t = correct[t, t] / total[t, t]`;
    NaN where no sample counts (always `old_0`, and tasks not evaluated)."""
    correct = np.asarray(correct, dtype=np.float64)
    total = np.asarray(total, dtype=np.float64)
    out = np.full((total.shape[1], 2), np.nan)
    for t in range(total.shape[1]):
        n_old = np.sum(total[:t, t])
        if n_old > 0:
            out[t, 0] = np.sum(correct[:t, t]) / n_old
        if total[t, t] > 0:
            out[t, 1] = correct[t, t] / total[t, t]
    return out


def pooled_accuracy(correct: np.ndarray, total: np.ndarray, t: int) -> float:
    """`sum_{i<=t} correct[i, t] / sum_{i<=t} total[i, t]`; NaN if no sample was evaluated."""
    correct, total = np.asarray(correct), np.asarray(total)
    if not 0 <= t < total.shape[1]:
        raise ValueError(f"t must be in [0, {total.shape[1]}); got {t}.")
    n = int(np.sum(total[: t + 1, t]))
    return int(np.sum(correct[: t + 1, t])) / n if n > 0 else math.nan


def pooled_accuracies(correct: np.ndarray, total: np.ndarray) -> np.ndarray:
    """`(acc_pooled_0, ..., acc_pooled_{T-1})`, shape (T,)."""
    return np.array([pooled_accuracy(correct, total, t) for t in range(np.shape(total)[1])])


def num_evaluated(a: np.ndarray) -> int:
    """Number of leading tasks `t` whose column `a[:t+1, t]` is fully evaluated."""
    a = np.asarray(a, dtype=np.float64)
    n = 0
    while n < a.shape[1] and np.all(np.isfinite(a[: n + 1, n])):
        n += 1
    return n


def summary(tracker: AccuracyTracker, predictor: str) -> dict[str, Any]:
    """JSON-ready metrics of one predictor, in PERCENT (0-100); None where undefined.

    Scalars are computed over the `n = tasks_evaluated` leading tasks evaluated so far, i.e. on
    `a[:n, :n]`; for a finished run n = T and they are the paper's metrics. Keys:
    `accuracy_matrix` (T x T, None for i > j or not evaluated), `A_t` and `acc_pooled` (length
    T, None where not evaluated), `A_T` (= A at task n-1), `avg_inc_acc`, `forgetting` (mean
    `f_i`, None for n <= 1), `forgetting_per_task` (length n-1), `forgetting_stepwise`
    (CODA-Prompt's, None for n <= 1), `bwt` (None for n <= 1), `acc_pooled_T`,
    `old_new_accuracy` (length T, `[old_t, new_t]` per task, None where undefined),
    `task_incremental_matrix`, `task_incremental_A_t`, `task_incremental_A_T` and
    `task_incremental_avg_inc_acc` (the same on `a_TI`, None where not recorded),
    `tasks_evaluated`; `ece` (%), `nll`, `test_entropy` (nats) after each task (length T,
    None where not recorded) and their values after task n-1, `ece_T`, `nll_T`,
    `test_entropy_T`: all None for a predictor with a note in `tracker.notes`, whose
    `calibration_note` ("scores, not probabilities: <why>") is then a key too.
    """
    a = tracker.accuracy[predictor]
    n = num_evaluated(a)
    a_t = incremental_accuracies(a)
    correct, total = tracker.correct[predictor], tracker.total[predictor]
    pooled = pooled_accuracies(correct, total)
    sub = a[:n, :n]
    a_ti = tracker.task_accuracy[predictor]
    a_ti_t = incremental_accuracies(a_ti)

    def pct(f: Callable[[], float]) -> float | None:
        return _finite_or_none(f(), 100.0) if n else None  # nothing evaluated: undefined

    old_new = old_new_accuracy(correct, total)
    return {
        "accuracy_matrix": _to_json_matrix(a, 100.0),
        "A_t": [_finite_or_none(v, 100.0) for v in a_t],
        "A_T": pct(lambda: a_t[n - 1]),
        "avg_inc_acc": pct(lambda: np.mean(a_t[:n])),
        "forgetting": pct(lambda: mean_forgetting(sub)),
        "forgetting_per_task": [_finite_or_none(v, 100.0) for v in forgetting(sub)] if n else [],
        "acc_pooled": [_finite_or_none(v, 100.0) for v in pooled],
        "acc_pooled_T": pct(lambda: pooled[n - 1]),
        "tasks_evaluated": n,
        "forgetting_stepwise": pct(lambda: mean_stepwise_forgetting(sub)),
        "bwt": pct(lambda: backward_transfer(sub)),
        "old_new_accuracy": [[_finite_or_none(v, 100.0) for v in pair] for pair in old_new],
        "task_incremental_matrix": _to_json_matrix(a_ti, 100.0),
        "task_incremental_A_t": [_finite_or_none(v, 100.0) for v in a_ti_t],
        "task_incremental_A_T": pct(lambda: a_ti_t[n - 1]),
        "task_incremental_avg_inc_acc": pct(lambda: np.mean(a_ti_t[:n])),
        **_calibration_summary(tracker.calibration[predictor], n, tracker.notes.get(predictor)),
    }


def _calibration_summary(
    cal: Mapping[str, np.ndarray], n: int, note: str | None = None
) -> dict[str, Any]:
    """The summary's calibration keys: per task and after task n-1 (ECE in percent); with a
    `note` (scores, not probabilities) None everywhere and `calibration_note`."""
    if note:
        out: dict[str, Any] = {k: None for k in CALIBRATION_KEYS}
        out.update({k: [None] * len(cal["ece"]) for k in ("ece", "nll", "test_entropy")})
        return {**out, "calibration_note": note}
    out = {}
    for key, name, scale in (
        ("ece", "ece", 100.0),
        ("nll", "nll", 1.0),
        ("entropy", "test_entropy", 1.0),
    ):
        values = cal[key]
        out[name] = [_finite_or_none(v, scale) for v in values]
        out[f"{name}_T"] = _finite_or_none(values[n - 1], scale) if n else None
    return out


def note_of(results: Mapping[str, Any], key: str) -> str | None:
    """Why `key` of a results.json dict (or one predictor's `summary`) holds no number because
    its predictor outputs scores, not probabilities (None: no such reason). `H_T` is the logged
    entropy after the last task (`experiments/layout.metric`)."""
    if key in CALIBRATION_KEYS:
        return results.get("calibration_note")
    if key in ("entropy", "H_T"):
        return results.get("entropy_note")
    return None


def as_float_array(x: Any) -> np.ndarray:
    """Nested lists with None (JSON) or an array, as float64 with NaN."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if x and isinstance(x[0], list | tuple):
        return np.array([[np.nan if v is None else v for v in row] for row in x], np.float64)
    return np.array([np.nan if v is None else v for v in x], np.float64)


# ---------------------------------------------------------------- calibration

BINS = 15
FLOOR = float(np.finfo(np.float32).tiny)


def bin_index(confidence: np.ndarray, bins: int = BINS) -> np.ndarray:
    """The bin `m - 1` (0-based) of each confidence: `ceil(c M) - 1`, bin 0 holding [0, 1/M]."""
    c = np.asarray(confidence, np.float64)
    return np.clip(np.ceil(c * bins).astype(np.int64) - 1, 0, bins - 1)


def reliability(
    confidence: np.ndarray, correct: np.ndarray, bins: int = BINS
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per bin `(accuracy, mean confidence, count)`, each (bins,); NaN for an empty bin."""
    c = np.asarray(confidence, np.float64)
    z = np.asarray(correct, np.float64)
    if c.shape != z.shape or c.ndim != 1:
        raise ValueError(
            f"confidence and correct must be equal 1-d shapes; got {c.shape}, {z.shape}."
        )
    m = bin_index(c, bins)
    count = np.bincount(m, minlength=bins).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = np.bincount(m, weights=z, minlength=bins) / count
        conf = np.bincount(m, weights=c, minlength=bins) / count
    return acc, conf, count.astype(np.int64)


def ece(confidence: np.ndarray, correct: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error (fraction in [0, 1]); NaN with no example."""
    acc, conf, count = reliability(confidence, correct, bins)
    n = count.sum()
    if n == 0:
        return float("nan")
    seen = count > 0
    return float(np.sum(count[seen] / n * np.abs(acc[seen] - conf[seen])))


def nll(p_true: np.ndarray) -> float:
    """`-mean log max(p(y), FLOOR)` in nats; NaN with no example."""
    p = np.asarray(p_true, np.float64)
    if p.size == 0:
        return float("nan")
    return float(-np.mean(np.log(np.maximum(p, FLOOR))))


def calibration(
    confidence: np.ndarray, correct: np.ndarray, p_true: np.ndarray, entropy: np.ndarray
) -> dict[str, float]:
    """`{"ece", "nll", "entropy"}` of one evaluation's examples (ECE as a fraction)."""
    h = np.asarray(entropy, np.float64)
    return {
        "ece": ece(confidence, correct),
        "nll": nll(p_true),
        "entropy": float(h.mean()) if h.size else float("nan"),
    }
