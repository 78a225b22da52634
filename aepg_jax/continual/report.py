"""What a continual run leaves in its workdir: metrics.jsonl, results.json, plots, a table.

`metrics.jsonl` holds one JSON object per line, each with a `type` field. The writer enforces
only `type`; the driver writes (accuracies and entropies as in `metrics.summary`, percent):

    * `"train"`: `task, step` (global optimizer step), `task_step, epoch, loss, alpha, entropy,
      lr, grad_norm, images_per_s`
    * `"eval"`: `task` (evaluated after it), `step`, `accuracy` ({predictor: [acc of task i
      for i <= task]} in %), `A_t`, `acc_pooled`, `entropy`

`results.json` is the run's final record, assembled by `build_results` (see there for keys).
Task indices are 0-based everywhere, in files, tables and plots.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from aepg_jax.continual import metrics

METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
SEEDS_RESULTS_FILE = "results_seeds.json"
SEED_METRICS = ("A_T", "avg_inc_acc", "forgetting", "acc_pooled_T")


def to_jsonable(x: Any) -> Any:
    """`x` with NumPy / JAX arrays and scalars as Python values, NaN and inf as None."""
    if isinstance(x, Mapping):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_jsonable(v) for v in x]
    if isinstance(x, bool | int | str) or x is None:
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, np.generic) or hasattr(x, "__array__"):
        return to_jsonable(np.asarray(x).tolist())
    if hasattr(x, "to_dict"):  # ml_collections.ConfigDict
        return to_jsonable(x.to_dict())
    raise TypeError(f"Cannot write {type(x).__name__} to JSON: {x!r}.")


def _dumps(x: Any, **kwargs: Any) -> str:
    return json.dumps(to_jsonable(x), allow_nan=False, **kwargs)


# ---------------------------------------------------------------------------- metrics.jsonl


def _drop_partial_last_line(path: Path) -> None:
    """Truncates `path` after its last newline: removes a line cut off by a killed run."""
    with open(path, "rb+") as f:
        end = f.seek(0, os.SEEK_END)
        pos = end
        while pos > 0:
            start = max(0, pos - 4096)
            f.seek(start)
            chunk = f.read(pos - start)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                keep = start + nl + 1
                break
            pos = start
        else:
            keep = 0
        if keep < end:
            f.truncate(keep)


class MetricsWriter:
    """Appends one JSON object per line to `<workdir>/metrics.jsonl`, flushed after each line.

    An existing file is continued (a resumed run); a partial last line left by a killed run is
    removed first. With `enabled=False` (processes other than 0) every call is a no-op.
    """

    def __init__(self, workdir: str | os.PathLike, enabled: bool = True):
        self.path = Path(workdir) / METRICS_FILE
        self.enabled = enabled
        self._file = None
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            if self.path.exists():
                _drop_partial_last_line(self.path)
            self._file = open(self.path, "a", encoding="utf-8")

    def write(self, record: str | Mapping[str, Any], /, **fields: Any) -> None:
        """Writes one line (NaN -> null): `write("train", step=1, ...)` or
        `write({"type": "train", "step": 1, ...})`; keyword fields update a dict record."""
        if not self.enabled:
            return
        if self._file is None:
            raise ValueError(f"MetricsWriter for {self.path} is closed.")
        line = {"type": record, **fields} if isinstance(record, str) else {**record, **fields}
        if not isinstance(line.get("type"), str) or not line["type"]:
            raise ValueError(f"A metrics record needs a non-empty string `type`; got {line!r}.")
        self._file.write(_dumps(line) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _timeline_key(record: Mapping[str, Any]) -> tuple[float, float]:
    task = record.get("task")
    return (float(record["step"]), -1.0 if task is None else float(task))


def read_metrics(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl (a file or a workdir), in file order, without resume repeats.

    A truncated last line is skipped silently, any other unreadable line with a warning. Records
    with a `step` form one timeline per `type`, ordered by `(step, task)`: a record that does
    not move its timeline forward marks a resumed run, and the earlier records of that type at
    or after its `(step, task)` are dropped. So only the last occurrence of each (type, task,
    step) is kept, and so are no steps of an abandoned run that the resumed run did not repeat.
    Records without a `step` are all kept.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    lines = path.read_text(encoding="utf-8").split("\n")
    kept: dict[str, list[tuple[int, dict[str, Any]]]] = {}
    loose: list[tuple[int, dict[str, Any]]] = []
    for n, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            if n < len(lines) - 1:  # the last element has no newline: a cut-off write
                warnings.warn(f"{path}:{n + 1}: skipping unreadable line ({e}).", stacklevel=2)
            continue
        if "step" not in record or record["step"] is None:
            loose.append((n, record))
            continue
        timeline = kept.setdefault(str(record.get("type")), [])
        key = _timeline_key(record)
        while timeline and _timeline_key(timeline[-1][1]) >= key:
            timeline.pop()
        timeline.append((n, record))
    merged = loose + [item for timeline in kept.values() for item in timeline]
    return [record for _, record in sorted(merged, key=lambda item: item[0])]


# ----------------------------------------------------------------------------- results.json


def write_results(
    workdir: str | os.PathLike, results: Mapping[str, Any], filename: str = RESULTS_FILE
) -> Path:
    """Writes `<workdir>/<filename>` atomically (temp file + `os.replace`), NaN -> null."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    text = _dumps(results, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=workdir, prefix=f".{filename}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, workdir / filename)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return workdir / filename


def build_results(
    tracker: metrics.AccuracyTracker,
    config: Mapping[str, Any],
    wall_time_s: float,
    seed: int,
    head_sizes: Sequence[int],
) -> dict[str, Any]:
    """The results.json dict.

    Keys: `config`, `seed`, `num_tasks`, `head_sizes`, `predictors` (the first is the primary
    one), `methods` ({predictor: `metrics.summary`}), every key of the primary predictor's
    summary copied to the top level (`accuracy_matrix`, `A_t`, `A_T`, `avg_inc_acc`,
    `forgetting`, `forgetting_per_task`, `acc_pooled`, `acc_pooled_T`, `tasks_evaluated`; %),
    `entropy` (per evaluation, None where not recorded), `wall_time_s`, `tracker`
    (`AccuracyTracker.to_dict()`, enough to rebuild everything).
    """
    methods = {p: metrics.summary(tracker, p) for p in tracker.predictors}
    primary = tracker.predictors[0]
    return {
        "config": to_jsonable(config),
        "seed": int(seed),
        "num_tasks": tracker.num_tasks,
        "head_sizes": [int(h) for h in head_sizes],
        "predictors": list(tracker.predictors),
        "methods": methods,
        **methods[primary],
        "entropy": [None if not math.isfinite(v) else float(v) for v in tracker.entropy],
        "wall_time_s": float(wall_time_s),
        "tracker": tracker.to_dict(),
    }


def _mean_std(values: Sequence[Any]) -> dict[str, Any]:
    """Mean and sample std (ddof=1; None for one value) of the finite values."""
    finite = [float(v) for v in values if _num(v) and math.isfinite(v)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else None,
        "values": [float(v) if _num(v) else None for v in values],
    }


def seeds_summary(
    per_seed: Sequence[Mapping[str, Any]], config: Mapping[str, Any], wall_time_s: float
) -> dict[str, Any]:
    """results_seeds.json of a multi-seed run: mean +- std over seeds.

    Keys: `config`, `seeds`, `predictors`, `metrics` ({predictor: {metric: {mean, std,
    values}}} for `SEED_METRICS`), `accuracy_matrix_mean` (primary predictor, %), `wall_time_s`
    (of the whole vmapped run) and `per_seed` (each seed's results.json dict).
    """
    predictors = list(per_seed[0]["predictors"])
    table = {
        p: {k: _mean_std([r["methods"][p].get(k) for r in per_seed]) for k in SEED_METRICS}
        for p in predictors
    }
    matrices = np.stack([_as_float_array(r["accuracy_matrix"]) for r in per_seed])
    with warnings.catch_warnings():  # entries no seed has (j < i) stay NaN without a warning
        warnings.simplefilter("ignore", RuntimeWarning)
        mean_matrix = np.nanmean(matrices, axis=0)
    return {
        "config": to_jsonable(config),
        "seeds": [int(r["seed"]) for r in per_seed],
        "predictors": predictors,
        "metrics": table,
        "accuracy_matrix_mean": [
            [None if not math.isfinite(v) else float(v) for v in row] for row in mean_matrix
        ],
        "wall_time_s": float(wall_time_s),
        "per_seed": [dict(r) for r in per_seed],
    }


def seeds_table(summary: Mapping[str, Any]) -> str:
    """The terminal summary of a multi-seed run: per-seed A_T and mean +- std per predictor."""
    seeds = summary["seeds"]
    primary = summary["predictors"][0]
    lines = [f"{len(seeds)} seeds {seeds}, A_T (%) per seed ({primary}):"]
    lines.append(
        "  "
        + "  ".join(
            f"{s}: {_fmt(v, 0)}"
            for s, v in zip(seeds, summary["metrics"][primary]["A_T"]["values"], strict=True)
        )
    )
    lines.append("")
    lines.append(f"{'predictor':<12}" + "".join(f"{k:>18}" for k in SEED_METRICS))
    for p, table in summary["metrics"].items():
        cells = []
        for k in SEED_METRICS:
            m, sd = table[k]["mean"], table[k]["std"]
            cells.append(f"{_fmt(m, 0)} +- {_fmt(sd, 0)}" if m is not None else "-")
        lines.append(f"{p:<12}" + "".join(f"{c:>18}" for c in cells))
    lines.append(f"{'wall time':<12}{_fmt_duration(summary.get('wall_time_s')):>18}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ plots


def _as_float_array(x: Any) -> np.ndarray:
    """Nested lists with None (JSON) or an array, as float64 with NaN."""
    if isinstance(x, np.ndarray):
        return x.astype(np.float64)
    if x and isinstance(x[0], list | tuple):
        return np.array([[np.nan if v is None else v for v in row] for row in x], np.float64)
    return np.array([np.nan if v is None else v for v in x], np.float64)


def plot_accuracy_matrix(
    a: Any, path: str | os.PathLike, title: str = "Accuracy (%) on task i after task j"
) -> None:
    """Heatmap of an accuracy matrix given in FRACTIONS (as `AccuracyTracker.accuracy`),
    annotated in %; NaN / None cells blank."""
    pct = 100.0 * _as_float_array(a)
    num = pct.shape[0]
    size = max(3.5, 0.6 * num + 1.5)
    fig, ax = plt.subplots(figsize=(size + 1.0, size))
    image = ax.imshow(np.ma.masked_invalid(pct), cmap="viridis", vmin=0.0, vmax=100.0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="accuracy (%)")
    fontsize = 9 if num <= 10 else 6
    for i, j in zip(*np.nonzero(np.isfinite(pct)), strict=True):
        v = pct[i, j]
        color = "black" if v > 60.0 else "white"
        ax.text(j, i, f"{v:.1f}", ha="center", va="center", fontsize=fontsize, color=color)
    ax.set(xlabel="after task j", ylabel="task i", title=title)
    ax.set_xticks(range(num))
    ax.set_yticks(range(num))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _task_boundaries(train: Sequence[Mapping[str, Any]]) -> list[float]:
    """Global steps where the `task` of consecutive train records changes."""
    out = []
    for prev, cur in itertools.pairwise(train):
        if prev.get("task") is not None and cur.get("task") != prev.get("task"):
            out.append(float(cur["step"]))
    return out


def _series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"], r[key]) for r in records if r.get("step") is not None and _num(r.get(key))]
    return np.array([p[0] for p in pts], np.float64), np.array([p[1] for p in pts], np.float64)


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def plot_training_curves(records: Sequence[Mapping[str, Any]], path: str | os.PathLike) -> None:
    """Output entropy and alpha over the global step (two stacked panels), task boundaries
    dashed. Train records give the curves, eval records' `entropy` the test markers; records
    missing a key are skipped."""
    train = [r for r in records if r.get("type") == "train" and r.get("step") is not None]
    evals = [r for r in records if r.get("type") == "eval"]
    fig, (ax_h, ax_a) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True)
    steps, values = _series(train, "entropy")
    if steps.size:
        ax_h.plot(steps, values, lw=1.0, label="train batch")
    steps, values = _series(evals, "entropy")
    if steps.size:
        ax_h.plot(steps, values, "o", ms=4, label="test (after task)")
    steps, values = _series(train, "alpha")
    if steps.size:
        ax_a.plot(steps, values, lw=1.0, color="tab:green")
    for ax in (ax_h, ax_a):
        for boundary in _task_boundaries(train):
            ax.axvline(boundary, color="gray", ls="--", lw=0.8)
    if ax_h.has_data():
        ax_h.legend(fontsize=8)
    else:
        ax_h.text(0.5, 0.5, "no entropy logged", ha="center", va="center", transform=ax_h.transAxes)
    if not ax_a.has_data():
        ax_a.text(0.5, 0.5, "no alpha logged", ha="center", va="center", transform=ax_a.transAxes)
    ax_h.set(ylabel="output entropy H(p)", title="Training curves")
    ax_a.set(xlabel="global step", ylabel="alpha (weight of CE)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_incremental_accuracy(
    A_t_by_predictor: Mapping[str, Sequence[float | None]],
    path: str | os.PathLike,
    title: str = "Incremental accuracy A_t",
) -> None:
    """A_t (PERCENT, None where not evaluated) over tasks, one line per predictor."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, values in A_t_by_predictor.items():
        y = _as_float_array(list(values))
        ax.plot(np.arange(y.size), y, "o-", label=name)
    ax.set(xlabel="after task t", ylabel="A_t (%)", title=title)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if A_t_by_predictor:
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_plots(
    workdir: str | os.PathLike,
    results: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]],
) -> list[Path]:
    """Writes accuracy_matrix.png (primary predictor), training_curves.png and
    incremental_accuracy.png (every predictor) into `workdir`; returns their paths."""
    workdir = Path(workdir)
    paths = [
        workdir / n
        for n in ("accuracy_matrix.png", "training_curves.png", "incremental_accuracy.png")
    ]
    primary = results["predictors"][0]
    a = _as_float_array(results["accuracy_matrix"]) / 100.0
    plot_accuracy_matrix(a, paths[0], title=f"Accuracy (%) on task i after task j ({primary})")
    plot_training_curves(records, paths[1])
    methods = results.get("methods") or {primary: results}
    plot_incremental_accuracy({p: m["A_t"] for p, m in methods.items()}, paths[2])
    return paths


# ------------------------------------------------------------------------------------ table


def _fmt(x: Any, width: int = 7, digits: int = 2) -> str:
    return f"{x:>{width}.{digits}f}" if _num(x) else f"{'-':>{width}}"


def _fmt_duration(seconds: Any) -> str:
    if not _num(seconds):
        return "-"
    s = round(seconds)
    return f"{seconds:.1f} s ({s // 3600:d}:{s % 3600 // 60:02d}:{s % 60:02d})"


def final_table(results: Mapping[str, Any]) -> str:
    """The terminal summary of a results dict: accuracy matrix (%), scalars, predictors."""
    rows = results["accuracy_matrix"]
    primary = results["predictors"][0]
    lines = [f"Accuracy (%) of task i (rows) after task j (columns), {primary}:"]
    lines.append("        " + "".join(f"{f'j={j}':>7}" for j in range(len(rows))))
    for i, row in enumerate(rows):
        lines.append(f"{f'i={i}':<8}" + "".join(_fmt(v, 7, 1) for v in row))
    lines.append("")
    scalars = [
        ("A_T (%)", results.get("A_T")),
        ("avg_inc_acc (%)", results.get("avg_inc_acc")),
        ("forgetting (%)", results.get("forgetting")),
        (
            "acc_pooled_T (%)",
            results.get("acc_pooled_T", (results.get("acc_pooled") or [None])[-1]),
        ),
    ]
    lines += [f"{name:<18}{_fmt(value, 8)}" for name, value in scalars]
    lines.append(f"{'wall time':<18}{_fmt_duration(results.get('wall_time_s')):>8}")
    methods = results.get("methods") or {}
    if len(methods) > 1:
        lines.append("")
        lines.append(f"{'predictor':<18}{'A_T':>8}{'avg_inc':>9}{'forget':>8}{'pooled_T':>9}")
        for name, m in methods.items():
            lines.append(
                f"{name:<18}{_fmt(m.get('A_T'), 8)}{_fmt(m.get('avg_inc_acc'), 9)}"
                f"{_fmt(m.get('forgetting'), 8)}{_fmt(m.get('acc_pooled_T'), 9)}"
            )
    return "\n".join(lines)
