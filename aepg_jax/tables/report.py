"""A sweep's report as one self-contained HTML page (`python -m aepg_jax.tables DIR --html=FILE`).

The page opens offline: inline CSS, charts as inline SVG (`svg.py`), no script, nothing fetched.
This module draws; `tables.report_page` gathers what it draws (the tables' cells, the runs'
folders and results) for the runs the tables show (`tables.View`). The page holds:

    * every table of the experiment as `tables.py` computes it: ours (mean ± sample std over
      the finished seeds, `k/n done`), the paper's number, Δ = ours - paper and the (!) mark,
      and beside it a dot chart per column of ours (± std) against the paper (± as printed);
      ours alone (no paper columns, charts or legend) for a table with no published number,
      and only the rows with a result or a published number in the charts;
    * aEPG beside CE: wherever cells of a table differ only in their `loss`, one chart of their
      incremental accuracy A_t after each task, the mean over seeds with a ± std band;
    * aEPG against CE, paired by seed (`paired.py`): wherever rows differ only in their loss,
      the paired differences as a table and a forest plot per metric (zero marked);
    * per run (a collapsible `<details>`, grouped by cell, i.e. the runs that differ only in
      their seed): its accuracy matrix as a heatmap, its loss / alpha / entropy curves over the
      global step (metrics.jsonl; task boundaries dashed; the train entropy over the task's
      classes, the test entropy over every seen class), its reliability diagram after the
      last task (predictions.npz, 15 equal-width bins; the first predictor solid, the others
      dashed over it) with ECE, NLL and test entropy per predictor (results.json; "scores, not
      probabilities" and no line for a predictor whose outputs are not a probability model's,
      docs/algorithm.md §4, named as not drawn), and the config
      fields in which it differs from its cell's other runs (`runs/identity.differences`).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aepg_jax import metrics
from aepg_jax.experiments import Experiment, Run, Table
from aepg_jax.runs import identity, predictions, records
from aepg_jax.tables import paired, svg

MAX_POINTS = 400  # a curve longer than this is averaged over consecutive chunks
LOSS_KEY = "loss"

CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 12px 16px 40px; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; }
h3 { font-size: 1.05em; margin-top: 1.4em; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0; font-size: 0.88em; background: #fff; }
th, td { border: 1px solid #ccc; padding: 3px 6px; text-align: right; vertical-align: top; }
th:first-child, td:first-child { text-align: left; }
td.flag { background: #fde2e1; font-weight: bold; }
td.config-value { text-align: left; word-break: break-all; max-width: 30em; }
.legend, .meta, .note { font-size: 0.85em; color: #555; }
.warning { color: #9a3b00; font-size: 0.85em; }
.charts { display: flex; flex-wrap: wrap; gap: 10px; align-items: flex-start; }
.charts svg { flex: 1 1 360px; max-width: 520px; min-width: 260px; height: auto;
  background: #fff; border: 1px solid #e4e4e4; }
.charts svg.heatmap { flex: 0 1 300px; min-width: 180px; }
details.run { background: #fff; border: 1px solid #ddd; margin: 6px 0; padding: 4px 10px; }
details.run > summary { cursor: pointer; font-family: monospace; font-size: 0.9em;
  overflow-wrap: anywhere; }
code { overflow-wrap: anywhere; }
"""


@dataclasses.dataclass(frozen=True)
class RunInfo:
    """One run as the page shows it: its folder name (with the override suffix), the folder that
    holds its results.json (a vmapped program's `seed_<s>/`), its results (None while it has
    none), whether its cell counts it (False: of another config), and a status line."""

    run: Run
    name: str
    folder: pathlib.Path | None
    results: dict | None
    counted: bool
    status: str


@dataclasses.dataclass(frozen=True)
class CellText:
    """One cell of a table as `tables.py` prints it (ours, paper, Δ and its mark), with the
    numbers its chart draws (ours: mean ± sample std over seeds; the paper's mean ± as printed;
    None where absent)."""

    ours: str
    paper: str
    diff: str
    flagged: bool
    mean: float | None
    std: float | None
    paper_mean: float | None
    paper_pm: float | None


@dataclasses.dataclass(frozen=True)
class Block:
    """One table of the experiment (`part`: the experiment, or the section, it belongs to) with
    its cells, row by row."""

    part: Experiment
    table: Table
    cells: list[list[CellText]]
    paired: Sequence[paired.PairedRow] = ()  # its rows against their CE rows, seed by seed


# ---------------------------------------------------------------------------------- tables


def _joined(text: str) -> str:
    """`mean ± std` kept on one line (non-breaking spaces) where a narrow cell wraps."""
    return text.replace(" ± ", "\u00a0±\u00a0")


def published(cells: list[list[CellText]]) -> bool:
    """Whether any cell of a table has a published number (else it has no paper columns)."""
    return any(c.paper_mean is not None or c.paper.strip() for row in cells for c in row)


# The legend of a table without published numbers: ours only.
OURS_LEGEND = "ours: mean ± std over seeds (n runs; `k/n done` while runs are missing)."


def table_html(table: Table, cells: list[list[CellText]]) -> str:
    """`table` as an HTML table: per column ours, paper, Δ (a flagged Δ marked); ours alone
    when no cell has a published number."""
    e = svg.esc
    paper = published(cells)
    span = ' colspan="3"' if paper else ""
    head1 = "".join(f"<th{span}>{e(c.label)}</th>" for c in table.columns)
    head2 = ("<th>ours</th><th>paper</th><th>Δ</th>" if paper else "<th>ours</th>") * len(
        table.columns
    )
    lines = [
        '<div class="scroll"><table class="results">',
        f"<thead><tr><th></th>{head1}</tr><tr><th>method</th>{head2}</tr></thead><tbody>",
    ]
    for row, row_cells in zip(table.rows, cells, strict=True):
        parts = [f"<td>{e(row.label)}</td>"]
        for c in row_cells:
            parts.append(f"<td>{e(_joined(c.ours))}</td>")
            if paper:
                flag = ' class="flag"' if c.flagged else ""
                parts.append(f"<td>{e(_joined(c.paper))}</td><td{flag}>{e(c.diff)}</td>")
        lines.append(f"<tr>{''.join(parts)}</tr>")
    lines.append("</tbody></table></div>")
    return "\n".join(lines)


def comparison_charts(table: Table, cells: list[list[CellText]]) -> list[str]:
    """One dot chart per column: the rows with a result or a published number, ours (± std)
    beside the paper's (±); ours alone when the table has no published number."""
    out = []
    for k, col in enumerate(table.columns):
        pairs = [
            svg.Pair(row.label, c.mean, c.std, c.paper_mean, c.paper_pm)
            for row, c in zip(table.rows, (r[k] for r in cells), strict=True)
        ]
        pairs = [p for p in pairs if p.ours is not None or p.paper is not None]
        if pairs:
            paper = any(p.paper is not None for p in pairs)
            title = f"{col.label}: ours and paper" if paper else f"{col.label}: ours"
            out.append(svg.comparison(pairs, title=title, xlabel="%"))
    return out


# ------------------------------------------------------- aEPG against CE, paired by seed


def source_html(table: Table) -> str:
    """Where the table's published cells were read (`Table.source`), "" for the paper's own."""
    return f'<p class="note">published cells: {svg.esc(table.source)}</p>' if table.source else ""


def paired_html(table: Table, rows: Sequence[paired.PairedRow]) -> str:
    """The paired differences of `table` (`paired.py`): a table (one line per pair, one column
    per table column) and one forest plot per metric, an estimate and its 95% interval per pair
    and column, zero marked; "" when no two rows differ only in their loss."""
    if not rows:
        return ""
    e = svg.esc
    name = paired.title(table)
    head = "".join(f"<th>{e(c.label)}</th>" for c in table.columns)
    lines = [
        f'<h4 class="paired">{e(name)}</h4>',
        '<div class="scroll"><table class="paired">',
        f"<thead><tr><th></th>{head}</tr></thead><tbody>",
    ]
    for r in rows:
        cells = "".join(f"<td>{e(p.text())}</td>" for p in r.columns)
        lines.append(f"<tr><td>{e(r.label)}</td>{cells}</tr>")
    lines += ["</tbody></table></div>", f'<p class="legend">{e(paired.LEGEND)}</p>']
    charts = []
    metrics_in = dict.fromkeys(c.metric for c in table.columns)
    for metric in metrics_in:
        intervals = []
        for r in rows:
            for col, p in zip(table.columns, r.columns, strict=True):
                if col.metric != metric or p.mean is None:
                    continue
                lo, hi = p.interval or (None, None)
                label = f"{r.label} · {col.label}"
                intervals.append(svg.Interval(label, p.mean, lo, hi, p.wins_text))
        if intervals:
            labels = [c.label for c in table.columns if c.metric == metric]
            charts.append(
                svg.forest(
                    intervals,
                    title=f"{name}: {', '.join(labels)}",
                    xlabel=f"difference in {metric} (row - CE)",
                )
            )
    if charts:
        lines.append(f'<div class="charts">{"".join(charts)}</div>')
    return "\n".join(lines)


# ------------------------------------------------------------------ aEPG beside CE: A_t curves


def _mean_band(curves: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(mean, mean - std, mean + std) over runs of equal-length curves (sample std; 0 for one)."""
    stack = np.stack(curves)
    mean = np.nanmean(stack, 0)
    std = np.nanstd(stack, 0, ddof=1) if len(curves) > 1 else np.zeros_like(mean)
    return mean, mean - std, mean + std


def _curve(results: Mapping[str, Any], key: str) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in results.get(key) or []], float)


def _where_text(where: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in where.items() if k != "config")


def loss_groups(table: Table) -> list[tuple[str, list[tuple[str, dict]]]]:
    """The cells of `table` that differ only in their `loss`: (the shared arguments as text,
    [(label, where) per loss]) for every group with two losses or more. A member's label is its
    row's, with its column's arguments when the table's columns select different runs."""
    wheres = {tuple(sorted(c.where.items())) for c in table.columns}
    groups: dict[tuple, list[tuple[str, dict]]] = {}
    for col, row in itertools.product(table.columns, table.rows):
        where = {**row.where, **col.where}
        if LOSS_KEY not in where:
            continue
        key = tuple(sorted((k, str(v)) for k, v in where.items() if k != LOSS_KEY))
        label = row.label + (f" ({_where_text(col.where)})" if len(wheres) > 1 else "")
        members = groups.setdefault(key, [])
        if all(m[1] != where for m in members):
            members.append((label, where))
    return [
        (_where_text(dict(key)), members)
        for key, members in groups.items()
        if len({str(m[1][LOSS_KEY]) for m in members}) > 1
    ]


def loss_charts(experiment: Experiment, table: Table, infos: Mapping[str, RunInfo]) -> list[str]:
    """Per `loss_groups` group: A_t after each task per loss, mean ± std band over seeds."""
    out = []
    for shared, members in loss_groups(table):
        series = []
        for label, where in members:
            curves = []
            for run in experiment.select(where):
                info = infos.get(run.name)
                if info is not None and info.counted and info.results is not None:
                    curve = _curve(info.results, "A_t")
                    if curve.size:
                        curves.append(curve)
            if not curves:
                continue
            length = min(c.size for c in curves)
            mean, lo, hi = _mean_band([c[:length] for c in curves])
            x = np.arange(1, length + 1)
            series.append(svg.Series(f"{label} (n={len(curves)})", x, mean, lo, hi, points=True))
        if len(series) > 1:
            out.append(
                svg.chart(
                    series,
                    title=f"A_t per task: {shared}" if shared else "A_t per task",
                    xlabel="after task t",
                    ylabel="A_t (%)",
                    cls="chart loss-comparison",
                )
            )
    return out


# ---------------------------------------------------------------------------------- one run


def _thin(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `limit` points: means over consecutive chunks of a longer curve."""
    if x.size <= limit:
        return x, y
    chunks = np.array_split(np.arange(x.size), limit)
    return (
        np.array([x[c].mean() for c in chunks]),
        np.array([np.nanmean(y[c]) if np.isfinite(y[c]).any() else np.nan for c in chunks]),
    )


def _series(recs: Sequence[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [
        (r["step"], r[key])
        for r in recs
        if records.is_number(r.get("step")) and records.is_number(r.get(key))
    ]
    return np.array([p[0] for p in pts], float), np.array([p[1] for p in pts], float)


def task_boundaries(recs: Sequence[Mapping[str, Any]]) -> list[float]:
    """The global steps at which each task but the last ends (its eval record's step)."""
    evals = [r for r in recs if r.get("type") == "eval" and records.is_number(r.get("step"))]
    steps = sorted({float(r["step"]) for r in evals})
    return steps[:-1]


def curve_charts(recs: Sequence[Mapping[str, Any]]) -> list[str]:
    """Training loss, alpha (when the loss has one) and entropy (train batches, and the test
    set after each task) over the global step."""
    train = [r for r in recs if r.get("type") == "train"]
    evals = [r for r in recs if r.get("type") == "eval"]
    bounds = task_boundaries(recs)
    out = []
    for key, ylabel in (("loss", "training loss"), ("alpha", "alpha (weight of CE)")):
        x, y = _thin(*_series(train, key))
        if x.size:
            out.append(
                svg.chart(
                    [svg.Series("", x, y)],
                    title=ylabel,
                    xlabel="global step",
                    ylabel=key,
                    vlines=bounds,
                    cls="chart curve",
                )
            )
    x, y = _thin(*_series(train, "entropy"))
    ex, ey = _series(evals, "entropy")
    series = []
    # The two are over different supports: a training batch's softmax over its task's
    # classes (the loss's local logits), the test set's over every class seen so far.
    if x.size:
        series.append(svg.Series("train batch: task's classes", x, y))
    if ex.size:
        series.append(svg.Series("test: every seen class", ex, ey, points=True, line=False))
    if series:
        out.append(
            svg.chart(
                series,
                title="output entropy H(p), over the classes in the legend",
                xlabel="global step",
                ylabel="nats",
                vlines=bounds,
                cls="chart curve",
            )
        )
    return out


def reliability_chart(
    folder: pathlib.Path, predictors: Sequence[str], notes: Mapping[str, str] | None = None
) -> str | None:
    """The reliability diagram after the last task evaluated, one line per predictor (not those
    with a note in `notes`: scores, not probabilities, named in the legend as not drawn), from
    the run's kept predictions; None when it kept none or no predictor has one. The first
    predictor is drawn solid, the others dashed over it, so that coinciding lines all show."""
    path = folder / predictions.FILE
    if not path.exists():
        return None
    arrays = predictions.load(path)
    last = arrays["after_task"] == arrays["after_task"].max()
    label = arrays["label"][last]
    series = []
    for p in predictors:
        if f"{p}/top_probs" not in arrays or (notes or {}).get(p):
            continue
        c = predictions.predictor_columns(arrays, p)
        conf = c["top_probs"][last, 0].astype(np.float64)
        correct = c["top_classes"][last, 0] == label
        acc, mean_conf, count = metrics.reliability(conf, correct)
        seen = count > 0
        ece = 100.0 * metrics.ece(conf, correct)
        label, dashed = f"{p} (ECE {ece:.1f}%)", bool(series)
        series.append(svg.Series(label, mean_conf[seen], acc[seen], points=True, dashed=dashed))
    if not series:
        return None
    series += [
        svg.Series(f"{p}: {metrics.SCORES}, not drawn", [], [], line=False, color="#bbb")
        for p in predictors
        if (notes or {}).get(p)
    ]
    task = int(arrays["after_task"].max()) + 1
    return svg.chart(
        series,
        title=f"reliability after task {task}",
        xlabel="confidence",
        ylabel="accuracy",
        xlim=(0.0, 1.0),
        ylim=(0.0, 1.0),
        diagonal=True,
        cls="chart reliability",
    )


def calibration_table(results: Mapping[str, Any]) -> str:
    """Per predictor after the last task: A_T, ECE (%), NLL and test entropy (nats); "scores,
    not probabilities" across the last three for a predictor with a `calibration_note` (its
    reason as the cell's tooltip)."""
    methods = results.get("methods") or {results.get("predictors", ["model"])[0]: results}
    keys = (("A_T", "A_T (%)"), ("ece_T", "ECE (%)"), ("nll_T", "NLL"), ("test_entropy_T", "H"))
    head = "".join(f"<th>{svg.esc(t)}</th>" for _, t in keys)
    rows = []
    for name, m in methods.items():
        note = m.get("calibration_note")
        if note:
            cells = (
                f"<td>{_fmt(m.get('A_T'))}</td>"
                f'<td colspan="{len(keys) - 1}" class="note" title="{svg.esc(note)}">'
                f"{svg.esc(metrics.SCORES)}</td>"
            )
        else:
            cells = "".join(f"<td>{_fmt(m.get(k))}</td>" for k, _ in keys)
        rows.append(f"<tr><td>{svg.esc(name)}</td>{cells}</tr>")
    return (
        f'<div class="scroll"><table class="calibration"><thead><tr><th>predictor</th>{head}'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _fmt(value: Any) -> str:
    if isinstance(value, int | float) and math.isfinite(value):
        return f"{value:.2f}"
    return "—"


def config_differences(mine: Mapping[str, Any], others: Mapping[str, Mapping[str, Any]]) -> str:
    """The fields in which the config `mine` differs from any of its cell's `others` (name ->
    config), with its value and theirs, as an HTML table."""
    from aepg_jax import main

    if not others:
        return '<p class="note">the only run of its cell with results.</p>'
    fields = sorted(
        {f for o in others.values() for f in identity.differences(mine, o, main.SCHEMAS)}
    )
    if not fields:
        return '<p class="note">same config as its cell\'s other runs.</p>'
    flat_mine = identity.flatten(dict(mine))
    flat_others = {n: identity.flatten(dict(o)) for n, o in others.items()}
    rows = []
    for f in fields:
        theirs = sorted({identity.value_text(fo.get(f)) for fo in flat_others.values()})
        rows.append(
            f"<tr><td><code>{svg.esc(f)}</code></td>"
            f'<td class="config-value">{svg.esc(identity.value_text(flat_mine.get(f)))}</td>'
            f'<td class="config-value">{svg.esc(", ".join(theirs))}</td></tr>'
        )
    return (
        '<div class="scroll"><table class="config-diff"><thead><tr><th>field</th><th>this run'
        f"</th><th>its cell's other runs</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</div>"
    )


def run_html(
    info: RunInfo, cell_configs: Mapping[str, Mapping[str, Any]], is_open: bool = False
) -> str:
    """One run's `<details>` (open with `is_open`): heatmap, curves, reliability, calibration,
    config differences."""
    e = svg.esc
    parts = [
        f'<details class="run" id="run-{e(info.name)}"{" open" if is_open else ""}>'
        f"<summary>{e(info.name)} — "
        f"{e(info.status)}</summary>"
    ]
    r = info.results
    if r is None or info.folder is None:
        parts.append("</details>")
        return "\n".join(parts)
    parts.append(f'<p class="meta">folder: <code>{e(info.folder)}</code></p>')
    charts = []
    primary = (r.get("predictors") or ["model"])[0]
    if r.get("accuracy_matrix"):
        charts.append(svg.heatmap(r["accuracy_matrix"], title=f"accuracy (%), {primary}"))
    try:
        recs = records.read_metrics(info.folder)
    except OSError:
        recs = []
    charts += curve_charts(recs)
    notes = {p: m.get("calibration_note") for p, m in (r.get("methods") or {}).items()}
    diagram = reliability_chart(info.folder, r.get("predictors") or [], notes)
    if diagram:
        charts.append(diagram)
    parts.append(f'<div class="charts">{"".join(charts)}</div>')
    parts.append(calibration_table(r))
    mine = r.get("config")
    if isinstance(mine, dict):
        others = {n: c for n, c in cell_configs.items() if n != info.name}
        parts.append("<h4>config differences within its cell</h4>")
        parts.append(config_differences(mine, others))
    parts.append("</details>")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- the page


def page(
    root: str,
    experiment: Experiment,
    blocks: Sequence[Block],
    infos: Sequence[RunInfo],
    warnings: Sequence[str] = (),
    legend: str = "",
    selection: str = "",
) -> str:
    """The report of the sweep directory `root` as one HTML document (see the module doc): the
    tables `blocks` (with `legend` under each), the runs `infos`, the `warnings`; `selection`
    says which runs are shown (overrides, `--where`)."""
    e = svg.esc
    by_name = {i.run.name: i for i in infos}
    done = sum(1 for i in infos if i.results is not None and i.counted)
    body = [
        f"<h1>{e(experiment.title)}</h1>",
        f'<p class="meta">experiment <code>{e(experiment.name)}</code> · directory '
        f"<code>{e(root)}</code> · {done}/{len(infos)} runs finished"
        + (f" · {e(selection)}" if selection else "")
        + "</p>",
        '<h2 id="tables">Tables</h2>',
    ]
    for block in blocks:
        body.append(f"<h3>{e(block.table.title)}</h3>")
        body.append(table_html(block.table, block.cells))
        if legend:
            shown = legend if published(block.cells) else OURS_LEGEND
            body.append(f'<p class="legend">{e(shown)}</p>')
        charts = comparison_charts(block.table, block.cells)
        charts += loss_charts(block.part, block.table, by_name)
        if charts:
            body.append(f'<div class="charts">{"".join(charts)}</div>')
        body.append(source_html(block.table))
        body.append(paired_html(block.table, block.paired))
    if warnings:
        body.append('<h2 id="warnings">Warnings</h2><ul>')
        body += [f'<li class="warning">{e(w)}</li>' for w in warnings]
        body.append("</ul>")
    body.append(f'<h2 id="runs">Runs ({len(infos)})</h2>')
    body.append(
        '<p class="note">each run: its accuracy matrix (task i after task j), training loss, '
        "alpha and entropy over the global step (task boundaries dashed), the reliability "
        "diagram of its test predictions after the last task (15 equal-width confidence bins; "
        "the diagonal is perfect calibration), ECE / NLL / test entropy per predictor, and the "
        "config fields in which it differs from its cell's other runs.</p>"
    )
    first = next((i for i in infos if i.results is not None), None)  # shown open
    cells: dict[str, list[RunInfo]] = {}
    for info in infos:
        cells.setdefault(info.run.cell_name, []).append(info)
    for cell_name, members in cells.items():
        body.append(f"<h3>{e(cell_name)} ({len(members)} runs)</h3>")
        configs = {
            i.name: i.results["config"]
            for i in members
            if i.results is not None and isinstance(i.results.get("config"), dict)
        }
        body += [run_html(i, configs, i is first) for i in members]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(experiment.name)}: {e(experiment.title)}</title>"
        f"<style>{CSS}</style></head><body><main>\n" + "\n".join(body) + "\n</main></body></html>\n"
    )
