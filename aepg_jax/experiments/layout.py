"""Where a sweep's runs live, and what is done: the directory layout shared by `aepg_jax.sweep`
(which writes it) and `aepg_jax.tables` (which reads it).

    DIR/sweep.json                       the experiment a sweep of DIR ran, its `--config.*`
                                         overrides and `--where` selection (the last sweep's,
                                         and every set) and what each `+overrides-<digest>` of
                                         its run folders stands for (for `tables DIR`)
    DIR/<run.name>/                      one run: aepg_jax.main's workdir (config.json,
                                         checkpoints/, metrics.jsonl, results.json when done)
    DIR/<run.cell_name>,seeds=A-B/       with --vmap_seeds: seeds A..B as one num_seeds program
                                         (results_seeds.json; seed_<s>/results.json per seed)
    <workdir>/sweep.log                  the run's own output (appended on every attempt)
    <workdir>/sweep_error.txt            the last attempt's error line, while it has failed

A run folder is two levels, `<config stem>/<arguments>[+<field>=<value>...]`, each at most
`names.MAX_BYTES` bytes (Linux allows 255) whatever the values: a value's `/`, `%`, NUL and
control characters are escaped as %XX, and where the grid's overrides (an experiment's
reference settings) would make the name too long they show as one `+overrides-<digest>`
(`names.py`); their values are in the run's config.json and under `digests` in sweep.json.
Names that fit are unchanged, so runs made before digests existed are found as before, except
those whose names were over `names.MAX_BYTES` (PILOT's DualPrompt runs, up to 255 bytes):
rename such a folder to its run's new name (`aepg_jax.sweep --list`) to keep it.

A `Unit` is what one process runs at once: one run, or (with `vmap_seeds`) the consecutive
seeds of one cell as a single `num_seeds` program. A sweep's `--config.*` overrides that change
a run's result (`runs/identity.py`: every field that acts but where files are, how often to
log and checkpoint) give it a workdir of its own, `<run.name>+<field>=<value>...` (digested as
well when the name would be too long), so that it never counts as, or resumes, the run of the
experiment's own config; the tables show the runs of one override set and selection (by
default the last sweep's) and name the others.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import re
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from aepg_jax.experiments import Run, names

SWEEP_FILE = "sweep.json"
LOG_FILE = "sweep.log"
ERROR_FILE = "sweep_error.txt"
RESULTS_FILE = "results.json"
SEEDS_RESULTS_FILE = "results_seeds.json"


@dataclasses.dataclass(frozen=True)
class Unit:
    """One program: `runs` (one, or consecutive seeds of one cell) in the workdir `name`;
    `changed`: the (field, value) pairs in which the sweep's overrides change its config."""

    runs: tuple[Run, ...]
    changed: tuple[tuple[str, str], ...] = ()

    @property
    def vmapped(self) -> bool:
        return len(self.runs) > 1

    @property
    def name(self) -> str:
        """The workdir, relative to the sweep's directory (`names.py`)."""
        if not self.vmapped:
            return self.runs[0].folder(self.changed)
        first, last = self.runs[0].seed, self.runs[-1].seed
        return self.runs[0].program_folder(first, last, self.changed)

    @property
    def digested(self) -> tuple[tuple[str, str], ...]:
        """The (field, value) pairs its name shows as `+overrides-<digest>` (none: ())."""
        if not self.vmapped:
            return self.runs[0].digested(self.changed)
        first, last = self.runs[0].seed, self.runs[-1].seed
        return self.runs[0].program_digested(first, last, self.changed)

    @property
    def config_arg(self) -> str:
        run = self.runs[0]
        return f"{run.config}:{run.arg}" if run.arg else run.config

    def overrides(self, extra: Sequence[str] = ()) -> list[str]:
        """`--config.<field>=<value>` flags: the grid's (but those of the fields the user's
        set: a tuple field given twice would be the two tuples joined), num_seeds, then the
        user's."""
        given = {flag.partition("=")[0] for flag in extra}
        grid = [(f"--config.{k}", v) for k, v in self.runs[0].overrides]
        flags = [f"{flag}={v}" for flag, v in grid if flag not in given]
        if self.vmapped:
            flags.append(f"--config.num_seeds={len(self.runs)}")
        return flags + list(extra)

    @property
    def results_file(self) -> str:
        return SEEDS_RESULTS_FILE if self.vmapped else RESULTS_FILE

    def command(self, root: str, extra: Sequence[str] = ()) -> str:
        """The equivalent `aepg_jax.main` command line, runnable as printed: this Python
        (`.venv/bin/python` when it is the venv below the working directory)."""
        args = [f"--config={self.config_arg}", f"--workdir={os.path.join(root, self.name)}"]
        return shlex.join([python(), "-m", "aepg_jax.main", *args, *self.overrides(extra)])

    def result_files(self, root: str | os.PathLike) -> list[pathlib.Path]:
        """Where this unit's runs write their results.json (one per run)."""
        workdir = pathlib.Path(root) / self.name
        if not self.vmapped:
            return [workdir / RESULTS_FILE]
        return [workdir / f"seed_{r.seed}" / RESULTS_FILE for r in self.runs]


def python() -> str:
    """This interpreter as a command: relative to the working directory when below it."""
    exe = sys.executable
    try:
        rel = os.path.relpath(exe)
    except ValueError:
        return exe
    return rel if not rel.startswith("..") else exe


def has_checkpoint(workdir: str | os.PathLike) -> bool:
    """Whether `<workdir>/checkpoints` holds a checkpoint (a step directory)."""
    directory = pathlib.Path(workdir) / "checkpoints"
    return directory.is_dir() and any(p.name.isdigit() for p in directory.iterdir())


def saved_config(root: str | os.PathLike, unit: Unit) -> dict | None:
    """The config a unit's workdir holds a run of (finished, or with a checkpoint to resume),
    with its input digests (`identity.saved_inputs`: config.json's, else the weights' sha256
    its results record), or None: a workdir with neither takes whatever config runs next
    (`main`)."""
    from aepg_jax.runs import identity

    workdir = pathlib.Path(root) / unit.name
    if not (workdir / "config.json").exists():
        return None
    if not (has_checkpoint(workdir) or any(p.exists() for p in unit.result_files(root))):
        return None
    config = read_json(workdir / "config.json")
    if config is None:
        return None
    results = next((r for p in unit.result_files(root) if (r := read_json(p))), None)
    found = identity.saved_inputs(config, results)
    return {**config, identity.INPUTS_KEY: found} if found else config


Changed = Sequence[tuple[str, str]]
_SEEDS = re.compile(r"seeds=(\d+)-(\d+)")


def _programs(root: pathlib.Path, run: Run, changed: Changed = ()) -> list[pathlib.Path]:
    """The workdirs of vmapped programs of `run`'s cell under `root` run with the sweep's
    overrides `changed` (`<cell>,seeds=A-B...` for any A-B)."""
    directory = pathlib.PurePosixPath(run.program_folder(0, 0, changed)).parent
    found = []
    for path in (root / directory).glob("*seeds=*"):
        for m in _SEEDS.finditer(path.name):
            if f"{directory}/{path.name}" == run.program_folder(int(m[1]), int(m[2]), changed):
                found.append(path)
                break
    return sorted(found)


def units(runs: Sequence[Run], vmap_seeds: bool = False) -> list[Unit]:
    """One unit per run; with `vmap_seeds`, one per block of consecutive seeds of a cell
    (in the order of the cells' first runs)."""
    if not vmap_seeds:
        return [Unit((r,)) for r in runs]
    cells: dict[tuple, list[Run]] = {}
    out: list[Unit] = []
    for run in runs:
        if run.seed is None:
            out.append(Unit((run,)))
            continue
        cells.setdefault(run.without_seed(), []).append(run)
    for members in cells.values():
        members = sorted(members, key=lambda r: r.seed)
        block = [members[0]]
        for run in members[1:]:
            if run.seed == block[-1].seed + 1:
                block.append(run)
            else:
                out.append(Unit(tuple(block)))
                block = [run]
        out.append(Unit(tuple(block)))
    return out


def parse_shard(text: str | None) -> tuple[int, int]:
    """`"i/n"` -> (i, n) with 0 <= i < n; None -> (0, 1)."""
    if not text:
        return 0, 1
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise ValueError(f"--shard={text}: expected i/n, e.g. --shard=0/4.") from None
    if not 0 <= i < n:
        raise ValueError(f"--shard={text}: need 0 <= i < n (shards are numbered from 0).")
    return i, n


def shard(items: Sequence[Any], i: int, n: int) -> list[tuple[int, Any]]:
    """(position, item) of shard i of n: every n-th item from i, so that the n shards partition
    `items` whatever each has already finished."""
    return [(k, x) for k, x in enumerate(items) if k % n == i]


def metric(results: dict, name: str) -> float | None:
    """A number of one run's results.json: a key of it, or `H_T` (the entropy after the last
    task)."""
    if name == "H_T":
        finite = [v for v in results.get("entropy") or [] if v is not None]
        return finite[-1] if finite else None
    value = results.get(name)
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def read_json(path: pathlib.Path) -> dict | None:
    """The JSON object in `path`; None when it is missing, unreadable or not an object."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def result_paths(root: str | os.PathLike, run: Run, changed: Changed = ()) -> list[pathlib.Path]:
    """Every file that may hold `run`'s results (run with the sweep's overrides that change it,
    `changed`): its own workdir's results.json, and its seed's in each vmapped program of its
    cell."""
    root = pathlib.Path(root)
    own = [root / run.folder(changed) / RESULTS_FILE]
    if run.seed is None:
        return own
    return own + [p / f"seed_{run.seed}" / RESULTS_FILE for p in _programs(root, run, changed)]


def run_results(root: str | os.PathLike, run: Run, changed: Changed = ()) -> dict | None:
    """The results.json of `run` in the sweep directory `root`: its own workdir's, else that of
    its seed in a vmapped program of its cell; None while it is not finished."""
    for path in result_paths(root, run, changed):
        found = read_json(path)
        if found is not None:
            return found
    return None


def finished_without_results(
    root: str | os.PathLike, run: Run, changed: Changed = ()
) -> str | None:
    """The workdir of `run` when it looks finished (its metrics.jsonl holds the evaluation after
    its config's last task) but has no readable results.json (deleted, or lost), else None."""
    root = pathlib.Path(root)
    dirs = [root / run.folder(changed)]
    if run.seed is not None:
        dirs += [p / f"seed_{run.seed}" for p in _programs(root, run, changed)]
    for workdir in dirs:
        config = read_json(workdir / "config.json") or read_json(workdir.parent / "config.json")
        total = (config or {}).get("data", {}).get("num_tasks")
        if not isinstance(total, int) or (workdir / RESULTS_FILE).exists():
            continue
        try:
            with open(workdir / "metrics.jsonl") as f:
                for line in f:
                    try:
                        record = json.loads(line)
                    except ValueError:
                        continue
                    if record.get("type") == "eval" and record.get("task") == total - 1:
                        return str(workdir)
        except OSError:
            continue
    return None


def run_error(root: str | os.PathLike, run: Run, changed: Changed = ()) -> str | None:
    """The error line of `run`'s last failed attempt (its own or its vmapped program's)."""
    root = pathlib.Path(root)
    candidates = [
        root / run.folder(changed),
        *(_programs(root, run, changed) if run.seed is not None else []),
    ]
    for directory in candidates:
        try:
            return (directory / ERROR_FILE).read_text().strip().splitlines()[0]
        except (OSError, IndexError):
            continue
    return None


def unit_status(root: str | os.PathLike, unit: Unit) -> str:
    """done (every run has results), failed, partial (started) or todo."""
    done = all(run_results(root, r, unit.changed) is not None for r in unit.runs)
    if done:
        return "done"
    workdir = pathlib.Path(root) / unit.name
    if (workdir / ERROR_FILE).exists():
        return "failed"
    return "partial" if (workdir / "config.json").exists() else "todo"


def write_sweep_file(
    root: str | os.PathLike,
    experiment: str,
    overrides: Sequence[str] = (),
    where: str | None = None,
    units: Sequence[Unit] = (),
) -> None:
    """Records the experiment of `root`, the `--config.*` overrides and `--where` selection of
    its latest sweep (`overrides`, `where`), with every override set sweeps of `root` have run
    (`override_sets`, oldest first) and every (overrides, where) pair (`selections`), and the
    pairs each `+overrides-<digest>` of `units`' folders stands for (`digests`), atomically:
    several shards may write it at once."""
    root = pathlib.Path(root)
    root.mkdir(parents=True, exist_ok=True)
    before = read_json(root / SWEEP_FILE) or {}
    known = before.get("override_sets") or []
    sets = [list(s) for s in known if isinstance(s, list)]
    selections = [s for s in before.get("selections") or [] if isinstance(s, dict)]
    digests = before.get("digests") if isinstance(before.get("digests"), dict) else {}
    if before.get("experiment") not in (None, experiment):
        sets, selections, digests = [], [], {}  # another experiment's runs are not this one's
    if list(overrides) not in sets:
        sets.append(list(overrides))
    selection = {"overrides": list(overrides), "where": where or None}
    if selection not in selections:
        selections.append(selection)
    for unit in units:
        if unit.digested:
            digests[names.digest(unit.digested)] = [list(p) for p in unit.digested]
    record = {
        "experiment": experiment,
        "python": sys.executable,
        "overrides": list(overrides),
        "where": where or None,
        "override_sets": sets,
        "selections": selections,
        "digests": digests,
    }
    tmp = root / f".{SWEEP_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, root / SWEEP_FILE)


def sweep_experiment(root: str | os.PathLike) -> str | None:
    found = read_json(pathlib.Path(root) / SWEEP_FILE)
    return found.get("experiment") if found else None


def sweep_overrides(root: str | os.PathLike) -> tuple[list[str], list[list[str]]]:
    """(the overrides of the latest sweep of `root`, every override set its sweeps ran)."""
    found = read_json(pathlib.Path(root) / SWEEP_FILE) or {}
    latest = found.get("overrides") or []
    sets = found.get("override_sets") or [latest]
    return list(latest), [list(s) for s in sets if isinstance(s, list)]


def sweep_selection(root: str | os.PathLike, overrides: Sequence[str]) -> tuple[str, ...] | None:
    """The `--where` selections the sweeps of `root` ran with `overrides` (a run is shown when
    any selects it), or None when one of them ran every run or none ran these overrides."""
    found = read_json(pathlib.Path(root) / SWEEP_FILE) or {}
    wheres = [
        s.get("where")
        for s in found.get("selections") or []
        if isinstance(s, dict) and s.get("overrides") == list(overrides)
    ]
    if not wheres or any(not isinstance(w, str) or not w for w in wheres):
        return None
    return tuple(dict.fromkeys(wheres))
