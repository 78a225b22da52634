"""Paired comparisons of a loss against cross-entropy, seed by seed.

Where two rows of a table differ only in their `loss` (`LAE` with `loss=ce`, `LAE + aEPG` with
`loss=aepg`), their runs share everything else: seed, class order, initial weights. For each
column, the runs of the two cells are paired by that identity (`pair_key`: the run's config,
arguments and overrides but its loss), and the table reports the paired difference
d_s = x_s(loss) - x_s(CE) over the n seeds that both finished:

    mean   d̄ = (1/n) Σ_s d_s
    95% CI d̄ ± t_{0.975, n-1} · sd(d) / √n      (Student t, sample sd; none for n < 2)
    wins   #{s : d_s better}                    (higher accuracy; lower ECE, NLL, forgetting)

A figure that is null by design (`calibration_note`: scores, not probabilities) has no value
in its cell and pairs with nothing. `t_quantile` is exact for integer degrees of freedom
(Abramowitz & Stegun 26.7.3, solved by bisection), so no statistics package is needed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from aepg_jax.experiments import Run, Table

LOSS = "loss"
BASELINE = "ce"
LEVEL = 0.95
# Metrics where smaller is better: a win is a negative difference.
LOWER_IS_BETTER = frozenset({"ece_T", "nll_T", "forgetting", "forgetting_stepwise"})
LOSS_NAMES = {"aepg": "aEPG", "epg": "EPG", "ce": "CE"}


def t_two_sided(t: float, df: int) -> float:
    """P(|T| <= t) for Student's T with integer `df` >= 1 degrees of freedom (A&S 26.7.3):
    with θ = atan(t/√df), odd df: (2/π)(θ + sin θ Σ_k a_k cos^(2k+1) θ), a_0 = 1,
    a_k = a_{k-1}·2k/(2k+1), k < (df-1)/2; even df: sin θ Σ_k b_k cos^(2k) θ, b_0 = 1,
    b_k = b_{k-1}(2k-1)/(2k), k < df/2."""
    if df < 1:
        raise ValueError(f"Student t needs df >= 1, got {df}.")
    theta = math.atan(abs(t) / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:
        total, term = 0.0, c
        for k in range((df - 1) // 2):
            if k:
                term *= c * c * (2 * k) / (2 * k + 1)
            total += term
        return (2 / math.pi) * (theta + s * total) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0
    for k in range(df // 2):
        if k:
            term *= c * c * (2 * k - 1) / (2 * k)
        total += term
    return s * total


def t_quantile(p: float, df: int) -> float:
    """The `p`-quantile (0.5 < p < 1) of Student's t with integer `df`: the t at which
    P(|T| <= t) = 2p - 1, by bisection to 1e-12."""
    if not 0.5 < p < 1:
        raise ValueError(f"t_quantile wants 0.5 < p < 1, got {p}.")
    target, lo, hi = 2 * p - 1, 0.0, 1.0
    while t_two_sided(hi, df) < target:
        hi *= 2
    while hi - lo > 1e-12 * max(1.0, hi):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_two_sided(mid, df) < target else (lo, mid)
    return (lo + hi) / 2


@dataclasses.dataclass(frozen=True)
class Paired:
    """The per-seed differences `diffs` (other loss - CE, in seed order) of one column, with
    the number of pairs the two cells select (`expected`) and the metric's direction."""

    diffs: tuple[float, ...]
    expected: int
    lower_is_better: bool = False

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
        return t_quantile((1 + LEVEL) / 2, self.n - 1) * sd / math.sqrt(self.n)

    @property
    def interval(self) -> tuple[float, float] | None:
        h = self.half_width
        return None if h is None else (self.mean - h, self.mean + h)

    @property
    def wins(self) -> int:
        return sum(1 for d in self.diffs if (d < 0 if self.lower_is_better else d > 0))

    def text(self, decimals: int = 2) -> str:
        """`+1.20 [+0.31, +2.09] wins 4/5` (`(3/5 pairs)` while runs are missing; `—` with no
        pair finished)."""
        if not self.expected:
            return ""
        if self.mean is None:
            return f"— (0/{self.expected} pairs)"
        out = f"{self.mean:+.{decimals}f}"
        if self.interval is not None:
            lo, hi = self.interval
            out += f" [{lo:+.{decimals}f}, {hi:+.{decimals}f}]"
        out += f" wins {self.wins}/{self.n}"
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
        metric in LOWER_IS_BETTER,
    )


def title(table: Table) -> str:
    """`aEPG - CE (paired)` (every loss of `table`'s pairs against CE)."""
    losses = dict.fromkeys(str(table.rows[i].where[LOSS]) for _, i in row_pairs(table))
    names = " / ".join(LOSS_NAMES.get(lo, lo) for lo in losses)
    return f"{names} - CE (paired)"


LEGEND = (
    "paired: per seed, the row's value minus its CE row's (same seed and settings); mean over "
    "the seeds both finished [95% CI, Student t with n - 1 df] and wins: seeds where the row "
    "is better (higher accuracy; lower ECE, NLL, forgetting)."
)
