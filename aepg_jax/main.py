"""Runs one experiment: continual fine-tuning of a ViT, or training a ResNet from scratch.

    python -m aepg_jax.main --config=configs/<name>.py[:args] --workdir=DIR [--config.a.b=value]

The config file's `get_config(args)` builds the run's config; `--config.<field>=<value>`
changes a field (a misspelt field or a value of the wrong type is one `error:` line). Every
field with its default and meaning: `python -m pydoc aepg_jax.config.schema` (the from-scratch
trainer's: `python -m pydoc aepg_jax.scratch.config`); configs/README.md maps the paper's
tables to config files. The run writes its config, metrics.jsonl, results.json, plots and
checkpoints into DIR; the same command resumes it, and a different config in DIR is refused
once DIR has a checkpoint (except fields that change no result: where the data and weights are,
how often to log and checkpoint). Ctrl-C, SIGTERM and SIGUSR1 checkpoint the current step and
end the run with one line (exit 130, 143, 138); the same command resumes there. A second
Ctrl-C ends it at once, saying what the rerun resumes from (the newest checkpoint). Several
processes: `--config.distributed=True`, or `python -m aepg_jax.launch` on one machine.
docs/running.md has the details.
"""

from __future__ import annotations

import json
import logging as pylogging
import os
import sys
import traceback

import jax
import tqdm
from absl import app, flags, logging
from ml_collections import config_flags

from aepg_jax.checkpoints import augreg
from aepg_jax.config import command_line, schema
from aepg_jax.continual import trainer as continual_trainer
from aepg_jax.runs import checkpointing, identity, lock, tensorboard
from aepg_jax.scratch import config as scratch_config
from aepg_jax.scratch import trainer as scratch_trainer
from aepg_jax.system import cli, hosts, memory, preemption, progress, xla_cache

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, configs/<name>.py[:args].", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Run directory (config, metrics, checkpoints, results); re-run to resume."
)
flags.mark_flags_as_required(["config", "workdir"])

# Errors that mean "the user must change something": shown as one line, not a traceback.
USER_ERRORS = (
    ValueError,
    FileNotFoundError,
    PermissionError,  # a file or directory the user must make readable or writable
    FloatingPointError,
    augreg.CheckpointError,
    checkpointing.NoRestorableCheckpoint,
    lock.Busy,  # another run holds the workdir, or took it over (lock.Lost) (runs/lock.py)
    lock.LockError,  # the lock's files cannot be used (a full disk, an unreadable .lock)
    tensorboard.EventWriteError,  # the event file cannot be written (a full disk)
)

EXIT_INTERRUPTED = 130  # what a shell reports for a process ended by SIGINT

# config.trainer -> (its config schema: `base_config(preset)`, `validate(cfg, num_devices)`;
# run(cfg, workdir)).
TRAINERS = {
    "continual": (schema, continual_trainer.run),
    "scratch": (scratch_config, scratch_trainer.run),
}
# The trainers' schemas, as the run identity compares configs (`identity.differences`).
SCHEMAS = {name: module.base_config for name, (module, _) in TRAINERS.items()}


def _quiet_orbax(record: pylogging.LogRecord) -> bool:
    """Drops Orbax's warnings below ERROR (e.g. "Waiting for previous save to complete took
    1.03 seconds"): nothing a user can act on. Its errors, and everything at --verbosity, stay."""
    return record.levelno >= pylogging.ERROR or f"{os.sep}orbax{os.sep}" not in record.pathname


def select_trainer(cfg):
    """The (validate, run) pair of `cfg.trainer`."""
    name = cfg.trainer
    if name not in TRAINERS:
        raise ValueError(f"trainer={name!r} is unknown; use one of {', '.join(TRAINERS)}.")
    module, run = TRAINERS[name]
    return module.validate, run


def workdir_problem(workdir: str, given: str) -> str | None:
    """Why the absolute path `workdir` (`--workdir=given`) cannot hold a run, or None: a file,
    or a directory (or its nearest existing ancestor, where it would be created) that this
    process cannot write."""
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        return f"--workdir={given} is an existing file; name a directory."
    existing = workdir
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"--workdir={given}: {existing} is a file, not a directory; name a directory."
    if not os.access(existing, os.W_OK | os.X_OK):
        where = "that directory" if existing == workdir else f"{existing}, where it would go,"
        return (
            f"--workdir={given}: {where} is not writable; name a directory you can write to "
            "(or change its permissions)."
        )
    return None


def has_checkpoint(workdir: str) -> bool:
    """Whether `<workdir>/checkpoints` holds a checkpoint (a step directory), complete or not."""
    directory = os.path.join(workdir, "checkpoints")
    return os.path.isdir(directory) and any(name.isdigit() for name in os.listdir(directory))


def check_or_save_config(cfg, workdir: str) -> None:
    """Saves the config, with the digests of the files it names (`identity.inputs`), in a new
    workdir; refuses a config of another identity (`identity.differences`) in a workdir whose
    run has a checkpoint, and replaces it in one that has none yet (a failed start, corrected)
    or where only what leaves the identity changed (a moved weights file, say)."""
    path = os.path.join(workdir, "config.json")
    current = identity.with_inputs(json.loads(cfg.to_json_best_effort()))
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        lacks = [k for k in ("trainer", "tensorboard") if k in current and k not in saved]
        if lacks and has_checkpoint(workdir):  # saved before configs had these fields
            commit = command_line.FLAT_NAMES_COMMIT
            raise ValueError(
                f"{workdir} holds a run of aepg_jax <= commit {commit} (its config.json has no "
                f"{' or '.join(lacks)}); resume it with that version (git checkout {commit}) "
                "or use a new --workdir."
            )
        if saved == current:
            return
        diff = identity.differences(saved, current, SCHEMAS)
        if diff and has_checkpoint(workdir):
            raise ValueError(
                f"{workdir} holds a run with another config (differs in: {', '.join(diff)}); "
                "use a new --workdir, or the same config to resume that run."
            )
        # Nothing was trained that a checkpoint keeps (the corrected config starts afresh), or
        # only where files are and how often to log changed (`identity.NOT_IDENTITY`), or the
        # saved config predates the input digests (recorded now; the checkpoint's backbone
        # fingerprint is still checked on resume).
    if jax.process_index() == 0:
        lock.fence(path)
        os.makedirs(workdir, exist_ok=True)
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(current, f, indent=1)
        os.replace(tmp, path)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)  # orbax and XLA log a lot at INFO
        logging.get_absl_handler().addFilter(_quiet_orbax)
    cfg = _CONFIG.value
    # Before anything compiles: jax settles on its persistent cache at the first compilation.
    xla_cache.enable(xla_cache.directory(cfg.get("compile_cache", xla_cache.DEFAULT)))
    try:
        memory.apply_default()  # before the backend starts (memory.py)
        hosts.initialize(cfg.distributed)
    except ValueError as err:
        cli.fail(str(err), shared=True)
    workdir = os.path.abspath(os.path.expanduser(_WORKDIR.value))
    problem = workdir_problem(workdir, _WORKDIR.value)
    if problem:
        cli.fail(problem, exit_fn=hosts.leave, shared=True)
    try:
        validate, _ = select_trainer(cfg)
        validate(cfg, jax.device_count())
    except ValueError as err:  # the same on every process: printed once (cli.fail)
        cli.fail(str(err), exit_fn=hosts.leave, shared=True)
    try:
        with preemption.catch():
            execute(cfg, workdir, validated=True)
    except KeyboardInterrupt:
        _interrupted()
    except preemption.Preempted as stop:
        _preempted(stop)
    except Exception as err:
        _fail(err)


def execute(cfg, workdir: str, *, validated: bool = False) -> dict:
    """Validates `cfg` (unless the caller did), saves it in `workdir` (or checks it against the
    saved one) and runs (or resumes) its trainer; returns the run's results. `aepg_jax.sweep`
    runs each run through it. The run holds `workdir`'s lock throughout (`runs/lock.py`): a
    second run on it raises `lock.Busy` before touching anything."""
    validate, run = select_trainer(cfg)
    if not validated:
        validate(cfg, jax.device_count())
    with lock.hold_run(workdir):
        check_or_save_config(cfg, workdir)
        return run(cfg, workdir)


def _interrupted() -> None:
    """A second Ctrl-C (`system/preemption.py`): one line saying where the run stopped and what
    the rerun resumes from, exit code 130 (128 + SIGINT)."""
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()
    sys.stdout.flush()
    if jax.process_index() == 0:
        print(progress.interrupted_message(), file=sys.stderr)
    sys.stderr.flush()
    # No interpreter shutdown: background threads (Orbax's, XLA's) may still hold the process.
    os._exit(EXIT_INTERRUPTED)


def _preempted(stop: preemption.Preempted) -> None:
    """Ctrl-C / SIGTERM / SIGUSR1: one line saying where the run stopped and that rerunning
    resumes it, exit status 128 + the signal's number (the run's checkpoint is written, its
    lock free)."""
    for bar in list(getattr(tqdm.tqdm, "_instances", ())):
        bar.close()
    sys.stdout.flush()
    if jax.process_index() == 0:
        print(f"{stop}; run the same command to resume", file=sys.stderr, flush=True)
    hosts.leave(stop.status, at_once=True)  # Orbax's and XLA's threads need no goodbye


def _fail(err: Exception) -> None:
    """Ends the process on `err`: one line for a user error or a lost process, else the
    traceback; with several processes at once (`hosts.leave`)."""
    if hosts.lost_a_process(err):
        cli.fail(
            f"another process of this run failed or died ({cli.one_line(str(err))}); restart "
            "all of them to resume from the last checkpoint.",
            exit_fn=lambda _: hosts.leave(1),
        )
    if isinstance(err, checkpointing.CheckpointWriteError | lock.Lost):
        # Orbax's threads of a failed save never finish; a run taken over writes nothing more
        cli.fail(str(err), exit_fn=lambda status: hosts.leave(status, at_once=True))
    if isinstance(err, USER_ERRORS):
        cli.fail(str(err), exit_fn=hosts.leave)
    if jax.process_count() > 1:  # a lone failure must not wait for its peers (hosts.leave)
        traceback.print_exc()
        hosts.leave(1)
    raise  # the exception being handled by main


if __name__ == "__main__":
    app.run(main, flags_parser=lambda argv: command_line.parse_flags(argv, _CONFIG))
