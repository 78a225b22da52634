"""An experiment's tables from a sweep's results, beside the paper's numbers.

    python -m aepg_jax.tables DIR [--experiment=NAME] [--format=markdown|latex|csv] [--out=FILE]
        [--html=FILE] [--where=key=value,...] [--no_overrides | --config.<field>=<value> ...]

For every cell of the experiment's tables (the paper's, or the demo's): our mean ± sample
std over the finished runs (seeds) with their number n, the published mean ± as printed, and
Δ = ours - paper. A cell with runs missing shows how many are done (`3/5 done`) and how many
failed; a cell whose |Δ| > max(1, 2 x the paper's ±) is marked `(!)`. Under a table whose rows
differ only in their loss comes "aEPG - CE (paired)": per column, the mean over
seeds of each row's value minus its CE row's for the same seed and settings, its 95% Student t
interval and wins/n (the CSV's `paired_*` fields; the report's forest plot); under a table whose
published cells were not read in the paper itself, the line naming their source. The
experiment is the one `aepg_jax.sweep` recorded in DIR unless `--experiment` names it; the runs
shown are those of the `--config.*` overrides the last sweep of DIR recorded (their run folders
`<run>+<field>=<value>`), unless `--config.*` flags are given here (or `--no_overrides`, the
experiment's own configs); a DIR whose sweeps ran several override sets names them in a
`note:` line. The runs shown are those the sweeps of DIR selected with these overrides
(their `--where`, recorded in DIR/sweep.json; the other cells say `no run selected`), named in
a first `Shown:` line, unless `--where` is given here (`--where=` for every run). Figure
experiments also get their plots, written to `DIR/plots/`. `--html=FILE` also writes the
sweep's report, one self-contained page that opens offline: these tables with the paper's
numbers beside ours as charts, the A_t curves of cells that differ only in their loss on one
chart (mean ± std over seeds), and per run its accuracy-matrix heatmap, loss / alpha / entropy
curves, reliability diagram with ECE / NLL, and its config differences from its cell's other
runs. A run whose results file cannot be read (truncated, say), that is missing from a run
folder whose metrics.jsonl holds the last task's evaluation, or that holds a non-finite metric
is named in one `warning:` line and counted as failed in its cell; a run whose results were
made with another config than the experiment's (its identity differs: a field that changes
results, or the content of its weights file; where the data is does not) is named with those
fields and left out of its cell (`k/n done, m of another config`); the runs with no results
yet are counted in one `warning:` line (`3 of 10 cells have runs without results ...`). The
command exits 0 when it printed the tables, 1 when not one run shown has results (it prints
them all the same), 2 on a bad argument. A
calibration figure (ECE, NLL, test entropy) of a method whose predictions are scores, not
probabilities (results.json's `calibration_note`; docs/algorithm.md §4) is no failure: its
cell reads "scores, not probabilities".
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import io
import json
import math
import os
import pathlib
import sys
from collections.abc import Sequence

import numpy as np

from aepg_jax import experiments, metrics
from aepg_jax.experiments import Column, Experiment, Published, Row, Run, Table, layout, registry
from aepg_jax.runs import identity
from aepg_jax.system import cli
from aepg_jax.tables import paired

FORMATS = ("markdown", "latex", "csv")
MARK = "(!)"
OURS_LEGEND = "ours: mean ± std over seeds (n runs; `k/n done` while runs are missing)."
LEGEND = OURS_LEGEND[:-1] + f"; Δ = ours - paper; {MARK}: |Δ| > max(1, 2 x paper ±)."


@dataclasses.dataclass(frozen=True)
class Cell:
    values: tuple[float, ...]  # one per finished run
    expected: int  # runs of the cell
    failed: int
    published: Published | None
    other: int = 0  # finished runs of another config than the experiment's: left out
    scores: int = 0  # finished runs whose figure is null: scores, not probabilities
    runs: tuple[Run, ...] = ()  # the run of each value, in `values`' order
    selected: tuple[Run, ...] = ()  # every run of the cell that the view selects

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def done(self) -> int:
        """Finished runs: with a number, or with scores instead of probabilities."""
        return self.n + self.scores

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.values)) if self.values else None

    @property
    def std(self) -> float | None:
        return float(np.std(self.values, ddof=1)) if self.n > 1 else None

    @property
    def diff(self) -> float | None:
        if self.mean is None or self.published is None:
            return None
        return self.mean - self.published.mean

    @property
    def flagged(self) -> bool:
        if self.diff is None:
            return False
        return abs(self.diff) > max(1.0, 2 * (self.published.pm or 0.0))

    def decimals(self) -> int:
        return max(1, self.published.decimals) if self.published else 1


def damage(root: str, run, results: dict | None, name: str, changed=()) -> str | None:
    """Why `run`'s results are unusable for metric `name` (None when they are fine or the run
    is not finished): a results file that exists but cannot be read, a run folder that looks
    finished (its last task evaluated) without one, or a non-finite value."""
    if results is None:
        unreadable = [p for p in layout.result_paths(root, run, changed) if p.exists()]
        if unreadable:
            return f"{unreadable[0]} cannot be read as a results object"
        lost = layout.finished_without_results(root, run, changed)
        if lost:
            return f"{lost} has its last task's evaluation in metrics.jsonl but no results.json"
        return None
    value = results.get(name)
    finite = isinstance(value, int | float) and math.isfinite(value)
    if metrics.note_of(results, name):  # scores, not probabilities: null by design
        return None
    if name in results and not finite:  # NaN / inf are written as null (runs/records.py)
        return f"{run.folder(changed)}: {name} is {value} (not finite)"
    return None


@dataclasses.dataclass
class Tally:
    """What the cells found: how many select runs (`cells`), the folders of the runs without
    results per cell (`missing`), and the values read."""

    cells: int = 0
    missing: dict[tuple[str, str, str], list[str]] = dataclasses.field(default_factory=dict)
    read: int = 0

    def summary(self) -> str | None:
        """One line for every cell with runs missing (None: none is)."""
        if not self.missing:
            return None
        runs = sorted({name for names in self.missing.values() for name in names})
        example = ", ".join(runs[:2])
        count = f"{len(runs)} run" + "s" * (len(runs) != 1)
        return (
            f"{len(self.missing)} of {self.cells} cells have runs without results (not run yet, "
            f"or running): {count}, e.g. {example}"
        )


def cell(
    root: str,
    experiment: Experiment,
    table: Table,
    row: Row,
    col: Column,
    warnings=None,
    view: View | None = None,
    tally: Tally | None = None,
) -> Cell:
    """The runs of (row, col) (those `view.where` selects) and the metric of those that are
    finished with `view.overrides`; a damaged run (`damage`, or a finished-looking run folder
    without results.json) counts as failed and its reason is added to `warnings` (a set); the
    runs without results go to `tally`."""
    view = view or View()
    where = {**row.where, **col.where}
    runs = [r for r in experiment.select(where) if view.selects(r)]
    values, failed, other, scores = [], 0, 0, 0
    missing, valued = [], []
    for run in runs:
        changed = _changed(run, view.overrides)
        results = layout.run_results(root, run, changed)
        differs = other_config(run, results, view.overrides, root, changed)
        if differs:
            other += 1
            if warnings is not None:
                warnings.add(
                    f"{run.folder(changed)}: its results are of another config than the "
                    f"experiment's (differs in: {', '.join(differs)}); left out of its cell: run "
                    "the sweep again with --rerun_changed"
                )
            continue
        value = None if results is None else layout.metric(results, col.metric)
        problem = damage(root, run, results, col.metric, changed) if value is None else None
        if value is not None:
            values.append(value)
            valued.append(run)
        elif results is not None and metrics.note_of(results, col.metric):
            scores += 1
        elif problem is not None:
            failed += 1
            if warnings is not None:
                warnings.add(f"{problem}; counted as failed")
        elif results is None and layout.run_error(root, run, changed) is not None:
            failed += 1
        elif results is None:
            missing.append(run.folder(changed))
    if tally is not None and runs:
        tally.cells += 1
        tally.read += len(values) + scores
        if missing:
            tally.missing[(table.title, row.label, col.label)] = missing
    return Cell(
        tuple(values), len(runs), failed, table.published(row, col), other, scores,
        tuple(valued), tuple(runs),
    )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class View:
    """Which runs the tables show: those `where` selects (`key=value,...`, as the sweep's
    `--where`, or several such, any of which selects a run; None: all), run with the
    `--config.*` `overrides`; `recorded`: `where` is the selection DIR's sweeps recorded."""

    overrides: tuple[str, ...] = ()
    where: str | tuple[str, ...] | None = None
    recorded: bool = False

    @property
    def wheres(self) -> tuple[str, ...]:
        return (self.where,) if isinstance(self.where, str) else tuple(self.where or ())

    def selects(self, run) -> bool:
        wheres = [w for w in self.wheres if w]
        return not wheres or any(experiments.filter_runs([run], w) for w in wheres)

    def selection(self, root: str) -> str:
        """The runs shown, in words: `--where=...` (or several, `or`), with where it comes
        from (the sweeps of `root`, or the command line); "" for every run."""
        wheres = [w for w in self.wheres if w]
        if not wheres:
            return ""
        text = " or ".join(f"--where={w}" for w in wheres)
        source = f"recorded by the sweep of {root}" if self.recorded else "given here"
        return f"runs {text} ({source}; --where= shows every run)"


@functools.cache
def _configs(run, overrides: tuple[str, ...]) -> tuple[dict, dict] | None:
    """(the experiment's own config of `run`, the config with `overrides`), as JSON; None if
    either does not build."""
    from aepg_jax.sweep import preflight

    unit = layout.Unit((run,))
    try:
        own = json.loads(
            preflight.load_config(unit.config_arg, unit.overrides()).to_json_best_effort()
        )
        if not overrides:
            return own, own
        mine = preflight.load_config(unit.config_arg, unit.overrides(overrides))
    except ValueError:
        return None
    return own, json.loads(mine.to_json_best_effort())


@functools.cache
def _changed(run, overrides: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The (field, value) pairs by which the sweep names `run`'s folder under `overrides`
    (`preflight.changes`)."""
    configs = _configs(run, overrides) if overrides else None
    if configs is None:
        return ()
    from aepg_jax import main

    own, mine = configs
    flat = identity.flatten(mine)
    fields = identity.differences(own, mine, main.SCHEMAS, contents=False)
    return tuple((f, identity.value_text(flat.get(f))) for f in fields)


@functools.cache
def _expected(run, overrides: tuple[str, ...] = ()) -> dict | None:
    """The config of `run` as the experiment defines it with `overrides` (JSON, with the digests
    of the files it names), None if it does not build."""
    configs = _configs(run, overrides)
    return None if configs is None else identity.with_inputs(configs[1])


def other_config(
    run, results: dict | None, overrides: tuple[str, ...] = (), root: str = "", changed=()
) -> list[str]:
    """The fields in which the config `results` were made with (with the input digests its run
    folder's config.json or results record) differs from the experiment's config of `run` with
    `overrides` ([] when they agree, or either is unknown)."""
    saved = (results or {}).get("config")
    expected = _expected(run, tuple(overrides)) if isinstance(saved, dict) else None
    if expected is None:
        return []
    folder = layout.read_json(pathlib.Path(root, run.folder(changed), "config.json"))
    found = identity.saved_inputs(folder, results)
    from aepg_jax import main

    return identity.differences({**saved, identity.INPUTS_KEY: found}, expected, main.SCHEMAS)


def shown_results(root: str, view: View):
    """`results_of(run)` for the plots: the results of `run` that the tables show with `view`
    (None for a run it does not select, or of another identity)."""

    def results_of(run) -> dict | None:
        if not view.selects(run):
            return None
        changed = _changed(run, view.overrides)
        results = layout.run_results(root, run, changed)
        return None if other_config(run, results, view.overrides, root, changed) else results

    return results_of


def grid(
    root: str,
    experiment: Experiment,
    table: Table,
    warnings=None,
    view: View | None = None,
    tally: Tally | None = None,
) -> list[list[Cell]]:
    return [
        [cell(root, experiment, table, r, c, warnings, view, tally) for c in table.columns]
        for r in table.rows
    ]


def _num(x: float, d: int, sign: bool = False) -> str:
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def ours_text(c: Cell, pm: str = "±") -> str:
    if not c.expected:
        return "— (no run selected)"
    d = c.decimals()
    if c.mean is None:
        text = metrics.SCORES if c.scores else "—"
    else:
        text = _num(c.mean, d) + (f" {pm} {_num(c.std, d)}" if c.std is not None else "")
    if c.done == c.expected and c.expected:
        return f"{text} (n={c.done})"
    status = f"{c.done}/{c.expected} done" + (f", {c.failed} failed" if c.failed else "")
    status += f", {c.other} of another config" if c.other else ""
    return f"{text} ({status})"


def paper_text(c: Cell, pm: str = "±") -> str:
    p = c.published
    if p is None:
        return ""
    d = p.decimals
    return _num(p.mean, d) + (f" {pm} {_num(p.pm, d)}" if p.pm is not None else "")


def diff_text(c: Cell) -> str:
    if c.diff is None:
        return ""
    return _num(c.diff, c.decimals(), sign=True) + (f" {MARK}" if c.flagged else "")


def shown(table: Table, cells: Sequence[Sequence]) -> tuple[list[int], list[int]]:
    """(rows, columns) of `table` whose cells select a run (`expected`); all of them when none
    does."""
    rows = [i for i, row in enumerate(cells) if any(c.expected for c in row)]
    cols = [k for k in range(len(table.columns)) if any(row[k].expected for row in cells)]
    if not rows:
        return list(range(len(table.rows))), list(range(len(table.columns)))
    return rows, cols


def rest_text(table: Table, rows: Sequence[int], cols: Sequence[int] | None = None) -> str:
    """The line counting the rows (and columns) left out because they select no run, naming
    the first three; "" when none is."""
    parts = []
    kinds = (("row", table.rows, rows), ("column", table.columns, cols))
    for kind, items, kept in kinds:
        left = [] if kept is None else [x.label for i, x in enumerate(items) if i not in kept]
        if left:
            names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
            parts.append(f"{len(left)} {kind}{'s' * (len(left) != 1)} ({names})")
    return f"{' and '.join(parts)}: no run selected, not shown." if parts else ""


def has_published(cells: Sequence[Sequence[Cell]]) -> bool:
    return any(c.published is not None for row in cells for c in row)


def markdown(table: Table, cells: list[list[Cell]]) -> str:
    """The table's rows that select a run (the others counted in one line under it): per
    column ours, paper and Δ; ours alone when no cell has a published number."""
    parts_of = ("ours", "paper", "Δ") if has_published(cells) else ("ours",)
    head = [""] + [f"{c.label} {part}" for c in table.columns for part in parts_of]
    lines = [f"### {table.title}", "", "| " + " | ".join(head) + " |"]
    lines.append("|---" + "|---:" * (len(head) - 1) + "|")
    rows, _ = shown(table, cells)
    for i in rows:
        parts = [table.rows[i].label]
        for c in cells[i]:
            parts += [ours_text(c), paper_text(c), diff_text(c)][: len(parts_of)]
        lines.append("| " + " | ".join(parts) + " |")
    rest = rest_text(table, rows)
    legend = LEGEND if has_published(cells) else OURS_LEGEND
    return "\n".join([*lines, *["", rest] * bool(rest), "", legend])


def _tex(text: str) -> str:
    for a, b in (
        ("\\", r"\textbackslash{}"),
        ("&", r"\&"),
        ("%", r"\%"),
        ("#", r"\#"),
        ("_", r"\_"),
    ):
        text = text.replace(a, b)
    return text


def latex(table: Table, cells: list[list[Cell]]) -> str:
    """As `markdown`: the rows that select a run, paper columns only with published numbers."""
    n, k = len(table.columns), 3 if has_published(cells) else 1
    rows, _ = shown(table, cells)
    rest = rest_text(table, rows)
    lines = [
        f"% {table.title}" + (f" (paper: {table.label})" if table.label else ""),
        "% " + (LEGEND if k == 3 else OURS_LEGEND).replace("`", ""),
        *[f"% {rest}"] * bool(rest),
        r"\begin{tabular}{l" + "r" * k * n + "}",
        r"\toprule",
        " & ".join(
            [""]
            + [rf"\multicolumn{{{k}}}{{c}}{{{c.latex or _tex(c.label)}}}" for c in table.columns]
        )
        + r" \\",
        *[" ".join(rf"\cmidrule(lr){{{2 + 3 * i}-{4 + 3 * i}}}" for i in range(n))] * (k == 3),
        " & ".join(["Method"] + ["ours", "paper", r"$\Delta$"][:k] * n) + r" \\",
        r"\midrule",
    ]
    for i in rows:
        parts = [_tex(table.rows[i].label)]
        for c in cells[i]:
            ours = ours_text(c, r"$\pm$").replace("—", "--")
            parts += [ours, paper_text(c, r"$\pm$"), diff_text(c)][:k]
        lines.append(" & ".join(parts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


def paired_rows(table: Table, cells: list[list[Cell]]) -> list[paired.PairedRow]:
    """Every row of `table` that differs from a CE row only in its loss, paired with it seed by
    seed in every column (`paired.compare`); a pair whose cells select no run is left out."""
    out = []
    for j, i in paired.row_pairs(table):
        columns = tuple(
            paired.compare(
                list(zip(b.runs, b.values, strict=True)),
                list(zip(o.runs, o.values, strict=True)),
                (b.selected, o.selected),
                col.metric,
            )
            for col, b, o in zip(table.columns, cells[j], cells[i], strict=True)
        )
        label = paired.pair_label(table.rows[j].label, table.rows[i].label)
        if any(p.expected for p in columns):
            out.append(paired.PairedRow(j, i, label, columns))
    return out


def source_text(table: Table, fmt: str) -> str:
    """The line naming where the table's published cells were read (`Table.source`)."""
    if not table.source:
        return ""
    return (
        f"Published cells: {table.source}"
        if fmt == "markdown"
        else f"% Published cells: {table.source}"
    )


def paired_markdown(table: Table, rows: Sequence[paired.PairedRow]) -> str:
    """The paired block under a table: one line per pair, one column per table column."""
    if not rows:
        return ""
    head = ["", *(c.label for c in table.columns)]
    lines = [f"#### {paired.title(table)}: {table.title}", "", "| " + " | ".join(head) + " |"]
    lines.append("|---" + "|---:" * (len(head) - 1) + "|")
    lines += ["| " + " | ".join([r.label, *(p.text() for p in r.columns)]) + " |" for r in rows]
    return "\n".join([*lines, "", paired.LEGEND])


def paired_latex(table: Table, rows: Sequence[paired.PairedRow]) -> str:
    if not rows:
        return ""
    n = len(table.columns)
    lines = [
        f"% {paired.title(table)}: {table.title}",
        "% " + paired.LEGEND,
        r"\begin{tabular}{l" + "r" * n + "}",
        r"\toprule",
        " & ".join(["", *(c.latex or _tex(c.label) for c in table.columns)]) + r" \\",
        r"\midrule",
    ]
    lines += [
        " & ".join([_tex(r.label), *(p.text().replace("—", "--") for p in r.columns)]) + r" \\"
        for r in rows
    ]
    return "\n".join([*lines, r"\bottomrule", r"\end{tabular}"])


CSV_FIELDS = (
    "table",
    "row",
    "column",
    "metric",
    "n",
    "expected",
    "failed",
    "mean",
    "std",
    "paper_mean",
    "paper_pm",
    "diff",
    "flagged",
    "note",
    # The row minus its CE row, paired by seed (`paired_rows`), on the non-CE row.
    "paired_vs",
    "paired_n",
    "paired_expected",
    "paired_mean",
    "paired_lo",
    "paired_hi",
    "paired_wins",
)


def csv_rows(table: Table, cells: list[list[Cell]]) -> list[dict]:
    out = []
    pairs = {r.row: r for r in paired_rows(table, cells)}
    for i, (row, row_cells) in enumerate(zip(table.rows, cells, strict=True)):
        for k, (col, c) in enumerate(zip(table.columns, row_cells, strict=True)):
            p = c.published
            out.append(_paired_fields(table, pairs.get(i), k))
            out[-1].update(dict(
                table=table.title, row=row.label, column=col.label, metric=col.metric, n=c.n,
                expected=c.expected, failed=c.failed, mean=c.mean, std=c.std,
                paper_mean=p.mean if p else None, paper_pm=p.pm if p else None, diff=c.diff,
                flagged=int(c.flagged), note=metrics.SCORES if c.scores and not c.n else "",
            ))  # fmt: skip
    return out


def _paired_fields(table: Table, row: paired.PairedRow | None, k: int) -> dict:
    """The paired_* CSV fields of column `k` of `row` (empty where the row has no CE row)."""
    if row is None:
        return {}
    p = row.columns[k]
    lo, hi = p.interval or (None, None)
    return dict(
        paired_vs=table.rows[row.base].label, paired_n=p.n, paired_expected=p.expected,
        paired_mean=p.mean, paired_lo=lo, paired_hi=hi, paired_wins=p.wins if p.n else None,
    )  # fmt: skip


def render(
    root: str,
    experiment: Experiment,
    fmt: str,
    warnings: set | None = None,
    view: View | None = None,
    tally: Tally | None = None,
) -> str:
    """Every table of `experiment` from the results under `root` (the runs `view` selects, with
    its overrides, named in a first line of markdown and LaTeX), in `fmt`; the damaged runs'
    reasons and one line for the runs without results (`Tally.summary`) are added to
    `warnings`."""
    tally = Tally() if tally is None else tally
    blocks = [
        (t, grid(root, e, t, warnings, view, tally))
        for e, tables, _ in experiment.sections()
        for t in tables
    ]
    if warnings is not None and tally.summary():
        warnings.add(tally.summary())
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for table, cells in blocks:
            writer.writerows(csv_rows(table, cells))
        return buffer.getvalue()
    fn, fn_paired = (markdown, paired_markdown) if fmt == "markdown" else (latex, paired_latex)
    selection = view.selection(root) if view else ""
    head = [(f"Shown: {selection}." if fmt == "markdown" else f"% Shown: {selection}.")]
    texts = [
        text
        for t, c in blocks
        for text in (fn(t, c), source_text(t, fmt), fn_paired(t, paired_rows(t, c)))
        if text
    ]
    return "\n\n".join(head * bool(selection) + texts) + "\n"


def report_runs(root: str, experiment: Experiment, view: View) -> list:
    """Every run of `experiment` that `view` selects, once, as the report shows it
    (`report.RunInfo`: its folder, its results, whether its cell counts it, a status line)."""
    from aepg_jax.tables import report

    out, seen = [], set()
    for run in experiment.runs():
        if run.name in seen or not view.selects(run):
            continue
        seen.add(run.name)
        changed = _changed(run, view.overrides)
        results = layout.run_results(root, run, changed)
        paths = [p for p in layout.result_paths(root, run, changed) if p.exists()]
        folder = next((p.parent for p in paths if layout.read_json(p) is not None), None)
        differs = other_config(run, results, view.overrides, root, changed)
        error = layout.run_error(root, run, changed)
        if results is None:
            status = f"failed: {error}" if error else "no results (not run yet, or running)"
        elif differs:
            status = f"of another config (differs in: {', '.join(differs)}); left out of its cell"
        else:
            a_t = layout.metric(results, "A_T")
            status = "done" + (f", A_T {a_t:.2f}" if a_t is not None else "")
        out.append(report.RunInfo(run, run.folder(changed), folder, results, not differs, status))
    return out


def report_page(
    root: str, experiment: Experiment, view: View | None = None, warnings: set | None = None
) -> str:
    """The sweep's report (`report.page`) of the runs `view` selects: every table's cells as
    `render` computes them, every run's files; the damaged runs' reasons are added to
    `warnings`."""
    from aepg_jax.tables import report

    view = view or View()
    warnings = set() if warnings is None else warnings
    tally = Tally()
    blocks = []
    for part, part_tables, _ in experiment.sections():
        for table in part_tables:
            raw = grid(root, part, table, warnings, view, tally)
            cells = [
                [
                    report.CellText(
                        ours_text(c), paper_text(c), diff_text(c), c.flagged, c.mean, c.std,
                        c.published.mean if c.published else None,
                        c.published.pm if c.published else None,
                        c.expected, tuple(sorted(r.seed for r in c.runs if r.seed is not None)),
                    )
                    for c in row
                ]
                for row in raw
            ]  # fmt: skip
            rows, cols = shown(table, raw)
            rest = rest_text(table, rows, cols)
            blocks.append(
                report.Block(part, table, cells, paired_rows(table, raw), rows, cols, rest)
            )
    if tally.summary():
        warnings.add(tally.summary())
    chosen = view.selection(root)
    selection = " · ".join(
        [f"overrides {' '.join(view.overrides)}"] * bool(view.overrides) + [chosen] * bool(chosen)
    )
    runs = report_runs(root, experiment, view)
    legends = (LEGEND, OURS_LEGEND)
    return report.page(root, experiment, blocks, runs, sorted(warnings), legends, selection)


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m aepg_jax.tables",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("dir", help="the sweep's directory (aepg_jax.sweep --workdir)")
    parser.add_argument("--experiment", help="default: the one the sweep of DIR recorded")
    parser.add_argument("--format", choices=FORMATS, default="markdown")
    parser.add_argument("--out", help="write the tables to this file (default: stdout)")
    parser.add_argument("--no_plots", action="store_true", help="skip the figure plots")
    parser.add_argument(
        "--html", help="also write the sweep's report to this file: one self-contained HTML page"
    )
    parser.add_argument(
        "--where",
        help="only the runs whose arguments match, as the sweep's, e.g. method=plain; default: "
        "the selection the sweeps of DIR recorded; --where= for every run",
    )
    parser.add_argument(
        "--no_overrides",
        action="store_true",
        help="the runs of the experiment's own configs, not those of the overrides DIR's last "
        "sweep recorded",
    )
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if not a.startswith("--config.")]
    if bad:
        parser.error(f"unrecognized arguments: {' '.join(bad)}")
    args.overrides = rest
    return args


def choose_overrides(root: str, args: argparse.Namespace) -> tuple[tuple[str, ...], str | None]:
    """(the overrides whose runs the tables show, a note naming them and the override sets
    `root` holds when it holds several): `--config.*` given here, else none with
    `--no_overrides`, else those of the last sweep of `root` (`sweep.json`)."""
    latest, sets = layout.sweep_overrides(root)
    chosen = tuple(args.overrides) if args.overrides else () if args.no_overrides else tuple(latest)
    if len(sets) < 2:
        shown = f"these tables show the runs of {' '.join(chosen)}" if chosen else None
        return chosen, shown
    names = "; ".join(" ".join(s) or "(none)" for s in sets)
    return chosen, (
        f"{root} holds runs of {len(sets)} override sets: {names}; these tables show "
        f"{' '.join(chosen) or '(none)'} (pass that set's --config.* flags, or --no_overrides "
        "for none, to show another)"
    )


def choose_where(root: str, args: argparse.Namespace, overrides: Sequence[str]) -> View:
    """The runs shown: `--where` given here ("" for all), else the selections the sweeps of
    `root` recorded with `overrides` (`layout.sweep_selection`)."""
    if args.where is not None:
        return View(tuple(overrides), args.where or None)
    recorded = layout.sweep_selection(root, overrides)
    return View(tuple(overrides), recorded, recorded is not None)


def main(argv: Sequence[str]) -> int:
    args = parse(argv)
    if not os.path.isdir(args.dir):
        what = "is not a directory" if os.path.exists(args.dir) else "does not exist"
        cli.fail(f"{args.dir} {what}: name the sweep's directory (aepg_jax.sweep --workdir).")
    name = args.experiment or layout.sweep_experiment(args.dir)
    if name is None:
        cli.fail(
            f"{args.dir} has no {layout.SWEEP_FILE} (no sweep ran there): name the "
            "experiment with --experiment=NAME."
        )
    try:
        experiment = registry.get(name)
    except ValueError as err:
        cli.fail(str(err))
    overrides, note = choose_overrides(args.dir, args)
    if note:
        print(f"note: {note}.", file=sys.stderr)
    unit = layout.Unit((experiment.runs()[0],))
    view = choose_where(args.dir, args, overrides)
    try:  # a misspelt override is one line, as in the sweep
        from aepg_jax.sweep import preflight

        preflight.load_config(unit.config_arg, unit.overrides(overrides))
        for where in view.wheres:
            if where and not experiments.filter_runs(experiment.runs(), where):
                raise ValueError(f"--where={where} matches none of {experiment.name}'s runs.")
    except ValueError as err:
        cli.fail(str(err))
    warnings: set[str] = set()
    text = render(args.dir, experiment, args.format, warnings, view)
    if args.format == "csv" and view.selection(args.dir):
        print(f"note: shown: {view.selection(args.dir)}.", file=sys.stderr)
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as err:
            cli.fail(f"--out={args.out} cannot be written ({err.strerror}); name a writable file.")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    if args.html:
        data = report_page(args.dir, experiment, view, warnings).encode("utf-8")
        try:
            with open(args.html, "wb") as f:
                f.write(data)
        except OSError as err:
            cli.fail(
                f"--html={args.html} cannot be written ({err.strerror}); name a writable file."
            )
        print(f"wrote {args.html} ({len(data) / 1e3:.0f} kB)", file=sys.stderr)
    for problem in sorted(warnings):
        print(f"warning: {problem}.", file=sys.stderr)
    results_of = shown_results(args.dir, view)
    if not args.no_plots:
        from aepg_jax.tables import plots

        for path in plots.write_plots(args.dir, experiment, results_of):
            print(f"plot: {path}", file=sys.stderr)
    if not any(results_of(run) is not None for run in experiment.runs()):
        print(
            f"error: no run shown has results in {args.dir} yet (aepg_jax.sweep --status lists "
            "the runs).",
            file=sys.stderr,
        )
        return 1
    return 0
