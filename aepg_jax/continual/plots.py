"""Every figure of the project, drawn with matplotlib: a run's PNGs (`write_plots`: its accuracy
matrix, training curves, incremental accuracy and reliability diagram), the paper figures
(`tables/plots.py` gathers their series) and the report page's charts (`tables/report.py`,
embedded as inline SVG by `svg_text`). Tasks are numbered t = 1..T on the axes (the files'
0-based index + 1).

One spread everywhere: the sample std over seeds (ddof 1, as the tables print; 0 for one run).
One colour per loss on every chart (`loss_color`).
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import os
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from aepg_jax import metrics
from aepg_jax.metrics import as_float_array
from aepg_jax.runs import predictions
from aepg_jax.runs.records import is_number, run_name

plt.rcParams.update(
    {"svg.fonttype": "none", "svg.hashsalt": "aepg", "font.size": 9, "font.family": "sans-serif",
     "font.sans-serif": ["DejaVu Sans"]}
)  # fmt: skip
LOSS_COLORS = {"ce": "#1f77b4", "aepg": "#d62728", "epg": "#2ca02c"}
OTHER_COLORS = ("#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e")
PAPER_COLOR = "#444444"
MAX_POINTS = 400  # a curve longer than this is averaged over consecutive chunks
WRAP = 34  # characters per line of a row label


def loss_color(loss: Any) -> str:
    """The colour of a loss on every chart (CE blue, aEPG red, EPG green; others in turn)."""
    name = str(loss)
    if name in LOSS_COLORS:
        return LOSS_COLORS[name]
    return OTHER_COLORS[sum(map(ord, name)) % len(OTHER_COLORS)]


def wrap(label: str, width: int = WRAP) -> str:
    """A label on several lines of at most `width` characters, whole (never cut)."""
    return "\n".join(textwrap.wrap(label, width, break_on_hyphens=False)) or label


def mean_std(curves: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sample std) over runs of curves (cut to the shortest; NaN ignored; std 0 where
    fewer than two runs have a value)."""
    length = min(len(c) for c in curves)
    stack = np.array([np.asarray(c, float)[:length] for c in curves], float).reshape(-1, length)
    count = np.isfinite(stack).sum(0)
    mean, std = np.full(length, np.nan), np.zeros(length)
    seen, two = count > 0, count > 1
    mean[seen] = np.nanmean(stack[:, seen], 0)
    std[two] = np.nanstd(stack[:, two], 0, ddof=1)
    return mean, std


def values_of(results: Mapping[str, Any], key: str) -> np.ndarray:
    """A per-task (per-epoch) list of results.json as floats (None as NaN)."""
    return np.array([np.nan if v is None else v for v in results.get(key) or []], float)


def _series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [
        (r["step"], r[key]) for r in records if is_number(r.get("step")) and is_number(r.get(key))
    ]
    return np.array([p[0] for p in pts], np.float64), np.array([p[1] for p in pts], np.float64)


def _thin(x: np.ndarray, y: np.ndarray, limit: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """At most `limit` points: means over consecutive chunks of a longer curve."""
    if x.size <= limit:
        return x, y
    chunks = np.array_split(np.arange(x.size), limit)
    return np.array([x[c].mean() for c in chunks]), np.array([np.nanmean(y[c]) for c in chunks])


def _task_boundaries(
    train: Sequence[Mapping[str, Any]], evals: Sequence[Mapping[str, Any]] = ()
) -> list[float]:
    """Global steps where a task ends and the next begins: the last step of each task but the
    last (its eval record's step, else its last logged train step, which the driver always
    logs)."""
    ends = {r["task"]: float(r["step"]) for r in evals if r.get("task") is not None}
    out = []
    for prev, cur in itertools.pairwise(train):
        task = prev.get("task")
        if task is not None and cur.get("task") != task:
            out.append(ends.get(task, float(prev["step"])))
    return out


# ------------------------------------------------------------------------------ one run


def draw_accuracy_matrix(ax, a_pct: Any, title: str, colorbar: bool = True) -> None:
    """An accuracy matrix in PERCENT (NaN / None blank) as a heatmap annotated with its values,
    task i against after task j, both from 1 (viridis, 0 to 100: `colorbar` draws the scale)."""
    pct = as_float_array(a_pct)
    num = pct.shape[0]
    image = ax.imshow(np.ma.masked_invalid(pct), cmap="viridis", vmin=0.0, vmax=100.0)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="accuracy (%)")
    fontsize = 8 if num <= 10 else 5
    for i, j in zip(*np.nonzero(np.isfinite(pct)), strict=True):
        v = pct[i, j]
        color = "black" if v > 60.0 else "white"
        ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=fontsize, color=color)
    ax.set(xlabel="after task j", ylabel="task i")
    ax.set_title(wrap(title, 40), fontsize=9)
    ax.set_xticks(range(num), [str(j + 1) for j in range(num)])
    ax.set_yticks(range(num), [str(i + 1) for i in range(num)])


def curve_keys(records: Sequence[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """The training curves the records hold: (key, axis label) of the loss (when logged), the
    entropy, and alpha (only for a loss that logs one)."""
    train = [r for r in records if r.get("type") == "train"]
    keys = [("loss", "training loss")] * bool(_series(train, "loss")[0].size)
    keys.append(("entropy", "entropy H(p) (nats)"))
    return keys + [("alpha", "alpha (weight of CE)")] * bool(_series(train, "alpha")[0].size)


def draw_curve(ax, records: Sequence[Mapping[str, Any]], key: str, ylabel: str) -> None:
    """One training curve over the global step (the entropy: train batches over the task's
    classes, the test set after each task over every class seen), task boundaries dashed."""
    train = [r for r in records if r.get("type") == "train" and r.get("step") is not None]
    evals = [r for r in records if r.get("type") == "eval"]
    x, y = _thin(*_series(train, key))
    if x.size:
        label = "train batch: task's classes" if key == "entropy" else None
        ax.plot(x, y, lw=1.0, color="#2ca02c" if key == "alpha" else "#1f77b4", label=label)
    if key == "entropy":
        ex, ey = _series(evals, "entropy")
        if ex.size:
            ax.plot(ex, ey, "o", ms=4, color="#ff7f0e", label="test: every seen class")
        if not (x.size or ex.size):
            ax.text(0.5, 0.5, "no entropy logged", ha="center", transform=ax.transAxes)
    for n, boundary in enumerate(_task_boundaries(train, evals)):
        label = "task boundary" if n == 0 and key == "entropy" else None
        ax.axvline(boundary, color="gray", ls="--", lw=0.8, label=label)
    ax.set_ylabel(wrap(ylabel, 22))
    ax.set_xlabel("global step")
    ax.locator_params(nbins=5)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)


def draw_reliability(
    ax, kept: Mapping[str, tuple[np.ndarray, np.ndarray]], title: str, not_drawn: Sequence[str] = ()
) -> None:
    """Reliability diagram: per predictor `(confidence, correct)` of its test predictions, the
    accuracy of each of the 15 equal-width confidence bins (`aepg_jax/metrics.py`) against the
    bin's mean confidence, the diagonal being perfect calibration; the legend gives the ECE and
    names the predictors `not_drawn` (scores, not probabilities). The first predictor is solid,
    the others dashed over it, so that coinciding lines all show."""
    ax.plot([0, 1], [0, 1], "k--", lw=1, label="calibrated")
    for k, (name, (conf, correct)) in enumerate(kept.items()):
        conf = np.asarray(conf, np.float64)
        acc, mean_conf, count = metrics.reliability(conf, correct)
        seen = count > 0
        ece = 100.0 * metrics.ece(conf, correct)
        ls = "--" if k else "-"
        ax.plot(mean_conf[seen], acc[seen], "o", ls=ls, ms=3, label=f"{name} (ECE {ece:.1f}%)")
    for name in not_drawn:
        ax.plot([], [], " ", label=wrap(f"{name}: {metrics.SCORES}, not drawn", 30))
    ax.set(xlabel="confidence", ylabel="accuracy", xlim=(0, 1), ylim=(0, 1))
    ax.set(xticks=(0, 0.5, 1), yticks=(0, 0.5, 1))
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def plot_accuracy_matrix(
    a: Any,
    path: str | os.PathLike | None = None,
    title: str = "Accuracy (%) on task i after task j",
) -> Figure:
    """Heatmap of an accuracy matrix given in FRACTIONS (as `AccuracyTracker.accuracy`),
    annotated in %; written to `path` (PNG) when given."""
    pct = 100.0 * as_float_array(a)
    size = max(3.0, 0.5 * pct.shape[0] + 1.3)
    fig, ax = plt.subplots(figsize=(size + 0.9, size), layout="constrained")
    draw_accuracy_matrix(ax, pct, title)
    return _done(fig, path)


def plot_training_curves(
    records: Sequence[Mapping[str, Any]],
    path: str | os.PathLike | None = None,
    title: str = "Training curves",
) -> Figure:
    """`curve_keys`' curves stacked over the global step (`draw_curve`)."""
    keys = curve_keys(records)
    fig, axes = plt.subplots(
        len(keys), 1, figsize=(6.4, 1.3 + 1.5 * len(keys)), sharex=True, layout="constrained"
    )
    for ax, (key, ylabel) in zip(np.atleast_1d(axes), keys, strict=True):
        draw_curve(ax, records, key, ylabel)
        ax.label_outer()  # one x label, under the last panel
    np.atleast_1d(axes)[0].set_title(wrap(title, 80))
    return _done(fig, path)


def plot_incremental_accuracy(
    A_t_by_predictor: Mapping[str, Sequence[float | None]],
    path: str | os.PathLike | None = None,
    title: str = "Incremental accuracy A_t",
) -> Figure:
    """A_t (PERCENT, None where not evaluated) over tasks, one line per predictor."""
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    for name, values in A_t_by_predictor.items():
        y = as_float_array(list(values))
        ax.plot(np.arange(1, y.size + 1), y, "o-", label=name)
    ax.set(xlabel="after task t", ylabel="A_t (%)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if A_t_by_predictor:
        ax.legend(fontsize=8)
    return _done(fig, path)


def plot_reliability(
    kept: Mapping[str, tuple[np.ndarray, np.ndarray]],
    path: str | os.PathLike | None = None,
    title: str = "Reliability after the last task",
) -> Figure:
    """`draw_reliability` on its own figure."""
    fig, ax = plt.subplots(figsize=(4.2, 4.2), layout="constrained")
    draw_reliability(ax, kept, title)
    return _done(fig, path)


def plot_run(
    accuracy_pct: Any,
    records: Sequence[Mapping[str, Any]],
    reliability: tuple[Mapping[str, tuple[np.ndarray, np.ndarray]], int] | None,
    not_drawn: Sequence[str] = (),
    primary: str = "model",
) -> Figure:
    """A run's figures on one canvas (the report page's): its accuracy matrix, reliability
    diagram (after task k; `reliability` from `kept_reliability`) and training curves."""
    keys = curve_keys(records)
    fig = plt.figure(figsize=(11, 6.4))
    grid = fig.add_gridspec(2, 3, left=0.06, right=0.98, bottom=0.08, top=0.95, wspace=0.3,
                            hspace=0.35)  # fmt: skip
    top = [fig.add_subplot(grid[0, k]) for k in range(3)]
    if accuracy_pct is not None:
        draw_accuracy_matrix(top[0], accuracy_pct, f"accuracy (%), {primary}", colorbar=False)
    else:
        top[0].set_visible(False)
    if reliability and reliability[0]:
        draw_reliability(top[1], reliability[0], f"reliability after task {reliability[1]}",
                         not_drawn)  # fmt: skip
    else:
        top[1].set_visible(False)
    draw_curve(top[2], records, *keys[0])
    rest = keys[1:]
    spans = [grid[1, :2], grid[1, 2]] if len(rest) == 2 else [grid[1, :]] * len(rest)
    for span, (key, ylabel) in zip(spans, rest, strict=True):
        draw_curve(fig.add_subplot(span), records, key, ylabel)
    return fig


def kept_reliability(
    folder: str | os.PathLike, predictors: Sequence[str], notes: Mapping[str, Any] | None = None
) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], int] | None:
    """(per predictor `(confidence, correct)` after the last task evaluated, that task 1-based)
    from a run's kept predictions, leaving out the predictors with a note (scores, not
    probabilities); None when it kept none."""
    path = Path(folder) / predictions.FILE
    if not path.exists():
        return None
    arrays = predictions.load(path)
    last = arrays["after_task"] == arrays["after_task"].max()
    label = arrays["label"][last]
    kept = {}
    for p in predictors:
        if f"{p}/top_probs" not in arrays or (notes or {}).get(p):
            continue
        c = predictions.predictor_columns(arrays, p)
        kept[p] = (c["top_probs"][last, 0].astype(np.float64), c["top_classes"][last, 0] == label)
    return kept, int(arrays["after_task"].max()) + 1


def write_plots(
    workdir: str | os.PathLike,
    results: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
) -> list[Path]:
    """Writes accuracy_matrix.png (primary predictor), training_curves.png,
    incremental_accuracy.png (every predictor) and, when the run kept its predictions,
    reliability.png (every predictor with calibration, after the last task evaluated; none
    when every predictor outputs scores, not probabilities) into `workdir`; returns their
    paths."""
    workdir = Path(workdir)
    paths = [
        workdir / n
        for n in ("accuracy_matrix.png", "training_curves.png", "incremental_accuracy.png")
    ]
    primary = results["predictors"][0]
    a = as_float_array(results["accuracy_matrix"]) / 100.0
    plot_accuracy_matrix(a, paths[0], title=f"Accuracy (%) on task i after task j ({primary})")
    plot_training_curves(records, paths[1], title=f"Training curves ({run_name(results)})")
    methods = results.get("methods") or {primary: results}
    plot_incremental_accuracy({p: m["A_t"] for p, m in methods.items()}, paths[2])
    notes = {p: m.get("calibration_note") for p, m in methods.items()}
    found = kept_reliability(workdir, results["predictors"], notes)
    if found and found[0]:
        paths.append(workdir / "reliability.png")
        plot_reliability(found[0], paths[-1])
    return paths


# ------------------------------------------------------------- over seeds, and the page


@dataclasses.dataclass(frozen=True)
class Band:
    """One line of a chart over seeds: its mean and sample std at each `x`, with a colour and
    the hover text of its points (`tip`)."""

    label: str
    x: Sequence[float]
    mean: Sequence[float]
    std: Sequence[float]
    color: str | None = None
    tip: str = ""


def plot_bands(
    panels: Mapping[str, Sequence[Band]],
    *,
    xlabel: str,
    ylabel: str,
    title: str = "",
    curves: bool = True,
    xticks: Sequence[str] | None = None,
    legend_title: str | None = None,
    path: str | os.PathLike | None = None,
) -> Figure:
    """One panel per entry of `panels`, one line per `Band`: with `curves`, the mean with a
    shaded mean ± std band; else points with ± std error bars (at positions 0..n-1 named
    `xticks` when given)."""
    cols = min(len(panels), 3)
    rows = -(-len(panels) // cols)
    head = 0.45 + 0.2 * (wrap(title, 100).count("\n") + 1) * bool(title)
    width, height = 4.6 * cols, 3.4 * rows + head
    fig, axes = plt.subplots(rows, cols, figsize=(width, height), squeeze=False)
    _margins(fig, left=0.75, right=0.15, bottom=0.5, top=head, hspace=0.45)
    for ax, (name, bands) in zip(axes.flat, panels.items(), strict=False):
        for band in bands:
            x, mean, std = (np.asarray(v, float) for v in (band.x, band.mean, band.std))
            if curves:
                (line,) = ax.plot(x, mean, marker="o" if x.size < 30 else None, ms=3,
                                  color=band.color, label=wrap(band.label, 44))  # fmt: skip
                ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
            else:
                cont = ax.errorbar(x, mean, yerr=std, marker="o", capsize=3, color=band.color,
                                   label=wrap(band.label, 44) or None)  # fmt: skip
                line = cont.lines[0]
            if band.tip:
                line.set_gid(band.tip)
        if xticks is not None:
            ax.set_xticks(range(len(xticks)), xticks)
        elif curves:
            ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set(xlabel=xlabel, ylabel=ylabel)
        ax.set_title(wrap(name, 56), fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, title=legend_title)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)
    if title:
        fig.suptitle(wrap(title, 100))
    return _done(fig, path)


@dataclasses.dataclass(frozen=True)
class Dot:
    """One row of a dot chart or forest plot: an estimate with its spread or interval
    (`lo`, `hi`; None: none), a colour, its hover text, and optional per-seed points
    (`seeds`: (value, hover text))."""

    label: str
    value: float
    lo: float | None = None
    hi: float | None = None
    color: str | None = None
    tip: str = ""
    seeds: Sequence[tuple[float, str]] = ()
    hollow: bool = False


def plot_dots(
    panels: Mapping[str, Sequence[Dot]],
    rows: Sequence[str],
    *,
    legend: Sequence[tuple[str, str, bool]],
    xlabel: str,
    zero: bool = False,
    title: str = "",
) -> Figure:
    """Rows (labels wrapped, whole) against one value axis per panel: each `Dot` at its row
    (two dots of a row side by side), its bar from `lo` to `hi`; `zero` marks 0 (a forest
    plot). `legend`: (label, colour, hollow) entries."""
    labels = [wrap(r) for r in rows]
    lines = sum(label.count("\n") + 1 for label in labels)
    widest = max((len(line) for label in labels for line in label.split("\n")), default=4)
    head = 0.5 + 0.2 * (wrap(title, 110).count("\n") + 1) * bool(title)
    foot = 0.55 + 0.2 * len(legend)
    left = 0.3 + 0.075 * widest
    height = head + foot + 0.16 * lines + 0.22 * len(rows)
    fig, axes = plt.subplots(
        1, len(panels), figsize=(left + 0.3 + 2.9 * len(panels), height), sharey=True,
        squeeze=False,
    )  # fmt: skip
    _margins(fig, left=left, right=0.3, bottom=foot, top=head, wspace=0.15)
    position = {r: k for k, r in enumerate(rows)}
    for ax, (name, dots) in zip(axes[0], panels.items(), strict=True):
        offsets: dict[str, int] = {}
        for dot in dots:
            y = (
                position[dot.label]
                + 0.22 * offsets.get(dot.label, 0)
                - 0.11 * (sum(d.label == dot.label for d in dots) - 1)
            )
            offsets[dot.label] = offsets.get(dot.label, 0) + 1
            for value, tip in dot.seeds:
                (seed,) = ax.plot([value], [y], "o", ms=2.5, color=dot.color, alpha=0.45)
                seed.set_gid(tip)
            err = None
            if dot.lo is not None and dot.hi is not None:
                err = [[dot.value - dot.lo], [dot.hi - dot.value]]
            face = "white" if dot.hollow else dot.color
            cont = ax.errorbar([dot.value], [y], xerr=err, fmt="D" if dot.hollow else "o", ms=5,
                               color=dot.color, mfc=face, capsize=2, lw=1.4)  # fmt: skip
            if dot.tip:
                cont.lines[0].set_gid(dot.tip)
        if zero:
            ax.axvline(0.0, color="black", lw=1.0)
        ax.set_title(wrap(name, 30), fontsize=9)
        ax.set_xlabel(wrap(xlabel, 34))
        ax.grid(axis="x", alpha=0.3)
    axes[0][0].set_yticks(range(len(rows)), labels)
    axes[0][0].set_ylim(len(rows) - 0.5, -0.5)
    handles = [
        plt.Line2D([], [], marker="D" if hollow else "o", ls="", color=color,
                   mfc="white" if hollow else color, label=label)
        for label, color, hollow in legend
    ]  # fmt: skip
    if handles:
        fig.legend(handles=handles, loc="lower center", fontsize=8, ncols=1, frameon=False)
    if title:
        fig.suptitle(wrap(title, 110), fontsize=10)
    return fig


# ---------------------------------------------------------------------------- output


def _margins(fig: Figure, *, left: float, right: float, bottom: float, top: float, **space):
    """Margins in inches (matplotlib's are fractions of the figure)."""
    width, height = fig.get_size_inches()
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height,
                        top=1 - top / height, **space)  # fmt: skip


def _done(fig: Figure, path: str | os.PathLike | None) -> Figure:
    if path is not None:
        save_png(fig, path)
    return fig


def save_png(fig: Figure, path: str | os.PathLike) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


_NUMBER = re.compile(r"(\d+\.\d)\d+")
_ATTRIBUTE = re.compile(r'="([^"]*)"')
_GID = re.compile(r'<g id="(tip:\d+)">')
_STYLE = re.compile(r'style="([^"]*)"')
_ID = re.compile(r' id="([^"]*)"')


def svg_text(fig: Figure, cls: str, styles: dict[str, str] | None = None) -> str:
    """`fig` as one inline `<svg class=cls>` element for an HTML page: text kept as text, no
    namespace URL or metadata, coordinates to 0.1 px, unreferenced ids dropped, at most its
    own size; each style attribute becomes a class named in `styles` (style -> class name,
    shared by the page's charts: `style_sheet` writes them once); a line whose gid is its
    hover text gets a `<title>` (a tooltip)."""
    tips = {}
    for artist in (line for ax in fig.axes for line in ax.lines):
        gid = artist.get_gid()
        if gid:
            key = f"tip:{len(tips)}"
            tips[key] = gid
            artist.set_gid(key)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None,
                                                "Type": None})  # fmt: skip
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)
    text = re.sub(r' xmlns(:\w+)?="[^"]*"| transform="rotate\(-0 [^"]*\)"', "", text)
    text = re.sub(
        r' (width|height)="([\d.]+)pt"',
        lambda m: f' {m[1]}="{float(m[2]) * 4 / 3:.0f}"',
        text,
        count=2,
    )  # CSS px are 3/4 pt
    text = re.sub(r"<style[^>]*>.*?</style>", "", text, flags=re.S)
    text = text.replace("<svg", f'<svg class="{cls}" role="img"', 1)
    text = _ATTRIBUTE.sub(lambda m: '="' + _NUMBER.sub(r"\1", " ".join(m[1].split())) + '"', text)
    used = set(re.findall(r"#([\w.-]+)", text))
    text = _ID.sub(lambda m: m[0] if m[1] in used or m[1].startswith("tip:") else "", text)
    if styles is not None:
        text = _STYLE.sub(lambda m: f'class="{styles.setdefault(m[1], f"s{len(styles)}")}"', text)
    text = re.sub(r">\s+<", "><", text.strip())
    return _GID.sub(lambda m: f'<g class="tip"><title>{_escape(tips[m[1]])}</title>', text)


def style_sheet(styles: Mapping[str, str]) -> str:
    """The CSS of the classes `svg_text` named (`svg .s0 { ... }`), with the charts' defaults
    (round joins, butt caps: matplotlib's)."""
    rules = [f"svg.chart .{name} {{{style}}}" for style, name in styles.items()]
    return "\n".join(["svg.chart * { stroke-linejoin: round; stroke-linecap: butt }", *rules])


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
