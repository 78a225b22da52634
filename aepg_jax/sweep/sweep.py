"""Runs every run of an experiment (a table or figure of the paper, or the demo), resumably.

    python -m aepg_jax.sweep --experiment=NAME --workdir=DIR [--list | --status]
        [--where key=value[/value...],...] [--shard=i/n] [--[no-]vmap_seeds] [--rerun_changed]
        [--slurm [--array_size=N] [--gpus_per_worker=N] [--cpus_per_worker=N] [--signal_s=S]
                 [--sbatch=OPTION ...]] [--config.<field>=<value> ...]

Before any run, every run's config (with the `--config.*` overrides, which go to every run; every
field with its default: `python -m pydoc aepg_jax.config.schema`) is checked as
`python -m aepg_jax.main` checks it: a problem stops the sweep with one `error:` line (exit 2),
naming how many runs have it. An override that changes a run's result gives it a run folder of
its own, `DIR/<run name>+<field>=<value>`; DIR/sweep.json records the overrides and `--where`,
and `aepg_jax.tables DIR` shows the runs the last sweep's overrides and selection ran. A run
folder that holds a run of another identity (another config, or other weights: the weights
file's sha256) stops the sweep in one line naming the fields (`--rerun_changed` keeps it as
`<run>.replaced-<time>` and runs afresh). Run names are `<config>/<arguments>` and always show
the method, loss and seed (`--list` prints them with their `aepg_jax.main` commands); overrides
that would make a name too long for the file system show as `+overrides-<digest>`, which
DIR/sweep.json spells out. Any number of sweeps on one DIR (one per GPU, a SLURM array,
a second node) share the runs, most expensive first, and a run whose sweep died resumes from
its checkpoint. A run's own output goes to DIR/<run name>/sweep.log; the sweep prints one line
per run (A_T when done, the ETA). A run that fails on its data is recorded, the others go on
and the sweep exits 1 at the end; run it again to retry. `--shard=i/n` takes every n-th run from
the i-th; `--slurm` prints an sbatch array script; `--vmap_seeds` trains a cell's seeds as one
program (an experiment may do so by default; `--no-vmap_seeds` then runs each seed alone).
Ctrl-C, SIGTERM or SIGUSR1 checkpoint the run in progress and exit 130, 143 or 138; the same
command resumes (a second Ctrl-C stops at once: the run resumes from its newest
checkpoint). A worker whose runs are all done (a signal that its last run finished despite)
exits 0. `--status` prints each run as done, running, failed, partial or todo.
docs/paper.md has the details; `python -m aepg_jax.tables DIR` then prints the tables.

`--slurm` (docs/paper.md, "On a SLURM cluster") prints, instead of running, an sbatch array
script of `--array_size` workers (default one per run) on DIR, to `sbatch`. Each array task asks
for `--gpus_per_worker` GPUs (`#SBATCH --gres=gpu:N`; default 1 if this process sees a GPU:
/dev/nvidiaN, CUDA_VISIBLE_DEVICES, JAX_PLATFORMS; else 0 and no --gres line) and
`--cpus_per_worker` cores (`--cpus-per-task`, default 2), and has `--requeue`,
`--open-mode=append`, its log in `DIR/slurm-<job>_<task>.out` and `--signal=B:USR1@S`: SLURM
sends SIGUSR1 to the batch shell `--signal_s` seconds (default 120; 0: none) before the time
limit. The shell runs the worker in the background and passes it SIGUSR1 and SIGTERM; the
worker finishes its step, checkpoints and exits 138 (SIGUSR1) or 143 (SIGTERM), and after 138
the shell requeues its array task (`scontrol requeue JOB_TASK`), which resumes. `--sbatch=OPTION`
adds an `#SBATCH` line and replaces the default of the same option (`--sbatch=--gres=gpu:a100:2`,
`--sbatch=-c 16`, `--sbatch=--no-requeue`; `--gpus*` replace `--gres`).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
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
from aepg_jax.system import cli, preemption, xla_cache

EXIT_FAILED_RUNS = 1
DEFAULT_CPUS_PER_WORKER = 2
DEFAULT_SIGNAL_S = 120
load_config = preflight.load_config


def _count(minimum: int):
    def parse_count(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise ValueError(text)
        return value

    parse_count.__name__ = "integer >= 0" if minimum == 0 else f"integer >= {minimum}"
    return parse_count


_non_negative, _positive = _count(0), _count(1)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one `error:` line (exit 2), not the usage block."""

    def error(self, message: str):
        cli.fail(f"{message} (see python -m aepg_jax.sweep --help).")


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The sweep's options and the `--config.<field>=<value>` overrides."""
    parser = _Parser(
        prog="python -m aepg_jax.sweep",
        description=__doc__,
        epilog="experiments (--experiment=NAME):\n" + registry.listing(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--experiment",
        required=True,
        help="an experiment listed below, or a .py file defining EXPERIMENT",
    )
    parser.add_argument("--workdir", help="the sweep's directory (DIR)")
    parser.add_argument(
        "--list", action="store_true", help="print the runs, their status and commands; exit"
    )
    parser.add_argument("--status", action="store_true", help="print the runs' status; exit")
    parser.add_argument(
        "--where",
        help="only the runs whose arguments match, e.g. tasks=10,loss=ce/aepg,seed=0/1/2 (a "
        "/ between values: any of them; head_init=official: each method's own heads)",
    )
    parser.add_argument("--shard", help="i/n: run only shard i (0-based) of n")
    parser.add_argument(
        "--vmap_seeds",
        action=argparse.BooleanOptionalAction,
        help="run the consecutive seeds of a cell as one num_seeds program (default: on for "
        f"{', '.join(n for n, e in registry.registry().items() if e.vmap_seeds)}, off for the "
        "others)",
    )
    parser.add_argument(
        "--compile_cache",
        help="JAX's persistent compilation cache, shared by the runs and the workers (seeds of "
        "a cell compile the same programs); default ~/.cache/aepg_jax/xla, as aepg_jax.main's "
        "compile_cache; '' for none; AEPG_COMPILE_CACHE overrides it",
    )
    parser.add_argument(
        "--rerun_changed",
        action="store_true",
        help="a run folder holding a run of another config than the one the sweep would run "
        "there is kept as <run>.replaced-<time> and the run starts afresh (without it, the "
        "sweep stops before any run, naming the folder and the fields)",
    )
    parser.add_argument(
        "--slurm",
        action="store_true",
        help="print an sbatch array script of sweep workers (sbatch it; docs/paper.md)",
    )
    parser.add_argument(
        "--array_size", type=int, help="--slurm: array tasks (default: one per run)"
    )
    parser.add_argument(
        "--gpus_per_worker",
        type=_non_negative,
        help="--slurm: GPUs of each array task (#SBATCH --gres=gpu:N; 0: no --gres line); "
        "default 1 if this process sees a GPU (/dev/nvidia*, CUDA_VISIBLE_DEVICES, "
        "JAX_PLATFORMS), else 0",
    )
    parser.add_argument(
        "--cpus_per_worker",
        type=_positive,
        default=DEFAULT_CPUS_PER_WORKER,
        help=f"--slurm: cores of each array task (#SBATCH --cpus-per-task; default "
        f"{DEFAULT_CPUS_PER_WORKER}, which a small node can give; a GPU worker decoding "
        "images wants more, e.g. 8)",
    )
    parser.add_argument(
        "--signal_s",
        type=_non_negative,
        default=DEFAULT_SIGNAL_S,
        help="--slurm: SLURM sends SIGUSR1 this many seconds before a task's time limit "
        "(#SBATCH --signal=B:USR1@S); the worker checkpoints, exits 138 and the task is "
        f"requeued; default {DEFAULT_SIGNAL_S}, 0: no signal",
    )
    parser.add_argument(
        "--sbatch",
        action="append",
        default=[],
        help="--slurm: an #SBATCH option, e.g. --sbatch=--partition=gpu --sbatch=--time=4:00:00;"
        " one the script sets by default (--gres/--gpus*, --cpus-per-task, --signal, --output, "
        "--open-mode, --requeue, --job-name, --array, --nodes, --ntasks) is replaced by it",
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


def values(runs: Sequence[experiments.Run], keys: Sequence[str]) -> str:
    """What `keys` take in `runs`: `method is one of coda_prompt, lae, plain` (with the values
    that stand for one per run, `head_init=official`)."""
    parts = []
    for key in keys:
        found = sorted({v for r in runs if (v := r.value(key)) is not None}, key=_value_order)
        found += [a for a in experiments.aliases(key) if any(r.matches({key: a}) for r in runs)]
        parts.append(f"{key} is one of {', '.join(found)}")
    return "; ".join(parts)


def _value_order(value: str) -> tuple:
    """Numbers by value (seed 2 before 10), then text."""
    try:
        return (0, float(value), value)
    except ValueError:
        return (1, 0.0, value)


def select(args: argparse.Namespace) -> tuple[experiments.Experiment, list[layout.Unit]]:
    """The experiment and the units of the runs `--where` selects: one per run, or with seeds
    vmapped (`--vmap_seeds`, else the experiment's own `vmap_seeds`) one per block of a cell's
    consecutive seeds. Sets `args.vmap_seeds` to the choice made."""
    experiment = registry.get(args.experiment)
    runs = experiment.runs()
    known = {experiments.CONFIG_KEY, *(k for r in runs for k, _ in r.args)}
    selection = experiments.parse_where(args.where)
    for key, wanted in selection.items():
        if key not in known:
            raise ValueError(
                f"--where={args.where}: {key!r} is not an argument of {experiment.name}'s runs; "
                f"they have {', '.join(sorted(known))}."
            )
        for value in wanted:
            if not any(r.matches({key: value}) for r in runs):
                raise ValueError(
                    f"--where={args.where}: {key}={value} matches none of {experiment.name}'s "
                    f"runs; {values(runs, [key])}."
                )
    runs = experiments.filter_runs(runs, args.where)
    if not runs:
        raise ValueError(
            f"--where={args.where} matches none of {experiment.name}'s runs; "
            f"{values(experiment.runs(), list(selection))}."
        )
    if args.vmap_seeds is None:
        args.vmap_seeds = experiment.vmap_seeds
    return experiment, layout.units(runs, args.vmap_seeds)


def print_list(
    units: Sequence[layout.Unit], root: str | None, overrides: Sequence[str], mine, commands: bool
) -> None:
    width = len(str(len(units)))
    for k, unit in mine:
        print(overview.line(root, unit, f"[{k + 1:>{width}}/{len(units)}]"))
        if commands:
            print(f"    {unit.command(root or '<workdir>', overrides)}")
    if any(u.vmapped for _, u in mine):
        runs = sum(len(u.runs) for _, u in mine)
        print(f"{runs} runs as {len(mine)} programs (seeds vmapped; --no-vmap_seeds: one each)")
    if root is not None:
        counts = overview.counts(root, [u for _, u in mine])
        print(", ".join(f"{n} {word}" for word, n in counts.items()))


# `--sbatch` options that replace a default of the script: the option's long name, and the
# default it replaces (the GPU options replace --gres, --no-requeue replaces --requeue).
_SHORT_SBATCH = {
    "a": "array", "c": "cpus-per-task", "G": "gpus", "J": "job-name", "n": "ntasks",
    "N": "nodes", "o": "output",
}  # fmt: skip
_SAME_SBATCH = {
    "gpus": "gres", "gpus-per-task": "gres", "gpus-per-node": "gres",
    "gpus-per-socket": "gres", "cpus-per-gpu": "cpus-per-task", "no-requeue": "requeue",
}  # fmt: skip


def _sbatch_name(option: str) -> str:
    """The default an `#SBATCH` option replaces: `--gres=gpu:2` -> gres, `-c 4` ->
    cpus-per-task, `--gpus=1` -> gres."""
    option = option.strip()
    if option.startswith("--"):
        name = option[2:].split("=", 1)[0].split()[0] if option[2:] else ""
    elif option.startswith("-") and len(option) > 1:
        name = _SHORT_SBATCH.get(option[1], option[1])
    else:
        name = option
    return _SAME_SBATCH.get(name, name)


def visible_gpus() -> int:
    """GPUs this process would see, without starting a JAX backend (a login node's GPUs are
    not to be claimed just to print a script): none if JAX_PLATFORMS names no GPU platform,
    else those of CUDA_VISIBLE_DEVICES if set, else the /dev/nvidiaN devices."""
    platforms = os.environ.get("JAX_PLATFORMS", "").lower()
    if platforms and not any(p in platforms for p in ("cuda", "gpu", "rocm")):
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def slurm_script(args: argparse.Namespace, overrides: Sequence[str], n_units: int) -> str:
    """An sbatch array script: each task is a sweep worker (`claims.py`), with the user's
    `--shard` if given. Resources follow the runs: `--gpus_per_worker` GPUs (default: 1 where
    this process sees a GPU, else none and no --gres line), `--cpus_per_worker` cores; every
    default `#SBATCH` option is replaced by a `--sbatch` one of the same name. The worker runs
    in the background of the batch shell, which forwards SIGUSR1 (`--signal_s` before the time
    limit) and SIGTERM to it; a worker that stopped on SIGUSR1 (status 138: its run
    checkpointed) has its array task requeued, to resume where it stopped."""
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
    if args.vmap_seeds != registry.get(args.experiment).vmap_seeds:  # else the experiment's
        sweep += ["--vmap_seeds" if args.vmap_seeds else "--no-vmap_seeds"]
    sweep += [f"--compile_cache={args.compile_cache}"] if args.compile_cache is not None else []
    sweep += [f"--shard={args.shard}"] if args.shard else []
    command = shlex.join(sweep)
    command += "".join(f" {shlex.quote(o)}" for o in overrides)
    gpus = visible_gpus() and 1 if args.gpus_per_worker is None else args.gpus_per_worker
    defaults = [
        f"--job-name=aepg-{os.path.basename(experiment).removesuffix('.py')}",
        f"--array=0-{size - 1}",
        "--nodes=1",
        "--ntasks=1",
        *([f"--gres=gpu:{gpus}"] if gpus else []),
        f"--cpus-per-task={args.cpus_per_worker}",
        f"--output={root}/slurm-%A_%a.out",
        "--open-mode=append",
        "--requeue",
        *([f"--signal=B:USR1@{args.signal_s}"] if args.signal_s else []),
    ]
    replaced = {_sbatch_name(o) for o in args.sbatch}
    options = [o for o in defaults if _sbatch_name(o) not in replaced] + list(args.sbatch)
    task = "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}"
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {o}" for o in options),
        f"# {n_units} runs of {args.experiment}, {size} workers claiming them (most expensive "
        "first); resubmit to resume.",
        "# The worker runs in the background: this shell passes it SLURM's SIGUSR1 (sent "
        f"{args.signal_s} s before the time limit) and SIGTERM; it finishes its step, writes a "
        "checkpoint and exits 128 + the signal's number. On SIGUSR1 (138) the array task is "
        "requeued and resumes; on SIGTERM (143: scancel, preemption) it is not.",
        "set -uo pipefail",
        f"cd {shlex.quote(os.getcwd())}",
        f"{command} &",
        "worker=$!",
        "trap 'kill -USR1 \"$worker\" 2>/dev/null' USR1",
        "trap 'kill -TERM \"$worker\" 2>/dev/null' TERM",
        'wait "$worker"',
        'while kill -0 "$worker" 2>/dev/null; do wait "$worker"; done  # a trap ended the wait',
        'wait "$worker"; status=$?  # the worker\'s own exit status',
        'if [ "$status" -eq 138 ]; then',
        f'  echo "worker stopped by SIGUSR1 (checkpointed): requeueing {task}"',
        f'  scontrol requeue "{task}"',
        'elif [ "$status" -eq 137 ]; then',
        '  echo "error: the worker was killed by SIGKILL: most likely out of memory (the'
        " kernel's OOM killer; sacct -j $SLURM_JOB_ID -o MaxRSS shows its peak); resubmit to"
        ' resume from the last checkpoint" >&2',
        "fi",
        'exit "$status"',
    ]
    return "\n".join(lines) + "\n"


def sweep(
    units: Sequence[layout.Unit],
    root: str,
    overrides: Sequence[str],
    mine,
    cost: dict[str, float] | None = None,
    shard: str | None = None,
) -> tuple[int, bool]:
    """Works on the unfinished units of `mine` (the shard `shard`, or all of `units`;
    `claims.work`, most expensive first by `cost`); the number that failed here, and whether
    one failed to write a checkpoint (Orbax's threads of a failed save never finish: no
    interpreter shutdown may wait for them)."""
    from aepg_jax.runs import checkpointing

    started = claims.Started(root, mine)  # the error files now: no clocks compared
    todo = claims.pending(root, mine, started)
    runs = "run" if len(units) == 1 else "runs"
    which = (
        f"{len(mine)} of {len(units)} {runs} in shard {shard}" if shard else f"{len(units)} {runs}"
    )
    print(f"{which}: {len(mine) - len(todo)} done, {len(todo)} to run.", flush=True)
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


def enable_compile_cache(path: str | None) -> None:
    """Every compiled program is kept in the persistent cache and reused by later runs (and
    other workers): the seeds of a cell run the same programs, so only the first compiles (the
    numbers are those of a run without the cache). `path` None: the project's cache
    (`xla_cache.directory`); "": none. The runs' own `compile_cache` fields are not read: one
    cache serves the sweep's process."""
    xla_cache.enable(xla_cache.directory() if path is None else xla_cache.directory(path))


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
        checked = preflight.with_changes(checked, overrides)  # a changed config: its own name
    except ValueError as err:
        cli.fail(str(err))
    units = [c.unit for c in checked]
    root = args.workdir
    mine = layout.shard(units, i, n)
    if args.slurm:
        os.makedirs(root, exist_ok=True)  # SLURM writes its logs there
        print(slurm_script(args, overrides, len(units)), end="")
        return 0
    if args.list or args.status:
        # `| head` ends it quietly; SIGPIPE stays ignored, as main() runs in tests' processes too
        try:
            print_list(units, root, overrides, mine, commands=args.list)
            sys.stdout.flush()
        except BrokenPipeError:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # exit's flush too
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
        ours = {id(u) for _, u in mine}
        found = preflight.conflicts(root, [c for c in checked if id(c.unit) in ours])
        if found and not args.rerun_changed:
            raise ValueError(preflight.conflict_line(root, found))
        for path in preflight.set_aside(root, found):
            print(f"kept the run of another config as {path}", flush=True)
    except ValueError as err:
        cli.fail(str(err))
    enable_compile_cache(args.compile_cache)
    name = os.path.abspath(args.experiment) if args.experiment.endswith(".py") else experiment.name
    layout.write_sweep_file(root, name, overrides, args.where, units)
    try:
        with preemption.catch():
            failed, save_failed = sweep(
                units, root, overrides, mine, preflight.costs(checked), args.shard
            )
    except KeyboardInterrupt:  # a second Ctrl-C (system/preemption.py)
        print(
            "\ninterrupted at once: run the same command again; the run in progress resumes "
            "from its newest checkpoint.",
            file=sys.stderr,
        )
        from aepg_jax.system import hosts

        hosts.leave(128 + signal.SIGINT, at_once=True)  # Orbax's threads may never finish
    except preemption.Preempted as stop:
        print(f"{stop.how}: run the same command again to resume.", file=sys.stderr)
        return stop.status
    status = EXIT_FAILED_RUNS if failed else 0
    if save_failed:
        from aepg_jax.system import hosts

        hosts.leave(status, at_once=True)
    return status
