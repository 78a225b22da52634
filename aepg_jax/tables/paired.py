"""Paired comparisons of a loss against cross-entropy, seed by seed.

Where two rows of a table differ only in their `loss` (`LAE` with `loss=ce`, `LAE + aEPG` with
`loss=aepg`), their runs share everything else: seed, class order, initial weights. For each
column, the runs of the two cells are paired by that identity (`pair_key`: the run's config,
arguments and overrides but its loss; a seed of a vmapped program pairs as its single run), and
the table reports the paired difference d_s = x_s(loss) - x_s(CE) over the n seeds that both
finished:

    mean   d̄ = (1/n) Σ_s d_s
    95% CI d̄ ± t_{0.975, n-1} · sd(d) / √n      (Student t, sample sd; none for n < 2)
    wins   #{s : d_s better}                    (higher accuracy; lower ECE, NLL, forgetting)

Wins are counted only for a metric with a better direction (`HIGHER_IS_BETTER`,
`LOWER_IS_BETTER`); an entropy, or any metric declared neither, shows the mean and interval
alone. A figure that is null by design (`calibration_note`: scores, not probabilities) has no
value in its cell and pairs with nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import scipy.stats

from aepg_jax.experiments import Run, Table

LOSS = "loss"
BASELINE = "ce"
LEVEL = 0.95
# Metrics with a better direction: a win is a positive (higher) or negative (lower) difference.
# Any other metric (H_T, test_entropy_T: no entropy is better) counts no wins.
HIGHER_IS_BETTER = frozenset({
    "A_T", "avg_inc_acc", "acc_pooled_T", "task_incremental_A_T", "task_incremental_avg_inc_acc",
    "best_test_acc", "bwt",
})  # fmt: skip
LOWER_IS_BETTER = frozenset({"ece_T", "nll_T", "forgetting", "forgetting_stepwise"})
LOSS_NAMES = {"aepg": "aEPG", "epg": "EPG", "ce": "CE"}


@dataclasses.dataclass(frozen=True)
class Paired:
    """The per-seed differences `diffs` (other loss - CE, in seed order) of one column, with
    the number of pairs the two cells select (`expected`) and the metric's direction (`better`:
    +1 higher is better, -1 lower, 0 neither: no wins)."""

    diffs: tuple[float, ...]
    expected: int
    better: int = 1

    @property
    def n(self) -> int:
        return len(self.diffs)

    @property
    def mean(self) -> float | None:
        return float(np.mean(self.diffs)) if self.diffs else None

    @property
    def half_width(self) -> float | None:
        """t_{0.975, n-1} · sd / √n (None for fewer than two pairs)."""
        if self.n < 2:
            return None
        sd = float(np.std(self.diffs, ddof=1))
        return float(scipy.stats.t.ppf((1 + LEVEL) / 2, self.n - 1)) * sd / math.sqrt(self.n)

    @property
    def interval(self) -> tuple[float, float] | None:
        h = self.half_width
        return None if h is None else (self.mean - h, self.mean + h)

    @property
    def wins(self) -> int | None:
        """The seeds whose difference is better; None for a metric with no better direction."""
        return sum(1 for d in self.diffs if d * self.better > 0) if self.better else None

    @property
    def wins_text(self) -> str:
        """`wins 4/5`; "" where wins are not counted."""
        return "" if self.wins is None else f"wins {self.wins}/{self.n}"

    def text(self, decimals: int = 2) -> str:
        """`+1.20 [+0.31, +2.09] wins 4/5` (no wins where the metric has no better direction;
        `(3/5 pairs)` while runs are missing; `—` with no pair finished)."""
        if not self.expected:
            return ""
        if self.mean is None:
            return f"— (0/{self.expected} pairs)"
        out = f"{self.mean:+.{decimals}f}"
        if self.interval is not None:
            lo, hi = self.interval
            out += f" [{lo:+.{decimals}f}, {hi:+.{decimals}f}]"
        out += f" {self.wins_text}" if self.wins_text else ""
        return out + (f" ({self.n}/{self.expected} pairs)" if self.n < self.expected else "")


@dataclasses.dataclass(frozen=True)
class PairedRow:
    """A row of a table against its CE row (`row_pairs`; `base`, `row`: their indices) with
    each column's paired differences."""

    base: int
    row: int
    label: str
    columns: tuple[Paired, ...]


def pair_label(base: str, other: str) -> str:
    """`LAE: aEPG - CE` for the rows `LAE` and `LAE + aEPG`; `<other> - <base>` otherwise."""
    extra = other[len(base) :].strip(" +") if other.startswith(base) else ""
    return f"{base}: {extra} - CE" if extra else f"{other} - {base}"


def pair_key(run: Run) -> tuple:
    """What a run shares with its counterpart of another loss: all but its loss."""
    return (run.config, tuple(sorted(kv for kv in run.args if kv[0] != LOSS)), run.overrides)


def row_pairs(table: Table) -> list[tuple[int, int]]:
    """(CE row, other row) index pairs of `table`: rows whose selections differ only in their
    `loss`, the first with `loss=ce`."""

    def rest(where: Mapping[str, Any]) -> tuple:
        return tuple(sorted((k, str(v)) for k, v in where.items() if k != LOSS))

    baselines: dict[tuple, int] = {}
    for i, r in enumerate(table.rows):  # the first CE row of its settings
        if str(r.where.get(LOSS)) == BASELINE:
            baselines.setdefault(rest(r.where), i)
    out = []
    for i, r in enumerate(table.rows):
        loss = r.where.get(LOSS)
        if loss is None or str(loss) == BASELINE:
            continue
        j = baselines.get(rest(r.where))
        if j is not None:
            out.append((j, i))
    return out


def compare(
    base: Sequence[tuple[Run, float]],
    other: Sequence[tuple[Run, float]],
    selected: tuple[Sequence[Run], Sequence[Run]],
    metric: str,
) -> Paired:
    """The paired differences of one column: `other`'s value minus `base`'s for every run of
    each with the same `pair_key` (finished (run, value) pairs); `selected`: every run each
    cell selects (the pairs expected)."""
    base_by = {pair_key(r): v for r, v in base}
    diffs = [
        (r.seed if r.seed is not None else -1, v - base_by[pair_key(r)])
        for r, v in other
        if pair_key(r) in base_by
    ]
    expected = len({pair_key(r) for r in selected[0]} & {pair_key(r) for r in selected[1]})
    return Paired(
        tuple(d for _, d in sorted(diffs, key=lambda sd: sd[0])),
        expected,
        direction(metric),
    )


def direction(metric: str) -> int:
    """+1 where a higher `metric` is better, -1 where lower is, 0 where neither is declared."""
    return 1 if metric in HIGHER_IS_BETTER else -1 if metric in LOWER_IS_BETTER else 0


def title(table: Table) -> str:
    """`aEPG - CE (paired)` (every loss of `table`'s pairs against CE)."""
    losses = dict.fromkeys(str(table.rows[i].where[LOSS]) for _, i in row_pairs(table))
    names = " / ".join(LOSS_NAMES.get(lo, lo) for lo in losses)
    return f"{names} - CE (paired)"


LEGEND = (
    "paired: per seed, the row's value minus its CE row's (same seed and settings); mean over "
    "the seeds both finished [95% CI, Student t with n - 1 df] and wins: seeds where the row "
    "is better (higher accuracy; lower ECE, NLL, forgetting), none for entropies and other "
    "metrics with no better direction."
)
