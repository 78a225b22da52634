"""Small inline-SVG charts for the sweep report (`report.py`): line charts with a band over seeds,
an accuracy-matrix heatmap, and a dot chart of ours beside the published numbers. Each function
returns one `<svg>` element as text, self-contained (no script, no external reference), sized
by its `viewBox` so that it scales to the page's width."""

from __future__ import annotations

import dataclasses
import html
import math
from collections.abc import Sequence

import numpy as np

PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
# viridis at 0, 0.25, 0.5, 0.75, 1 (matplotlib's), interpolated linearly in RGB
VIRIDIS = ((68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37))
FONT = 11
MARGIN = (44, 12, 26, 36)  # left, right, top (title), bottom (x label)


@dataclasses.dataclass(frozen=True)
class Series:
    """One line of a chart: `y` against `x` (NaN breaks the line); `lo`/`hi` a shaded band
    (mean ± std over seeds, say); `points` draws markers, `line` the polyline."""

    label: str
    x: Sequence[float]
    y: Sequence[float]
    lo: Sequence[float] | None = None
    hi: Sequence[float] | None = None
    points: bool = False
    line: bool = True
    dashed: bool = False
    color: str | None = None


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _n(x: float) -> str:
    """A coordinate: one decimal, no trailing zeros."""
    return f"{x:.1f}".rstrip("0").rstrip(".")


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values in [lo, hi] (steps of 1, 2 or 5 x 10^k), as close to `count` of them
    as such steps allow."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    power = 10 ** math.floor(math.log10((hi - lo) / max(count - 1, 1)))
    steps = [m * power for m in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50)]

    def number(step: float) -> int:
        return math.floor(hi / step + 1e-9) - math.ceil(lo / step - 1e-9) + 1

    step = min(steps, key=lambda st: (abs(number(st) - count), -st))
    first = math.ceil(lo / step - 1e-9)
    return [round((first + k) * step, 10) for k in range(number(step))]


def _tick_text(value: float) -> str:
    return f"{value:.6g}"


def _extent(values: Sequence[float], pad: float = 0.0) -> tuple[float, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    lo, hi = min(finite), max(finite)
    if hi == lo:
        lo, hi = lo - (abs(lo) * 0.1 or 0.5), hi + (abs(hi) * 0.1 or 0.5)
    span = hi - lo
    return lo - pad * span, hi + pad * span


def _open(width: int, height: int, title: str, cls: str) -> list[str]:
    return [
        f'<svg class="{esc(cls)}" viewBox="0 0 {width} {height}" role="img" '
        f'font-family="sans-serif" font-size="{FONT}">',
        f"<title>{esc(title)}</title>",
        f'<text x="{width / 2:.0f}" y="14" text-anchor="middle" font-weight="bold">'
        f"{esc(title)}</text>",
    ]


def _paths(xs: np.ndarray, ys: np.ndarray) -> list[str]:
    """Polyline point lists of the finite runs of (xs, ys)."""
    out, current = [], []
    for x, y in zip(xs, ys, strict=True):
        if math.isfinite(x) and math.isfinite(y):
            current.append(f"{_n(x)},{_n(y)}")
        elif current:
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return out


def chart(
    series: Sequence[Series],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = None,
    vlines: Sequence[float] = (),
    diagonal: bool = False,
    width: int = 440,
    height: int = 270,
    cls: str = "chart",
) -> str:
    """A line chart of `series` (each with an optional band), axes with round ticks, dashed
    vertical lines at `vlines` (task boundaries), the diagonal y = x when `diagonal`, and a
    legend below the plot area when any series has a label."""
    labelled = [s for s in series if s.label]
    legend_rows = math.ceil(len(labelled) / 2)
    height += 14 * legend_rows
    left, right, top, bottom = MARGIN
    bottom += 14 * legend_rows
    pw, ph = width - left - right, height - top - bottom
    xs_all = [v for s in series for v in s.x]
    ys_all = [v for s in series for v in s.y]
    for s in series:
        ys_all += [v for band in (s.lo, s.hi) if band is not None for v in band]
    x0, x1 = xlim or _extent(xs_all)
    y0, y1 = ylim or _extent(ys_all, pad=0.05)

    def sx(v):
        return left + (np.asarray(v, float) - x0) / (x1 - x0) * pw

    def sy(v):
        return top + ph - (np.asarray(v, float) - y0) / (y1 - y0) * ph

    out = _open(width, height, title, cls)
    out.append('<g stroke="#ddd" stroke-width="0.6">')
    for t in ticks(y0, y1):
        out.append(f'<line x1="{left}" x2="{left + pw}" y1="{_n(sy(t))}" y2="{_n(sy(t))}"/>')
    out.append("</g>")
    out.append(
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#444" '
        'stroke-width="0.8"/>'
    )
    for t in ticks(y0, y1):
        out.append(
            f'<text x="{left - 4}" y="{_n(sy(t) + 4)}" text-anchor="end">{_tick_text(t)}</text>'
        )
    for t in ticks(x0, x1, 6):
        out.append(
            f'<text x="{_n(sx(t))}" y="{top + ph + 13}" text-anchor="middle">{_tick_text(t)}</text>'
        )
    out.append(
        f'<text x="{left + pw / 2:.0f}" y="{top + ph + 26}" text-anchor="middle">{esc(xlabel)}'
        "</text>"
    )
    out.append(
        f'<text transform="translate(11 {top + ph / 2:.0f}) rotate(-90)" text-anchor="middle">'
        f"{esc(ylabel)}</text>"
    )
    for v in vlines:
        out.append(
            f'<line x1="{_n(sx(v))}" x2="{_n(sx(v))}" y1="{top}" y2="{top + ph}" stroke="#999" '
            'stroke-dasharray="4 3" stroke-width="0.8"/>'
        )
    if diagonal:
        a, b = max(x0, y0), min(x1, y1)
        out.append(
            f'<line x1="{_n(sx(a))}" y1="{_n(sy(a))}" x2="{_n(sx(b))}" y2="{_n(sy(b))}" '
            'stroke="#000" stroke-dasharray="5 4" stroke-width="0.9"/>'
        )
    for k, s in enumerate(series):
        color = s.color or PALETTE[k % len(PALETTE)]
        x, y = sx(s.x), sy(s.y)
        if s.lo is not None and s.hi is not None:
            lo, hi = sy(s.lo), sy(s.hi)
            ok = np.isfinite(x) & np.isfinite(lo) & np.isfinite(hi)
            if ok.sum() > 1:
                pts = [f"{_n(a)},{_n(b)}" for a, b in zip(x[ok], hi[ok], strict=True)]
                pts += [f"{_n(a)},{_n(b)}" for a, b in zip(x[ok][::-1], lo[ok][::-1], strict=True)]
                band = " ".join(pts)
                out.append(f'<polygon points="{band}" fill="{color}" fill-opacity="0.18"/>')
            elif ok.sum() == 1:  # one point: an error bar
                i = int(np.flatnonzero(ok)[0])
                out.append(
                    f'<line x1="{_n(x[i])}" x2="{_n(x[i])}" y1="{_n(lo[i])}" y2="{_n(hi[i])}" '
                    f'stroke="{color}"/>'
                )
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        if s.line:
            for pts in _paths(x, y):
                out.append(
                    f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1.4"'
                    f"{dash}/>"
                )
        if s.points:
            for a, b in zip(x, y, strict=True):
                if math.isfinite(a) and math.isfinite(b):
                    out.append(f'<circle cx="{_n(a)}" cy="{_n(b)}" r="2.6" fill="{color}"/>')
    for k, s in enumerate(labelled):
        color = s.color or PALETTE[series.index(s) % len(PALETTE)]
        lx = left + (k % 2) * pw / 2
        ly = top + ph + 40 + 14 * (k // 2)
        out.append(
            f'<rect x="{_n(lx)}" y="{ly - 8}" width="12" height="8" fill="{color}"/>'
            f'<text x="{_n(lx + 16)}" y="{ly}">{esc(s.label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


def viridis(fraction: float) -> str:
    """The colour of `fraction` in [0, 1] on the viridis scale, as `#rrggbb`."""
    f = min(max(fraction, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(f), len(VIRIDIS) - 2)
    t = f - i
    rgb = [round(a + (b - a) * t) for a, b in zip(VIRIDIS[i], VIRIDIS[i + 1], strict=True)]
    return "#" + "".join(f"{c:02x}" for c in rgb)


def heatmap(
    matrix: Sequence[Sequence[float | None]],
    *,
    title: str,
    xlabel: str = "after task j",
    ylabel: str = "task i",
    vmin: float = 0.0,
    vmax: float = 100.0,
) -> str:
    """An accuracy matrix (PERCENT, None / NaN blank) as coloured cells annotated with their
    values: row i = task i, column j = after task j, both numbered from 1."""
    a = np.array([[np.nan if v is None else v for v in row] for row in matrix], float)
    rows, cols = a.shape
    cell = max(16, min(44, 300 // max(rows, cols, 1)))
    left, top = 40, 24
    width, height = max(left + cols * cell + 10, 200), top + rows * cell + 52
    out = _open(width, height, title, "heatmap")
    size = FONT if cell >= 30 else 8
    for i in range(rows):
        out.append(
            f'<text x="{left - 4}" y="{_n(top + (i + 0.5) * cell + 4)}" text-anchor="end">'
            f"{i + 1}</text>"
        )
        for j in range(cols):
            v = a[i, j]
            if not math.isfinite(v):
                continue
            x, y = left + j * cell, top + i * cell
            frac = (v - vmin) / (vmax - vmin)
            ink = "#000" if frac > 0.6 else "#fff"
            out.append(
                f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{viridis(frac)}">'
                f"<title>task {i + 1} after task {j + 1}: {v:.2f}</title></rect>"
            )
            if cell >= 24:
                out.append(
                    f'<text x="{_n(x + cell / 2)}" y="{_n(y + cell / 2 + size / 3)}" '
                    f'text-anchor="middle" font-size="{size}" fill="{ink}">{v:.0f}</text>'
                )
    for j in range(cols):
        out.append(
            f'<text x="{_n(left + (j + 0.5) * cell)}" y="{top + rows * cell + 12}" '
            f'text-anchor="middle">{j + 1}</text>'
        )
    out.append(
        f'<text x="{left + cols * cell / 2:.0f}" y="{top + rows * cell + 26}" '
        f'text-anchor="middle">{esc(xlabel)}</text>'
    )
    out.append(
        f'<text transform="translate(11 {top + rows * cell / 2:.0f}) rotate(-90)" '
        f'text-anchor="middle">{esc(ylabel)}</text>'
    )
    # the colour scale: 20 steps from vmin to vmax
    y = top + rows * cell + 34
    out.append(f'<text x="{left - 4}" y="{y + 8}" text-anchor="end">{vmin:g}</text>')
    for k in range(20):
        out.append(
            f'<rect x="{left + 6 * k}" y="{y}" width="6" height="9" fill="{viridis(k / 19)}"/>'
        )
    out.append(f'<text x="{left + 124}" y="{y + 8}">{vmax:g} %</text>')
    out.append("</svg>")
    return "\n".join(out)


@dataclasses.dataclass(frozen=True)
class Pair:
    """One row of a comparison chart: ours (mean ± std, None while no run is done) beside the
    paper's (mean ± its printed ±, None when unpublished)."""

    label: str
    ours: float | None
    ours_std: float | None
    paper: float | None
    paper_pm: float | None


def comparison(pairs: Sequence[Pair], *, title: str, xlabel: str, width: int = 440) -> str:
    """Ours (filled dot, bar = ± std over seeds) beside the paper (hollow diamond, bar = its ±),
    one row per `pairs` entry, on a shared value axis; the paper's legend entry only when some
    pair has a published number."""
    left, right, top = 150, 14, 24
    row = 18
    height = top + row * len(pairs) + 44
    values = []
    for p in pairs:
        for m, s in ((p.ours, p.ours_std), (p.paper, p.paper_pm)):
            if m is not None:
                values += [m - (s or 0.0), m + (s or 0.0)]
    x0, x1 = _extent(values, pad=0.08)
    pw = width - left - right

    def sx(v):
        return left + (v - x0) / (x1 - x0) * pw

    out = _open(width, height, title, "comparison")
    bottom = top + row * len(pairs)
    for t in ticks(x0, x1, 6):
        out.append(
            f'<line x1="{_n(sx(t))}" x2="{_n(sx(t))}" y1="{top}" y2="{bottom}" stroke="#ddd" '
            f'stroke-width="0.6"/><text x="{_n(sx(t))}" y="{bottom + 12}" text-anchor="middle">'
            f"{_tick_text(t)}</text>"
        )
    for k, p in enumerate(pairs):
        y = top + row * (k + 0.5)
        label = p.label if len(p.label) <= 24 else p.label[:23] + "…"
        out.append(f'<text x="{left - 6}" y="{_n(y + 4)}" text-anchor="end">{esc(label)}</text>')
        if p.paper is not None:
            c = _n(sx(p.paper))
            if p.paper_pm:
                out.append(
                    f'<line x1="{_n(sx(p.paper - p.paper_pm))}" x2="{_n(sx(p.paper + p.paper_pm))}"'
                    f' y1="{_n(y + 3)}" y2="{_n(y + 3)}" stroke="{PALETTE[3]}"/>'
                )
            out.append(
                f'<path d="M{c},{_n(y - 2)} l5,5 l-5,5 l-5,-5 z" fill="#fff" stroke="{PALETTE[3]}"'
                f' stroke-width="1.4"><title>paper {p.paper:g}</title></path>'
            )
        if p.ours is not None:
            if p.ours_std:
                out.append(
                    f'<line x1="{_n(sx(p.ours - p.ours_std))}" x2="{_n(sx(p.ours + p.ours_std))}"'
                    f' y1="{_n(y - 3)}" y2="{_n(y - 3)}" stroke="{PALETTE[0]}" stroke-width="1.4"/>'
                )
            out.append(
                f'<circle cx="{_n(sx(p.ours))}" cy="{_n(y - 3)}" r="3.5" fill="{PALETTE[0]}">'
                f"<title>ours {p.ours:.2f}</title></circle>"
            )
    out.append(
        f'<text x="{left + pw / 2:.0f}" y="{bottom + 26}" text-anchor="middle">{esc(xlabel)}</text>'
    )
    ly = bottom + 38
    out.append(
        f'<circle cx="{left}" cy="{ly - 4}" r="3.5" fill="{PALETTE[0]}"/>'
        f'<text x="{left + 8}" y="{ly}">ours (± std over seeds)</text>'
    )
    if any(p.paper is not None for p in pairs):
        out.append(
            f'<path d="M{left + 170},{ly - 9} l5,5 l-5,5 l-5,-5 z" fill="#fff" '
            f'stroke="{PALETTE[3]}"/><text x="{left + 180}" y="{ly}">paper (± as printed)</text>'
        )
    out.append("</svg>")
    return "\n".join(out)


@dataclasses.dataclass(frozen=True)
class Interval:
    """One row of a forest plot: an estimate and its interval (None: no interval)."""

    label: str
    mean: float
    lo: float | None = None
    hi: float | None = None
    note: str = ""


def forest(rows: Sequence[Interval], *, title: str, xlabel: str, width: int = 520) -> str:
    """A forest plot: per row its estimate (dot) and interval (bar), on a value axis with zero
    marked (a solid vertical line), `note` printed at the right."""
    left, right, top, row = 190, 80, 24, 18
    bottom = top + row * len(rows)
    height = bottom + 32
    values = [0.0] + [v for r in rows for v in (r.mean, r.lo, r.hi) if v is not None]
    x0, x1 = _extent(values, pad=0.08)
    pw = width - left - right

    def sx(v):
        return left + (v - x0) / (x1 - x0) * pw

    out = _open(width, height, title, "forest")
    for t in ticks(x0, x1, 6):
        out.append(
            f'<line x1="{_n(sx(t))}" x2="{_n(sx(t))}" y1="{top}" y2="{bottom}" stroke="#ddd" '
            f'stroke-width="0.6"/><text x="{_n(sx(t))}" y="{bottom + 12}" text-anchor="middle">'
            f"{_tick_text(t)}</text>"
        )
    out.append(
        f'<line class="zero" x1="{_n(sx(0.0))}" x2="{_n(sx(0.0))}" y1="{top - 4}" y2="{bottom}" '
        'stroke="#000" stroke-width="1.1"/>'
    )
    for k, r in enumerate(rows):
        y = top + row * (k + 0.5)
        label = r.label if len(r.label) <= 32 else r.label[:31] + "…"
        out.append(f'<text x="{left - 6}" y="{_n(y + 4)}" text-anchor="end">{esc(label)}</text>')
        if r.lo is not None and r.hi is not None:
            out.append(
                f'<line x1="{_n(sx(r.lo))}" x2="{_n(sx(r.hi))}" y1="{_n(y)}" y2="{_n(y)}" '
                f'stroke="{PALETTE[0]}" stroke-width="1.6"/>'
            )
        out.append(
            f'<circle cx="{_n(sx(r.mean))}" cy="{_n(y)}" r="3.5" fill="{PALETTE[0]}">'
            f"<title>{esc(r.label)}: {r.mean:+.2f}</title></circle>"
        )
        if r.note:
            out.append(f'<text x="{left + pw + 6}" y="{_n(y + 4)}">{esc(r.note)}</text>')
    out.append(
        f'<text x="{left + pw / 2:.0f}" y="{bottom + 26}" text-anchor="middle">{esc(xlabel)}</text>'
    )
    out.append("</svg>")
    return "\n".join(out)
