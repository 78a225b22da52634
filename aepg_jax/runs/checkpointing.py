"""Orbax checkpoints of a run: `<workdir>/checkpoints/<global_step>/`.

Each checkpoint holds the named pytrees its trainer gives (the continual loop: `state`, the
whole `TrainState`) and `meta` (JSON: for the continual loop the state layout, task index,
phase `in_task` / `task_done`, epoch, seeds, the accuracy trackers, head sizes, the backbone
fingerprint, wall time). A frozen backbone is not saved: its sha256 fingerprint is
stored and checked on resume.

Saves are asynchronous (`wait()` before anything depends on them). On resume the newest
checkpoint is restored; if it is corrupt or partial, the previous one is tried, with a warning,
and so on. If checkpoints exist but none can be restored, that is an error, never a silent
fresh start. Each item's sha256 (`tree_digest`, over leaf paths, shapes, dtypes and bytes) and
the sha256 of the rest of `meta` are saved in `meta["digests"]` and checked on restore (the meta
before anything reads it, the arrays after): a checkpoint whose bytes changed on disk, or that
has no digests, counts as unreadable.

A checkpoint that cannot be written (a read-only or full disk, a file where the directory should
be) raises `CheckpointWriteError`, found when the directory is opened (a probe file) or at the
save's next wait. Orbax's background threads of a failed save never finish, so after one the
Checkpointer waits for nothing more and the process must leave without joining them
(`hosts.leave(status, at_once=True)`).

Under the workdir lock (`runs/lock.py`) a save is written into
`<step>.orbax-checkpoint-tmp.<claim>` (named after the lock's claim, so that a holder taken over
and resumed never writes into its taker's save) and committed (renamed to `<step>`) only while
the lock is still this process's, checked just before: a holder that lost the run, or released
it, while a save was in flight drops that save and removes what it had written of it. A
Checkpointer opened by a process that took the run over from a holder that did not release it
(dead, or paused) first removes that holder's unfinished saves.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from aepg_jax.models import partition
from aepg_jax.runs import lock

META_DIGEST = "_meta"  # key of the meta's own digest in meta["digests"]


class NoRestorableCheckpoint(RuntimeError):
    """Checkpoints exist but none of them can be restored."""


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written to the run's checkpoint directory."""


class CorruptCheckpoint(ValueError):
    """A checkpoint whose restored arrays do not match the digest saved with them."""


class IncompatibleCheckpoint(ValueError):
    """A readable checkpoint that this run cannot continue (another state layout or seeds):
    raised by a restore target builder, it stops the restore instead of trying older ones."""


def tree_digest(tree: Any) -> str:
    """sha256 over a pytree's leaf paths, shapes, dtypes and bytes (host copies)."""
    digest = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
    for path, leaf in leaves:
        array = np.asarray(jax.device_get(leaf))
        key = jax.tree_util.keystr(path)
        digest.update(f"{key}:{array.shape}:{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _meta_digest(meta: dict[str, Any]) -> str:
    """sha256 of `meta` without its `digests` entry (canonical JSON)."""
    rest = {k: v for k, v in meta.items() if k != "digests"}
    return hashlib.sha256(json.dumps(rest, sort_keys=True).encode()).hexdigest()


def _short(err: BaseException, limit: int = 160) -> str:
    """`Type: first line of the message`, cut to `limit` characters."""
    lines = str(err).strip().splitlines()
    text = f"{type(err).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def backbone_fingerprint(frozen: dict[str, Any]) -> str:
    """sha256 over the frozen leaves' names, shapes, dtypes and bytes."""
    digest = hashlib.sha256()
    for name, leaf in sorted(partition.named_leaves(frozen).items()):
        array = np.asarray(jax.device_get(leaf))
        digest.update(f"{name}:{array.shape}:{array.dtype}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def _silence_closed_loop_noise() -> None:
    """After a failed restore, tensorstore's pending reads call back into Orbax's finished
    asyncio loop; Python reports each as an unraisable `RuntimeError('Event loop is closed')`
    (hundreds of traceback lines, no effect on the run). Drop exactly those, process-wide."""
    previous = sys.unraisablehook
    if getattr(previous, "_aepg_quiet", False):
        return

    def hook(unraisable) -> None:
        err = unraisable.exc_value
        if isinstance(err, RuntimeError) and "Event loop is closed" in str(err):
            return
        previous(unraisable)

    hook._aepg_quiet = True
    sys.unraisablehook = hook


# What Orbax logs (each with a ~60-line traceback) when a background save fails.
_FAILED_SAVE_LOGS = ("raised an exception", "in background save thread", "Finalize thread")


class _DropFailedSaveTracebacks(logging.Filter):
    """Orbax logs a failed background save with its tracebacks before the main thread sees
    the error; `CheckpointWriteError` reports it in one line instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        in_orbax = f"{os.sep}orbax{os.sep}" in record.pathname
        return not (in_orbax and any(m in str(record.msg) for m in _FAILED_SAVE_LOGS))


def _quiet_failed_saves() -> None:
    logger = logging.getLogger("absl")
    if not any(isinstance(f, _DropFailedSaveTracebacks) for f in logger.filters):
        logger.addFilter(_DropFailedSaveTracebacks())


def _write_error(directory: str, err: BaseException) -> CheckpointWriteError:
    reason = err.strerror if isinstance(err, OSError) and err.strerror else _short(err)
    return CheckpointWriteError(
        f"cannot write checkpoints to {directory} ({reason}); make that directory writable "
        "(or free space on its disk) and run the same command again to resume from the last "
        "checkpoint written."
    )


def check_writable(directory: str) -> None:
    """Raises CheckpointWriteError unless a file can be created in `directory` (created if
    missing): a read-only directory is found before any training, not at the first save."""
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise CheckpointWriteError(
            f"cannot write checkpoints to {directory}: it is a file, not a directory; move it "
            "away and run the same command again."
        )
    try:
        os.makedirs(directory, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=".write_probe-", dir=directory)
        os.close(fd)
        os.remove(path)
    except OSError as err:
        raise _write_error(directory, err) from None


def _verify_meta(meta: Any) -> None:
    """Raises CorruptCheckpoint unless `meta` carries digests and matches its own."""
    if not isinstance(meta, dict) or not isinstance(meta.get("digests"), dict):
        raise CorruptCheckpoint("its metadata has no digests")
    if meta["digests"].get(META_DIGEST) != _meta_digest(meta):
        raise CorruptCheckpoint("its metadata differs from its saved digest")


def _verify_items(restored: dict[str, Any], names: Any, meta: dict[str, Any]) -> None:
    """Raises CorruptCheckpoint unless every restored item matches its saved digest."""
    for name in names:
        if tree_digest(restored[name]) != meta["digests"].get(name):
            raise CorruptCheckpoint(f"the arrays of item {name!r} differ from their saved digest")


_TMP = ocp.path.atomicity.TMP_DIR_SUFFIX


class _FencedTemporaryPath(ocp.path.atomicity.AtomicRenameTemporaryPath):
    """Orbax's write-then-rename save under the workdir lock: a step's temporary directory
    carries the lock's claim number, and the rename that commits the step (after its items
    were renamed inside it) first checks, re-reading the claims, that the lock the save started
    under is still held and owned; if not, the step's temporary directory is removed and
    `lock.Lost` raised on Orbax's thread (re-raised by the next wait)."""

    _fence: Callable[[], None] | None = None

    @classmethod
    def from_final(cls, final_path, **kwargs) -> _FencedTemporaryPath:
        made = super().from_final(final_path, **kwargs)
        if _TMP in made._tmp_path.parent.name:  # an item, inside its step's directory
            return made
        claim = lock.claim_number(final_path)
        if claim is not None:  # `<step>.orbax-checkpoint-tmp.<claim>`: Orbax reads it back
            made._tmp_path = made._tmp_path.parent / f"{made._tmp_path.name}.{claim}"
        made._fence = lock.fence_of(final_path)
        return made

    async def finalize(self) -> None:
        if self._fence is not None:
            try:
                self._fence()
            except lock.Lost:
                shutil.rmtree(self._tmp_path, ignore_errors=True)  # this claim's: this save's
                raise
        await super().finalize()


class Checkpointer:
    """Saves and restores (state, lwf params, meta) under `directory`."""

    def __init__(self, directory: str, max_to_keep: int = 3):
        self.directory = os.path.abspath(directory)
        self._failed = False  # a save failed: Orbax's threads will never finish
        # The `resumes` notes of the newest checkpoint on disk and of a save in flight.
        self._on_disk: str | None = None
        self._in_flight: tuple[str | None] | None = None
        _quiet_failed_saves()
        lock.fence(self.directory, now=True)  # before removing anything
        if jax.process_index() == 0:  # the process that writes (Orbax's primary host)
            check_writable(self.directory)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                create=True,
                # A holder taken over (dead or paused) may have left unfinished saves.
                cleanup_tmp_directories=lock.inherited(self.directory) is not None,
                temporary_path_class=_FencedTemporaryPath,
            ),
        )

    def _writing(self, action: Callable[[], Any]) -> Any:
        """`action()` (a call that may wait on a pending save); its file system failure, or a
        pending save's, as CheckpointWriteError; `lock.Lost` when the run was taken over (a
        pending save dropped, or one that failed because its taker removed its files)."""
        if self._failed:
            lock.fence(self.directory, now=True)
            raise CheckpointWriteError(f"an earlier save to {self.directory} failed.")
        try:
            return action()
        except lock.Lost:
            self._failed = True
            raise
        except OSError as err:
            self._failed = True
            lock.fence(self.directory, now=True)
            raise _write_error(self.directory, err) from None
        except Exception:
            self._failed = True  # e.g. a lost peer process: reported as such by the caller
            lock.fence(self.directory, now=True)
            raise

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def save(
        self,
        step: int,
        items: dict[str, Any],
        meta: dict[str, Any],
        resumes: str | None = None,
    ) -> None:
        """Starts an asynchronous save of checkpoint `step` (replaces an existing one): each
        named pytree of `items` (empty trees are skipped: Orbax refuses them) and `meta`;
        `lock.Lost` when another process has taken the run over. `resumes`: what a run
        resumed from it does, in words (`on_disk()`)."""
        lock.fence(self.directory)
        if step in self._manager.all_steps():
            self._writing(self._manager.wait_until_finished)
            self._writing(lambda: self._manager.delete(step))
        items = {k: v for k, v in items.items() if jax.tree.leaves(v)}
        # Digests of the arrays as saved: a restore that reads other bytes is refused.
        digests = {k: tree_digest(v) for k, v in items.items()}
        meta = {**meta, "digests": {**digests, META_DIGEST: _meta_digest(meta)}}
        args = {k: ocp.args.StandardSave(v) for k, v in items.items()}
        composite = ocp.args.Composite(**args, meta=ocp.args.JsonSave(meta))
        self._writing(lambda: self._manager.save(step, args=composite))
        if self._in_flight is not None:  # Orbax's save waited for the previous one
            self._on_disk = self._in_flight[0]
        self._in_flight = (resumes,)

    def wait(self) -> None:
        """Blocks until the pending asynchronous save is on disk."""
        lock.fence(self.directory)
        self._writing(self._manager.wait_until_finished)
        if self._in_flight is not None:
            self._on_disk, self._in_flight = self._in_flight[0], None

    def restored(self, resumes: str | None) -> None:
        """Notes what a run resumed from the checkpoint restored does (`on_disk()`)."""
        self._on_disk, self._in_flight = resumes, None

    def on_disk(self) -> str | None:
        """The `resumes` note of the newest checkpoint known to be on disk: a save in flight
        counts once written, one cut short (a save's call interrupted) never."""
        if self._in_flight is not None and not self._manager.is_saving_in_progress():
            return self._in_flight[0]
        return self._on_disk

    def restore_latest(
        self, make_targets: Callable[[dict[str, Any]], dict[str, Any]]
    ) -> tuple[dict[str, Any], dict[str, Any]] | None:
        """`(items, meta)` of the newest restorable checkpoint; None if there is none.

        `make_targets(meta)` builds trees of the right structure (values arbitrary) for the
        items of that checkpoint; an empty target is returned as is (it was not saved).
        """
        steps = self.steps()
        failures = []
        for step in reversed(steps):
            try:
                meta = self._manager.restore(
                    step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())
                )["meta"]
                _verify_meta(meta)  # before make_targets trusts its fields
                targets = make_targets(meta)
                args = {
                    k: ocp.args.StandardRestore(v) for k, v in targets.items() if jax.tree.leaves(v)
                }
                restored = self._manager.restore(step, args=ocp.args.Composite(**args))
                _verify_items(restored, args, meta)
            except IncompatibleCheckpoint:
                raise
            except Exception as err:  # any failure means: try the previous checkpoint
                _silence_closed_loop_noise()
                failures.append(f"{step} ({_short(err)})")
                logging.warning(
                    "Checkpoint %d in %s cannot be restored (%s); trying the previous one.",
                    step,
                    self.directory,
                    _short(err),
                )
                continue
            if failures:
                logging.warning(
                    "Resumed from checkpoint %d after skipping %d unreadable newer one(s).",
                    step,
                    len(failures),
                )
            return {k: restored[k] if k in args else v for k, v in targets.items()}, meta
        if steps:
            raise NoRestorableCheckpoint(
                f"none of the checkpoints in {self.directory} can be restored "
                f"({'; '.join(failures)}); move the workdir away to start fresh."
            )
        return None

    def abandon(self) -> None:
        """Ctrl-C: `close` then waits for nothing. The process ends at once (`aepg_jax.main`),
        a pending save is left unfinished (a temporary directory no restore reads): the
        interrupt may have cut Orbax's threads' hand-over in the main thread, and a wait on
        them could then never end."""
        self._failed = True

    def close(self) -> None:
        """Waits for the pending save and closes; after a failed save, nothing (its threads
        would never finish), after `abandon`, or after the run was taken over by another
        process (`lock.Lost`)."""
        if self._failed or not lock.owns(self.directory):
            return
        self._writing(self._manager.wait_until_finished)
        self._manager.close()
