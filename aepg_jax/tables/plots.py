"""The figures of an experiment (`experiments.Plot`) from a sweep's results: what each draws,
gathered here and drawn by `continual/plots.py` (the one module that draws). A metric's mean ±
sample std over seeds (as the tables print) against an argument (Fig. 3a: A_T against the fixed
alpha), or per-task / per-epoch curves (Fig. 2: A_t and the entropy after each task), one line
per series value, coloured by its loss where the series is the loss."""

from __future__ import annotations

import math
import os
import pathlib
from collections.abc import Callable, Sequence

from aepg_jax.continual import plots
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


def _color(plot: Plot, label: str) -> str | None:
    return plots.loss_color(label) if plot.series == "loss" else None


def _curves(results_of: Callable, runs: Sequence[Run], plot: Plot) -> list[plots.Band]:
    out = []
    for label, members in _groups(runs, plot.series).items():
        curves = [plots.values_of(r, plot.metric) for r in filter(None, map(results_of, members))]
        curves = [c for c in curves if c.size]
        if curves:
            mean, std = plots.mean_std(curves)
            x = range(1, mean.size + 1)
            name = f"{label} (n={len(curves)})"
            out.append(
                plots.Band(name, x, mean, std, _color(plot, label), f"{plot.metric}: {name}")
            )
    return out


def _points(results_of: Callable, runs: Sequence[Run], plot: Plot) -> tuple[list, list[str]]:
    bands, names = [], sorted({str(r.value(plot.x)) for r in runs}, key=_key)
    numeric = all(_key(x)[0] == 0 for x in names)
    for label, members in _groups(runs, plot.series).items():
        xs, means, stds = [], [], []
        for x, at_x in _groups(members, plot.x).items():
            values = [
                layout.metric(res, plot.metric) for res in filter(None, map(results_of, at_x))
            ]
            values = [v for v in values if v is not None and math.isfinite(v)]
            if values:
                mean, std = plots.mean_std([[v] for v in values])
                xs.append(float(x) if numeric else names.index(x))
                means.append(mean[0])
                stds.append(std[0])
        if xs:
            bands.append(plots.Band(label, xs, means, stds, _color(plot, label)))
    return bands, names


def figure(root: str, experiment: Experiment, plot: Plot, results_of: Callable | None = None):
    """The figure of `plot` from each run's results (`results_of(run)`, None for a run left out;
    default: its results.json under `root`), None while none of its runs is finished."""
    results_of = results_of or (lambda run: layout.run_results(root, run))
    panels, ticks = {}, None
    for name, members in _groups(experiment.select(plot.where), plot.panel).items():
        if plot.x in CURVE_AXES:
            bands = _curves(results_of, members, plot)
        else:
            bands, names = _points(results_of, members, plot)
            ticks = None if all(_key(x)[0] == 0 for x in names) else names
        if bands:
            panels[name or plot.title] = bands
    if not panels:
        return None
    return plots.plot_bands(
        panels, xlabel=plot.x, ylabel=plot.ylabel or plot.metric,
        title=plot.title if plot.panel else "", curves=plot.x in CURVE_AXES, xticks=ticks,
        legend_title=plot.series,
    )  # fmt: skip


def write_plot(
    root: str, experiment: Experiment, plot: Plot, path: str, results_of: Callable | None = None
) -> bool:
    """Draws `plot` to `path` (PNG, `figure`); False (nothing written) while none of its runs is
    finished."""
    fig = figure(root, experiment, plot, results_of)
    if fig is not None:
        plots.save_png(fig, path)
    return fig is not None


def write_plots(root: str, experiment: Experiment, results_of: Callable | None = None) -> list[str]:
    """Every plot of `experiment` with finished runs, as `<root>/plots/<file>` (`write_plot`)."""
    directory = pathlib.Path(root) / "plots"
    written = []
    for part, _, plots_of in experiment.sections():
        for plot in plots_of:
            path = os.fspath(directory / plot.file)
            if write_plot(root, part, plot, path, results_of):
                written.append(path)
    return written
