"""Runs an experiment's runs (a paper table or figure, `aepg_jax/experiments/paper.py`), resumably.

    python -m aepg_jax.sweep --experiment=NAME --workdir=DIR [--list | --status]
        [--where key=value,...] [--shard=i/n] [--vmap_seeds]
        [--slurm [--array_size=N] [--sbatch=OPTION ...]] [--config.<field>=<value> ...]

Before any run, every `--config.*` override is applied to every run's config and validated: a
bad one stops the sweep with one `error:` line (exit 2). The process is then a worker
(`claims.py`): it claims the next unclaimed, unfinished run (most expensive first, by
`plan/estimate.py`) through the run's lock, until none is left, so that any number of sweep
processes on one DIR (one per GPU, a SLURM array, a second node) share the runs and a run whose
worker died is claimed again and resumes. Every run goes through
`aepg_jax.main.execute` with `aepg_jax.main`'s command-line semantics: same workdir
(`DIR/<run name>`, see `experiments/layout.py`), same config checks, same resume (an interrupted run
continues from its last checkpoint). A run's own output goes to `<workdir>/sweep.log`; the
sweep prints one line per run (index, name, A_T when done, the sweep's ETA). A run that fails
is recorded (`<workdir>/sweep_error.txt`, its error line printed) and the sweep goes on; it
exits with status 1 at the end if any failed. `--config.*` overrides (weights, data dir,
`model.dtype`, ...) go to every run. `--shard=i/n` limits the worker to every n-th run from the
i-th (static sharding); `--slurm` prints an sbatch array script of workers; `--vmap_seeds` runs
the consecutive seeds of a cell as one `num_seeds` program (docs/running.md, "Many seeds
in one program"). SIGTERM or SIGUSR1 (SLURM's preemption, requeue or `--signal`) stops the
worker: the run in progress checkpoints its current step, no other run is claimed, and the sweep
exits with status 128 + the signal's number (143, 138); the same command resumes. `--status`
prints each run's status (done, running: worker, since, task t of T, failed: its error line,
partial, todo; `overview.py`), `--list` also their `aepg_jax.main` commands; both work without
--workdir (status unknown). `python -m aepg_jax.tables DIR` then
prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import sys
import time
import traceback
from collections.abc import Sequence

from aepg_jax import experiments
from aepg_jax.experiments import layout, registry
from aepg_jax.runs import lock
from aepg_jax.sweep import claims, overview, preflight
from aepg_jax.system import cli, preemption

EXIT_FAILED_RUNS = 1
load_config = preflight.load_config


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line (exit 2), not the usage block."""

    def error(self, message: str):
        cli.fail(f"{message} (see python -m aepg_jax.sweep --help).")


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's options and the `--config.<field>=<value>` overrides."""
    parser = _Parser(
        prog="python -m aepg_jax.sweep",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--experiment",
        required=True,
        help="table1, table2, ..., fig6, paper, demo, or a .py file with EXPERIMENT",
    )
    parser.add_argument("--workdir", help="the sweep's directory (DIR)")
    parser.add_argument(
        "--list", action="store_true", help="print the runs, their status and commands; exit"
    )
    parser.add_argument("--status", action="store_true", help="print the runs' status; exit")
    parser.add_argument(
        "--where", help="only the runs whose arguments match, e.g. tasks=10,loss=ce"
    )
    parser.add_argument("--shard", help="i/n: run only shard i (0-based) of n")
    parser.add_argument(
        "--vmap_seeds",
        action="store_true",
        help="run the consecutive seeds of a cell as one num_seeds program",
    )
    parser.add_argument(
        "--compile_cache",
        help="JAX's persistent compilation cache, shared by the runs (seeds of a cell compile "
        "the same programs); default DIR/.jax_cache, '' for none",
    )
    parser.add_argument("--slurm", action="store_true", help="print an sbatch array script")
    parser.add_argument(
        "--array_size", type=int, help="--slurm: array tasks (default: one per run)"
    )
    parser.add_argument(
        "--sbatch",
        action="append",
        default=[],
        help="--slurm: an extra #SBATCH option, e.g. --sbatch=--partition=gpu",
    )
    args, rest = parser.parse_known_args(argv)
    bad = [a for a in rest if not a.startswith("--config.")]
    if bad:
        parser.error(f"unknown arguments: {' '.join(bad)} (overrides are --config.<field>=<value>)")
    return args, rest


def _fmt_time(seconds: float) -> str:
    seconds = round(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def headline(results: dict | None) -> str:
    """The number a run is known by: A_T (continual), best test accuracy (from scratch), or
    their mean ± std over a vmapped program's seeds."""
    if not results:
        return ""
    for key, label in (("A_T", "A_T"), ("best_test_acc", "best test acc")):
        if results.get(key) is not None:
            return f"{label} {results[key]:.2f}"
        metrics = results.get("metrics", {})
        table = metrics.get(results.get("predictors", [None])[0], metrics)
        m = table.get(key) if isinstance(table, dict) else None
        if m and m.get("mean") is not None:
            std = f" ± {m['std']:.2f}" if m.get("std") is not None else ""
            return f"{label} {m['mean']:.2f}{std} ({len(m['values'])} seeds)"
    return ""


@contextlib.contextmanager
def _output_to(path: str):
    """Sends this process's output to `path`: the file descriptors 1 and 2 (XLA's and other
    C++ output) and Python's sys.stdout / sys.stderr (progress bars, tables)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                yield
        finally:
            log.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_unit(unit: layout.Unit, root: str, overrides: Sequence[str]) -> dict:
    """Runs (or resumes) one unit in its workdir, its output appended to sweep.log."""
    import jax

    from aepg_jax import main

    workdir = os.path.abspath(os.path.join(root, unit.name))
    os.makedirs(workdir, exist_ok=True)
    with _output_to(os.path.join(workdir, layout.LOG_FILE)):
        print(
            f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {unit.command(root, overrides)}", flush=True
        )
        try:
            cfg = preflight.load_config(unit.config_arg, unit.overrides(overrides))
            return main.execute(cfg, workdir)
        except Exception:
            traceback.print_exc()
            raise
        finally:
            jax.clear_caches()  # the next run compiles other programs


def _error_line(err: BaseException) -> str:
    from aepg_jax import main

    line = cli.one_line(str(err)) or type(err).__name__
    return line if isinstance(err, main.USER_ERRORS) else f"{type(err).__name__}: {line}"


def select(args: argparse.Namespace) -> tuple[experiments.Experiment, list[layout.Unit]]:
    experiment = registry.get(args.experiment)
    runs = experiment.runs()
    known = {experiments.CONFIG_KEY, *(k for r in runs for k, _ in r.args)}
    for piece in filter(None, (args.where or "").split(",")):
        key = piece.partition("=")[0].strip()
        if "=" in piece and key not in known:
            raise ValueError(
                f"--where={args.where}: {key!r} is not an argument of {experiment.name}'s runs; "
                f"they have {', '.join(sorted(known))}."
            )
    runs = experiments.filter_runs(runs, args.where)
    if not runs:
        raise ValueError(f"--where={args.where} matches none of {experiment.name}'s runs.")
    return experiment, layout.units(runs, args.vmap_seeds)


def print_list(
    units: Sequence[layout.Unit], root: str | None, overrides: Sequence[str], mine, commands: bool
) -> None:
    width = len(str(len(units)))
    for k, unit in mine:
        print(overview.line(root, unit, f"[{k + 1:>{width}}/{len(units)}]"))
        if commands:
            print(f"    {unit.command(root or '<workdir>', overrides)}")
    if root is not None:
        counts = overview.counts(root, [u for _, u in mine])
        print(", ".join(f"{n} {word}" for word, n in counts.items()))


def slurm_script(args: argparse.Namespace, overrides: Sequence[str], n_units: int) -> str:
    """An sbatch array script: each task is a sweep worker (`claims.py`), with the
    user's `--shard` if given."""
    size = min(args.array_size or n_units, n_units)
    root = os.path.abspath(args.workdir)
    experiment = args.experiment
    if experiment.endswith(".py"):
        experiment = os.path.abspath(experiment)
    sweep = [
        sys.executable,
        "-m",
        "aepg_jax.sweep",
        f"--experiment={experiment}",
        f"--workdir={root}",
    ]
    sweep += [f"--where={args.where}"] if args.where else []
    sweep += ["--vmap_seeds"] if args.vmap_seeds else []
    sweep += [f"--compile_cache={args.compile_cache}"] if args.compile_cache is not None else []
    sweep += [f"--shard={args.shard}"] if args.shard else []
    command = shlex.join(sweep)
    command += "".join(f" {shlex.quote(o)}" for o in overrides)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name=aepg-{os.path.basename(experiment).removesuffix('.py')}",
        f"#SBATCH --array=0-{size - 1}",
        "#SBATCH --nodes=1",
        "#SBATCH --ntasks=1",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --cpus-per-task=8",
        f"#SBATCH --output={root}/slurm-%A_%a.out",
        "#SBATCH --open-mode=append",
        *(f"#SBATCH {opt}" for opt in args.sbatch),
        f"# {n_units} runs of {args.experiment}, {size} workers claiming them (most expensive "
        "first); resubmit to resume.",
        "set -euo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        command,
    ]
    return "\n".join(lines) + "\n"


def sweep(
    units: Sequence[layout.Unit],
    root: str,
    overrides: Sequence[str],
    mine,
    cost: dict[str, float] | None = None,
) -> tuple[int, bool]:
    """Works on this shard's unfinished units (`claims.work`, most expensive first by
    `cost`); the number that failed here, and whether one failed to write a checkpoint (Orbax's
    threads of a failed save never finish: no interpreter shutdown may wait for them)."""
    from aepg_jax.runs import checkpointing

    started = claims.Started(root, mine)  # the error files now: no clocks compared
    todo = claims.pending(root, mine, started)
    print(
        f"{len(mine)} of {len(units)} runs in this shard: {len(mine) - len(todo)} done, "
        f"{len(todo)} to run.",
        flush=True,
    )
    width, spent, tried = len(str(len(units))), [], []
    save_failed = False

    def run_one(k: int, unit: layout.Unit, left: int) -> None:
        nonlocal save_failed
        head = f"[{k + 1:>{width}}/{len(units)}] {unit.name}"
        start = time.monotonic()
        error_file = os.path.join(root, unit.name, layout.ERROR_FILE)
        try:
            results = run_unit(unit, root, overrides)
        except lock.Busy:  # cannot happen under the claim; never recorded as the run's failure
            raise
        except preemption.Preempted as stop:  # not the run's failure: it resumes
            print(f"{head}  {stop}", flush=True)
            raise
        except Exception as err:
            tried.append(False)
            save_failed |= isinstance(err, checkpointing.CheckpointWriteError)
            line = _error_line(err)
            with open(error_file, "w") as f:
                f.write(line + "\n")
            status = f"FAILED: {line} (log: {os.path.join(root, unit.name, layout.LOG_FILE)})"
        else:
            tried.append(True)
            if os.path.exists(error_file):
                os.remove(error_file)
            status = f"done {headline(results)}"
        spent.append(time.monotonic() - start)
        eta = sum(spent) / len(spent) * left
        print(f"{head}  {status}  {_fmt_time(spent[-1])}, ETA {_fmt_time(eta)}", flush=True)

    order = preflight.by_cost(todo, cost or {})
    claims.work(root, order, run_one, started)
    failed = tried.count(False)
    if failed:
        print(
            f"error: {failed} of {len(tried)} runs failed (see above); run the sweep again "
            "to retry them.",
            file=sys.stderr,
        )
    return failed, save_failed


def enable_compile_cache(path: str) -> None:
    """Every compiled program is kept in `path` and reused by later runs (and other shards):
    the seeds of a cell run the same programs, so only the first compiles (the numbers are
    those of a run without the cache)."""
    if not path:
        return
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.abspath(path))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def main(argv: Sequence[str]) -> int:
    args, overrides = parse(argv)
    try:
        experiment, units = select(args)
        i, n = layout.parse_shard(args.shard)
        if args.workdir is None and not (args.list or args.status):
            raise ValueError(
                "--workdir is required: the sweep's directory (its runs' workdirs, the tables' "
                "input), e.g. --workdir=runs/demo; --list and --status work without it."
            )
        checked = preflight.check(units, overrides)  # before anything is written
    except ValueError as err:
        cli.fail(str(err))
    root = args.workdir
    mine = layout.shard(units, i, n)
    if args.slurm:
        os.makedirs(root, exist_ok=True)  # SLURM writes its logs there
        print(slurm_script(args, overrides, len(units)), end="")
        return 0
    if args.list or args.status:
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
        print_list(units, root, overrides, mine, commands=args.list)
        return 0
    from absl import flags, logging

    from aepg_jax.system import memory

    memory.apply_default()  # before the backend starts, as aepg_jax.main
    flags.FLAGS.mark_as_parsed()  # absl's own flags keep their defaults (no absl.app here)
    logging.set_verbosity(logging.WARNING)  # as aepg_jax.main: orbax and XLA log a lot at INFO
    import jax

    try:  # the trainers' checks too, as aepg_jax.main runs them, still before any run
        own = {id(c.unit) for c in checked if c.cfg is None}
        preflight.check(
            [u for u in units if id(u) not in own],
            overrides,
            preflight.trainer_validate(jax.device_count()),
        )
    except ValueError as err:
        cli.fail(str(err))
    enable_compile_cache(
        os.path.join(root, ".jax_cache") if args.compile_cache is None else args.compile_cache
    )
    name = os.path.abspath(args.experiment) if args.experiment.endswith(".py") else experiment.name
    layout.write_sweep_file(root, name)
    try:
        with preemption.catch():
            failed, save_failed = sweep(units, root, overrides, mine, preflight.costs(checked))
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to resume.", file=sys.stderr)
        return 128 + signal.SIGINT
    except preemption.Preempted as stop:
        name = signal.Signals(stop.signum).name
        print(f"stopped by {name}: run the same command again to resume.", file=sys.stderr)
        return stop.status
    status = EXIT_FAILED_RUNS if failed else 0
    if save_failed:
        from aepg_jax.system import hosts

        hosts.leave(status, at_once=True)
    return status

