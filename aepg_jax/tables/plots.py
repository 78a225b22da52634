"""The figures of an experiment (`experiments.Plot`) from a sweep's results: a metric's mean ±
std over seeds against an argument (Fig. 3a: A_T against the fixed alpha), or per-task /
per-epoch curves (Fig. 2: A_t and the entropy after each task), one line per series value."""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from aepg_jax.experiments import Experiment, Plot, Run, layout

CURVE_AXES = ("task", "epoch")


def _key(value: str) -> tuple:
    """Sort numbers numerically, then text in order."""
    try:
        return (0, float(value), "")
    except ValueError:
        return (1, 0.0, value)


def _groups(runs: Sequence[Run], key: str | None) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = {}
    for run in runs:
        out.setdefault("" if key is None else str(run.value(key)), []).append(run)
    return dict(sorted(out.items(), key=lambda kv: _key(kv[0])))


def _curve(results: dict, metric: str) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in results.get(metric) or []], float)


def _draw_curves(ax, results_of: Callable, runs: Sequence[Run], plot: Plot) -> bool:
    drawn = False
    for label, members in _groups(runs, plot.series).items():
        curves = [_curve(r, plot.metric) for r in filter(None, (results_of(m) for m in members))]
        curves = [c for c in curves if c.size]
        if not curves:
            continue
        length = min(c.size for c in curves)
        stack = np.stack([c[:length] for c in curves])
        mean, std = np.nanmean(stack, 0), np.nanstd(stack, 0)
        x = np.arange(1, length + 1)
        ax.plot(x, mean, marker="o" if length < 30 else None, label=f"{label} (n={len(curves)})")
        ax.fill_between(x, mean - std, mean + std, alpha=0.2)
        drawn = True
    ax.set_xlabel(plot.x)
    return drawn


def _draw_points(ax, results_of: Callable, runs: Sequence[Run], plot: Plot) -> bool:
    drawn = False
    for label, members in _groups(runs, plot.series).items():
        xs, means, stds = [], [], []
        for x, at_x in _groups(members, plot.x).items():
            values = [
                layout.metric(res, plot.metric)
                for res in filter(None, (results_of(r) for r in at_x))
            ]
            values = [v for v in values if v is not None and math.isfinite(v)]
            if values:
                xs.append(x)
                means.append(np.mean(values))
                stds.append(np.std(values, ddof=1) if len(values) > 1 else 0.0)
        if not xs:
            continue
        numeric = all(_key(x)[0] == 0 for x in xs)
        pos = [float(x) for x in xs] if numeric else list(range(len(xs)))
        ax.errorbar(pos, means, yerr=stds, marker="o", capsize=3, label=label or None)
        if not numeric:
            ax.set_xticks(pos, xs)
        drawn = True
    ax.set_xlabel(plot.x)
    return drawn


def write_plot(
    root: str, experiment: Experiment, plot: Plot, path: str, results_of: Callable | None = None
) -> bool:
    """Draws `plot` to `path` from each run's results (`results_of(run)`, None for a run left
    out; default: its results.json under `root`); False (nothing written) while none of its
    runs is finished."""
    results_of = results_of or (lambda run: layout.run_results(root, run))
    runs = experiment.select(plot.where)
    panels = _groups(runs, plot.panel)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8), squeeze=False)
    drawn = False
    for ax, (name, members) in zip(axes[0], panels.items(), strict=True):
        draw = _draw_curves if plot.x in CURVE_AXES else _draw_points
        if draw(ax, results_of, members, plot):
            drawn = True
            ax.set(ylabel=plot.ylabel or plot.metric, title=name or plot.title)
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(title=plot.series, fontsize=8)
    if drawn:
        if plot.panel:
            fig.suptitle(plot.title)
        fig.tight_layout()
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return drawn


def write_plots(root: str, experiment: Experiment, results_of: Callable | None = None) -> list[str]:
    """Every plot of `experiment` with finished runs, as `<root>/plots/<file>` (`write_plot`)."""
    directory = pathlib.Path(root) / "plots"
    written = []
    for part, _, plots in experiment.sections():
        for plot in plots:
            path = os.fspath(directory / plot.file)
            if write_plot(root, part, plot, path, results_of):
                written.append(path)
    return written
