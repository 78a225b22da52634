"""An experiment's tables from a sweep's results, beside the paper's numbers.

    python -m aepg_jax.tables DIR [--experiment=NAME] [--format=markdown|latex|csv] [--out=FILE]

For every cell of the experiment's tables (the paper's, or the demo's): our mean ± sample
std over the finished runs (seeds) with their number n, the published mean ± as printed, and
Δ = ours - paper. A cell with runs missing shows how many are done (`3/5 done`) and how many
failed; a cell whose |Δ| > max(1, 2 x the paper's ±) is marked `(!)`. The experiment is the
one `aepg_jax.sweep` recorded in DIR unless `--experiment` names it. Figure experiments also
get their plots, written to `DIR/plots/`. A run whose results file cannot be
read (truncated, say) or holds a non-finite metric is named in one `warning:` line and counted
as failed in its cell; a run whose results were made with another config than the experiment's
(its saved config differs in a field that changes results; where the data is does not) is
named with those fields and left out of its cell (`k/n done, m of another config`); a run with
no results yet is named in its cell's `warning:` line. With any of these the command exits with
status 1 (the tables are printed all the same).
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
import sys
from collections.abc import Sequence

import numpy as np

from aepg_jax.experiments import Column, Experiment, Published, Row, Table, layout, registry
from aepg_jax.runs import identity
from aepg_jax.system import cli

FORMATS = ("markdown", "latex", "csv")
MARK = "(!)"
LEGEND = (
    "ours: mean ± std over seeds (n runs; `k/n done` while runs are missing); Δ = ours - paper; "
    f"{MARK}: |Δ| > max(1, 2 x paper ±)."
)


@dataclasses.dataclass(frozen=True)
class Cell:
    values: tuple[float, ...]  # one per finished run
    expected: int  # runs of the cell
    failed: int
    published: Published | None
    other: int = 0  # finished runs of another config than the experiment's: left out

    @property
    def n(self) -> int:
        return len(self.values)

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


def damage(root: str, run, results: dict | None, name: str) -> str | None:
    """Why `run`'s results are unusable for metric `name` (None when they are fine or the run
    is not finished): a results file that exists but cannot be read, or a non-finite value."""
    if results is None:
        unreadable = [p for p in layout.result_paths(root, run) if p.exists()]
        return f"{unreadable[0]} cannot be read as a results object" if unreadable else None
    value = results.get(name)
    finite = isinstance(value, int | float) and math.isfinite(value)
    if name in results and not finite:  # NaN / inf are written as null (runs/records.py)
        return f"{run.name}: {name} is {value} (not finite)"
    return None


def cell(
    root: str, experiment: Experiment, table: Table, row: Row, col: Column, warnings=None
) -> Cell:
    """The runs of (row, col) and the metric of those that are finished; a damaged run
    (`damage`) counts as failed and its reason is added to `warnings` (a set)."""
    where = {**row.where, **col.where}
    runs = experiment.select(where)
    values, failed, other = [], 0, 0
    missing = []
    for run in runs:
        results = layout.run_results(root, run)
        changed = other_config(run, results)
        if changed:
            other += 1
            if warnings is not None:
                warnings.add(
                    f"{run.name}: its results are of another config than the experiment's "
                    f"(differs in: {', '.join(changed)}); left out of its cell: run the sweep "
                    "again with --rerun_changed"
                )
            continue
        value = None if results is None else layout.metric(results, col.metric)
        problem = damage(root, run, results, col.metric) if value is None else None
        if value is not None:
            values.append(value)
        elif problem is not None:
            failed += 1
            if warnings is not None:
                warnings.add(f"{problem}; counted as failed")
        elif results is None and layout.run_error(root, run) is not None:
            failed += 1
        elif results is None:
            missing.append(run.name)
    if missing and warnings is not None:
        warnings.add(
            f"{len(missing)} of the runs of cell ({row.label}, {col.label}) have no results "
            f"(not run yet, or running): {', '.join(missing)}"
        )
    return Cell(tuple(values), len(runs), failed, table.published(row, col), other)


@functools.cache
def _expected(run) -> dict | None:
    """The config of `run` as the experiment defines it (JSON), None if it does not build."""
    from aepg_jax.sweep import preflight

    unit = layout.Unit((run,))
    try:
        cfg = preflight.load_config(unit.config_arg, unit.overrides())
    except ValueError:
        return None
    return json.loads(cfg.to_json_best_effort())


def other_config(run, results: dict | None) -> list[str]:
    """The fields in which the config `results` were made with differs from the experiment's
    config of `run` ([] when they agree, or either is unknown)."""
    saved = (results or {}).get("config")
    expected = _expected(run) if isinstance(saved, dict) else None
    return identity.differences(saved, expected) if expected is not None else []


def grid(root: str, experiment: Experiment, table: Table, warnings=None) -> list[list[Cell]]:
    return [
        [cell(root, experiment, table, r, c, warnings) for c in table.columns] for r in table.rows
    ]


def _num(x: float, d: int, sign: bool = False) -> str:
    return f"{x:+.{d}f}" if sign else f"{x:.{d}f}"


def ours_text(c: Cell, pm: str = "±") -> str:
    d = c.decimals()
    if c.mean is None:
        text = "—"
    else:
        text = _num(c.mean, d) + (f" {pm} {_num(c.std, d)}" if c.std is not None else "")
    if c.n == c.expected and c.expected:
        return f"{text} (n={c.n})"
    status = f"{c.n}/{c.expected} done" + (f", {c.failed} failed" if c.failed else "")
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


def markdown(table: Table, cells: list[list[Cell]]) -> str:
    head = [""] + [f"{c.label} {part}" for c in table.columns for part in ("ours", "paper", "Δ")]
    lines = [f"### {table.title}", "", "| " + " | ".join(head) + " |"]
    lines.append("|---" + "|---:" * (len(head) - 1) + "|")
    for row, row_cells in zip(table.rows, cells, strict=True):
        parts = [row.label]
        for c in row_cells:
            parts += [ours_text(c), paper_text(c), diff_text(c)]
        lines.append("| " + " | ".join(parts) + " |")
    return "\n".join([*lines, "", LEGEND])


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
    n = len(table.columns)
    lines = [
        f"% {table.title}" + (f" (paper: {table.label})" if table.label else ""),
        "% " + LEGEND.replace("`", ""),
        r"\begin{tabular}{l" + "rrr" * n + "}",
        r"\toprule",
        " & ".join(
            [""] + [rf"\multicolumn{{3}}{{c}}{{{c.latex or _tex(c.label)}}}" for c in table.columns]
        )
        + r" \\",
        " ".join(rf"\cmidrule(lr){{{2 + 3 * i}-{4 + 3 * i}}}" for i in range(n)),
        " & ".join(["Method"] + ["ours", "paper", r"$\Delta$"] * n) + r" \\",
        r"\midrule",
    ]
    for row, row_cells in zip(table.rows, cells, strict=True):
        parts = [_tex(row.label)]
        for c in row_cells:
            ours = ours_text(c, r"$\pm$").replace("—", "--")
            parts += [ours, paper_text(c, r"$\pm$"), diff_text(c)]
        lines.append(" & ".join(parts) + r" \\")
    lines += [r"\bottomrule", r"\end{tabular}"]
    return "\n".join(lines)


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
)


def csv_rows(table: Table, cells: list[list[Cell]]) -> list[dict]:
    out = []
    for row, row_cells in zip(table.rows, cells, strict=True):
        for col, c in zip(table.columns, row_cells, strict=True):
            p = c.published
            out.append(dict(
                table=table.title, row=row.label, column=col.label, metric=col.metric, n=c.n,
                expected=c.expected, failed=c.failed, mean=c.mean, std=c.std,
                paper_mean=p.mean if p else None, paper_pm=p.pm if p else None, diff=c.diff,
                flagged=int(c.flagged),
            ))  # fmt: skip
    return out


def render(root: str, experiment: Experiment, fmt: str, warnings: set | None = None) -> str:
    """Every table of `experiment` from the results under `root`, in `fmt`; the damaged runs'
    reasons are added to `warnings`."""
    blocks = [
        (t, grid(root, e, t, warnings)) for e, tables, _ in experiment.sections() for t in tables
    ]
    if fmt == "csv":
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, CSV_FIELDS, lineterminator="\n")
        writer.writeheader()
        for table, cells in blocks:
            writer.writerows(csv_rows(table, cells))
        return buffer.getvalue()
    fn = markdown if fmt == "markdown" else latex
    return "\n\n".join(fn(t, c) for t, c in blocks) + "\n"


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
    return parser.parse_args(argv)


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
    warnings: set[str] = set()
    text = render(args.dir, experiment, args.format, warnings)
    if args.out:
        try:
            with open(args.out, "w") as f:
                f.write(text)
        except OSError as err:
            cli.fail(f"--out={args.out} cannot be written ({err.strerror}); name a writable file.")
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    for problem in sorted(warnings):
        print(f"warning: {problem}.", file=sys.stderr)
    if not args.no_plots:
        from aepg_jax.tables import plots

        for path in plots.write_plots(args.dir, experiment):
            print(f"plot: {path}", file=sys.stderr)
    return 1 if warnings else 0

