"""Paired comparisons of aEPG against CE in `aepg_jax.tables` (`tables/paired.py`): the Student
t quantile against printed tables, and the paired column of a fake results tree (results.json
files as a sweep leaves them) against a hand computation, in markdown, CSV, LaTeX and the
report page's forest plot."""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib

import pytest

from aepg_jax.experiments import Column, Experiment, Grid, Row, Table
from aepg_jax.tables import paired, tables

# t_{0.975, df} as printed in every statistics table (3 decimals).
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 9: 2.262, 10: 2.228, 20: 2.086,
         29: 2.045, 30: 2.042}  # fmt: skip


@pytest.mark.parametrize("df", sorted(T_975))
def test_t_quantile_matches_printed_tables(df):
    assert paired.t_quantile(0.975, df) == pytest.approx(T_975[df], abs=6e-4)


def test_t_quantile_other_levels_and_bad_input():
    assert paired.t_quantile(0.95, 1) == pytest.approx(6.314, abs=6e-4)  # one-sided 95%
    assert paired.t_quantile(0.995, 4) == pytest.approx(4.604, abs=6e-4)
    assert paired.t_two_sided(0.0, 3) == 0.0
    with pytest.raises(ValueError, match="df >= 1"):
        paired.t_two_sided(1.0, 0)
    with pytest.raises(ValueError, match=r"0\.5 < p < 1"):
        paired.t_quantile(0.4, 3)


EXPERIMENT = Experiment(
    "fake_paired",
    "fake paired",
    [Grid("configs/demo.py", "method=plain,loss=ce/aepg,seed=0/1/2")],
    [
        Table(
            "Fake paired",
            columns=[Column("A_5", {}, "A_T"), Column("ECE_5", {}, "ece_T")],
            rows=[Row("LoRA", {"loss": "ce"}), Row("LoRA + aEPG", {"loss": "aepg"})],
            source="a reprint",
        )
    ],
)
# (A_T, ece_T) per (loss, seed); aEPG seed 2's ECE is null by design (scores, not
# probabilities), so ECE pairs seeds 0 and 1 only.
VALUES = {
    ("ce", 0): (60.0, 10.0),
    ("ce", 1): (62.0, 12.0),
    ("ce", 2): (58.0, 9.0),
    ("aepg", 0): (61.0, 8.0),
    ("aepg", 1): (65.0, 13.0),
    ("aepg", 2): (57.5, None),
}


def write_tree(root: pathlib.Path) -> None:
    for run in EXPERIMENT.runs():
        a_t, ece = VALUES[(run.value("loss"), run.seed)]
        results = {"A_T": a_t, "ece_T": ece}
        if ece is None:
            results["calibration_note"] = "scores, not probabilities: test"
        (root / run.name).mkdir(parents=True)
        (root / run.name / "results.json").write_text(json.dumps(results))


def test_the_paired_column_of_a_fake_tree_is_the_hand_computation(tmp_path):
    write_tree(tmp_path)
    # A_T: d = (+1, +3, -0.5), mean 7/6, sd 1.7559, half width t(0.975, 2) sd / sqrt 3.
    d = [1.0, 3.0, -0.5]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)
    # ECE (lower is better): d = (-2, +1), seed 2 unpaired; half width t(0.975, 1) sd / sqrt 2.
    e_mean, e_half = -0.5, 12.706204736174705 * math.sqrt(4.5) / math.sqrt(2)

    text = tables.render(str(tmp_path), EXPERIMENT, "markdown")
    line = next(x for x in text.splitlines() if x.startswith("| LoRA: aEPG - CE |"))
    assert line == (
        f"| LoRA: aEPG - CE | {mean:+.2f} [{mean - half:+.2f}, {mean + half:+.2f}] wins 2/3 "
        f"| {e_mean:+.2f} [{e_mean - e_half:+.2f}, {e_mean + e_half:+.2f}] wins 1/2 (2/3 pairs) |"
    )
    assert "#### aEPG - CE (paired): Fake paired" in text
    assert "\nPublished cells: a reprint\n" in text

    rows = list(csv.DictReader(io.StringIO(tables.render(str(tmp_path), EXPERIMENT, "csv"))))
    a_t, ece = (r for r in rows if r["row"] == "LoRA + aEPG")
    assert a_t["paired_vs"] == "LoRA" and a_t["paired_n"] == "3" and a_t["paired_wins"] == "2"
    assert float(a_t["paired_mean"]) == pytest.approx(mean)
    assert float(a_t["paired_lo"]) == pytest.approx(mean - half)
    assert float(a_t["paired_hi"]) == pytest.approx(mean + half)
    assert (ece["paired_n"], ece["paired_expected"], ece["paired_wins"]) == ("2", "3", "1")
    assert float(ece["paired_hi"]) == pytest.approx(e_mean + e_half)
    assert all(r["paired_vs"] == "" for r in rows if r["row"] == "LoRA")

    latex = tables.render(str(tmp_path), EXPERIMENT, "latex")
    assert f"LoRA: aEPG - CE & {mean:+.2f} [" in latex
    assert latex.count(r"\begin{tabular}") == 2

    page = tables.report_page(str(tmp_path), EXPERIMENT, tables.View())
    assert "published cells: a reprint" in page
    assert page.count('class="chart forest"') == 1  # one per table, a panel per column
    assert f"LoRA: aEPG - CE · A_5: {mean:+.2f}" in page


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
