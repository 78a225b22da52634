"""Kept predictions: what every evaluation predicted for each test example, in one file per run.

Every evaluation (after each task `j`, every seen task `i`'s test set, every predictor `p`)
keeps per test example: its dataset index and label, and per predictor the top-K classes and
their probabilities (`K = min(5, C)`; the first is the class-incremental prediction), the
probability of the true class, the entropy of the predictor's distribution, and the
task-incremental prediction (the argmax over task `i`'s own classes). The run's metrics and
calibration (`aepg_jax/metrics.py`) are recomputed from them without the model by
`python -m aepg_jax.evaluate` (`evaluate/evaluate.py`).

File: `<seed dir>/predictions.npz` (uncompressed `.npz`), rewritten atomically after each
evaluation with every evaluation so far; its sha256 in `results.json`. Arrays (N rows: one per
example and evaluation, in order of `after_task`, then `task`, then the test split's order):

    after_task (N,) int16, task (N,) int16, index (N,) int32, label (N,) int16|int32,
    logged_entropy (N,) float32     the entropy of the logits `method.predict` names (the eval
                                    record's `entropy`)
    <p>/top_classes (N, K) int16|int32, <p>/top_probs (N, K) float16,
    <p>/p_true (N,) float32, <p>/entropy (N,) float16, <p>/task_pred (N,) int16|int32
    predictors, task_offsets, task_sizes, num_classes, scenario, format   (metadata)
    notes (one per predictor), entropy_note   (metadata: "" or "scores, not probabilities:
                                    <why>", `Method.calibration_notes`; absent in older files)

A predictor with a note outputs scores (cosines, a ridge readout): its `top_probs`, `p_true`
and `entropy` are those of the softmax of its scores, kept for the ranking (accuracy, top-5)
only; no calibration is computed from them (`notes_of`), as results.json has none.
"""

from __future__ import annotations

import hashlib
import io
import os
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import chex
import jax
import jax.numpy as jnp
import numpy as np

from aepg_jax import metrics
from aepg_jax.runs import lock

FILE = "predictions.npz"
FORMAT = 1
TOP_K = 5
SHARED = ("label", "logged_entropy")
PER_PREDICTOR = ("top_classes", "top_probs", "p_true", "entropy", "task_pred")


# ---------------------------------------------------------------- inside the jitted evaluation


def per_example(
    probs: Mapping[str, jax.Array],
    logged_entropy: jax.Array,
    labels: jax.Array,
    offset: jax.Array,
    stop: jax.Array,
) -> dict[str, Any]:
    """The kept columns of one batch: `label`, `logged_entropy` (B,), and per predictor
    `{top_classes, top_probs (B, K), p_true, entropy, task_pred (B,)}`; `[offset, stop)` are the
    evaluated task's own classes (the task-incremental argmax)."""
    out: dict[str, Any] = {"label": labels, "logged_entropy": logged_entropy}
    for name, p in probs.items():
        chex.assert_rank(p, 2)
        p = p.astype(jnp.float32)
        k = min(TOP_K, p.shape[-1])
        top_probs, top_classes = jax.lax.top_k(p, k)  # ties: the lower class first, as argmax
        classes = jnp.arange(p.shape[-1])
        own = (classes >= offset) & (classes < stop)
        out[name] = {
            "top_classes": top_classes.astype(jnp.int32),
            "top_probs": top_probs,
            "p_true": jnp.take_along_axis(p, labels[:, None].astype(jnp.int32), -1)[:, 0],
            "entropy": -jnp.sum(jnp.where(p > 0, p * jnp.log(jnp.where(p > 0, p, 1.0)), 0.0), -1),
            "task_pred": jnp.argmax(jnp.where(own[None], p, -jnp.inf), -1).astype(jnp.int32),
        }
    return out


# ---------------------------------------------------------------- host side


def _class_dtype(num_classes: int) -> np.dtype:
    return np.dtype(np.int16 if num_classes <= np.iinfo(np.int16).max else np.int32)


def host_rows(rows: Any, valid: int, num_classes: int) -> dict[str, Any]:
    """One evaluated task's kept columns on the host: the device rows of its batches
    (concatenated, one seed's), the first `valid` kept (the loader pads the last batch at the
    end), cast to the file's dtypes."""
    cls = _class_dtype(num_classes)
    casts = {
        "label": cls,
        "logged_entropy": np.float32,
        "top_classes": cls,
        "top_probs": np.float16,
        "p_true": np.float32,
        "entropy": np.float16,
        "task_pred": cls,
    }

    def cast(path, x):
        return np.asarray(x)[:valid].astype(casts[path[-1].key])

    return jax.tree_util.tree_map_with_path(cast, rows)


def concat(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Column-wise concatenation of kept-row dicts (same structure)."""
    return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)


def flatten(rows: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """`{"label": .., "<p>/top_classes": .., ...}`: the file's array names."""
    flat = {}
    for k, v in rows.items():
        if isinstance(v, Mapping):
            flat.update({f"{k}/{c}": x for c, x in v.items()})
        else:
            flat[k] = v
    return flat


def write(
    seed_dir: str | os.PathLike,
    after_task: int,
    evaluation: Mapping[str, np.ndarray],
    meta: Mapping[str, Any],
) -> str:
    """Replaces the rows of evaluations after tasks >= `after_task` in `<seed_dir>/FILE` with
    `evaluation` (the flat columns of the evaluation after `after_task`, with `after_task`,
    `task` and `index`), atomically; returns the file's sha256. A resumed run that evaluates a
    task again therefore keeps no row twice."""
    path = Path(seed_dir) / FILE
    lock.fence(path)
    kept = {}
    if path.exists():
        old = load(path)
        keep = old["after_task"] < after_task
        kept = {k: v[keep] for k, v in old.items() if not k.startswith("meta/")}
    columns = {k: np.concatenate([kept[k], v]) if k in kept else v for k, v in evaluation.items()}
    arrays = {**columns, **{f"meta/{k}": np.asarray(v) for k, v in meta.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            _write_npz(f, arrays)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return sha256(path)


def _write_npz(f: BinaryIO, arrays: Mapping[str, np.ndarray]) -> None:
    """An uncompressed `.npz` (what `np.load` reads) whose bytes depend on the arrays alone:
    every member dated 1980-01-01 (`np.savez` dates them now), so equal predictions have
    equal digests."""
    with zipfile.ZipFile(f, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH), buffer.getvalue())


_EPOCH = (1980, 1, 1, 0, 0, 0)


class Damaged(ValueError):
    """A predictions file that cannot be read as one: truncated, bytes changed (each member's
    CRC-32 is checked as it is read), or arrays missing or of unequal lengths."""


META_KEYS = ("predictors", "task_offsets", "task_sizes", "num_classes", "scenario")
COLUMNS = ("after_task", "task", "index", *SHARED)


def load(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every array of a predictions file (metadata under `meta/`); `Damaged`, one line naming
    the file, when it cannot be read or lacks an array (a missing file: FileNotFoundError)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        _check_layout(arrays)
    except OSError:
        raise
    except Exception as err:  # zipfile.BadZipFile, EOFError, ValueError, ...: a damaged file
        reason = " ".join(str(err).split()) or type(err).__name__
        raise Damaged(f"{path} is damaged ({reason}); restore it from a copy of the run.") from None
    return arrays


def _check_layout(arrays: Mapping[str, np.ndarray]) -> None:
    """ValueError naming the first array missing, or a column whose length is not the rows'."""
    names = [f"meta/{k}" for k in META_KEYS] + list(COLUMNS)
    if "meta/predictors" in arrays:
        names += [f"{p}/{c}" for p in arrays["meta/predictors"] for c in PER_PREDICTOR]
    missing = [k for k in names if k not in arrays]
    if missing:
        raise ValueError(f"no array {missing[0]}")
    rows = len(arrays["after_task"])
    short = [k for k in names if not k.startswith("meta/") and len(arrays[k]) != rows]
    if short:
        raise ValueError(f"{short[0]} has {len(arrays[short[0]])} rows, after_task {rows}")


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def notes_of(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, str], str | None]:
    """(`{predictor: note}` of the predictors that output scores, the logged entropy's note or
    None) of a predictions file's arrays; none in a file that keeps no notes."""
    if "meta/notes" not in arrays:
        return {}, None
    names = [str(p) for p in arrays["meta/predictors"]]
    notes = [str(n) for n in np.atleast_1d(arrays["meta/notes"])]
    entropy = str(arrays["meta/entropy_note"]) if "meta/entropy_note" in arrays else ""
    return {p: n for p, n in zip(names, notes, strict=True) if n}, entropy or None


def calibration_of(evaluation: Mapping[str, np.ndarray], predictor: str) -> dict[str, float]:
    """`predictor`'s calibration over one evaluation's kept rows (`metrics.calibration`)."""
    c = predictor_columns(evaluation, predictor)
    return metrics.calibration(
        c["top_probs"][:, 0],
        c["top_classes"][:, 0] == evaluation["label"],
        c["p_true"],
        c["entropy"],
    )


def predictor_columns(arrays: Mapping[str, np.ndarray], predictor: str) -> dict[str, np.ndarray]:
    """One predictor's columns `{top_classes, top_probs, p_true, entropy, task_pred}`."""
    return {c: arrays[f"{predictor}/{c}"] for c in PER_PREDICTOR}
