"""TensorBoard event files mirroring metrics.jsonl (tensorboardX: no TensorFlow needed).

Every number of a metrics record becomes a scalar at the record's `step`, tagged
`<type>/<field>` and, inside nested fields, `<type>/<field>/<key or task_i>` (i = 1..T, tasks
counted from 1 as the console and the docs count them):

    train/loss  train/alpha  train/entropy  train/lr  train/grad_norm  train/images_per_s
    eval/A_t  eval/acc_pooled  eval/forgetting  eval/bwt  eval/task_incremental_A_t
    eval/accuracy/<predictor>/task_<i>  eval/task_incremental_accuracy/<predictor>/task_<i>  ...

Position fields (`step`, `task`, `task_step`, `epoch`), booleans, strings and nulls are not
scalars. metrics.jsonl stays the source of truth: the events hold the same numbers. They go
into the run's own directory, so `tensorboard --logdir=SWEEPDIR` lists a sweep's runs by their
directory names. A reader merges every event file of a directory, so a resumed run does not add
a file beside the stopped process's: it writes the records it keeps (`records.MetricsWriter.
rewind`) into one new file and removes the earlier ones (`event_files`), and each step shows
once.

A disk that fills (or any other failed write of the event file, at a record or a flush) raises
`EventWriteError` at the run's next record, one line; the failed writer writes nothing more and
its `close` does not raise again, so the run stops as after any error and the same command
resumes it from its last checkpoint (in a new event file).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from aepg_jax.runs import lock

POSITION_FIELDS = frozenset({"type", "step", "task", "task_step", "epoch"})
EVENT_FILE_PREFIX = "events.out.tfevents."


def event_files(directory: str | os.PathLike) -> list[Path]:
    """The TensorBoard event files directly in `directory` (none when it does not exist)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name.startswith(EVENT_FILE_PREFIX))


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
            for i, item in enumerate(value, start=1):
                yield from walk(f"{tag}/task_{i}", item)

    kind = record["type"]
    for key, value in record.items():
        if key not in POSITION_FIELDS:
            yield from walk(f"{kind}/{key}", value)


def _code_block(value: Any) -> str:
    """`value` as indented JSON: a Markdown code block."""
    body = json.dumps(value, indent=1, sort_keys=True)
    return "\n".join("    " + line for line in body.splitlines())


class EventWriteError(RuntimeError):
    """The event file could not be written (a full disk, say)."""


class EventWriter:
    """Writes a run's scalars and config text into a new event file in `directory`.

    Events are written in the calling thread (tensorboardX's `EventsWriter`, without its
    `SummaryWriter`'s queue and background thread) and flushed every `FLUSH_S` seconds, at
    `flush` and at `close`: a Ctrl-C that lands while a record is written cannot leave a queue
    that `close` then waits on forever."""

    FLUSH_S = 30.0

    def __init__(self, directory: str | os.PathLike):
        from tensorboardX.event_file_writer import EventsWriter

        self.directory = os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        self.error: OSError | None = None
        self._events = EventsWriter(os.path.join(self.directory, "events"))
        self.path = Path(self._events._file_name)
        self._flushed = time.monotonic()

    def _write(self, events: Iterator[Any] | Sequence[Any], flush: bool = False) -> None:
        """Writes `events` (tensorboardX `Event`s); keeps a write's OSError for `check` instead
        of raising it. After one, or once the run was taken over, it writes nothing more."""
        if self.error is not None or not lock.owns(self.directory):
            return
        try:
            for event in events:
                self._events.write_event(event)
            if flush or time.monotonic() - self._flushed >= self.FLUSH_S:
                self._events.flush()
                self._flushed = time.monotonic()
        except OSError as err:
            self.error = err

    def check(self) -> None:
        """Raises EventWriteError, one line, once a write of the event file failed."""
        if self.error is not None:
            reason = self.error.strerror or type(self.error).__name__
            raise EventWriteError(
                f"cannot write TensorBoard events to {self.directory} ({reason}); free space on "
                "its disk (or turn them off with --config.tensorboard=False) and run the same "
                "command to resume from the last checkpoint."
            )

    def record(self, record: Mapping[str, Any]) -> None:
        """The scalars of one metrics record (JSON-ready: `records.to_jsonable`)."""
        self.check()
        if record.get("step") is not None:
            self._write(_scalar_events(record, time.time()))

    def text(self, tag: str, value: Any) -> None:
        """`value` (JSON-ready: `records.to_jsonable`) as JSON in a code block (TensorBoard
        renders text as Markdown)."""
        self.check()
        self._write([_text_event(tag, value, time.time())])

    def replay(
        self, texts: Sequence[tuple[str, Any]], records: Sequence[Mapping[str, Any]]
    ) -> None:
        """Writes `texts` (as `text`) and the scalars of `records` (as `record`) into the event
        file now, in order, and flushes it: a resumed run's history."""
        self.check()
        now = time.time()
        self._write([_text_event(tag, value, now) for tag, value in texts])
        for record in records:
            if record.get("step") is not None:
                self._write(_scalar_events(record, now))
        self._write([], flush=True)
        self.check()

    def flush(self) -> None:
        self._write([], flush=True)
        self.check()

    def close(self) -> None:
        """Flushes and closes; after a failed write, closes without raising (the failure was
        raised at a record, or is no use to report now)."""
        failed = self.error is not None
        self._write([], flush=True)
        try:
            self._events.close()
        except OSError:
            failed = True
        if not failed:
            self.check()


def _scalar_events(record: Mapping[str, Any], wall_time: float) -> Iterator[Any]:
    """The scalar events of a metrics record with a `step`."""
    from tensorboardX import summary
    from tensorboardX.proto import event_pb2

    step = int(record["step"])
    for tag, value in scalars(record):
        yield event_pb2.Event(summary=summary.scalar(tag, value), step=step, wall_time=wall_time)


def _text_event(tag: str, value: Any, wall_time: float) -> Any:
    """A text event at step 0: `value` as JSON in a Markdown code block."""
    from tensorboardX import summary
    from tensorboardX.proto import event_pb2

    return event_pb2.Event(
        summary=summary.text(tag, _code_block(value)), step=0, wall_time=wall_time
    )
