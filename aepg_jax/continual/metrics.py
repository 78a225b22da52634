"""Class-incremental accuracy metrics (docs/algorithm.md §4), pure NumPy.

Notation (0-based): `T` tasks; accuracy matrix `a[i, j]` = accuracy on the test set of task `i`
after learning task `j`, defined for `i <= j` (NaN above the diagonal's complement, `i > j`).

    * `A_t = mean_{i<=t} a[i, t]`               incremental accuracy (mean over seen tasks)
    * `avg_inc_acc = mean_t A_t`                the paper's A-tilde
    * `f_i = max_{j<T-1} a[i, j] - a[i, T-1]`   forgetting of task `i < T-1`
    * `acc_pooled_t = sum_{i<=t} correct[i, t] / sum_{i<=t} total[i, t]`
                                                LAE's "Acc": all seen test samples pooled, which
                                                differs from `A_t` when tasks differ in size

Accuracies are fractions in [0, 1] everywhere in this module except in `summary`, which reports
percent (0-100) and JSON-ready `None` for values that are undefined or not yet evaluated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _finite_or_none(x: float, scale: float = 1.0) -> float | None:
    """`x * scale` as a Python float, or None for NaN / inf."""
    x = float(x)
    return x * scale if math.isfinite(x) else None


def _to_json_matrix(m: np.ndarray, scale: float = 1.0) -> list[list[float | None]]:
    return [[_finite_or_none(v, scale) for v in row] for row in m]


class AccuracyTracker:
    """Accuracy matrices of one or more predictors, plus counts and per-evaluation entropies.

    For each predictor name: `accuracy[p]` (T, T) float64 in [0, 1], NaN where not evaluated;
    `correct[p]`, `total[p]` (T, T) int64, 0 where not evaluated. `entropy` (T,) float64: the
    mean predictive entropy after task j over all seen test samples (softmax over all seen
    classes), NaN where not recorded.
    """

    def __init__(self, num_tasks: int, predictors: Sequence[str]):
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
        self.entropy = np.full((num_tasks,), np.nan)

    def matrix(self, predictor: str) -> np.ndarray:
        """The (T, T) accuracy matrix of `predictor` (fractions, NaN where not evaluated)."""
        if predictor not in self.accuracy:
            raise KeyError(f"Unknown predictor {predictor!r}; expected one of {self.predictors}.")
        return self.accuracy[predictor]

    def _check_after_task(self, after_task: int) -> None:
        if not 0 <= after_task < self.num_tasks:
            raise ValueError(f"after_task must be in [0, {self.num_tasks}); got {after_task}.")

    def record(self, after_task: int, predictor: str, task: int, correct: int, total: int) -> None:
        """Stores `a[task, after_task] = correct / total` for `predictor` (overwrites)."""
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
        self.correct[predictor][task, after_task] = correct
        self.total[predictor][task, after_task] = total
        self.accuracy[predictor][task, after_task] = correct / total

    def record_entropy(self, after_task: int, value: float) -> None:
        """Stores the mean predictive entropy of the evaluation after task `after_task`."""
        self._check_after_task(after_task)
        self.entropy[after_task] = float(value)

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable state; NaN and unevaluated counts become None."""

        def counts(p: str, m: np.ndarray) -> list[list[int | None]]:
            seen = self.total[p] > 0
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
            "entropy": [_finite_or_none(v) for v in self.entropy],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AccuracyTracker:
        """Inverse of `to_dict`; accuracies are re-derived from the counts."""
        tracker = cls(d["num_tasks"], d["predictors"])
        for p in tracker.predictors:
            for i, (row_c, row_n) in enumerate(zip(d["correct"][p], d["total"][p], strict=True)):
                for j, (c, n) in enumerate(zip(row_c, row_n, strict=True)):
                    if n is not None:
                        tracker.record(j, p, i, int(c), int(n))
        tracker.entropy = np.array(
            [np.nan if v is None else v for v in d["entropy"]], dtype=np.float64
        )
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
    T, None where not evaluated), `A_T` (= A at task n-1), `avg_inc_acc`, `forgetting` (mean,
    None for n <= 1), `forgetting_per_task` (length n-1), `acc_pooled_T`, `tasks_evaluated`.
    """
    a = tracker.accuracy[predictor]
    n = num_evaluated(a)
    a_t = incremental_accuracies(a)
    pooled = pooled_accuracies(tracker.correct[predictor], tracker.total[predictor])
    sub = a[:n, :n]
    return {
        "accuracy_matrix": _to_json_matrix(a, 100.0),
        "A_t": [_finite_or_none(v, 100.0) for v in a_t],
        "A_T": _finite_or_none(a_t[n - 1], 100.0) if n else None,
        "avg_inc_acc": _finite_or_none(np.mean(a_t[:n]), 100.0) if n else None,
        "forgetting": _finite_or_none(mean_forgetting(sub), 100.0) if n else None,
        "forgetting_per_task": [_finite_or_none(v, 100.0) for v in forgetting(sub)] if n else [],
        "acc_pooled": [_finite_or_none(v, 100.0) for v in pooled],
        "acc_pooled_T": _finite_or_none(pooled[n - 1], 100.0) if n else None,
        "tasks_evaluated": n,
    }


def as_float_array(x: Any) -> np.ndarray:
    """Nested lists with None (JSON) or an array, as float64 with NaN."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if x and isinstance(x[0], list | tuple):
        return np.array([[np.nan if v is None else v for v in row] for row in x], np.float64)
    return np.array([np.nan if v is None else v for v in x], np.float64)
