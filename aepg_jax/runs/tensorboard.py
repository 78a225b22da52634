"""TensorBoard event files mirroring metrics.jsonl (tensorboardX: no TensorFlow needed).

Every number of a metrics record becomes a scalar at the record's `step`, tagged
`<type>/<field>` and, inside nested fields, `<type>/<field>/<key or task_i>`:

    train/loss  train/alpha  train/entropy  train/lr  train/grad_norm  train/images_per_s
    eval/A_t  eval/acc_pooled  eval/forgetting  eval/accuracy/<predictor>/task_<i>  ...

Position fields (`step`, `task`, `task_step`, `epoch`), booleans, strings and nulls are not
scalars. metrics.jsonl stays the source of truth: the events hold the same numbers. They go
into the run's own directory, so `tensorboard --logdir=SWEEPDIR` lists a sweep's runs by their
directory names.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Mapping
from typing import Any

POSITION_FIELDS = frozenset({"type", "step", "task", "task_step", "epoch"})


def scalars(record: Mapping[str, Any]) -> Iterator[tuple[str, float]]:
    """`(tag, value)` for every finite number of `record` (JSON-ready values)."""

    def walk(tag: str, value: Any) -> Iterator[tuple[str, float]]:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return
        if isinstance(value, int | float):
            yield tag, float(value)
        elif isinstance(value, Mapping):
            for key, item in value.items():
                yield from walk(f"{tag}/{key}", item)
        elif isinstance(value, list | tuple):
            for i, item in enumerate(value):
                yield from walk(f"{tag}/task_{i}", item)

    kind = record["type"]
    for key, value in record.items():
        if key not in POSITION_FIELDS:
            yield from walk(f"{kind}/{key}", value)


class EventWriter:
    """Writes a run's scalars and config text into `directory`'s event file."""

    def __init__(self, directory: str | os.PathLike):
        from tensorboardX import SummaryWriter

        self._writer = SummaryWriter(logdir=os.fspath(directory), flush_secs=30)

    def record(self, record: Mapping[str, Any]) -> None:
        """The scalars of one metrics record (JSON-ready: `records.to_jsonable`)."""
        step = record.get("step")
        if step is None:
            return
        for tag, value in scalars(record):
            self._writer.add_scalar(tag, value, global_step=int(step))

    def text(self, tag: str, value: Any) -> None:
        """`value` (JSON-ready: `records.to_jsonable`) as JSON in a code block (TensorBoard
        renders text as Markdown)."""
        body = json.dumps(value, indent=1, sort_keys=True)
        self._writer.add_text(tag, "\n".join("    " + line for line in body.splitlines()), 0)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
