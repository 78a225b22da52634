"""Paired comparisons of aEPG against CE in `aepg_jax.tables` (`tables/paired.py`): the Student
t quantile against printed tables, and the paired column (from single runs or from the seeds
of vmapped programs) of a fake results tree (results.json
files as a sweep leaves them) against a hand computation, in markdown, CSV, LaTeX and the
report page's forest plot."""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib

import numpy as np
import pytest

from aepg_jax.experiments import Column, Experiment, Grid, Row, Table, layout
from aepg_jax.tables import paired, tables

# Student's t_{0.975, df}, the textbook quantiles (to 1e-11), and the 95% intervals the
# project's paired column has always printed for three sets of differences.
T_975 = {1: 12.706204736172367, 2: 4.302652729749752, 3: 3.1824463052844294,
         4: 2.776445105198036, 5: 2.570581835635494, 6: 2.4469118511451597,
         7: 2.3646242515924314, 8: 2.306004135204603, 9: 2.2621571627978483,
         10: 2.2281388519868415, 30: 2.042272456300452, 60: 2.0002978220136356}  # fmt: skip
INTERVALS = {
    (1.0, 3.0, -0.5): (-3.1953358009011907, 5.528669134234525),
    (-2.0, 1.0): (-19.559307104258547, 18.559307104258547),
    (0.25, -1.5, 2.0, 0.75, 1.125): (-1.089461646996912, 2.139461646996912),
}


@pytest.mark.parametrize("df", sorted(T_975))
def test_the_interval_uses_the_textbook_t_quantile(df):
    d = [float(i * i % 7) for i in range(df + 1)]  # n = df + 1 pairs, not all equal
    p = paired.Paired(tuple(d), len(d))
    scale = float(np.std(d, ddof=1)) / math.sqrt(len(d))
    assert p.half_width / scale == pytest.approx(T_975[df], abs=1e-9)


@pytest.mark.parametrize("diffs", sorted(INTERVALS))
def test_paired_intervals_are_unchanged(diffs):
    lo, hi = paired.Paired(diffs, len(diffs)).interval
    assert (lo, hi) == pytest.approx(INTERVALS[diffs], abs=1e-9)


EXPERIMENT = Experiment(
    "fake_paired",
    "fake paired",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0/1/2")],
    [
        Table(
            "Fake paired",
            columns=[
                Column("A_5", {}, "A_T"), Column("ECE_5", {}, "ece_T"), Column("H_5", {}, "H_T"),
            ],
            rows=[Row("LoRA", {"loss": "ce"}), Row("LoRA + aEPG", {"loss": "aepg"})],
            source="a reprint",
        )
    ],
)  # fmt: skip
# (A_T, ece_T, entropy after the last task) per (loss, seed); aEPG seed 2's ECE is null by
# design (scores, not probabilities), so ECE pairs seeds 0 and 1 only.
VALUES = {
    ("ce", 0): (60.0, 10.0, 0.5),
    ("ce", 1): (62.0, 12.0, 0.75),
    ("ce", 2): (58.0, 9.0, 0.5),
    ("aepg", 0): (61.0, 8.0, 1.0),
    ("aepg", 1): (65.0, 13.0, 1.5),
    ("aepg", 2): (57.5, None, 1.25),
}


def write_tree(root: pathlib.Path, vmapped: tuple[str, ...] = ()) -> None:
    """The results a sweep leaves: one run folder per run, or for the losses in `vmapped`
    one program per cell holding its seeds (`seed_<s>/results.json`)."""
    for unit in layout.units(EXPERIMENT.runs(), vmap_seeds=True):
        own = [root / r.name / "results.json" for r in unit.runs]
        files = unit.result_files(root) if unit.runs[0].value("loss") in vmapped else own
        for run, path in zip(unit.runs, files, strict=True):
            _write_results(path, run)


def _write_results(path: pathlib.Path, run) -> None:
    a_t, ece, entropy = VALUES[(run.value("loss"), run.seed)]
    results = {"A_T": a_t, "ece_T": ece, "entropy": [2.0, entropy]}
    if ece is None:
        results["calibration_note"] = "scores, not probabilities: test"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(results))


def test_the_paired_column_of_a_fake_tree_is_the_hand_computation(tmp_path):
    write_tree(tmp_path)
    # A_T: d = (+1, +3, -0.5), mean 7/6, sd 1.7559, half width t(0.975, 2) sd / sqrt 3.
    d = [1.0, 3.0, -0.5]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = T_975[2] * sd / math.sqrt(3)
    # ECE (lower is better): d = (-2, +1), seed 2 unpaired; half width t(0.975, 1) sd / sqrt 2.
    e_mean, e_half = -0.5, T_975[1] * math.sqrt(4.5) / math.sqrt(2)
    # H_T (no better direction: no wins): d = (+0.5, +0.75, +0.75).
    h_mean, h_half = 2 / 3, T_975[2] * math.sqrt(1 / 48) / math.sqrt(3)

    text = tables.render(str(tmp_path), EXPERIMENT, "markdown")
    line = next(x for x in text.splitlines() if x.startswith("| LoRA: aEPG - CE |"))
    assert line == (
        f"| LoRA: aEPG - CE | {mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] wins 2/3 "
        f"| {e_mean:+.2f} [{e_mean - e_half:+.2f}, {e_mean + e_half:+.2f}] wins 1/2 (2/3 pairs) "
        f"| {h_mean:+.2f} [{h_mean - h_half:+.2f}, {h_mean + h_half:+.2f}] |"
    )
    assert "#### aEPG - CE (paired): Fake paired" in text
    assert "\nPublished cells: a reprint\n" in text

    rows = list(csv.DictReader(io.StringIO(tables.render(str(tmp_path), EXPERIMENT, "csv"))))
    a_t, ece, h_t = (r for r in rows if r["row"] == "LoRA + aEPG")
    assert a_t["paired_vs"] == "LoRA" and a_t["paired_n"] == "3" and a_t["paired_wins"] == "2"
    assert float(a_t["paired_mean"]) == pytest.approx(mean)
    assert float(a_t["paired_lo"]) == pytest.approx(mean - half)
    assert float(a_t["paired_hi"]) == pytest.approx(mean + half)
    assert (ece["paired_n"], ece["paired_expected"], ece["paired_wins"]) == ("2", "3", "1")
    assert float(ece["paired_hi"]) == pytest.approx(e_mean + e_half)
    assert (h_t["metric"], h_t["paired_n"], h_t["paired_wins"]) == ("H_T", "3", "")
    assert float(h_t["paired_lo"]) == pytest.approx(h_mean - h_half)
    assert all(r["paired_vs"] == "" for r in rows if r["row"] == "LoRA")

    latex = tables.render(str(tmp_path), EXPERIMENT, "latex")
    assert f"LoRA: aEPG - CE & {mean:+.2f} [" in latex
    assert f"& {h_mean:+.2f} [{h_mean - h_half:+.2f}, {h_mean + h_half:+.2f}] \\\\" in latex
    assert latex.count(r"\begin{tabular}") == 2

    page = tables.report_page(str(tmp_path), EXPERIMENT, tables.View())
    assert "published cells: a reprint" in page
    assert page.count('class="chart forest"') == 1  # one per table, a panel per column
    assert f"LoRA: aEPG - CE · A_5: {mean:+.2f}" in page
    h_cell = f"<td>{h_mean:+.2f} [{h_mean - h_half:+.2f}, {h_mean + h_half:+.2f}]</td>"
    assert h_cell in page  # the paired table's entropy cell, without wins
    # Wins: A_5's and ECE_5's, once in the paired table and once in the forest plot each.
    assert page.count("wins ") == 4 and page.count("wins 2/3") == 2


@pytest.mark.parametrize("vmapped", [("ce",), ("ce", "aepg")], ids=["ce", "both"])
def test_the_seeds_of_a_vmapped_program_pair_as_its_single_runs(tmp_path, vmapped):
    write_tree(tmp_path / "single")
    write_tree(tmp_path / "vmapped", vmapped)
    assert (tmp_path / "vmapped/demo/loss=ce,method=plain,seeds=0-2/seed_2/results.json").is_file()
    assert not (tmp_path / "vmapped/demo/loss=ce,method=plain,seed=0").exists()
    for fmt in ("csv", "latex", "markdown"):
        single = tables.render(str(tmp_path / "single"), EXPERIMENT, fmt)
        assert tables.render(str(tmp_path / "vmapped"), EXPERIMENT, fmt) == single
    assert "| LoRA | 60.0 ± 2.0 (n=3) |" in single


def test_rows_pair_only_when_they_differ_in_the_loss_alone():
    table = Table(
        "t",
        rows=[
            Row("a", {"method": "lae", "loss": "ce"}),
            Row("b", {"method": "lae", "loss": "aepg"}),
            Row("c", {"method": "plain", "loss": "aepg"}),  # no CE row of its own
            Row("d", {"method": "plain", "peft": "lora"}),
        ],
        columns=[Column("A", {}, "A_T")],
    )
    assert paired.row_pairs(table) == [(0, 1)]
    assert paired.title(table) == "aEPG - CE (paired)"
    assert paired.pair_label("LAE", "LAE + aEPG") == "LAE: aEPG - CE"
    assert paired.pair_label("CE", "LoRA_aEPG") == "LoRA_aEPG - CE"
    none_yet = paired.Paired((), 3)
    assert none_yet.text() == "— (0/3 pairs)" and none_yet.interval is None
    one = paired.Paired((2.0,), 1)
    assert one.text() == "+2.00 wins 1/1" and one.interval is None
