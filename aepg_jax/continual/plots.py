"""The plots of a continual run: the accuracy matrix, training curves (entropy, and alpha when
the loss uses one, over the global step), incremental accuracy per predictor and the
reliability diagram of the kept predictions. Tasks are
numbered t = 1..T on the axes (the files' 0-based index + 1)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from aepg_jax import metrics
from aepg_jax.metrics import as_float_array
from aepg_jax.runs import predictions
from aepg_jax.runs.records import is_number, run_name


def plot_accuracy_matrix(
    a: Any, path: str | os.PathLike, title: str = "Accuracy (%) on task i after task j"
) -> None:
    """Heatmap of an accuracy matrix given in FRACTIONS (as `AccuracyTracker.accuracy`),
    annotated in %; NaN / None cells blank."""
    pct = 100.0 * as_float_array(a)
    num = pct.shape[0]
    size = max(3.5, 0.6 * num + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(np.ma.masked_invalid(pct), cmap="viridis", vmin=0.0, vmax=100.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="accuracy (%)")
    fontsize = 9 if num <= 10 else 6
    for i, j in zip(*np.nonzero(np.isfinite(pct)), strict=True):
        v = pct[i, j]
        color = "black" if v > 60.0 else "white"
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=fontsize, color=color)
    ax.set(xlabel="after task j", ylabel="task i", title=title)
    ax.set_xticks(range(num), [str(j + 1) for j in range(num)])
    ax.set_yticks(range(num), [str(i + 1) for i in range(num)])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _task_boundaries(
    train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]] = ()
) -> list[float]:
    """Global steps where a task ends and the next begins: the last step of each task but the
    last (its eval record's step, else its last logged train step, which the driver always
    logs)."""
    ends = {r["task"]: float(r["step"]) for r in evals if r.get("task") is not None}
    out = []
    for prev, cur in itertools.pairwise(train):
        task = prev.get("task")
        if task is not None and cur.get("task") != task:
            out.append(ends.get(task, float(prev["step"])))
    return out


def _series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [
        (r["step"], r[key]) for r in records if r.get("step") is not None and is_number(r.get(key))
    ]
    return np.array([p[0] for p in pts], np.float64), np.array([p[1] for p in pts], np.float64)


def plot_training_curves(
    records: Sequence[Mapping[str, Any]], path: str | os.PathLike, title: str = "Training curves"
) -> None:
    """Output entropy over the global step, and below it alpha when the records carry one (a
    loss without alpha logs none, and gets no alpha panel); task boundaries dashed (in the
    legend). Train records give the curves, eval records' `entropy` the test markers; records
    missing a key are skipped."""
    train = [r for r in records if r.get("type") == "train" and r.get("step") is not None]
    evals = [r for r in records if r.get("type") == "eval"]
    alpha_steps, alpha_values = _series(train, "alpha")
    if alpha_steps.size:
        fig, (ax_h, ax_a) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
        ax_a.plot(alpha_steps, alpha_values, lw=1.0, color="tab:green")
        ax_a.set(xlabel="global step", ylabel="alpha (weight of CE)")
        axes = (ax_h, ax_a)
    else:
        fig, ax_h = plt.subplots(figsize=(8, 3.4))
        ax_h.set(xlabel="global step")
        axes = (ax_h,)
    steps, values = _series(train, "entropy")
    if steps.size:
        ax_h.plot(steps, values, lw=1.0, label="train batch")
    steps, values = _series(evals, "entropy")
    if steps.size:
        ax_h.plot(steps, values, "o", ms=4, label="test (after task)")
    for ax in axes:
        for n, boundary in enumerate(_task_boundaries(train, evals)):
            label = "task boundary" if n == 0 and ax is ax_h else None
            ax.axvline(boundary, color="gray", ls="--", lw=0.8, label=label)
    if ax_h.has_data():
        ax_h.legend(fontsize=8)
    else:
        ax_h.text(0.5, 0.5, "no entropy logged", ha="center", va="center", transform=ax_h.transAxes)
    ax_h.set(ylabel="output entropy H(p)", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_incremental_accuracy(
    A_t_by_predictor: Mapping[str, Sequence[float | None]],
    path: str | os.PathLike,
    title: str = "Incremental accuracy A_t",
) -> None:
    """A_t (PERCENT, None where not evaluated) over tasks, one line per predictor."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in A_t_by_predictor.items():
        y = as_float_array(list(values))
        ax.plot(np.arange(1, y.size + 1), y, "o-", label=name)
    ax.set(xlabel="after task t", ylabel="A_t (%)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if A_t_by_predictor:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_reliability(
    kept: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | os.PathLike,
    title: str = "Reliability after the last task",
) -> None:
    """Reliability diagram: per predictor `(confidence, correct)` of its test predictions, the
    accuracy of each of the 15 equal-width confidence bins (`aepg_jax/metrics.py`) against the
    bin's mean confidence, the diagonal being perfect calibration; the legend gives the ECE."""
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
    for name, (conf, correct) in kept.items():
        acc, mean_conf, count = metrics.reliability(conf, correct)
        seen = count > 0
        ece = 100.0 * metrics.ece(conf, correct)
        ax.plot(mean_conf[seen], acc[seen], "o-", label=f"{name} (ECE {ece:.1f}%)")
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1), title=title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(
    workdir: str | os.PathLike,
    results: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
) -> list[Path]:
    """Writes accuracy_matrix.png (primary predictor), training_curves.png,
    incremental_accuracy.png (every predictor) and, when the run kept its predictions,
    reliability.png (every predictor with calibration, after the last task evaluated; none
    when every predictor outputs scores, not probabilities) into `workdir`; returns their
    paths."""
    workdir = Path(workdir)
    paths = [
        workdir / n
        for n in ("accuracy_matrix.png", "training_curves.png", "incremental_accuracy.png")
    ]
    primary = results["predictors"][0]
    a = as_float_array(results["accuracy_matrix"]) / 100.0
    plot_accuracy_matrix(a, paths[0], title=f"Accuracy (%) on task i after task j ({primary})")
    plot_training_curves(records, paths[1], title=f"Training curves ({run_name(results)})")
    methods = results.get("methods") or {primary: results}
    plot_incremental_accuracy({p: m["A_t"] for p, m in methods.items()}, paths[2])
    kept_file = workdir / predictions.FILE
    if kept_file.exists():
        arrays = predictions.load(kept_file)
        last = arrays["after_task"] == arrays["after_task"].max()
        label = arrays["label"][last]
        kept = {}
        for p in results["predictors"]:
            if methods.get(p, {}).get("calibration_note"):
                continue  # scores, not probabilities: no reliability
            c = predictions.predictor_columns(arrays, p)
            kept[p] = (c["top_probs"][last, 0], c["top_classes"][last, 0] == label)
        if kept:
            paths.append(workdir / "reliability.png")
            plot_reliability(kept, paths[-1])
    return paths
