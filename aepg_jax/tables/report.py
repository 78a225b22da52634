"""A sweep's report as one self-contained HTML page (`python -m aepg_jax.tables DIR --html=FILE`).

The page opens offline: inline CSS, charts as inline SVG drawn by matplotlib
(`continual/plots.py`, the module that draws every figure), no script, nothing fetched. This
module lays the page out; `tables.report_page` gathers what it shows (the tables' cells, the
runs' folders and results) for the runs the tables show (`tables.View`). Its title and captions
say what the sweep holds (the seeds that ran, not those planned). Each loss has one colour on
every chart (`plots.loss_color`), named in the legends; a point's tooltip names its row, loss
and seeds. The page holds, in order:

    * aEPG against CE, paired by seed (`paired.py`): wherever rows differ only in their loss,
      a forest plot per table (one panel per column: the mean difference over seeds, its 95%
      interval and each seed's difference, zero marked) and the differences as a table;
    * every table of the experiment as `tables.py` computes it, with only the rows and columns
      that select a run (the others counted in one line): ours (mean ± sample std over the
      finished seeds, `k/n done`), the paper's number, Δ = ours - paper and the (!) mark (ours
      alone for a table with no published number); beside it a dot chart of ours (± std) and
      the paper's (±) per column, and, wherever cells differ only in their loss, their A_t
      after each task (mean ± std band over seeds);
    * per run (a collapsible `<details>`, grouped by cell, i.e. the runs that differ only in
      their seed): its accuracy matrix, reliability diagram after the last task
      (predictions.npz, 15 equal-width bins) and loss / entropy / alpha curves over the global
      step (metrics.jsonl; task boundaries dashed) on one chart, ECE, NLL and test entropy per
      predictor ("scores, not probabilities" for a predictor whose outputs are not a
      probability model's, docs/algorithm.md §4), and the config fields in which it differs
      from its cell's other runs (`runs/identity.differences`).
"""

from __future__ import annotations

import dataclasses
import html
import itertools
import math
import pathlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from aepg_jax import metrics
from aepg_jax.continual import plots
from aepg_jax.experiments import Experiment, Run, Table
from aepg_jax.runs import identity, records
from aepg_jax.tables import paired

LOSS_KEY = "loss"

CSS = """
body { font-family: system-ui, sans-serif; margin: 0; color: #222; background: #fafafa; }
main { max-width: 1200px; margin: 0 auto; padding: 12px 16px 40px; }
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
svg.chart { display: block; max-width: 100%; height: auto; background: #fff;
  border: 1px solid #e4e4e4; margin: 6px 0; }
details.run { background: #fff; border: 1px solid #ddd; margin: 6px 0; padding: 4px 10px; }
details.run > summary { cursor: pointer; font-family: monospace; font-size: 0.9em;
  overflow-wrap: anywhere; }
code { overflow-wrap: anywhere; }
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


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
    None where absent), the runs it selects (`expected`) and the seeds of its finished runs."""

    ours: str
    paper: str
    diff: str
    flagged: bool
    mean: float | None
    std: float | None
    paper_mean: float | None
    paper_pm: float | None
    expected: int = 1
    seeds: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class Block:
    """One table of the experiment (`part`: the experiment, or the section, it belongs to) with
    its cells, row by row."""

    part: Experiment
    table: Table
    cells: list[list[CellText]]
    paired: Sequence[paired.PairedRow] = ()  # its rows against their CE rows, seed by seed
    rows: Sequence[int] = ()  # the rows and columns shown (`tables.shown`)
    cols: Sequence[int] = ()
    rest: str = ""  # the line counting the others


# ---------------------------------------------------------------------------------- tables


def _joined(text: str) -> str:
    """`mean ± std` kept on one line (non-breaking spaces) where a narrow cell wraps."""
    return text.replace(" ± ", "\u00a0±\u00a0")


def published(cells: list[list[CellText]]) -> bool:
    """Whether any cell of a table has a published number (else it has no paper columns)."""
    return any(c.paper_mean is not None or c.paper.strip() for row in cells for c in row)


def _loss_name(loss: Any) -> str:
    return paired.LOSS_NAMES.get(str(loss), str(loss))


def seeds_text(seeds: Sequence[int]) -> str:
    """`seed 0` / `seeds 0, 1, 2`."""
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def table_html(block: Block) -> str:
    """`block`'s table as an HTML table of its rows and columns that select a run (the rest
    counted below it): per column ours, paper, Δ (a flagged Δ marked); ours alone when no cell
    has a published number."""
    table, cells, rows, cols = block.table, block.cells, block.rows, block.cols
    paper = published(cells)
    span = ' colspan="3"' if paper else ""
    head1 = "".join(f"<th{span}>{esc(table.columns[k].label)}</th>" for k in cols)
    head2 = ("<th>ours</th><th>paper</th><th>Δ</th>" if paper else "<th>ours</th>") * len(cols)
    lines = [
        '<div class="scroll"><table class="results">',
        f"<thead><tr><th></th>{head1}</tr><tr><th>method</th>{head2}</tr></thead><tbody>",
    ]
    for i in rows:
        parts = [f"<td>{esc(table.rows[i].label)}</td>"]
        for k in cols:
            c = cells[i][k]
            parts.append(f"<td>{esc(_joined(c.ours))}</td>")
            if paper:
                flag = ' class="flag"' if c.flagged else ""
                parts.append(f"<td>{esc(_joined(c.paper))}</td><td{flag}>{esc(c.diff)}</td>")
        lines.append(f"<tr>{''.join(parts)}</tr>")
    lines.append("</tbody></table></div>")
    rest = f'<p class="note rest">{esc(block.rest)}</p>'
    return "\n".join(lines + [rest] * bool(block.rest))


def comparison_chart(
    table: Table, cells: list[list[CellText]], styles: dict[str, str]
) -> str | None:
    """Ours (mean ± std over seeds, coloured by the row's loss) beside the paper's (hollow
    diamond, ± as printed) for the rows with a result or a published number, one panel per
    column; None when no row has either."""
    panels: dict[str, list[plots.Dot]] = {}
    labels: dict[str, None] = {}
    losses: dict[str, None] = {}
    for k, col in enumerate(table.columns):
        dots = []
        for row, c in zip(table.rows, (r[k] for r in cells), strict=True):
            loss = row.where.get(LOSS_KEY)
            if c.mean is not None:
                std = c.std or 0.0
                tip = f"{row.label} · {col.label} · {_loss_name(loss)} · {seeds_text(c.seeds)}"
                dots.append(plots.Dot(row.label, c.mean, c.mean - std, c.mean + std,
                                      plots.loss_color(loss), f"{tip}: {c.ours}"))  # fmt: skip
                losses[str(loss)] = None
            if c.paper_mean is not None:
                pm, tip = c.paper_pm or 0.0, f"{row.label} · {col.label} · paper: {c.paper}"
                lo, hi = c.paper_mean - pm, c.paper_mean + pm
                dots.append(plots.Dot(row.label, c.paper_mean, lo, hi, plots.PAPER_COLOR, tip,
                                      hollow=True))  # fmt: skip
            if dots and dots[-1].label == row.label:
                labels[row.label] = None
        if dots:
            panels[col.label] = dots
    if not panels:
        return None
    legend = [(f"ours, {_loss_name(lo)}: mean ± std over seeds", plots.loss_color(lo), False)
              for lo in losses]  # fmt: skip
    paper = any(d.hollow for ds in panels.values() for d in ds)
    legend += [("paper (± as printed)", plots.PAPER_COLOR, True)] * paper
    fig = plots.plot_dots(panels, list(labels), legend=legend, xlabel="%",
                          title="ours and paper" if paper else "ours")  # fmt: skip
    return plots.svg_text(fig, "chart comparison", styles)


def source_html(table: Table) -> str:
    """Where the table's published cells were read (`Table.source`), "" for the paper's own."""
    return f'<p class="note">published cells: {esc(table.source)}</p>' if table.source else ""


# ------------------------------------------------------- aEPG against CE, paired by seed


def _with_data(rows: Sequence[paired.PairedRow]) -> list[paired.PairedRow]:
    return [r for r in rows if any(p.n for p in r.columns)]


def forest_chart(block: Block, styles: dict[str, str], caption: str) -> str | None:
    """The paired differences of `block` as a forest plot: per pair with a finished seed and
    per column (a panel), the mean difference and its 95% interval, each seed's difference as a
    small dot, zero marked; coloured by the pair's loss. None when no pair has a seed."""
    table, rows = block.table, _with_data(block.paired)
    if not rows:
        return None
    panels: dict[str, list[plots.Dot]] = {}
    losses: dict[str, None] = {}
    for k, col in enumerate(table.columns):
        dots = []
        for r in rows:
            p = r.columns[k]
            if p.mean is None:
                continue
            loss = table.rows[r.row].where.get(LOSS_KEY)
            losses[str(loss)] = None
            both = [s for s in block.cells[r.row][k].seeds if s in block.cells[r.base][k].seeds]
            seeds = sorted(both) if len(both) == p.n else []
            per_seed = [(d, f"{r.label} · {col.label} · seed {s}: {d:+.2f}")
                        for d, s in zip(p.diffs, seeds, strict=True)] if seeds else [
                        (d, f"{r.label} · {col.label}: {d:+.2f}") for d in p.diffs]  # fmt: skip
            lo, hi = p.interval or (None, None)
            which = seeds_text(seeds) if seeds else f"{p.n} pairs"
            tip = f"{r.label} · {col.label}: {p.text()} ({which})"
            dots.append(plots.Dot(r.label, p.mean, lo, hi, plots.loss_color(loss), tip, per_seed))
        if dots:
            panels[col.label] = dots
    legend = [(f"{_loss_name(lo)} - CE: mean over seeds, 95% CI (small dots: each seed)",
               plots.loss_color(lo), False) for lo in losses]  # fmt: skip
    fig = plots.plot_dots(panels, [r.label for r in rows], legend=legend, zero=True,
                          xlabel="difference (row - CE)",
                          title=f"{paired.title(table)}: {caption}")  # fmt: skip
    return plots.svg_text(fig, "chart forest", styles)


def paired_html(table: Table, rows: Sequence[paired.PairedRow], caption: str) -> str:
    """The paired differences of `table` (`paired.py`) as a table, one line per pair and one
    column per table column that selects a run; "" when no two rows differ only in their
    loss."""
    rows = [r for r in rows if any(p.expected for p in r.columns)]
    if not rows:
        return ""
    name = paired.title(table)
    cols = [k for k in range(len(table.columns)) if any(r.columns[k].expected for r in rows)]
    head = "".join(f"<th>{esc(table.columns[k].label)}</th>" for k in cols)
    lines = [
        f'<h4 class="paired">{esc(name)}: {esc(caption)}</h4>',
        '<div class="scroll"><table class="paired">',
        f"<thead><tr><th></th>{head}</tr></thead><tbody>",
    ]
    for r in rows:
        cells = "".join(f"<td>{esc(r.columns[k].text())}</td>" for k in cols)
        lines.append(f"<tr><td>{esc(r.label)}</td>{cells}</tr>")
    lines += ["</tbody></table></div>", f'<p class="legend">{esc(paired.LEGEND)}</p>']
    return "\n".join(lines)


# ------------------------------------------------------------------ aEPG beside CE: A_t curves


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


def loss_chart(
    experiment: Experiment, table: Table, infos: Mapping[str, RunInfo], styles: dict[str, str]
) -> str | None:
    """Per `loss_groups` group with two losses run (a panel): A_t after each task per loss,
    the mean ± sample std band over seeds, coloured by loss; None when no group has two."""
    panels = {}
    for shared, members in loss_groups(table):
        bands = []
        for label, where in members:
            curves, seeds = [], []
            for run in experiment.select(where):
                info = infos.get(run.name)
                if info is not None and info.counted and info.results is not None:
                    curve = plots.values_of(info.results, "A_t")
                    if curve.size:
                        curves.append(curve)
                        seeds.append(run.seed)
            if curves:
                mean, std = plots.mean_std(curves)
                loss = where[LOSS_KEY]
                name = f"{label} ({_loss_name(loss)}; {seeds_text(sorted(seeds))})"
                bands.append(plots.Band(name, range(1, mean.size + 1), mean, std,
                                        plots.loss_color(loss), f"A_t: {name}"))  # fmt: skip
        if len(bands) > 1:
            panels[f"A_t per task: {shared}" if shared else "A_t per task"] = bands
    if not panels:
        return None
    fig = plots.plot_bands(panels, xlabel="after task t", ylabel="A_t (%)")
    return plots.svg_text(fig, "chart loss-comparison", styles)


# ---------------------------------------------------------------------------------- one run


def run_chart(info: RunInfo, recs: Sequence[Mapping[str, Any]], styles: dict[str, str]) -> str:
    """The run's accuracy matrix, reliability diagram and training curves (`plots.plot_run`)."""
    r = info.results or {}
    predictors = r.get("predictors") or ["model"]
    notes = {p: m.get("calibration_note") for p, m in (r.get("methods") or {}).items()}
    found = plots.kept_reliability(info.folder, predictors, notes) if info.folder else None
    fig = plots.plot_run(
        r.get("accuracy_matrix") or None,
        recs,
        found,
        [p for p in predictors if notes.get(p)],
        predictors[0],
    )
    return plots.svg_text(fig, "chart run", styles)


def calibration_table(results: Mapping[str, Any]) -> str:
    """Per predictor after the last task: A_T, ECE (%), NLL and test entropy (nats); "scores,
    not probabilities" across the last three for a predictor with a `calibration_note` (its
    reason as the cell's tooltip)."""
    methods = results.get("methods") or {results.get("predictors", ["model"])[0]: results}
    keys = (("A_T", "A_T (%)"), ("ece_T", "ECE (%)"), ("nll_T", "NLL"), ("test_entropy_T", "H"))
    head = "".join(f"<th>{esc(t)}</th>" for _, t in keys)
    rows = []
    for name, m in methods.items():
        note = m.get("calibration_note")
        if note:
            cells = (
                f"<td>{_fmt(m.get('A_T'))}</td>"
                f'<td colspan="{len(keys) - 1}" class="note" title="{esc(note)}">'
                f"{esc(metrics.SCORES)}</td>"
            )
        else:
            cells = "".join(f"<td>{_fmt(m.get(k))}</td>" for k, _ in keys)
        rows.append(f"<tr><td>{esc(name)}</td>{cells}</tr>")
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
            f"<tr><td><code>{esc(f)}</code></td>"
            f'<td class="config-value">{esc(identity.value_text(flat_mine.get(f)))}</td>'
            f'<td class="config-value">{esc(", ".join(theirs))}</td></tr>'
        )
    return (
        '<div class="scroll"><table class="config-diff"><thead><tr><th>field</th><th>this run'
        f"</th><th>its cell's other runs</th></tr></thead><tbody>{''.join(rows)}</tbody></table>"
        "</div>"
    )


def run_html(
    info: RunInfo,
    cell_configs: Mapping[str, Mapping[str, Any]],
    styles: dict[str, str],
    is_open: bool = False,
) -> str:
    """One run's `<details>` (open with `is_open`): its chart (`run_chart`), calibration and
    config differences."""
    parts = [
        f'<details class="run" id="run-{esc(info.name)}"{" open" if is_open else ""}>'
        f"<summary>{esc(info.name)} — {esc(info.status)}</summary>"
    ]
    r = info.results
    if r is None or info.folder is None:
        parts.append("</details>")
        return "\n".join(parts)
    parts.append(f'<p class="meta">folder: <code>{esc(info.folder)}</code></p>')
    try:
        recs = records.read_metrics(info.folder)
    except OSError:
        recs = []
    parts.append(run_chart(info, recs, styles))
    parts.append(calibration_table(r))
    mine = r.get("config")
    if isinstance(mine, dict):
        others = {n: c for n, c in cell_configs.items() if n != info.name}
        parts.append("<h4>config differences within its cell</h4>")
        parts.append(config_differences(mine, others))
    parts.append("</details>")
    return "\n".join(parts)


# ---------------------------------------------------------------------------------- the page


def seeds_run(infos: Sequence[RunInfo]) -> list[int]:
    """The seeds of the runs with results that their cells count."""
    return sorted({i.run.seed for i in infos if i.results is not None and i.counted
                   and i.run.seed is not None})  # fmt: skip


def with_seeds(text: str, seeds: int) -> str:
    """`text` saying the seeds that ran: its `N seeds` as `3 seeds (of 5)` where fewer ran,
    `· 3 seeds` added when it names none."""
    if not seeds:
        return text
    word = f"{seeds} seed" + "s" * (seeds != 1)
    said = re.compile(r"\b(\d+) seeds\b")
    if not said.search(text):
        return f"{text} · {word}"
    return said.sub(lambda m: word if int(m[1]) == seeds else f"{word} (of {m[1]})", text)


def page(
    root: str,
    experiment: Experiment,
    blocks: Sequence[Block],
    infos: Sequence[RunInfo],
    warnings: Sequence[str] = (),
    legends: tuple[str, str] = ("", ""),
    selection: str = "",
) -> str:
    """The report of the sweep directory `root` as one HTML document (see the module doc): the
    paired differences of `blocks` first, then the tables (with `legends` under each: the
    one with published numbers, the one of ours alone), the
    `warnings`, the runs `infos`; `selection` says which runs are shown (overrides,
    `--where`)."""
    styles: dict[str, str] = {}
    by_name = {i.run.name: i for i in infos}
    done = sum(1 for i in infos if i.results is not None and i.counted)
    seeds = len(seeds_run(infos))
    title = with_seeds(experiment.title, seeds)
    body = [
        f"<h1>{esc(title)}</h1>",
        f'<p class="meta">experiment <code>{esc(experiment.name)}</code> · directory '
        f"<code>{esc(root)}</code> · {done}/{len(infos)} runs finished"
        + (f" · {esc(selection)}" if selection else "")
        + "</p>",
    ]
    captions = {id(b): with_seeds(b.table.title, seeds) for b in blocks}
    forests = [(b, forest_chart(b, styles, captions[id(b)])) for b in blocks]
    if any(chart for _, chart in forests):
        names = " / ".join(dict.fromkeys(paired.title(b.table) for b, c in forests if c))
        body.append(f'<h2 id="paired">{esc(names)}</h2>')
        for block, chart in forests:
            if chart:
                body += [chart, paired_html(block.table, block.paired, captions[id(block)])]
    body.append('<h2 id="tables">Tables</h2>')
    for block in blocks:
        body.append(f"<h3>{esc(captions[id(block)])}</h3>")
        body.append(table_html(block))
        text = legends[0] if published(block.cells) else legends[1]
        if text:
            body.append(f'<p class="legend">{esc(text)}</p>')
        body.append(comparison_chart(block.table, block.cells, styles) or "")
        body.append(loss_chart(block.part, block.table, by_name, styles) or "")
        body.append(source_html(block.table))
        if not any(c for b, c in forests if b is block):
            body.append(paired_html(block.table, block.paired, captions[id(block)]))
    if warnings:
        body.append('<h2 id="warnings">Warnings</h2><ul>')
        body += [f'<li class="warning">{esc(w)}</li>' for w in warnings]
        body.append("</ul>")
    body.append(f'<h2 id="runs">Runs ({len(infos)})</h2>')
    body.append(
        '<p class="note">each run: its accuracy matrix (task i after task j), the reliability '
        "diagram of its test predictions after the last task (15 equal-width confidence bins; "
        "the diagonal is perfect calibration), training loss, entropy and alpha over the global "
        "step (task boundaries dashed), ECE / NLL / test entropy per predictor, and the config "
        "fields in which it differs from its cell's other runs.</p>"
    )
    first = next((i for i in infos if i.results is not None), None)  # shown open
    cells: dict[str, list[RunInfo]] = {}
    for info in infos:
        cells.setdefault(info.run.cell_name, []).append(info)
    for cell_name, members in cells.items():
        body.append(f"<h3>{esc(cell_name)} ({len(members)} runs)</h3>")
        configs = {
            i.name: i.results["config"]
            for i in members
            if i.results is not None and isinstance(i.results.get("config"), dict)
        }
        body += [run_html(i, configs, styles, i is first) for i in members]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(experiment.name)}: {esc(title)}</title>"
        f"<style>{CSS}{plots.style_sheet(styles)}</style></head><body><main>\n"
        + "\n".join(filter(None, body))
        + "\n</main></body></html>\n"
    )
