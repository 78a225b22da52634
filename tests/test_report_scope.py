"""The report page shows only what the sweep has: a table without published numbers has no
paper columns and no paper legend, a row that selects no run takes no row of the table or the
charts (it is counted in one line), every predictor of the reliability diagram shows (the
first solid, the others dashed over it; a predictor of scores named as not drawn), and the two
entropies name their supports. The text tables fold those rows the same way."""

from __future__ import annotations

import html
import re

import numpy as np
import test_report
from test_report import TASKS, Collector, write_run

from aepg_jax.continual import plots
from aepg_jax.experiments import Column, Experiment, Grid, Row, Table
from aepg_jax.runs import predictions
from aepg_jax.tables import tables

UNPUBLISHED = Experiment(
    "fake_unpublished",
    "Fake, no published numbers",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0")],
    [
        Table(
            "Fake demo (digits; no published numbers)",
            columns=[Column("A_5", {}, "A_T")],
            rows=[
                Row("LoRA", {"loss": "ce"}),
                Row("LoRA + aEPG", {"loss": "aepg"}),
                Row("LoRA + EPG", {"loss": "epg"}),  # no run of the grid: never ran
            ],
        )
    ],
)


def _svgs(text: str, cls: str) -> list[str]:
    """The `<svg>` elements of class exactly `cls`."""
    return re.findall(rf'<svg class="chart {cls}".*?</svg>', text, re.S)


def test_a_table_without_published_numbers_shows_ours_alone(tmp_path):
    for run in UNPUBLISHED.runs():
        write_run(tmp_path / run.name, tables._configs(run, ())[0], run.seed, 0.6)
    text = tables.report_page(str(tmp_path), UNPUBLISHED, tables.View(), set())
    page = Collector()
    page.feed(text)
    assert "<th>paper</th>" not in text and "<th>Δ</th>" not in text
    assert "paper (± as printed)" not in text and "Δ = ours - paper" not in text
    assert f'<p class="legend">{html.escape(tables.OURS_LEGEND)}</p>' in text
    i = page.cells.index("LoRA")
    assert page.cells[i + 2] == "LoRA + aEPG"  # one cell per column: ours
    # The row that never ran takes no row of the table or the chart: one line counts it.
    assert "LoRA + EPG" not in page.cells
    assert "1 row (LoRA + EPG): no run selected, not shown." in text
    (chart,) = _svgs(text, "comparison")
    assert "LoRA + aEPG" in chart and "LoRA + EPG" not in chart and "paper" not in chart
    # The entropies are labelled with their supports.
    assert "train batch: task's classes" in text and "test: every seen class" in text
    # The text table the same way: ours alone, the row without runs in one line.
    markdown = tables.render(str(tmp_path), UNPUBLISHED, "markdown")
    assert "|  | A_5 ours |" in markdown and "paper" not in markdown
    assert "| LoRA + EPG |" not in markdown
    assert "1 row (LoRA + EPG): no run selected, not shown." in markdown
    latex = tables.render(str(tmp_path), UNPUBLISHED, "latex")
    assert r"\begin{tabular}{lr}" in latex and "paper" not in latex


def test_a_table_with_published_numbers_keeps_its_paper_columns(tmp_path):
    for run in test_report.EXPERIMENT.runs():
        write_run(tmp_path / run.name, tables._configs(run, ())[0], run.seed, 0.6)
    text = tables.report_page(str(tmp_path), test_report.EXPERIMENT, tables.View(), set())
    assert "<th>paper</th>" in text and "paper (± as printed)" in text
    assert "Δ = ours - paper" in text


def test_every_predictor_of_the_reliability_diagram_shows(tmp_path):
    """Two predictors with identical predictions: the second is dashed over the first, so both
    show; a predictor of scores is named in the legend as not drawn."""
    one = tmp_path / "one"
    write_run(one, {"loss": {"name": "ce"}}, 0, 0.7)
    arrays = predictions.load(one / predictions.FILE)
    two = tmp_path / "two"
    meta = {**test_report.META, "predictors": np.array(["online", "offline"])}
    for j in range(TASKS):
        rows = arrays["after_task"] == j
        kept = {}
        for k, v in arrays.items():
            if k.startswith("model/"):
                kept[k.replace("model/", "online/")] = v[rows]
                kept[k.replace("model/", "offline/")] = v[rows]
            elif not k.startswith("meta/"):
                kept[k] = v[rows]
        predictions.write(two, j, kept, meta)
    found = plots.kept_reliability(
        two, ["ensemble", "online", "offline"], {"ensemble": "scores: the max of two softmaxes"}
    )
    fig = plots.plot_run(None, [], found, ["ensemble"])
    chart = plots.svg_text(fig, "chart run")  # styles kept inline
    lines = re.findall(r'<path d="M [^"]*" clip-path="[^"]*" style="[^"]*"', chart)
    drawn = [line for line in lines if "#1f77b4" in line or "#ff7f0e" in line]
    assert len(drawn) == 2
    assert "stroke-dasharray" not in drawn[0] and "stroke-dasharray" in drawn[1]
    texts = re.findall(r">([^<>]+)</text>", chart)
    assert "online (ECE" in " ".join(texts) and "offline (ECE" in " ".join(texts)
    assert "ensemble: scores, not" in texts and "probabilities, not drawn" in texts


def test_a_column_that_selects_no_run_is_counted_not_shown(tmp_path):
    table = UNPUBLISHED.tables[0]
    narrow = Table(table.title, table.rows[:2], [*table.columns, Column("A_9", {"seed": 9}, "A_T")])
    experiment = Experiment(UNPUBLISHED.name, UNPUBLISHED.title, UNPUBLISHED.grids, [narrow])
    for run in experiment.runs():
        write_run(tmp_path / run.name, tables._configs(run, ())[0], run.seed, 0.6)
    text = tables.report_page(str(tmp_path), experiment, tables.View(), set())
    assert "<th>A_5</th>" in text and "<th>A_9</th>" not in text
    assert "1 column (A_9): no run selected, not shown." in text
