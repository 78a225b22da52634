"""Run records shared by every trainer: metrics.jsonl (one JSON object per line), atomic JSON
results files, and the bookkeeping of a run's seeds (their folders, their configs, their
summary as mean +- std, the run's name on its plots).

`metrics.jsonl` holds one JSON object per line, each with a `type` field (the writer enforces
only `type`; each trainer documents its records). Every record is there once: a resumed run
first rewinds its records to its checkpoint (`MetricsWriter.rewind` with the checkpoint's
`Cut`), dropping what the stopped process recorded after it (and a killed run's partial last
line), and regenerates the TensorBoard events from what is kept; `read_metrics` still drops the
repeats of a file written before rewinding existed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from aepg_jax import losses
from aepg_jax.runs import lock

METRICS_FILE = "metrics.jsonl"
RESULTS_FILE = "results.json"
SEEDS_RESULTS_FILE = "results_seeds.json"  # the summary of a run of several seeds


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


@dataclasses.dataclass(frozen=True)
class Cut:
    """Where a checkpoint leaves a run's records: every record of a global step before `step`,
    the `train` record of `step` itself and, when `closed`, the records that close the task or
    epoch ending at `step` (`eval`, `epoch`: written after that step's `train` record). Steps
    count from 1, so `Cut(0)` keeps no stepped record (a run started again from nothing).
    Records without a `step` are always kept."""

    step: int
    closed: bool = True

    def keeps(self, record: Mapping[str, Any]) -> bool:
        step = record.get("step")
        if step is None:
            return True
        if step != self.step:
            return step < self.step
        return self.closed or record.get("type") == "train"


class MetricsWriter:
    """Appends one JSON object per line to `<workdir>/metrics.jsonl`, flushed after each line.

    An existing file is continued (a resumed run), after `rewind` to the checkpoint resumed
    from; a partial last line left by a killed run is removed first. With `enabled=False`
    (processes other than 0) every call is a no-op. With `tensorboard=True` every record's
    numbers also go to a TensorBoard event file in `workdir` (`runs/tensorboard.py`; `rewind`
    writes the kept records into one new event file there, in place of the earlier ones).
    """

    def __init__(self, workdir: str | os.PathLike, enabled: bool = True, tensorboard: bool = False):
        self.path = Path(workdir) / METRICS_FILE
        self.enabled = enabled
        self._file = None
        self.events = None
        self._texts: list[tuple[str, Any]] = []  # written again into a regenerated event file
        if enabled and tensorboard:
            from aepg_jax.runs.tensorboard import EventWriter

            self.events = EventWriter(workdir)
        if enabled:
            lock.fence(self.path)
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
        lock.fence(self.path)  # lock.Lost once another process has taken the run over
        self._file.write(_dumps(line) + "\n")
        self._file.flush()
        if self.events is not None:
            self.events.record(to_jsonable(line))

    def text(self, tag: str, value: Any) -> None:
        """`value` (a config, say) as text in the event file, when there is one."""
        if self.events is not None:
            self._texts.append((tag, to_jsonable(value)))
            self.events.text(tag, to_jsonable(value))

    def rewind(self, cut: Cut) -> int:
        """Keeps in metrics.jsonl only the records that `cut` keeps, each (type, task, step)
        once (its last occurrence, as `read_metrics`), written atomically into a new file; with
        TensorBoard, replaces the directory's event files by one holding the kept records'
        scalars (and this writer's texts) when there were other event files or records were
        dropped. Whatever stopped the previous process (a signal, SIGKILL, a lost lock), every
        step is then recorded once. Returns the number of records dropped."""
        if not self.enabled:
            return 0
        lock.fence(self.path)
        kept, dropped = [], 0
        if self.path.exists():
            text = self.path.read_text(encoding="utf-8")
            lines = sum(1 for line in text.split("\n") if line.strip())
            kept = [r for r in read_metrics(self.path) if cut.keeps(r)]
            dropped = lines - len(kept)
            # A new file even when nothing is dropped: a process that lost the run and still
            # holds the old one open appends there, not here.
            self._file.close()
            _replace_text(self.path, "".join(_dumps(r) + "\n" for r in kept))
            self._file = open(self.path, "a", encoding="utf-8")
        if self.events is not None:
            self._regenerate_events(kept, dropped > 0)
        return dropped

    def _regenerate_events(self, kept: Sequence[Mapping[str, Any]], changed: bool) -> None:
        """One event file holding `kept` in place of the directory's event files (a reader
        merges every file of a directory: the steps of an abandoned process would show twice)."""
        from aepg_jax.runs.tensorboard import EventWriter, event_files

        directory = self.path.parent
        others = [f for f in event_files(directory) if f != self.events.path]
        if not (others or changed):
            return
        self.events.close()
        for f in event_files(directory):
            f.unlink(missing_ok=True)
        self.events = EventWriter(directory)
        self.events.replay(self._texts, kept)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if self.events is not None:
            if lock.owns(self.path):  # a run taken over writes no more events
                self.events.close()
            self.events = None

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


def _umask() -> int:
    """The process's umask (reading it means setting it; set straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def kept_results(
    workdir: str | os.PathLike, results: Mapping[str, Any], filename: str = RESULTS_FILE
) -> dict:
    """The results a finished run wrote into `<workdir>/<filename>` when it finished (a re-run
    keeps them byte for byte: its own figures, e.g. compile counts, would replace the ones the
    finished run measured); `results` written there when the file is missing or unreadable."""
    path = Path(workdir) / filename
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        write_results(workdir, results, filename)
        return dict(results)


def _replace_text(path: Path, text: str) -> None:
    """Writes `text` to `path` atomically (temp file + `os.replace`), with the mode of any file
    the process creates (0644 under the usual umask 022, not mkstemp's 0600)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_results(
    workdir: str | os.PathLike, results: Mapping[str, Any], filename: str = RESULTS_FILE
) -> Path:
    """Writes `<workdir>/<filename>` atomically (temp file + `os.replace`), NaN -> null, with
    the mode of any file the process creates (0644 under the usual umask 022, not mkstemp's
    0600)."""
    workdir = Path(workdir)
    lock.fence(workdir / filename)
    workdir.mkdir(parents=True, exist_ok=True)
    _replace_text(workdir / filename, _dumps(results, indent=2) + "\n")
    return workdir / filename


def seed_dirs(workdir: str, seeds: Sequence[int]) -> list[str]:
    """Where each seed's records go: `workdir` for one seed, `workdir/seed_<s>` for several."""
    if len(seeds) == 1:
        return [workdir]
    return [os.path.join(workdir, f"seed_{s}") for s in seeds]


def open_writers(cfg: Any, directories: Sequence[str], enabled: bool) -> list[MetricsWriter]:
    """One `MetricsWriter` per seed folder (TensorBoard events with `cfg.tensorboard`), each
    with the config as text in its event file."""
    writers = [MetricsWriter(d, enabled=enabled, tensorboard=cfg.tensorboard) for d in directories]
    for writer in writers:
        writer.text("config", cfg)
    return writers


def seed_config(cfg: Any, seed: int) -> dict[str, Any]:
    """The config of one seed of a multi-seed run, as a single run of that seed has it."""
    d = to_jsonable(cfg.to_dict())
    d["seed"], d["num_seeds"] = int(seed), 1
    return d


def is_number(x: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def mean_std(values: Sequence[Any]) -> dict[str, Any]:
    """`{mean, std, values}` over seeds: mean and sample std (ddof=1; None for one value) of
    the finite values; `values` as floats, None where not a finite number."""
    finite = [float(v) for v in values if is_number(v)]
    return {
        "mean": float(np.mean(finite)) if finite else None,
        "std": float(np.std(finite, ddof=1)) if len(finite) > 1 else None,
        "values": [float(v) if is_number(v) else None for v in values],
    }


def seeds_summary(
    per_seed: Sequence[Mapping[str, Any]],
    config: Mapping[str, Any],
    wall_time_s: float,
    metrics: Mapping[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """results_seeds.json of a multi-seed run: `config`, `seeds`, `metrics` (the trainer's
    `mean_std`s), the trainer's `extra` keys, `wall_time_s` (of the whole vmapped run) and
    `per_seed` (each seed's results.json dict)."""
    return {
        "config": to_jsonable(config),
        "seeds": [int(r["seed"]) for r in per_seed],
        "metrics": dict(metrics),
        **extra,
        "wall_time_s": float(wall_time_s),
        "per_seed": [dict(r) for r in per_seed],
    }


def run_name(results: Mapping[str, Any]) -> str:
    """A results dict in a few words, to title its plots: `[dataset: ]loss[, alpha = a]
    [ / method], seed s`."""
    config = results.get("config") or {}
    loss = config.get("loss") or {}
    name = loss.get("name", "?")
    if name in losses.LOSSES and losses.fixed_alpha(name) is not None and "alpha" in loss:
        name = f"{name}, alpha = {loss['alpha']:g}"
    method = (config.get("method") or {}).get("name")
    dataset = results.get("dataset")
    seed = results.get("seed", config.get("seed", "?"))
    return (
        (f"{dataset}: " if dataset else "")
        + name
        + (f" / {method}" if method else "")
        + f", seed {seed}"
    )
