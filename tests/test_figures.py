"""A paper figure and the table drawn from the same runs agree: the band of a curve at a task is
the table's mean ± (the sample std over seeds), and a point plot's error bar the same."""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.collections import PolyCollection

from aepg_jax.experiments import Column, Experiment, Grid, Plot, Row, Table
from aepg_jax.tables import plots, tables

EXPERIMENT = Experiment(
    "fake_figure",
    "Fake figure",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0/1/2")],
    [
        Table(
            "Fake",
            [Row("CE", {"loss": "ce"}), Row("aEPG", {"loss": "aepg"})],
            [Column("A_3", {}, "A_T")],
        )
    ],
    [
        Plot("curves.png", "A_t", x="task", series="loss"),
        Plot("points.png", "A_T", x="loss"),
    ],
)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("figure")
    rng = np.random.default_rng(0)
    for run in EXPERIMENT.runs():
        a_t = list(90 - 10 * np.arange(3) + rng.normal(0, 3, 3))
        (root / run.name).mkdir(parents=True)
        (root / run.name / "results.json").write_text(json.dumps({"A_t": a_t, "A_T": a_t[-1]}))
    return root


def _cell(root, loss: str) -> tables.Cell:
    table = EXPERIMENT.tables[0]
    row = next(r for r in table.rows if r.where["loss"] == loss)
    return tables.cell(str(root), EXPERIMENT, table, row, table.columns[0])


def test_a_curve_band_at_the_last_task_is_the_tables_mean_and_std(root):
    fig = plots.figure(str(root), EXPERIMENT, EXPERIMENT.plots[0])
    (ax,) = fig.axes
    bands = [c for c in ax.collections if isinstance(c, PolyCollection)]
    lines = {line.get_label().split(" ")[0]: line for line in ax.lines}
    assert sorted(lines) == ["aepg", "ce"] and len(bands) == 2
    for band, (loss, line) in zip(bands, lines.items(), strict=True):
        cell = _cell(root, loss)
        vertices = band.get_paths()[0].vertices
        at_last = vertices[np.isclose(vertices[:, 0], 3.0), 1]
        assert line.get_ydata()[-1] == pytest.approx(cell.mean)
        assert at_last.min() == pytest.approx(cell.mean - cell.std)
        assert at_last.max() == pytest.approx(cell.mean + cell.std)
        assert f"± {cell.std:.1f}" in tables.ours_text(cell)


def test_a_point_plots_error_bar_is_the_tables_std(root):
    fig = plots.figure(str(root), EXPERIMENT, EXPERIMENT.plots[1])
    (ax,) = fig.axes
    (bars,) = [c for c in ax.collections if c.get_segments()]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    for k, segment in enumerate(bars.get_segments()):
        cell = _cell(root, labels[k])
        assert segment[:, 1].min() == pytest.approx(cell.mean - cell.std)
        assert segment[:, 1].max() == pytest.approx(cell.mean + cell.std)
